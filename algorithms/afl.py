"""AFL, Agnostic Federated Learning — Mohri, Sivek & Suresh, ICML 2019.

The model is trained for the worst mixture of the clients' distributions: the minimax problem

    min_w max_{λ ∈ Δ} L(w, λ) = Σ_k λ_k F_k(w),

λ in the simplex over the clients (each client its own domain). Stochastic-AFL takes both
steps at once each round from (w_{t−1}, λ_{t−1}):

    w_t = Σ_k λ_k w̄_k / Σ_k λ_k   over the round's clients (each w̄_k its local SGD from w_{t−1}),
    λ_t = Proj_Δ(λ_{t−1} + γ_λ·F(w_{t−1})),

F(w_{t−1}) the vector of every client's loss of the global model on its train split (a
statistics round over all clients, before training), Proj_Δ the Euclidean projection onto the
simplex (sort-based, Duchi et al. 2008). λ starts uniform. The paper's output — and what the
clients are scored with by default (``evaluate: average``) — is the average of the iterates,
w̄_T = (1/T)·Σ_t w_t; ``evaluate: last`` scores the last one.

Choices, from the official code (litian96/fair_flearn: ``flearn/trainers/afl.py``, read at
f097971), which runs every client every round with one full-batch gradient each:

- the model step here is the scenario's local training (E epochs of SGD from w_{t−1}, its
  clients the scenario's sampling), weighted by λ; with every client, one epoch and one batch
  it is the official step w − η·Σλ_k∇F_k/Σλ_k;
- the official code's averaging ignores λ under its "sampling 2" (the README's command), which
  makes the model step a plain average; raysim weights by λ, as the paper;
- its simplex projection compares with a partial sum one entry short, so its λ can sum to more
  than 1 (up to 1.1 on random inputs); raysim projects exactly;
- ``lambda_lr`` γ_λ = 0.01: the official experiment script's (its README's Adult command: 0.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import Message, PerClient, StatsRequest, Weighted, params_of
from .fedavg import FedAvg, FedAvgHyper

AVERAGE = -2  # the group whose part is the average of the iterates (what evaluation scores)


@dataclass(frozen=True)
class AFLHyper(FedAvgHyper):
    lambda_lr: float = field(default=0.01, metadata={"min": 0.0, "help": "γ_λ, the step of λ's projected ascent"})
    evaluate: str = field(
        default="average",
        metadata={
            "choices": ("average", "last"),
            "help": "score the average of the iterates (the paper's output) or the last model",
        },
    )


@dataclass
class AFLServer:
    model: list[torch.Tensor]
    lam: torch.Tensor  # (clients,) float64: λ_{t−1}, the model step's weights
    pending: torch.Tensor  # λ_t from this round's losses, which the next round's step takes
    average: list[torch.Tensor]  # the average of the iterates w_1..w_t
    steps: int
    asked: int = -1  # the round whose losses gave ``pending`` (one statistics round a round)


def project_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of v onto {λ ≥ 0, Σλ = 1}: λ = max(v − θ, 0) with θ from the
    sorted v (the largest ρ with u_ρ − (Σ_{i≤ρ} u_i − 1)/ρ > 0)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u - (css - 1) / np.arange(1, len(u) + 1) > 0)[0][-1]
    theta = (css[rho] - 1) / (rho + 1)
    return np.maximum(v - theta, 0.0)


class AFL(FedAvg):
    dp_sgd = False  # its reply is weighted by λ, not n_k
    name = "afl"
    summary = (
        "AFL (Mohri et al. 2019): the model for the worst mixture of clients, λ by projected ascent on their losses"
    )
    paper = "Mohri, Sivek & Suresh, ICML 2019"
    family = "global model"
    personal = "nothing"
    sends = "its loss F_k (every client), then its model, weighted by λ_k"
    Hyper = AFLHyper
    decentralized = False
    no_gossip = "λ is one distribution over all clients, kept by a server"
    not_asynchronous = "its λ step needs every client's loss at the same model"

    def init_server(self, rng):
        m = params_of(self.model_fn())
        none = torch.zeros(0, dtype=torch.float64)
        return AFLServer(m, none, none, [t.clone() for t in m], 0)

    def stats_request(self, server, round_):
        return None if server.asked == round_ else StatsRequest("all", server.model)

    def client_stats(self, state, received, data, ctx):
        return state, PerClient({ctx.cid: self.train_loss(received.shared, data, ctx)})

    def absorb_stats(self, server, reduced, round_):
        losses = dict(reduced or {})
        n = max([len(server.lam), *(int(c) + 1 for c in losses)])
        lam = server.lam
        if len(lam) < n:  # the first round: uniform over the clients that answered
            lam = torch.zeros(n, dtype=torch.float64)
            lam[[int(c) for c in losses]] = 1.0 / len(losses)
        f = torch.zeros(n, dtype=torch.float64)
        for c, v in losses.items():
            f[int(c)] = float(v)
        # λ_{t−1} weighs this round's models; λ_t waits for the next round (a simultaneous step)
        pending = torch.from_numpy(project_simplex((lam + self.hp.lambda_lr * f).numpy()))
        return AFLServer(server.model, lam, pending, server.average, server.steps, round_)

    def select(self, server, round_, sampled, candidates, rng):
        return {int(c): int(c) for c in sampled}  # each client's group carries its λ_k

    def message(self, server, round_):
        groups = {c: float(server.lam[c]) for c in range(len(server.lam))}
        groups[AVERAGE] = server.average
        return Message(server.model, groups)

    def eval_groups(self, server, cids):
        return {int(c): AVERAGE for c in cids} if self.hp.evaluate == "average" else {}

    def train(self, state, received, data, ctx):
        (fit,) = yield [self.job(received.shared, data, ctx)]
        return state, Weighted(fit.params, float(received.part or 0.0)), fit.loss

    def aggregate(self, server, reduced, round_):
        lam = server.pending if len(server.pending) else server.lam
        model = server.model if reduced is None or reduced.weight <= 0 else reduced.mean(server.model[0].dtype)
        t = server.steps + 1
        average = [
            (a.to(torch.float64) + (w.to(torch.float64) - a.to(torch.float64)) / t).to(a.dtype)
            if a.is_floating_point()
            else w
            for a, w in zip(server.average if server.steps else model, model)
        ]
        return AFLServer(model, lam, lam, average, t, server.asked)

    def scored_model(self, received):
        return received.part if isinstance(received.part, list) else received.shared

    def evaluate(self, state, received, data, ctx):
        out = self.outputs([self.scored_model(received)], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(out, data.test_y, "global_")}

    def global_model(self, state, received):
        return self.scored_model(received)

    def server_params(self, server):
        return self.groups.pick(server.model, self.global_indices())

    def with_server_params(self, server, params):
        merged = self.groups.merge(server.model, self.global_indices(), params)
        return AFLServer(merged, server.lam, server.pending, server.average, server.steps, server.asked)

    def report(self, results, server):
        return {"lambda": [round(float(v), 6) for v in server.lam]}
