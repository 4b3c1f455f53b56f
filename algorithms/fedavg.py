"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017.

Each sampled client starts from the global model, runs local SGD on its train split, and replies
with its parameters weighted by its number of training samples n_k; the server sets the global
model to Σ_k n_k θ_k / Σ_k n_k.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .base import (Algorithm, ClientData, Context, EvalResult, LocalTraining, Weighted, consensus_terms,
                   weighted_rows, weighted_sum)
from . import stacked
from .local_sgd import accuracy_and_loss, get_params, load_params, local_sgd, predict_logits


@dataclass(frozen=True)
class FedAvgHyper(LocalTraining):
    stack_clients: str = stacked.stack_mode_field("a host's clients")


@dataclass
class DSGDState:
    """A client's own model in decentralized training (D-SGD); server mode keeps no state."""
    params: list[torch.Tensor]


class FedAvg(stacked.Stacking, Algorithm):
    name = "fedavg"
    summary = "FedAvg (McMahan et al. 2017): sample-weighted average of local SGD models"
    Hyper = FedAvgHyper
    ClientState = DSGDState
    supports_gossip = True

    # server: the state is the list of global parameters
    def init_server(self, model: nn.Module, rng: np.random.Generator) -> list[torch.Tensor]:
        return get_params(model)

    def broadcast(self, server_state: list[torch.Tensor], round_: int) -> list[torch.Tensor]:
        return server_state

    def aggregate(self, server_state, reduced: Weighted, round_: int) -> list[torch.Tensor]:
        if reduced is None or reduced.weight == 0:
            return server_state
        return reduced.mean(server_state[0].dtype)

    # client
    def prox_mu(self) -> float:
        """mu of a proximal term (mu/2)·‖w − w_start‖² in the local loss (FedProx); FedAvg: 0."""
        return 0.0

    def penalty(self, message: list[torch.Tensor], ctx: Context):
        """The proximal term as a function of the model (None when mu is 0)."""
        mu = self.prox_mu()
        if mu == 0:
            return None
        anchor = [m.to(ctx.device) for m in message]

        def prox(model):
            return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
        return prox

    def train_many(self, states, message, datas, ctxs):
        """All of a host's sampled clients in lockstep (small models without convolutions)."""
        if not self._batching() or not datas:
            return super().train_many(states, message, datas, ctxs)
        done = stacked.train_clients(self.scratch_model(ctxs[0].device), [message] * len(datas), datas, ctxs,
                                     self.hp, prox_mu=self.prox_mu())
        return [(s, Weighted(p, float(d.num_train)), loss) for s, d, (p, loss) in zip(states, datas, done)]

    def gossip_train_many(self, states, datas, ctxs):
        if not self._batching() or not datas:
            return super().gossip_train_many(states, datas, ctxs)
        done = stacked.train_clients(self.scratch_model(ctxs[0].device), [s.params for s in states], datas, ctxs,
                                     self.hp, prox_mu=self.prox_mu())
        return [(DSGDState(p), p, loss) for p, loss in done]

    def train(self, state, message: list[torch.Tensor], data: ClientData, ctx: Context):
        model = self.scratch_model(ctx.device)
        load_params(model, message)
        loss = local_sgd(model, data.train_x, data.train_y, self.hp, ctx,
                         penalty=self.penalty(message, ctx))
        return state, Weighted(get_params(model), float(data.num_train)), loss

    def global_model(self, message: list[torch.Tensor], device: torch.device) -> nn.Module:
        """A model holding the broadcast weights, loaded once per message (not once per client)."""
        if getattr(self, "_eval_message", None) is not message:
            if getattr(self, "_eval_model", None) is None:
                self._eval_model = self.model_fn().to(device)
            load_params(self._eval_model, message)
            self._eval_message = message          # a reference, so the identity check is sound
        return self._eval_model

    def evaluate(self, state, message: list[torch.Tensor], data: ClientData, ctx: Context) -> EvalResult:
        if message is None:                   # decentralized: the client's own model
            model = self.scratch_model(ctx.device)
            load_params(model, state.params)
            correct, loss = accuracy_and_loss(predict_logits(model, data.test_x), data.test_y)
            return EvalResult(correct, data.num_test, loss)
        model = self.global_model(message, ctx.device)
        correct, loss = accuracy_and_loss(predict_logits(model, data.test_x), data.test_y)
        return EvalResult(correct, data.num_test, loss, global_correct=correct)

    # gossip (D-SGD: Lian et al., "Can Decentralized Algorithms Outperform Centralized
    # Algorithms?", NeurIPS 2017): local SGD on the own model, then θ_i <- Σ_j W_ij θ_j
    def gossip_init(self, cid: int, message: list[torch.Tensor]) -> DSGDState:
        return DSGDState([t.clone() for t in message])

    def gossip_train(self, state: DSGDState, data: ClientData, ctx: Context):
        model = self.scratch_model(ctx.device)
        load_params(model, state.params)
        loss = local_sgd(model, data.train_x, data.train_y, self.hp, ctx,
                         penalty=self.penalty(state.params, ctx))
        params = get_params(model)
        return DSGDState(params), params, loss

    def mix(self, state: DSGDState, neighbours) -> DSGDState:
        return DSGDState(weighted_sum(neighbours))

    def mix_many(self, states, sources, rows):
        return [DSGDState(p) for p in weighted_rows(sources, rows)]

    def consensus_stats(self, state: DSGDState):
        return [consensus_terms(state.params)]
