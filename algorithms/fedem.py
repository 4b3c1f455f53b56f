"""FedEM — Marfoq, Neglia, Bellet, Kameni & Vidal, "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021 (Alg. 1 and 2).

M shared components θ_1..θ_M; client k keeps mixture weights π_k (its state, on its host).
Each round, at each sampled client, with the components just received:
  E-step   q[m, i] = softmax_m( log π_m − ℓ(θ_m; x_i, y_i) )   over the whole local train set
  M-step   π_m = mean_i q[m, i]
  then every component takes local SGD steps on the loss weighted per sample by q[m, i]
  (batch loss = mean_i q[m, i]·ℓ_i, as the official code's ``fit_batch``): M jobs of the one
  loop, each with its own sample order.
Server: each component becomes the average of the clients' components weighted by n_k.
Prediction: p(y|x) = Σ_m π_m · softmax(θ_m(x)) (regression: Σ_m π_m θ_m(x)); ``center_*``
metrics score the component of largest π alone (FedSoft's reading of FedEM's local model).
Unseen clients (Table 3) personalize π from uniform with the components frozen: E-step + π
update repeated until π moves less than ``unseen_tol`` (L1), at most ``unseen_max_steps``
times — the fixed point the official code reaches over its repeated evaluations.

Defaults follow the official code: SGD momentum .9, weight decay 5e-4, batch 128, 1 local epoch,
lr ×0.1 at R/2 and 3R/4, M = 3. Two choices where paper and official code differ:
- ``keep_momentum`` (default false, the paper's local SGD): the official clients keep one SGD
  object per learner across rounds, so their momentum carries over; true does that
  (measured on the synthetic data: +2 to 3 points).
- ``server_average`` (default ``sampled``, the paper's Alg. 1 and FedAvg's convention: the
  sampled clients' sample-weighted average): ``all`` is the official aggregator, which averages
  over every client with weights n_k / Σ_all n, unsampled clients contributing the previous
  components — a step damped by the sampled share of the data. It needs Σ_all n, which the
  server asks every client for before round 1. Equal under full participation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .base import Algorithm, LocalTraining, Message, StatsRequest, Weighted, params_of, training_field


@dataclass(frozen=True)
class FedEMHyper(LocalTraining):
    lr: float = training_field("lr", 0.05)
    batch_size: int = training_field("batch_size", 128)
    momentum: float = training_field("momentum", 0.9)
    weight_decay: float = training_field("weight_decay", 5e-4)
    lr_schedule: str = training_field("lr_schedule", "step")
    components: int = field(default=3, metadata={"min": 1, "help": "mixture components M"})
    unseen_tol: float = field(
        default=1e-6,
        metadata={"gt": 0.0, "help": "unseen clients: stop the E-step + pi updates when pi moves less (L1)"},
    )
    unseen_max_steps: int = field(default=1000, metadata={"min": 1, "help": "unseen clients: at most this many"})
    keep_momentum: bool = field(
        default=False,
        metadata={
            "help": "each client keeps its SGD momentum per component from round to round, as the official "
            "code's per-client optimizers do; false: a fresh buffer every round (the paper)"
        },
    )
    server_average: str = field(
        default="sampled",
        metadata={
            "choices": ("sampled", "all"),
            "help": "sampled: average the sampled clients' components by n_k (the paper); all: average over "
            "every client, unsampled ones contributing the previous components (the official code)",
        },
    )


@dataclass
class FedEMServer:
    components: list[list[torch.Tensor]]
    total_samples: float = 0.0  # Σ n_k over every training client (server_average: all)


@dataclass
class FedEMState:
    pi: torch.Tensor  # (M,) mixture weights of this client
    momentum: list[dict] | None = None  # keep_momentum: each component's optimizer state


def e_step(log_pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """q[m, i] = softmax over m of (log π_m − losses[m, i]); ``losses`` is (M, n)."""
    return torch.softmax(log_pi[:, None] - losses, dim=0)


def em_step(pi: torch.Tensor, losses: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(negative log-likelihood of the mixture before the update — the round's training loss —,
    q) for mixture weights pi and per-sample losses (M, n); the new pi is q.mean(dim=1)."""
    log_pi = torch.log(pi)
    nll = float(-torch.logsumexp(log_pi[:, None] - losses, dim=0).mean())
    return nll, e_step(log_pi, losses)


