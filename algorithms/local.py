"""Local — every client trains its own model on its own data; nothing is communicated.

The lower baseline of personalized FL papers (e.g. Marfoq et al. 2021, Table 2 "Local"). All
clients start from the same initial weights; each sampled client runs local SGD on its own
persistent model, which lives in the client's state on its host. An unseen client
(``eval.unseen_fraction``) trains a model of its own on its train split before it is scored,
``unseen_epochs`` epochs (default: as many as a client sampled every round gets in the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Algorithm, LocalTraining, params_of


@dataclass(frozen=True)
class LocalHyper(LocalTraining):
    unseen_epochs: int | None = field(
        default=None,
        metadata={"min": 1, "help": "epochs an unseen client trains on its own data (default: rounds x local_epochs)"},
    )


@dataclass
class LocalState:
    params: list[torch.Tensor]


class Local(Algorithm):
    no_gossip = "a client that never communicates has nothing to gossip"
    name = "local"
    summary = "Local training only (no communication): each client keeps its own model"
    paper = "a baseline, no paper (e.g. Marfoq et al., NeurIPS 2021, Table 2)"
    family = "local only"
    personal = "its model"
    sends = "nothing"
    Hyper = LocalHyper
    ClientState = LocalState

    def init_server(self, rng):
        return params_of(self.model_fn())  # the common initialization

    def aggregate(self, server, reduced, round_):
        return server

    def train(self, state, received, data, ctx):
        start = received.shared if state is None else state.params
        (fitted,) = yield [self.job(start, data, ctx)]
        return LocalState(fitted.params), None, fitted.loss

    def evaluate(self, state, received, data, ctx):
        params = received.shared if state is None else state.params
        return self.task.scores(self.outputs([params], data.test_x, ctx.device)[0], data.test_y)

    def personalize(self, received, data, ctx):
        epochs = self.hp.unseen_epochs or self.rounds * self.hp.local_epochs
        (fitted,) = yield [self.job(received.shared, data, ctx, epochs=epochs)]
        return LocalState(fitted.params)
