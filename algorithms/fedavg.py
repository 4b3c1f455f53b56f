"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017.

Each sampled client starts from the global model, runs local SGD on its train split, and replies
with its parameters weighted by its number of training samples n_k; the server sets the global
model to Σ_k n_k θ_k / Σ_k n_k.

Decentralized (a ``topology``), this is D-SGD (Lian et al., "Can Decentralized Algorithms
Outperform Centralized Algorithms?", NeurIPS 2017): local SGD on the client's own model, then
θ_i ← Σ_j W_ij θ_j over its neighbours.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Algorithm, LocalTraining, Weighted, params_of


@dataclass(frozen=True)
class FedAvgHyper(LocalTraining):
    pass


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg (McMahan et al. 2017): sample-weighted average of local SGD models; D-SGD with a topology"
    Hyper = FedAvgHyper
    decentralized = True

    def init_server(self, rng):
        return params_of(self.model_fn())

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.weight == 0:
            return server
        return reduced.mean(server[0].dtype)

    def consts(self, received) -> dict:
        """Per-job constants of the local objective (FedProx adds its proximal term)."""
        return {}

    def train(self, state, received, data, ctx):
        (fitted,) = yield [self.job(received.shared, data, ctx, consts=self.consts(received))]
        return state, Weighted(fitted.params, float(data.num_train)), fitted.loss

    def evaluate(self, state, received, data, ctx):
        out = self.outputs([received.shared], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(out, data.test_y, "global_")}