def mixture_log_prob(pi: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log Σ_m π_m softmax(logits_m) for logits of shape (M, n, classes) -> (n, classes)."""
    return torch.logsumexp(torch.log(pi)[:, None, None] + F.log_softmax(logits, dim=-1), dim=0)


class FedEM(Algorithm):
    name = "fedem"
    summary = (
        "FedEM (Marfoq et al. 2021): M shared components, per-client mixture weights by EM; D-FedEM with a topology"
    )
    paper = "Marfoq et al., NeurIPS 2021"
    family = "mixture"
    personal = "its mixture weights π (with keep_momentum also its SGD momentum)"
    sends = "its M component models (each trained on its loss weighted per sample by q), weighted by n_k"
    Hyper = FedEMHyper
    ClientState = FedEMState
    decentralized = True
    robust_replies = True  # one model per component, each from the component sent

    def client_work(self, n_train):
        """Each of the M components trains E epochs."""
        return float(self.hp.components * self.hp.local_epochs * n_train)

    @classmethod
    def check(cls, hp: FedEMHyper, decentralized: bool) -> tuple[str, str] | None:
        if decentralized and hp.server_average == "all":
            return "server_average", "'all' averages at a server; with a topology use 'sampled'"
        return None

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng) -> FedEMServer:
        # component m starts from its own initialization (variant m of the run's seeded init)
        return FedEMServer([params_of(self.model_fn(m)) for m in range(self.hp.components)])

    def stats_request(self, server, round_):
        if self.hp.server_average == "all" and server.total_samples == 0:
            return StatsRequest("all")
        return None

    def client_stats(self, state, received, data, ctx):
        return state, float(data.num_train)

    def absorb_stats(self, server, reduced, round_):
        return FedEMServer(server.components, float(reduced))

    def message(self, server, round_):
        return Message(server.components)

    def aggregate(self, server, reduced, round_):
        if reduced is None:
            return server
        comps = []
        for r, old in zip(reduced, server.components):
            if r.weight == 0:
                comps.append(old)
            elif self.hp.server_average == "all":
                rest = server.total_samples - r.weight  # unsampled clients hold the old component
                comps.append(
                    [((v + rest * o.double()) / server.total_samples).to(o.dtype) for v, o in zip(r.values, old)]
                )
            else:
                comps.append(r.mean(old[0].dtype))
        return FedEMServer(comps, server.total_samples)

    def centers(self, server):
        return server.components

    def shared(self, server):
        return server.components

    def with_shared(self, server, groups):
        return FedEMServer(groups, server.total_samples)

    # -- client ----------------------------------------------------------------------------
    def init_client(self, cid, rng) -> FedEMState:
        m = self.hp.components
        return FedEMState(torch.full((m,), 1.0 / m))

    def train(self, state: FedEMState, received, data, ctx):
        comps = received.shared
        n = data.num_train
        if n == 0:  # nothing to learn from: pi and components unchanged
            return (
                FedEMState(state.pi.clone(), state.momentum),
                [Weighted([p.clone() for p in c], 0.0) for c in comps],
                0.0,
            )
        nll, q = em_step(state.pi.to(ctx.device), self.losses(comps, data.train_x, data.train_y, ctx.device))
        keep = bool(self.hp.keep_momentum and self.hp.momentum)
        moms = state.momentum if keep and state.momentum else [None] * len(comps)
        fitted = yield [
            self.job(c, data, ctx, weights=q[m], opt_state=moms[m], keep_state=keep) for m, c in enumerate(comps)
        ]
        return (
            FedEMState(q.mean(dim=1).cpu(), [f.opt_state for f in fitted] if keep else None),
            [Weighted(f.params, float(n)) for f in fitted],
            nll,
        )

    def personalize(self, received, data, ctx) -> FedEMState:
        pi = self.init_client(ctx.cid, None).pi.to(ctx.device)
        if data.num_train == 0:
            return FedEMState(pi.cpu())
        losses = self.losses(received.shared, data.train_x, data.train_y, ctx.device)
        for _ in range(self.hp.unseen_max_steps):
            new = e_step(torch.log(pi), losses).mean(dim=1)
            moved = float((new - pi).abs().sum())
            pi = new
            if moved < self.hp.unseen_tol:
                break
        return FedEMState(pi.cpu())

    def importance(self, state: FedEMState):
        return state.pi

    @torch.no_grad()
    def evaluate(self, state: FedEMState, received, data, ctx):
        pi = state.pi.to(ctx.device)
        out = {"pi_entropy": float(-(pi * torch.log(pi.clamp_min(1e-12))).sum())}
        if data.num_test == 0:
            return out
        outputs = self.outputs(received.shared, data.test_x, ctx.device)
        if self.task.name == "classification":
            pred = mixture_log_prob(pi, outputs)
        else:
            pred = torch.einsum("m,mn...->n...", pi, outputs)
        # center_*: the component of largest π alone (how FedSoft scores FedEM's "local model")
        best = outputs[int(pi.argmax())]
        return {**out, **self.task.scores(pred, data.test_y), **self.task.scores(best, data.test_y, "center_")}
