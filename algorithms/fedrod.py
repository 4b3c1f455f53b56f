"""FedRoD — Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022.

The model is a body φ (feature extractor, z = φ(x)) and a head g (``model.head``, by default the
last layer): together the **generic** model, shared and averaged by the server (FedAvg, n_k
weights). Each client k also keeps a **personal head** p_k of the head's shape (its state). Each
local step, on one mini-batch:

- φ and g minimize the balanced softmax loss (Ren et al. 2020), the client's class prior
  π_{k,c} = n_{k,c} / n_k added to the generic logits:
      ℓ_BSM(x, y) = −log softmax(g(z) + log π_k)_y;
- p_k minimizes plain cross-entropy on the personalized logits g(z) + p_k(z), with z and g(z)
  detached (no gradient into φ or g from this loss):
      ℓ_P(x, y) = CE(g(z).detach() + p_k(z.detach()), y).

Both losses are summed in one ``BalancedSoftmax`` objective over the parameters (φ, g, p_k), so
one optimizer step (``lr``, shared, as PFLlib's separate head optimizer uses the same learning
rate) updates all three from the same point: exactly the sequential updates of PFLlib's
``clientrod.py``, whose personal-head loss is computed on the representation taken before the
generic step. p_k(z.detach()) is the model's forward pass with the body detached and the head
replaced by p_k (so a multi-layer ``model.head`` works as well). The prior is the job's
constant ``log_prior`` (K, C). Running statistics (batch norm) are trained by no one: the body's
follow the generic forward pass and are averaged with the model; a personal head that holds
some (a ``model.head`` reaching back over a normalization layer) keeps its initial ones.

Prediction: generic ŷ = g(z) (``global_*``: the generic model, what the server holds, also what
``eval.finetune`` updates), personalized ŷ = g(z) + p_k(z) (``accuracy`` etc.).

Choices, from PFLlib's FedRoD (``clientrod.py``, checked at commit d832e76). The official
repository (hongyouc/Fed-RoD) holds a README and no code, so PFLlib's is the reference
implementation followed here:

- classes absent from a client get log π = log 0 = −inf in the balanced softmax, as PFLlib's
  ``balanced_softmax_loss`` computes: those logits then get no probability and no gradient. No
  smoothing of the prior.
- the personal head's loss detaches z and g(z) (PFLlib's ``rep.detach()`` and
  ``out_g.detach()``), with z taken before the generic step.
- p_k starts as a copy of the initial model's head (PFLlib's ``deepcopy(model.head)`` when the
  client is made), trained by its own SGD at the same lr (PFLlib's ``opt_head``); the
  paper's hypernetwork variant (FedRoD with a hypernetwork producing p_k) is not provided.
- defaults: lr 0.01, batch 10, 1 local epoch, plain SGD: the values of FedRep's and FedPer's
  official scripts used here too (PFLlib's own defaults are lr 0.005, batch 10, 1 epoch; the
  paper's exact optimizer settings were not re-checked). Tune them in any case.
- classification only (the balanced softmax needs class logits).

A client that never trained (``eval.unseen_fraction``) learns its p_k by one round's training
from the received generic model (``personalize_by_training``).

Decentralized (a ``topology``): each client trains its copy of the generic model (balanced
softmax) with its personal head, keeps the head and mixes the generic model with its
neighbours; the personal heads never travel (the paper has a server).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Algorithm, Objective, params_of, training_field
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class FedRoDHyper(FedAvgHyper):
    lr: float = training_field(
        "lr", 0.01, help=("η, the learning rate of the body, the generic head and the personal head alike")
    )
    batch_size: int = training_field("batch_size", 10)


@dataclass
class FedRoDState:
    head: list[torch.Tensor]  # the personal head p_k, in the head group's layout


class BalancedSoftmax(Objective):
    """Parameters: the model's (φ and g, in model order; ``n`` of them) then the personal head's
    (the head group's shapes). Loss: the balanced softmax on g(z) + log π (constant
    ``log_prior``, (K, C)) plus the cross-entropy of g(z).detach() + p(z.detach()). The data
    loss reported is the generic model's plain cross-entropy."""

    def __init__(self, task, groups, n: int, trainable: tuple[bool, ...] | None = None):
        self.task, self.groups, self.n = task, groups, n
        self.trainable = trainable
        head = set(groups.head) if groups is not None else set()
        self.head_mask = tuple(i in head for i in range(n))

    def balanced(self, out: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
        """Per-sample balanced softmax loss of logits ``out`` (K, B, C), prior (K, C)."""
        return self.task.per_sample(out + log_prior.unsqueeze(1), y)

    def loss(self, forward, params, batch, consts, draws):
        model, personal = params[: self.n], params[self.n :]
        out_g = forward(model, batch.x)
        bsm = self.balanced(out_g, batch.y, consts["log_prior"])
        body = [p.detach() for p in model]
        p_model = self.groups.merge(body, "head", personal)
        out_p = forward(p_model, batch.x)
        per_p = self.task.per_sample(out_g.detach() + out_p, batch.y)
        loss = ((bsm + per_p) * batch.weight).sum(1)
        plain = self.task.per_sample(out_g.detach(), batch.y)
        return loss, (plain * batch.valid).sum(1)

    def gradients(self, grad, params, batch, consts, draws):
        """``loss``'s gradients from the loop's ``grad`` (by hand for chains of linear layers):
        the balanced softmax's at the generic model (its outputs offset by log π), then the
        personal loss's at the model with the personal head, its outputs offset by the generic
        logits, differentiated in the head only."""
        model, personal = params[: self.n], params[self.n :]
        _, g_model, out_g = grad(model, offset=consts["log_prior"].unsqueeze(1), outputs=True)
        _, g_p = grad(self.groups.merge(model, "head", personal), offset=out_g, train=self.head_mask)
        plain = (self.task.per_sample(out_g, batch.y) * batch.valid).sum(1)
        return plain, g_model + [g_p[i] for i in self.groups.head], {}


def log_prior(y: torch.Tensor, classes: int) -> torch.Tensor:
    """log(n_c / n) per class, −inf for a class the client lacks."""
    counts = torch.bincount(y.reshape(-1).long(), minlength=classes).to(torch.float32)
    return torch.log(counts / counts.sum().clamp_min(1))


class FedRoD(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "fedrod"
    summary = (
        "FedRoD (Chen & Chao 2022): generic model trained with the balanced softmax and averaged; "
        "a personal head added to its logits"
    )
    paper = "Chen & Chao, ICLR 2022"
    family = "personalized"
    personal = "its personal head p_k"
    sends = "its generic model (body and generic head), weighted by n_k"
    Hyper = FedRoDHyper
    ClientState = FedRoDState
    decentralized = True
    personalized_is_global = False  # a personal head beside the generic model

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        init = params_of(model_fn())
        self.n = len(init)
        self.classes = int(init[self.groups.head[-1]].shape[0])
        # running statistics (not trained) wherever they are, in the model and in the personal head
        req = tuple(p.requires_grad for p in model_fn().parameters())
        self.bsm = BalancedSoftmax(task, self.groups, self.n, req + tuple(req[i] for i in self.groups.head))
        self._init_head = self.groups.pick(init, "head")

    def _head(self, state, device) -> list[torch.Tensor]:
        if state is not None:
            return state.head
        return [p.to(device) for p in self._init_head]

    def train(self, state, received, data, ctx):
        glob = received.shared
        head = self._head(state, glob[0].device)
        prior = log_prior(data.train_y, self.classes).to(glob[0].device)
        (fit,) = yield [self.job(glob + head, data, ctx, objective=self.bsm, consts={"log_prior": prior})]
        return (FedRoDState(fit.params[self.n :]), self.reply(fit.params[: self.n], glob, data.num_train), fit.loss)

    def evaluate(self, state, received, data, ctx):
        glob = received.shared
        mine = self.groups.merge(glob, "head", self._head(state, glob[0].device))
        out_g, out_p = self.outputs([glob, mine], data.test_x, ctx.device)
        task = self.task
        return {**task.scores(out_g + out_p, data.test_y), **task.scores(out_g, data.test_y, "global_")}

    personalize = Algorithm.personalize_by_training
