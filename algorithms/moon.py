"""MOON — Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021 (Algorithm 1).

FedAvg whose local loss adds a model-contrastive term: the representation z of a sample under
the local model being trained is pulled towards z_glob, its representation under the round's
received global model, and pushed from z_prev, its representation under the client's previous
local model:

    ℓ = ℓ_sup(w; (x, y)) + μ·ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),

sim the cosine similarity, averaged over the batch like the cross-entropy. The global and the
previous models are frozen: their forward passes reach the objective (``MOONObjective``) as
the job's constants ``glob`` and ``prev`` (their parameters, only the body's for a sequence
of layers; as Ditto and FedProx pass an anchor) and take no gradient. The server is FedAvg's (sample-weighted mean of the models).

Choices:

- The representation z is the output of the model's body (the ``body`` parameter group:
  everything before the head, ``model.head``; raysim/core/groups.py), i.e. the input of the
  classifier. The paper adds a projection head (a 2-layer MLP to 256 dimensions) to the
  network and contrasts its output; raysim does not change the model, so the zoo's models
  work as they are — with ``model.head: 2`` on an MLP the projection-like last hidden layer
  becomes part of the head. A model with no body is refused (``split``). A sequence of layers
  (``nn.Sequential``: the zoo's MLPs and CNNs) runs its body and head apart, stacked like any
  job, and the frozen models' passes run the body only; any other model (ResNets, VGG) runs
  whole, set by set, with z the input of the head's first layer (a forward pre-hook).
- The previous local model is the client's state (its whole model after its last round). At a
  client's first round it is the received global model: z_prev = z_glob, so ℓ_con = log 2
  with zero gradient and the first round is plain FedAvg for that client. The official code
  (QinbinLi/MOON ``main.py``, checked) differs at first rounds: its pool of previous models is
  empty in round 1, so the contrastive term is 0 there (also plain FedAvg); from round 2 the
  pool holds a copy of every client's network, and a client not sampled before has its own
  random initialization there (each client's network is initialized apart), which then serves
  as its z_prev. After a client's first round both agree: its model after its last round.
- The frozen passes run the body in evaluation mode (dropout off, batch norm with its running
  statistics), as the official code's ``global_model.eval()`` and previous networks' ``eval()``
  (checked).
- ``mu`` μ = 1: the paper's value for CIFAR-100 and Tiny-ImageNet (5 for CIFAR-10); ``tau``
  τ = 0.5, the paper's temperature for all datasets. The official code's buffer of several
  previous models (``model_buffer_size``, default 1) is not implemented: one previous model,
  the paper's default.

Metrics: ``accuracy`` and ``global_*`` score the global model; with ``eval.finetune`` the
unprefixed metrics are the locally tuned global model's.

Decentralized (a ``topology``): the paper has a server. On a graph each client's "global"
model is its own copy after the last mixing (its neighbourhood's average): the contrastive term
pulls its representation towards that copy's and away from its previous local model's, the
trained model is mixed with its neighbours, and the previous local model stays on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from raysim.core.features import Features

from .base import Objective
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class MOONHyper(FedAvgHyper):
    mu: float = field(
        default=1.0,
        metadata={
            "min": 0.0,
            "help": "μ, weight of the model-contrastive loss (paper: 1 on CIFAR-100/Tiny-ImageNet, 5 on CIFAR-10)",
        },
    )
    tau: float = field(default=0.5, metadata={"gt": 0.0, "help": "τ, temperature of the contrastive loss (paper: 0.5)"})


@dataclass
class MOONState:
    prev: list[torch.Tensor]  # the client's local model after its last round


class MOONObjective(Objective):
    """CE of the model + μ·ℓ_con on the body's outputs; constants ``glob`` and ``prev``: the
    parameters of the global and of the previous local model (frozen; a sequence of layers
    needs only their body's, ``body_only``)."""

    def __init__(self, task, model: nn.Module, body: tuple[int, ...], head: tuple[int, ...], mu: float, tau: float):
        self.task, self.mu, self.tau = task, mu, tau
        self.body_idx, self.head_idx = body, head
        self.live = Features(model, body, head)
        self.frozen = Features(model, body, head, frozen=True)
        self.body_only = self.live.body_only

    def const_params(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """What of a frozen model's parameters the job carries."""
        return self.frozen.carried(params)

    def contrastive(self, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        """ℓ_con per sample: (K, B, d) representations -> (K, B)."""
        pos = F.cosine_similarity(z, z_glob, dim=-1) / self.tau
        neg = F.cosine_similarity(z, z_prev, dim=-1) / self.tau
        return -pos + torch.logaddexp(pos, neg)

    def loss(self, forward, params, batch, consts, draws):
        z, out = self.live(params, batch.x)
        per = self.task.per_sample(out, batch.y)
        loss = (per * batch.weight).sum(1)
        if self.mu:
            zg, zp = self.frozen_reps(batch.x, consts)
            con = self.contrastive(z.flatten(2), zg.flatten(2), zp.flatten(2))
            loss = loss + self.mu * (con * batch.weight).sum(1)
        return loss, (per.detach() * batch.valid).sum(1)

    def frozen_reps(self, x: torch.Tensor, consts: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """z_glob and z_prev: the frozen models' representations of the batch."""
        with torch.no_grad():
            return self.frozen.z(consts["glob"], x), self.frozen.z(consts["prev"], x)

    # the contrastive gradient enters the hand-written backward pass at the head's input
    # (``grad(..., hidden=...)``), which only chains of linear layers have; other models train
    # ``loss`` through autograd
    needs_chain = True

    def gradients(self, grad, params, batch, consts, draws):
        """``loss``'s gradients by the loop's hand-written backward pass: the cross-entropy's
        error passed down through the head, plus μ·∂ℓ_con/∂z at the representation z (the
        head's input), taken by autograd over the (K, B, d) representations alone."""
        if not self.mu:
            seen, g = grad(params)
            return seen, g, {}
        zg, zp = (r.flatten(2) for r in self.frozen_reps(batch.x, consts))

        def pull(z: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad():
                leaf = z.detach().requires_grad_()
                con = self.contrastive(leaf.flatten(2), zg, zp)
                (g,) = torch.autograd.grad((con * batch.weight).sum() * self.mu, leaf)
            return g

        seen, g = grad(params, hidden=(self.head_idx[0], pull))
        return seen, g, {}


class MOON(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "moon"
    summary = "MOON (Li et al. 2021): FedAvg plus a contrastive loss pulling representations to the global model's"
    paper = "Li, He & Song, CVPR 2021"
    family = "global model"
    personal = "its previous local model"
    sends = "its model, weighted by n_k"
    Hyper = MOONHyper
    ClientState = MOONState
    decentralized = True
    split = True

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        g = self.groups  # made once, here: a model that cannot be split fails at setup
        self.moon = MOONObjective(task, model_fn(), g.body, g.head, hyper.mu, hyper.tau)

    def train(self, state, received, data, ctx):
        glob = received.shared
        prev = glob if state is None else state.prev
        keep = self.moon.const_params
        (fit,) = yield [self.job(glob, data, ctx, objective=self.moon, consts={"glob": keep(glob), "prev": keep(prev)})]
        return MOONState(fit.params), self.reply(fit.params, glob, data.num_train), fit.loss
