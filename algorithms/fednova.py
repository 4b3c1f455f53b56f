"""FedNova — Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020.

Clients that take different numbers of local steps τ_k (different data sizes, or stragglers
cut short by a deadline: ``systems.stragglers: partial``) pull FedAvg's average towards the
clients that took more of them: it then minimizes another objective than Σ p_k F_k. FedNova
normalizes each client's cumulative update by its number of steps before averaging, and rescales
the average by the effective number of steps:

    d_k = (x − x_k) / a_k,      x ← x − τ_eff Σ_k p_k d_k,      τ_eff = Σ_k p_k a_k,

with p_k = n_k / Σ_j n_j over the round's clients, and a_k = τ_k for plain SGD; with momentum ρ
(heavy ball, restarted each round) a_k = [τ_k − ρ(1 − ρ^τ_k)/(1 − ρ)] / (1 − ρ) (the paper's
eq. 9, as its official code accumulates it step by step). Equal steps everywhere give FedAvg
exactly (up to rounding). With FedProx's proximal term (``mu``) the paper's a_k changes further;
raysim's FedNova trains on the task's loss alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Weighted
from .fedavg import FedAvg, FedAvgHyper


@dataclass
class NovaReply:
    """Σ n_k d_k and Σ n_k a_k (each summed with its weight n_k)."""

    update: Weighted
    steps: Weighted


class FedNova(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "fednova"
    summary = "FedNova (Wang et al. 2020): updates normalized by each client's local steps, rescaled by τ_eff"
    paper = "Wang et al., NeurIPS 2020"
    family = "global model"
    personal = "nothing"
    sends = "its update divided by its normalized steps a_k, and a_k, weighted by n_k"
    Hyper = FedAvgHyper
    decentralized = False
    no_gossip = "its normalized average of the round's updates is a server step"

    @classmethod
    def check(cls, hp, decentralized):
        if getattr(hp, "track_variance", False):
            return "track_variance", "is FedAvg's; FedNova replies normalized updates"
        return super().check(hp, decentralized)

    def normalizer(self, steps: int) -> float:
        """a_k for ``steps`` local steps: τ for plain SGD; with momentum ρ, Σ_t (1 − ρ^t)/(1 − ρ)."""
        rho = self.hp.momentum if self.hp.optimizer == "sgd" else 0.0
        if rho == 0.0:
            return float(steps)
        return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)

    def train(self, state, received, data, ctx):
        (fitted,) = yield [self.job(received.shared, data, ctx)]
        a = self.normalizer(fitted.steps)
        n = float(data.num_train)
        d = [(x - y) / a if a > 0 else torch.zeros_like(x) for x, y in zip(received.shared, fitted.params)]
        return state, NovaReply(Weighted(d, n), Weighted([torch.tensor([a], dtype=torch.float64)], n)), fitted.loss

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.update.weight == 0:
            return server
        tau = float(reduced.steps.values[0][0]) / reduced.steps.weight
        return [
            (x.double() - tau * v / reduced.update.weight).to(x.dtype) for x, v in zip(server, reduced.update.values)
        ]

    def round_metrics(self, reduced):
        return {"tau_eff": float(reduced.steps.values[0][0]) / reduced.steps.weight} if reduced is not None else {}
