"""SCAFFOLD — Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (Algorithm 1, option II).

The server holds the global model x and the server control variate c; every client i holds its
own control variate c_i (its state, on its host; 0 until it first trains). A round:

1. the server sends (x, c) to the sampled clients S;
2. client i starts from y_i = x and takes K_i local steps
       y_i ← y_i − η_l · (g_i(y_i) − c_i + c),
   here the one loop's SGD on the loss f_i(y) + ⟨c − c_i, y⟩ (the ``linear`` constant of the
   loop's ``Supervised``: its gradient is g_i − c_i + c); K_i = local_epochs × ⌈n_i / B⌉, the
   steps this client actually took (it varies with n_i), and η_l the round's ``lr``;
3. option II: c_i⁺ = c_i − c + (x − y_i) / (K_i η_l); the client keeps c_i⁺ and sends
       Δy_i = y_i − x,   Δc_i = c_i⁺ − c_i;
4. the server: x ← x + η_g · (1/|S|) Σ_{i∈S} Δy_i,   c ← c + (1/N) Σ_{i∈S} Δc_i,
   N the number of training clients (counted once, by a statistics request to all of them,
   before the first round; unseen clients are not part of the federation) and η_g
   ``server_lr``.

Defaults and choices:

- ``server_lr`` η_g = 1: the paper's experiments (and FL-bench's ``global_lr``); with η_g = 1
  and every client sampled, x is the plain average of the y_i.
- η_l, batch size and epochs come from the scenario (LocalTraining's defaults otherwise).
- ``weighting: uniform`` (default) is the paper's 1/|S| (and FL-bench's). Weighting Δy by the
  clients' sample counts, as FedAvg does, is common too (NIID-Bench averages the models with
  sample-count weights and c uniformly over N). ``weighting: samples`` here is the consistent
  weighted version: x ← x + η_g · Σ_S n_i Δy_i / Σ_S n_i and c ← c + Σ_S n_i Δc_i / Σ_all n_j,
  so c stays the n-weighted mean of the c_i, the control variate of the objective Σ p_i f_i
  that the weighted model average optimizes. Uniform is the default because it is the paper's
  algorithm and its analysis: c = (1/N) Σ c_i estimates the gradient of (1/N) Σ f_i, the
  objective the uniform average of Δy descends; mixing a sample-weighted model step with a
  uniform c corrects towards a different objective than the one averaged.
- Option II assumes plain SGD steps: with ``momentum`` or ``weight_decay`` (both 0 by
  default), (x − y_i)/(K η_l) is no longer the mean corrected gradient and the control variates
  are only approximate (FL-bench and NIID-Bench compute option II the same way regardless).
  Badly so with heavy momentum: with momentum 0.9 the model moves ~10× further than K η_l
  plain steps, c_i overstates the gradient ~10×, and on pathological Fashion-MNIST (TwoNN, lr
  0.01) the corrected steps diverged in round 2 (and plain SGD at the same effective step, lr
  0.1, in round 35): ``pathological_fashion_table.yaml`` runs it with plain SGD at lr 0.01.
  With a step or exponential schedule η_l is the round's lr, the one the steps used.
- A client without training samples takes no step (K = 0): its c_i and y_i stay, it sends
  Δy = Δc = 0 (with uniform weighting it still counts in |S|, as in the paper).

Metrics: ``accuracy`` (and ``global_*``) score the global model x on each client's test split;
unseen clients score x too. With ``eval.finetune`` (SCAFFOLD-LU) ``accuracy`` and ``lu_*`` score
each client's local update of x (plain SGD on the task loss, no control variates). Communication is twice FedAvg's, both ways ((x, c) down, (Δy, Δc)
up), as in the paper.

Decentralized: no. The method is defined by a server control variate c = mean of every
client's c_i and a server step; a gossip variant would need each client to track the network
mean of the c_i as well (a different algorithm), so SCAFFOLD is star-only, like Ditto and
pFedMe, and a scenario with a ``topology`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Algorithm, LocalTraining, Message, StatsRequest, Weighted, params_of


@dataclass(frozen=True)
class ScaffoldHyper(LocalTraining):
    server_lr: float = field(default=1.0, metadata={"gt": 0.0, "help": "η_g, the server's step on the mean Δy"})
    weighting: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "samples"),
            "help": "uniform: 1/|S| and 1/N (the paper); samples: by the clients' sample counts",
        },
    )


@dataclass
class ScaffoldServer:
    x: list[torch.Tensor]  # the global model
    c: list[torch.Tensor]  # the server control variate
    clients: float = 0.0  # N: every training client (0: not counted yet)
    samples: float = 0.0  # Σ n_j over every training client (weighting: samples)


@dataclass
class ScaffoldState:
    c: list[torch.Tensor]  # the client control variate c_i


@dataclass
class ScaffoldMessage:
    x: list[torch.Tensor]
    c: list[torch.Tensor]


@dataclass
class ScaffoldReply:
    dy: Weighted  # Δy_i = y_i − x, weight 1 or n_i
    dc: Weighted  # Δc_i = c_i⁺ − c_i, weight 1 or n_i


class Scaffold(Algorithm):
    name = "scaffold"
    summary = "SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates c - c_i (option II)"
    paper = "Karimireddy et al., ICML 2020"
    family = "global model"
    personal = "its control variate c_i"
    sends = "Δy_i = y_i − x and Δc_i = c_i⁺ − c_i"
    Hyper = ScaffoldHyper
    ClientState = ScaffoldState
    decentralized = False
    no_gossip = "its server control variate c, the mean of every client's, has no counterpart on a graph"
    personalized_is_global = True
    not_asynchronous = (
        "its server control variate c is updated from every round's replies; an asynchronous "
        "server steps only the model"
    )

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        x = params_of(self.model_fn())
        return ScaffoldServer(x, [torch.zeros_like(p) for p in x])

    def stats_request(self, server, round_):
        return StatsRequest("all") if server.clients == 0 else None

    def client_stats(self, state, received, data, ctx):
        return state, (1.0, float(data.num_train))

    def absorb_stats(self, server, reduced, round_):
        clients, samples = reduced
        return ScaffoldServer(server.x, server.c, float(clients), float(samples))

    def message(self, server, round_):
        return Message(ScaffoldMessage(server.x, server.c))

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.dy.weight == 0:
            return server
        step = self.hp.server_lr
        x = [(o.double() + step * v / reduced.dy.weight).to(o.dtype) for o, v in zip(server.x, reduced.dy.values)]
        total = server.samples if self.hp.weighting == "samples" else server.clients
        c = [(o.double() + v / total).to(o.dtype) for o, v in zip(server.c, reduced.dc.values)]
        return ScaffoldServer(x, c, server.clients, server.samples)

    def server_params(self, server):
        return self.groups.pick(server.x, self.global_indices())

    def with_server_params(self, server, params):
        return ScaffoldServer(
            self.groups.merge(server.x, self.global_indices(), params), server.c, server.clients, server.samples
        )

    # -- client ----------------------------------------------------------------------------
    def steps(self, n: int) -> int:
        """K: the local steps a client with n training samples takes in a round."""
        return self.hp.local_epochs * -(-n // self.hp.batch_size)

    def train(self, state, received, data, ctx):
        x, c = received.shared.x, received.shared.c
        ci = [torch.zeros_like(p) for p in x] if state is None else state.c
        (fit,) = yield [self.job(x, data, ctx, consts={"linear": [a - b for a, b in zip(c, ci)]})]
        y = fit.params
        k = self.steps(data.num_train)
        if k == 0:
            new = ci
        else:
            scale = 1.0 / (k * self.hp.lr_at(ctx.round, ctx.rounds))
            new = [a - b + (p0 - p1) * scale for a, b, p0, p1 in zip(ci, c, x, y)]  # option II
        w = float(data.num_train) if self.hp.weighting == "samples" else 1.0
        reply = ScaffoldReply(
            Weighted([p1 - p0 for p0, p1 in zip(x, y)], w), Weighted([a - b for a, b in zip(new, ci)], w)
        )
        return ScaffoldState(new), reply, fit.loss

    def global_model(self, state, received):
        return received.shared.x

    def evaluate(self, state, received, data, ctx):
        out = self.outputs([received.shared.x], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(out, data.test_y, "global_")}
