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

from dataclasses import dataclass, field

from .base import Algorithm, LocalTraining, Received, Tracked, UpdateStats, Weighted, params_of


@dataclass(frozen=True)
class FedAvgHyper(LocalTraining):
    track_variance: bool = field(
        default=False,
        metadata={"help": "log each round's total variance of the clients' last-layer updates (SosicFL's eq. 10)"},
    )


class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg (McMahan et al. 2017): sample-weighted average of local SGD models; D-SGD with a topology"
    paper = "McMahan et al., AISTATS 2017"
    family = "global model"
    personal = "nothing (with a topology: its own model)"
    sends = "its model, weighted by n_k (with a topology: to its neighbours)"
    Hyper = FedAvgHyper
    decentralized = True
    personalized_is_global = True  # subclasses with a personal model set False
    dp_sgd = True  # subclasses with an objective of their own set False

    @classmethod
    def check(cls, hp, decentralized):
        if decentralized and getattr(hp, "track_variance", False):
            return "track_variance", "measures the updates a server receives; it needs a star topology"
        return None

    @classmethod
    def averages_one_model(cls) -> bool:
        return (
            cls.reply is FedAvg.reply
            and cls.aggregate is FedAvg.aggregate
            and cls.select is Algorithm.select
            and cls.message is Algorithm.message
        )

    def init_server(self, rng):
        return params_of(self.model_fn())

    def reply(self, params, received, n: int):
        """The client's reply: its model weighted by n_k, with the statistics of its
        last-layer update (params − received) beside it under ``track_variance``."""
        w = Weighted(params, float(n))
        if not getattr(self.hp, "track_variance", False):  # pFedMe's settings lack it
            return w
        i = self.head()
        return Tracked(w, UpdateStats.of(params[i] - received[i]))

    def aggregate(self, server, reduced, round_):
        if isinstance(reduced, Tracked):
            reduced = reduced.model
        if reduced is None or reduced.weight == 0:
            return server
        return reduced.mean(server[0].dtype)

    def server_params(self, server):
        return self.groups.pick(server, self.global_indices())

    def with_server_params(self, server, params):
        return self.groups.merge(server, self.global_indices(), params)

    def round_metrics(self, reduced):
        return {"total_variance": reduced.head.variance()} if isinstance(reduced, Tracked) else {}

    def consts(self, received) -> dict:
        """Per-job constants of the local objective (FedProx adds its proximal term)."""
        return {}

    def train(self, state, received, data, ctx):
        (fitted,) = yield [self.job(received.shared, data, ctx, consts=self.consts(received))]
        return state, self.reply(fitted.params, received.shared, data.num_train), fitted.loss

    def train_rows(self, params, block):
        """D-SGD's step for all of a host's clients at once: the jobs ``train`` makes, one per
        client, stacked; each client's model becomes its trained one, which ``aggregate`` of its
        own reply gives too (Σ n·θ / Σ n = θ)."""
        job = self.rows_job(params, block, consts=self.consts(Received(params)))
        return self.trainer(block.device).fit_rows(job)

    def global_model(self, state, received):
        return received.shared

    def evaluate(self, state, received, data, ctx):
        out = self.outputs([received.shared], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(out, data.test_y, "global_")}
