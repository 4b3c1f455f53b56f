"""FedSoft — Ruan & Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local
Updating", AAAI 2022 (Algorithm 1, eqs. 4–6).

S cluster models ("centers") c_1..c_S on the server; each client k keeps a local model w_k,
its optimizer state and its importance weights u_k (its state, on its host).

- **Importance estimation** every ``tau`` rounds (t mod τ = 0), over *all* clients: each
  client scores every training sample under every center and counts, per center, the samples it
  fits best (ties: lowest index); it keeps u_ks = max(n_ks / n_k, σ) and reports u_ks·n_k.
  Between estimations clients keep their u.
- **Aggregation weights** v_sk = u_ks·n_k / Σ_k' u_k's·n_k' over all clients (eq. 6).
- **Selection**: each center s independently draws ``per_cluster`` (K) clients with
  probabilities v_s·, without replacement within the center (numpy's sequential weighted draw,
  as the official ``np.random.choice``). A client drawn by several centers trains once; its
  group (``ctx.group``) is the bit mask of the centers that drew it, and its one model counts in
  each of their averages. ``selection: false``: every client, every round.
- **Local update**: from the client's previous w_k (never reset to a center; all clients start
  from one shared initialization, each center from its own), ``local_epochs`` of the optimizer
  (Adam, state kept across rounds: ``keep_optimizer``) on
  h_k(w) = f_k(w) + (λ/2)·Σ_s u_ks‖w − c_s‖²  (u not renormalized).
  Its gradient ∇f_k + λ·Σ_s u_ks(w − c_s) = ∇f_k + λU(w − c̄), U = Σ_s u_ks,
  c̄ = Σ_s u_ks c_s / U: the loop's proximal term with μ = λU and anchor c̄ (same gradient; the
  loss differs by a constant in w).
- **Center update**: c_s = (1/K)·Σ_{k∈Sel_s} w_k (uniform); without selection
  c_s = Σ_k v_sk·w_k (Theorem 5's full-participation form).
- **Evaluation**: the local model w_k on the client's test split (``mse`` / ``accuracy``),
  with ``eval_train`` also on its training data (``train_*``: what the paper reports), and the
  center of largest u_k (``center_*``: how the paper scores IFCA's and FedEM's local models).
  The engine scores every center on each source's held-out set (the center/source table).

The scenario's ``sampling`` does not apply: FedSoft selects its own clients. Defaults: the
paper's synthetic setting (σ = 1e-4, τ = 2, K = 30, Adam lr 5e-3, 10 epochs, batch 10,
λ = 1; use λ = 0.1 for image data). The official code does not run as released and is not
followed where it departs from the paper (see the fact sheet).

Unseen clients (``eval.unseen_fraction``) estimate u under the current centers and run one
local update from the shared initialization.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import (
    Algorithm,
    ByKey,
    LocalTraining,
    Message,
    PerClient,
    StatsRequest,
    Weighted,
    means_by_key,
    params_of,
    training_field,
)


@dataclass(frozen=True)
class FedSoftHyper(LocalTraining):
    lr: float = training_field("lr", 5e-3)
    local_epochs: int = training_field("local_epochs", 10)
    batch_size: int = training_field("batch_size", 10)
    optimizer: str = training_field("optimizer", "adam")
    clusters: int = field(default=2, metadata={"min": 1, "help": "cluster models (centers) S"})
    lam: float = field(default=1.0, metadata={"min": 0.0, "help": "λ of the proximal term (0.1 for images)"})
    sigma: float = field(default=1e-4, metadata={"gt": 0.0, "lt": 1.0, "help": "counter smoother σ"})
    tau: int = field(default=2, metadata={"min": 1, "help": "estimate importance weights every tau rounds"})
    per_cluster: int = field(default=30, metadata={"min": 1, "help": "clients K each center selects per round"})
    selection: bool = field(
        default=True, metadata={"help": "false: every client trains every round and c_s = Σ_k v_sk w_k"}
    )
    keep_optimizer: bool = field(
        default=True,
        metadata={"help": "clients keep their optimizer state (Adam moments) across rounds, as the paper's code"},
    )
    eval_train: bool = field(
        default=False,
        metadata={"help": "also score local models on their training data (train_*), as the paper reports"},
    )


@dataclass
class FedSoftServer:
    centers: list[list[torch.Tensor]]
    ids: torch.Tensor  # client ids, ascending, of the last estimation
    un: torch.Tensor  # (clients, S) float64: u_ks·n_k of each
    estimated: int = -1  # round of the last estimation


@dataclass
class FedSoftState:
    w: list[torch.Tensor]  # the local model
    u: torch.Tensor  # (S,) float64 importance weights
    opt: dict | None = None  # optimizer state (keep_optimizer)


def importance_weights(losses: torch.Tensor, sigma: float) -> torch.Tensor:
    """u_s = max(n_s / n, σ) from per-sample losses (S, n): n_s counts the samples whose lowest
    loss is under center s (ties: lowest index)."""
    s, n = losses.shape
    counts = torch.bincount(losses.argmin(dim=0), minlength=s).double()
    return (counts / max(n, 1)).clamp_min(sigma)


def aggregation_weights(un: torch.Tensor) -> torch.Tensor:
    """v (clients, S): column s is u_·s n_· / Σ_k u_ks n_k."""
    return un / un.sum(dim=0, keepdim=True)


def select_per_cluster(ids: np.ndarray, v: np.ndarray, k: int, rng: np.random.Generator) -> dict[int, int]:
    """{client: bit mask of the centers that drew it}: each center s draws min(k, N) clients
    with probabilities v[:, s], without replacement, independently of the others."""
    out: dict[int, int] = {}
    for s in range(v.shape[1]):
        p = v[:, s] / v[:, s].sum()
        for i in rng.choice(len(ids), size=min(k, len(ids)), replace=False, p=p):
            c = int(ids[i])
            out[c] = out.get(c, 0) | (1 << s)
    return out


class FedSoft(Algorithm):
    no_gossip = "the server weighs each client into its cluster centers"
    name = "fedsoft"
    summary = "FedSoft (Ruan & Joe-Wong 2022): soft clusters, per-sample importance, proximal local models"
    paper = "Ruan & Joe-Wong, AAAI 2022"
    family = "clustered"
    personal = "its local model w_k, its importance weights u_k and its Adam state"
    sends = "its local model, to each center that drew it; every τ rounds its counts u_ks·n_k per center"
    Hyper = FedSoftHyper
    ClientState = FedSoftState

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng) -> FedSoftServer:
        s = self.hp.clusters
        return FedSoftServer(
            [params_of(self.model_fn(1 + i)) for i in range(s)],
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, s, dtype=torch.float64),
        )

    def stats_request(self, server, round_):
        if round_ % self.hp.tau == 0 and server.estimated != round_:
            return StatsRequest("all", server.centers)
        return None

    def absorb_stats(self, server, reduced, round_):
        ids = sorted(reduced)
        return FedSoftServer(
            server.centers, torch.tensor(ids, dtype=torch.long), torch.stack([reduced[c] for c in ids]), round_
        )

    def select(self, server, round_, sampled, candidates, rng):
        full = (1 << self.hp.clusters) - 1
        if not self.hp.selection:
            return {int(c): full for c in candidates}
        return select_per_cluster(server.ids.numpy(), aggregation_weights(server.un).numpy(), self.hp.per_cluster, rng)

    def message(self, server, round_):
        return Message(server.centers)

    def aggregate(self, server, reduced, round_):
        return FedSoftServer(means_by_key(server.centers, reduced), server.ids, server.un, server.estimated)

    def centers(self, server):
        return server.centers

    # -- client ----------------------------------------------------------------------------
    def init_client(self, cid, rng) -> FedSoftState:
        s = self.hp.clusters
        return FedSoftState(params_of(self.model_fn(0)), torch.full((s,), 1.0 / s, dtype=torch.float64))

    def estimate(self, centers, data, device) -> torch.Tensor:
        return importance_weights(self.losses(centers, data.train_x, data.train_y, device), self.hp.sigma).cpu()

    def client_stats(self, state, received, data, ctx):
        u = self.estimate(received.shared, data, ctx.device)
        return FedSoftState(state.w, u, state.opt), PerClient({ctx.cid: u * data.num_train})

    def _update(self, state, centers, data, ctx):
        """One proximal local update of w_k: a job of the one loop."""
        u = state.u
        total = float(u.sum())
        anchor = [sum(float(u[s]) * c[i] for s, c in enumerate(centers)) / total for i in range(len(state.w))]
        keep = self.hp.keep_optimizer
        (fitted,) = yield [
            self.job(
                state.w,
                data,
                ctx,
                consts={"mu": self.hp.lam * total, "anchor": anchor},
                opt_state=state.opt if keep else None,
                keep_state=keep,
            )
        ]
        return FedSoftState(fitted.params, u, fitted.opt_state), fitted

    def train(self, state, received, data, ctx):
        state, fitted = yield from self._update(state, received.shared, data, ctx)
        n = float(data.num_train)
        if self.hp.selection:
            reply = ByKey({s: Weighted(fitted.params, 1.0) for s in range(self.hp.clusters) if ctx.group >> s & 1})
        else:
            reply = ByKey({s: Weighted(fitted.params, float(state.u[s]) * n) for s in range(self.hp.clusters)})
        return state, reply, fitted.loss

    def importance(self, state):
        return state.u

    def personalize(self, received, data, ctx):
        state = self.init_client(ctx.cid, None)
        state = FedSoftState([p.to(ctx.device) for p in state.w], state.u)  # the host's device
        if data.num_train == 0:
            return state
        state = FedSoftState(state.w, self.estimate(received.shared, data, ctx.device))
        state, _ = yield from self._update(state, received.shared, data, ctx)
        return state

    def evaluate(self, state, received, data, ctx):
        x = torch.cat([data.test_x, data.train_x]) if self.hp.eval_train else data.test_x
        local = self.outputs([state.w], x, ctx.device)[0]
        best = int(state.u.argmax())
        out = {
            **self.task.scores(local[: data.num_test], data.test_y),
            **self.task.scores(
                self.outputs([received.shared[best]], data.test_x, ctx.device)[0], data.test_y, "center_"
            ),
        }
        if self.hp.eval_train:
            out.update(self.task.scores(local[data.num_test :], data.train_y, "train_"))
        return out
