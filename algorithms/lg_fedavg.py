"""LG-FedAvg — Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, "Think
Locally, Act Globally: Federated Learning with Local and Global Representations",
arXiv:2001.01523, 2020 (Algorithm 1).

FedPer's split the other way round: each client m keeps a **local model** ℓ_m (the body, its
local representation; its state, persistent on its host, starting from the initial model's body)
and all clients share a **global model** θ_g on top of it (the head: ``model.head``). A round:

1. the server sends θ_g to the sampled clients M_t;
2. client m trains the whole model (ℓ_m, θ_g) on its data with local SGD, E epochs, and keeps
   the new ℓ_m;
3. it replies with its θ_g^m only;
4. the server: θ_g ← Σ_{m∈M_t} w_m θ_g^m / Σ_{m∈M_t} w_m (``weighting``: w_m = 1 or n_m).

Only the global layers travel (the paper's communication saving: the global model is small
because it works on compact local representations).

Defaults and choices (the official code is pliang279/LG-FedAvg, ``main_lg.py``):

- Which layers are global: ``model.head``. The official code makes the last
  ``--num_layers_keep`` layers global: 3 of its 5-layer MNIST MLP (the first two local), and
  FedRep's reimplementation (lgcollins/FedRep, ``--alg lg``) the last two layers of its MNIST
  MLP and CIFAR CNN. The default here is the model's own head (its last layer); set
  ``model: {head: 2}`` (or 3, or layer names) for the official splits.
- ``weighting: uniform`` (default): the official code divides the sum of the round's global
  layers by the number of clients m (its shards give every client the same n, where uniform and
  n-weighted agree); ``samples``: FedAvg's n_m weights.
- ``warmup_rounds`` (default 0): the official code never starts from scratch: ``main_lg.py``
  requires a FedAvg model (``--load_fed``; its scripts take FedAvg's models after 400 to 800 of
  1000 rounds on MNIST) and copies it into every client's local model. With ``warmup_rounds``
  = R_w the first R_w rounds here are FedAvg on the whole model (replies carry all of it, and
  no client keeps a body yet); after them the server's body is the warm-up's average, sent to
  the clients that have no body of their own yet (``SplitMessage.local``), and the rounds are
  LG-FedAvg's. 0 runs Algorithm 1 alone, from the run's initial model.
- ``lr`` 0.05, ``momentum`` 0.5, ``batch_size`` 10, ``local_epochs`` 1, no weight decay: the
  official MNIST script (CIFAR-10: lr 0.1, batch 50).
- Not reproduced: the official code keeps, per client, the local model of the round with the
  best *test* accuracy so far and reports the best round (an optimistic protocol).

Metrics: ``accuracy`` etc. score each client's local model with the current global layers (the
official "local test": after each round the global layers are copied into every client's
model, sampled or not). No ``global_*`` metrics: the global layers alone are not a model.
Unseen clients (``eval.unseen_fraction``): the paper's new devices, which learn a local model
under the trained global one: the body trained on the client's data with θ_g frozen,
``unseen_epochs`` (default ``local_epochs``) epochs, from the body a client without one starts
from.

Decentralized (a ``topology``): each client trains its local model under its copy of the
global layers, keeps the local model and mixes the global layers with its neighbours
(``SplitMethod``'s gossip). ``warmup_rounds`` (a FedAvg of the whole model) is refused there:
what gossip mixes is one group for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Message, Weighted, training_field
from .fedper import FedPerHyper, SplitMessage, SplitMethod


@dataclass(frozen=True)
class LGFedAvgHyper(FedPerHyper):
    lr: float = training_field("lr", 0.05)
    weight_decay: float = training_field("weight_decay", 0.0)
    weighting: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "samples"),
            "help": "the server's average of the global layers: uniform (1/|M|, the official code) or samples (n_m weights)",
        },
    )
    warmup_rounds: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "first rounds of FedAvg on the whole model (the official code starts from a FedAvg model)",
        },
    )


@dataclass
class LGFedAvgState:
    body: list[torch.Tensor]  # the client's local model ℓ_m


class LGFedAvg(SplitMethod):
    name = "lg_fedavg"
    summary = "LG-FedAvg (Liang et al. 2020): each client keeps its body (local representation), the head is averaged"
    paper = "Liang et al., arXiv 2020"
    family = "personalized"
    personal = "its body (local representation)"
    sends = "its head (the global layers)"
    Hyper = LGFedAvgHyper
    ClientState = LGFedAvgState
    keeps = "body"
    shares = "head"

    @classmethod
    def check(cls, hp, decentralized):
        if decentralized and hp.warmup_rounds:
            return (
                "warmup_rounds",
                "a FedAvg of the whole model has no gossip form here (gossip mixes the "
                "global layers, the same group every round); use 0 with a topology",
            )
        return super().check(hp, decentralized)

    def warming(self, round_: int) -> bool:
        return round_ < self.hp.warmup_rounds

    def message(self, server, round_):
        if self.hp.warmup_rounds == 0:
            return super().message(server, round_)
        # the server's body: the whole model in the warm-up, then where a client without a body starts
        return Message(SplitMessage(self.groups.pick(server, self.shares), self.groups.pick(server, self.keeps)))

    def aggregate(self, server, reduced, round_):
        if not self.warming(round_):
            return super().aggregate(server, reduced, round_)
        if reduced is None or reduced.weight == 0:
            return server
        return reduced.mean(server[0].dtype)

    def train(self, state, received, data, ctx):
        if not self.warming(ctx.round):
            return (yield from super().train(state, received, data, ctx))
        (fit,) = yield [self.job(self.model(None, received.shared, ctx.device), data, ctx)]
        w = float(data.num_train) if self.hp.weighting == "samples" else 1.0
        return state, Weighted(fit.params, w), fit.loss
