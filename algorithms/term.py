"""TERM, client-level tilting — Li, Beirami, Sanjabi & Smith, "Tilted Empirical Risk
Minimization", ICLR 2021 (its fair federated learning experiment).

Minimizes the tilted risk R̃(t; w) = (1/t)·log Σ_k p_k·exp(t·F_k(w)) over the clients, whose
gradient is Σ_k ω_k ∇F_k(w) with ω_k = p_k·exp(t·F_k) / Σ_j p_j·exp(t·F_j): t > 0 tilts the
model towards the clients with the highest losses (t → ∞: the worst client; t = 0: FedAvg).
Each round the sampled clients report F_k, their loss of the global model on their train
split (a statistics round, before training); the server computes ω_k over them; each trains
locally and the server sets

    w ← Σ_k ω_k·w̄_k      (``normalizer: round``: ω_k = n_k·e^(t(F_k − max F)) / Σ_j n_j·e^(t(F_j − max F)),

the paper's weights over the round's clients, p_k ∝ n_k, shifted by the round's largest loss so
that no exponential overflows.

``normalizer: official`` runs the official code's step instead (litian96/TERM:
``fair_flearn/flearn/trainers/tilting.py``, read at HEAD): ω_k = e^(t(F_k − max F)) / (m·est),
est ← ½·est + ½·mean_k e^(t(F_k − max F)) (an average over rounds, starting from 0; m the
round's clients), and w ← w − (1/m)·Σ_k ω_k·(w − w̄_k): the extra mean shrinks the step about
m-fold, and round one's weights are 2/m. It samples clients with probability ∝ n_k, so it has
no p_k in the weights; raysim keeps its n_k there. The default is the paper's step, which is
FedAvg at t = 0; the official one is a compatibility option.

``t`` = 0.1: the official script's tilt. The global model is what every client is scored with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import Message, PerClient, StatsRequest, Weighted, params_of
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class TERMHyper(FedAvgHyper):
    t: float = field(default=0.1, metadata={"help": "t, the tilt (0: FedAvg; larger: the worst clients weigh more)"})
    normalizer: str = field(
        default="round",
        metadata={
            "choices": ("round", "official"),
            "help": "ω_k normalized over the round's clients (the paper) or the official code's running estimate",
        },
    )


@dataclass
class TERMServer:
    model: list[torch.Tensor]
    omega: dict[int, float]  # this round's clients' weights (from the statistics round)
    est: float  # the official normalizer's running estimate
    asked: int = -1  # the round whose losses ω comes from (one statistics round a round)


def tilted_weights(losses: dict[int, float], sizes: dict[int, float], t: float) -> dict[int, float]:
    """ω_k = n_k·e^(t(F_k − max F)) / Σ_j n_j·e^(t(F_j − max F)) over the clients of ``losses``."""
    top = max(losses.values())
    raw = {c: sizes[c] * math.exp(t * (losses[c] - top)) for c in sorted(losses)}
    total = sum(raw.values())
    return {c: v / total for c, v in raw.items()}


class TERM(FedAvg):
    dp_sgd = False  # its reply is not FedAvg's
    name = "term"
    summary = "TERM (Li et al. 2021): clients weighted by e^(t·F_k), the tilted risk's gradient, for fairness"
    paper = "Li, Beirami, Sanjabi & Smith, ICLR 2021"
    family = "global model"
    personal = "nothing"
    sends = "its loss F_k, then its model, weighted by the server's ω_k"
    Hyper = TERMHyper
    decentralized = False
    no_gossip = "the tilted weights are normalized over a server's round"
    not_asynchronous = "its weights come from a statistics round of the round's clients"

    def init_server(self, rng):
        return TERMServer(params_of(self.model_fn()), {}, 0.0)

    def stats_request(self, server, round_):
        return None if server.asked == round_ else StatsRequest("sampled", server.model)

    def client_stats(self, state, received, data, ctx):
        loss = self.train_loss(received.shared, data, ctx)
        return state, PerClient({ctx.cid: (loss, float(data.num_train))})

    def absorb_stats(self, server, reduced, round_):
        if not reduced:
            return TERMServer(server.model, {}, server.est, round_)
        losses = {c: float(v[0]) for c, v in reduced.items()}
        if self.hp.normalizer == "round":
            return TERMServer(
                server.model, tilted_weights(losses, {c: v[1] for c, v in reduced.items()}, self.hp.t), 0.0, round_
            )
        top = max(losses.values())
        tilt = {c: math.exp(self.hp.t * (f - top)) for c, f in sorted(losses.items())}
        est = 0.5 * server.est + 0.5 * float(np.mean(list(tilt.values())))
        return TERMServer(server.model, {c: v / (est * len(tilt)) for c, v in tilt.items()}, est, round_)

    def select(self, server, round_, sampled, candidates, rng):
        return {int(c): int(c) for c in sampled}  # each client's group carries its ω_k

    def message(self, server, round_):
        return Message(server.model, dict(server.omega))

    def train(self, state, received, data, ctx):
        glob = received.shared
        (fit,) = yield [self.job(glob, data, ctx)]
        omega = float(received.part or 0.0)
        return state, Weighted(fit.params, omega), fit.loss

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.weight <= 0:
            return server
        if self.hp.normalizer == "round":  # Σ ω_k w̄_k with Σ ω_k = 1 over the round's clients
            model = reduced.mean(server.model[0].dtype)
        else:  # w − (1/m)·Σ ω_k (w − w̄_k) = w·(1 − Σω/m) + (1/m)·Σ ω_k w̄_k
            m = len(server.omega)
            model = [
                (w.to(torch.float64) * (1 - reduced.weight / m) + v / m).to(w.dtype) if w.is_floating_point() else w
                for w, v in zip(server.model, reduced.values)
            ]
        return TERMServer(model, {}, server.est, server.asked)

    def server_params(self, server):
        return self.groups.pick(server.model, self.global_indices())

    def with_server_params(self, server, params):
        return TERMServer(
            self.groups.merge(server.model, self.global_indices(), params), server.omega, server.est, server.asked
        )

    def global_model(self, state, received):
        return received.shared
