"""Local — every client trains its own model on its own data; nothing is communicated.

The lower baseline of personalized FL papers (e.g. Marfoq et al. 2021, Table 2 "Local"). All
clients start from the same initial weights; each sampled client runs local SGD on its own
persistent model, which lives in the client's state on its host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .base import Algorithm, ClientData, Context, EvalResult, LocalTraining
from . import stacked
from .local_sgd import accuracy_and_loss, get_params, load_params, local_sgd, predict_logits


@dataclass(frozen=True)
class LocalHyper(LocalTraining):
    stack_clients: str = stacked.stack_mode_field("a host's clients")


@dataclass
class LocalState:
    params: list[torch.Tensor]


class Local(stacked.Stacking, Algorithm):
    name = "local"
    summary = "Local training only (no communication): each client keeps its own model"
    Hyper = LocalHyper
    ClientState = LocalState
    has_global_model = False
    communicates = False

    def init_server(self, model: nn.Module, rng: np.random.Generator):
        return get_params(model)          # the common initialization, sent once per round

    def broadcast(self, server_state, round_: int):
        return server_state

    def aggregate(self, server_state, reduced, round_: int):
        return server_state

    def _model_for(self, state: LocalState | None, message, ctx: Context) -> nn.Module:
        model = self.scratch_model(ctx.device)
        load_params(model, message if state is None else state.params)
        return model

    def train(self, state: LocalState | None, message, data: ClientData, ctx: Context):
        model = self._model_for(state, message, ctx)
        loss = local_sgd(model, data.train_x, data.train_y, self.hp, ctx)
        return LocalState(get_params(model)), None, loss

    def train_many(self, states, message, datas, ctxs):
        """All of a host's sampled clients in lockstep (small models without convolutions)."""
        if not datas or not self._batching():
            return super().train_many(states, message, datas, ctxs)
        starts = [message if s is None else s.params for s in states]
        done = stacked.train_clients(self.scratch_model(ctxs[0].device), starts, datas, ctxs, self.hp)
        return [(LocalState(p), None, loss) for p, loss in done]

    def evaluate(self, state: LocalState | None, message, data: ClientData, ctx: Context) -> EvalResult:
        model = self._model_for(state, message, ctx)
        correct, loss = accuracy_and_loss(predict_logits(model, data.test_x), data.test_y)
        return EvalResult(correct, data.num_test, loss)
