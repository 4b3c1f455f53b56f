"""Ditto — Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (Alg. 1).

The global model w is trained by FedAvg. Every client also keeps a personal model v (its state,
on its host), trained on its own objective h_k(v; w) = F_k(v) + (λ/2)‖v − w‖² with w the
round's received global model held fixed. As in the official code, a selected client takes
each mini-batch twice: a personal step on v and a plain step on its copy of w — here two jobs
of the one loop with the same sample orders, trained in one ``fit`` call (w's job carries no
proximal term, so it trains at FedAvg's cost). v starts from the initial
global model and persists across rounds; the personalized metrics come from v, the global ones
from w. An unseen client trains a personal model from the received w for ``personal_epochs``.

``personal_epochs`` (default: ``local_epochs``, the official interleaving): the personal model's
epochs per round; when it differs, v's batches are drawn on their own (FL-bench's schedule).

Decentralized (a ``topology``; the paper has a server): each client trains its copy of w and
its v as above, mixes w with its neighbours and keeps v, pulled each round towards its own
mixed copy of w.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class DittoHyper(FedAvgHyper):
    lam: float = field(default=1.0, metadata={"min": 0.0, "help": "λ, pull of the personal model towards w"})
    personal_epochs: int | None = field(
        default=None,
        metadata={"min": 1, "help": "epochs of the personal model per round (default: local_epochs, interleaved)"},
    )


@dataclass
class DittoState:
    personal: list[torch.Tensor]


class Ditto(FedAvg):
    name = "ditto"
    summary = "Ditto (Li et al. 2021): FedAvg plus a personal model per client pulled towards the global one"
    paper = "Li et al., ICML 2021"
    family = "personalized"
    personal = "its personal model v"
    sends = "its copy of the global model w, weighted by n_k"
    Hyper = DittoHyper
    ClientState = DittoState
    decentralized = True

    def client_work(self, n_train):
        """The global model's E epochs and the personal model's epochs."""
        return float((self.hp.local_epochs + (self.hp.personal_epochs or self.hp.local_epochs)) * n_train)

    personalized_is_global = False  # a personal model beside the global one

    def private_epochs(self):
        """Both models train on the client's data each round: w's epochs and v's (DP-SGD counts both)."""
        return self.hp.local_epochs + (self.hp.personal_epochs or self.hp.local_epochs)

    def init_client(self, cid, rng):
        return None  # v = the initial global model until the client trains

    def _personal_job(self, v, received, data, ctx, orders=None):
        epochs = self.hp.personal_epochs or self.hp.local_epochs
        return self.job(
            v, data, ctx, epochs=epochs, orders=orders, consts={"anchor": received.shared, "mu": self.hp.lam}
        )

    def train(self, state, received, data, ctx):
        v = received.shared if state is None else state.personal
        glob = self.job(received.shared, data, ctx)
        same = self.hp.personal_epochs in (None, self.hp.local_epochs)
        fitted_w, fitted_v = yield [glob, self._personal_job(v, received, data, ctx, glob.orders if same else None)]
        return DittoState(fitted_v.params), self.reply(fitted_w.params, received.shared, data.num_train), fitted_w.loss

    def evaluate(self, state, received, data, ctx):
        v = received.shared if state is None else state.personal
        personal, glob = self.outputs([v, received.shared], data.test_x, ctx.device)
        return {**self.task.scores(personal, data.test_y), **self.task.scores(glob, data.test_y, "global_")}

    def personalize(self, received, data, ctx):
        (fitted,) = yield [self._personal_job(received.shared, received, data, ctx)]
        return DittoState(fitted.params)
