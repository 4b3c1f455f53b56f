"""q-FFL (q-FedAvg) — Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in Federated
Learning", ICLR 2020.

Minimizes f_q(w) = Σ_k p_k F_k(w)^(q+1) / (q+1): clients with a higher loss weigh more, the
more so the larger q (q = 0: FedAvg's objective). Each sampled client k takes its loss F_k(w)
of the received model w on its whole train split, runs local SGD to w̄_k, and replies

    Δ_k = F_k^q · L(w − w̄_k),
    h_k = q·F_k^(q−1)·‖L(w − w̄_k)‖² + L·F_k^q,        L = 1/η,

L(w − w̄_k) standing in for the gradient (the Lipschitz constant estimated by 1/η, η the round's
local learning rate); the server steps w ← w − Σ_k Δ_k / Σ_k h_k over the round's clients.

Choices, from the official code (litian96/fair_flearn: ``flearn/trainers/qffedavg.py``, read
at f097971), where the paper is silent:

- F_k is the loss of the global model on the client's train split before local training, each
  F_k raised with 1e-10 added (the code's guard against 0^(q−1)); the squared norm is over every
  parameter, flattened;
- the server's sum has no further weights: the paper samples clients with probability p_k;
  raysim samples as the scenario says (uniform by default), so with uniform sampling and q = 0
  the step is the unweighted mean of the clients' updates;
- ``q`` = 1 by default. The official ``main.py`` defaults to q = 0 (FedAvg's objective), and
  the paper tunes q per dataset; tune it on a validation split (``eval.validation``). Flower's
  ``QFedAvg`` differs from the official code: one loss (the server's evaluation) for every
  client, which stops q from reweighting clients, and a learning rate of its own for L; raysim
  follows the official code.

The global model is what every client is scored with (``accuracy``, ``global_*``); the fairness
numbers (``worst_accuracy``, ``worst10_accuracy``, ``entropy_accuracy``) are the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .fedavg import FedAvg, FedAvgHyper

EPS = 1e-10  # added to F_k before the powers (the official code's)


@dataclass(frozen=True)
class QFFLHyper(FedAvgHyper):
    q: float = field(
        default=1.0,
        metadata={"min": 0.0, "help": "q, how much more a client with a higher loss weighs (0: FedAvg's objective)"},
    )


@dataclass
class QReply:
    """Σ_k Δ_k (per tensor, floating-point tensors only) and Σ_k h_k once summed."""

    delta: list[torch.Tensor]
    h: float


def q_terms(
    received: list[torch.Tensor], trained: list[torch.Tensor], loss: float, q: float, lr: float
) -> tuple[list[torch.Tensor], float]:
    """(Δ_k, h_k) of one client (see the module's text): F = loss + 1e-10, g = (w − w̄)/η."""
    f = loss + EPS
    g = [(w - v) / lr if w.is_floating_point() else torch.zeros_like(w) for w, v in zip(received, trained)]
    sq = float(sum((t.to(torch.float64) ** 2).sum() for t in g))
    fq = f**q
    h = (q * f ** (q - 1) * sq if q else 0.0) + fq / lr
    return [fq * t for t in g], h


class QFFL(FedAvg):
    dp_sgd = False  # its reply is not the averaged model
    name = "qffl"
    summary = "q-FFL (Li et al. 2020): q-FedAvg, clients weighted by their loss to the power q for a fairer accuracy"
    paper = "Li, Sanjabi, Beirami & Smith, ICLR 2020"
    family = "global model"
    personal = "nothing"
    sends = "F_k^q·L(w − w̄_k) and h_k (its loss-weighted update and step scale)"
    Hyper = QFFLHyper
    decentralized = False
    no_gossip = "Σ_k h_k, the step's denominator, is over a server's round"
    not_asynchronous = "its step divides by the round's Σ_k h_k"

    def train(self, state, received, data, ctx):
        glob = received.shared
        loss = self.train_loss(glob, data, ctx)
        (fit,) = yield [self.job(glob, data, ctx)]
        lr = self.hp.settings(ctx.round, ctx.rounds).lr
        delta, h = q_terms(glob, fit.params, loss, self.hp.q, lr)
        return state, QReply(delta, h), fit.loss

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.h <= 0:
            return server
        return [
            (w.to(torch.float64) - d / reduced.h).to(w.dtype) if w.is_floating_point() else w
            for w, d in zip(server, reduced.delta)
        ]
