"""SosicFL — Grinwald, Wiesner & Nakajima 2024, "Solution Simplex Clustering for Heterogeneous
Federated Learning" (the published version's notation).
No public implementation exists; where the paper is silent the choice is named below.

**The model.** M is the simplex *dimension* (``dim``): M + 1 endpoints θ_1..θ_{M+1} of every
simplex parameter, and the model at α ∈ Δ^M is w_α = Σ_m α_m θ_m (eq. 6). ``layers: head``
(default): only the weight of the classifier's last linear layer is a simplex, its bias and the
feature extractor ordinary shared parameters (as the authors' Floco code); ``layers: all``
(SosicFL-All): every parameter is, with one α per step for all of them. Endpoint m starts from
the run's model initialization with variant m (independent random initializations).

**Preparation** (the server, before round t̃ = ``start_round``; 1: before round 1, the paper's
SosicFL; null: never, t̃ = ∞, plain simplex learning). The server knows every client's label
counts (asked once, before round 1; used from t̃):

1. α_k ∈ Δ^M: scikit-learn's online LDA with M + 1 topics on the K × L count matrix (or the
   proportions, ``lda_input``), the best of ``lda_restarts`` seeded fits by ``score``;
2. C = ``clusters`` clusters of {α_k} by centre-based clustering under the L1 distance (or the
   Hilbert metric, ``distance``), k-means++ seeded, Lloyd iterations, mean centres μ_c, best of
   ``cluster_inits`` — raysim's reading of "Hilbert simplex clustering with the L1 distance"
   (the paper gives no more);
3. subregions R_c = {α ∈ Δ^M : ‖α − μ_c‖₁ ≤ η}, η = ρ·δ̄, δ̄ the mean over centres of the mean L1
   distance from μ_c to a uniform point of the simplex (closed form; ``simplex.py``).

**Rounds.** Each selected client k runs local SGD on F_k(w_α) with α ~ U(R_{z_k}) drawn for
**every mini-batch** (Sec. 3.2 and the authors' code; ``alpha_pool`` = Ω_tr > 0: Ω_tr draws per
round used in turn, the appendix's literal reading) from its generator; autograd through w_α
gives eq. (8), θ_m ← θ_m − γ·α_m·∇_w F. Before t̃ clients draw α ~ U(Δ^M). ``sampler``:
``exact`` (uniform on R_c, on the simplex; default) or ``floco_code`` (the official Floco
formula, neither). The server averages every endpoint and shared parameter by training-set
size over the round's participants (FedAvg's and all public code's normalization; eq. (9)
read literally divides by all clients' N: ``server_weights: all``).

**Inference.** The global model is w at the centroid (1/(M+1))·1; client k's personalized model
is w at its cluster's centre μ_{z_k} (before t̃: the centroid). Where LDA puts a cluster at a
vertex (n-fold splits do), the centre is a corner of its subregion, not its middle;
``local_at: subregion_mean`` evaluates at the subregion's mean instead (an option, not the paper). ``accuracy`` is the local
(personalized) score, ``global_accuracy`` the centroid's.

**Metrics.** Per round, ``total_variance`` — eq. (11): Σ_{k∈S^t} ‖Δθ̄_k − mean‖² of the
endpoint-averaged last-layer update Δθ̄_k = (1/(M+1))Σ_m(θ_{m,k} − θ_m) — and
``total_variance_endpoints``, the same per endpoint, averaged over endpoints (each endpoint's
update is scaled by α_m, so eq. 11 is not on eq. 10's scale: FedAvg logs eq. 10 with
``track_variance``). ``cluster_ari`` (the engine) scores the clusters against the split's
groups where it has them; the report holds α_k, z_k, μ_c and η.

**SosicFL+** (``sosicfl+``): Ditto on the endpoints. Every client also keeps a personal copy,
trained each round it is selected, interleaved with the global update on the same batches, on
E_α[F_k(w_α)] + (λ/2)·‖θ − θ̂‖² with θ̂ the received global parameters, α ~ U(R_{z_k}) from a
pool of ``personal_pool`` = Ω_tr = 10 draws a round; evaluated at μ_{z_k}. ``personal``:
``endpoints`` (default) — the copy is the M + 1 endpoints only, trained on the received global
feature extractor, which stays frozen: the paper's objective read literally (the argmin is over
the θ_m and the regularizer sums over the endpoints; no SosicFL code exists to say otherwise);
``all`` — every parameter, as the authors' Floco+ code (Floco+'s default). λ = 1 (not
reported; Floco+'s).
Defaults: the paper's CIFAR-10 SimpleCNN row (SGD lr 0.02, momentum 0.5, weight decay 5e-4 —
the table's "0.5" read as the authors' config value —, batch 50, 5 epochs), C = 5, ρ = 0.4,
M = 4 (5-fold needs M + 1 ≥ 5 topics; the paper does not report M).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import simplex
from .base import (
    Algorithm,
    Message,
    PerClient,
    StatsRequest,
    UpdateStats,
    Weighted,
    params_of,
    training_field,
)
from .fedavg import FedAvg, FedAvgHyper
from .simplex import SimplexObjective
from .simplex_personal import Personal, lam_field, personal_field


@dataclass(frozen=True)
class SimplexHyper(FedAvgHyper):
    """What SosicFL and Floco share: the authors' CIFAR-10 SimpleCNN optimizer settings, which
    layers are a simplex, how α is drawn."""

    lr: float = training_field("lr", 0.02)
    local_epochs: int = training_field("local_epochs", 5)
    batch_size: int = training_field("batch_size", 50)
    momentum: float = training_field("momentum", 0.5)
    weight_decay: float = training_field("weight_decay", 5e-4)
    layers: str = field(
        default="head",
        metadata={
            "choices": ("head", "all"),
            "help": "head: the classifier's weight is the simplex; all: every parameter (SosicFL-All)",
        },
    )
    alpha_pool: int = field(
        default=0, metadata={"min": 0, "help": "0: a fresh α every mini-batch; Ω > 0: Ω draws a round, used in turn"}
    )
    sampler: str = field(
        default="exact",
        metadata={
            "choices": ("exact", "floco_code"),
            "help": "exact: uniform on the subregion; floco_code: Floco's formula",
        },
    )


@dataclass(frozen=True)
class SosicFLHyper(SimplexHyper):
    dim: int = field(default=4, metadata={"min": 1, "help": "M, the simplex dimension (M + 1 endpoints)"})
    clusters: int = field(default=5, metadata={"min": 1, "help": "C, clusters of the clients' α"})
    rho: float = field(default=0.4, metadata={"gt": 0.0, "help": "ρ: subregion radius η = ρ·δ̄"})
    start_round: int | None = field(
        default=1,
        metadata={"min": 1, "help": "t̃: clustering before this round (1-based); before it α ~ U(Δ); null: never"},
    )
    distance: str = field(default="l1", metadata={"choices": ("l1", "hilbert"), "help": "the clustering's distance"})
    lda_restarts: int = field(default=5, metadata={"min": 1, "help": "LDA fits (seeded); the best by score is kept"})
    lda_input: str = field(
        default="counts",
        metadata={
            "choices": ("counts", "proportions"),
            "help": (
                "what LDA fits: the clients' train label counts (K × L) or those counts as proportions (rows summing to 1)"
            ),
        },
    )
    cluster_inits: int = field(default=10, metadata={"min": 1, "help": "k-means++ seedings; the best is kept"})
    local_at: str = field(
        default="centre",
        metadata={
            "choices": ("centre", "subregion_mean"),
            "help": "where a client's personalized model sits: its cluster centre μ (the paper) or the mean of its "
            "subregion (differs where the subregion is cut by the simplex's boundary)",
        },
    )
    server_weights: str = field(
        default="participants",
        metadata={
            "choices": ("participants", "all"),
            "help": "participants: n_k / Σ_{S^t} n_j (FedAvg); all: n_k / N over every client (eq. 9 literally)",
        },
    )


@dataclass(frozen=True)
class SosicFLPlusHyper(SosicFLHyper):
    lam: float = lam_field()
    personal: str = personal_field("endpoints")
    personal_pool: int = field(
        default=10,
        metadata={"min": 0, "help": "Ω_tr: α draws a round for the personal copy (0: a fresh one every mini-batch)"},
    )


@dataclass
class SimplexServer:
    params: list[torch.Tensor]  # shared parameters, then each simplex parameter's M + 1 endpoints
    seed: int  # of the preparation's LDA and clustering
    ids: torch.Tensor  # clients with known label counts, ascending
    counts: torch.Tensor  # (K, L) their training label counts
    alpha: torch.Tensor  # (K, M + 1) float64 their α_k (empty before the preparation)
    z: torch.Tensor  # (K,) their clusters
    centres: torch.Tensor  # (C, M + 1) float64
    eta: float = 0.0
    prepared: bool = False
    means: torch.Tensor | None = None  # (C, M + 1) float64 each subregion's mean (local_at: subregion_mean)


@dataclass
class SimplexReply:
    model: Weighted
    endpoints: list  # per endpoint: UpdateStats of its last-layer update
    averaged: UpdateStats  # of the endpoints' mean update Δθ̄_k (eq. 11)


class SosicFL(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "sosicfl"
    summary = "SosicFL (Grinwald et al. 2024): a solution simplex head, clients clustered on it by label LDA"
    paper = "Grinwald, Wiesner & Nakajima, arXiv 2024"
    family = "clustered"
    personal = "nothing (the server keeps its α_k and its cluster)"
    sends = "the shared parameters and the M + 1 simplex endpoints, weighted by n_k; once, its label counts"
    Hyper = SosicFLHyper
    ClientState = None
    decentralized = False
    no_gossip = "the server clusters the clients"
    personalized_is_global = False  # a personal model beside the global one
    server_params = Algorithm.server_params  # a simplex server state: no server optimizer (yet)

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        model = model_fn()
        n = len(list(model.parameters()))
        self.simplex = list(range(n)) if hyper.layers == "all" else [self.head()]
        self.plain = [i for i in range(n) if i not in self.simplex]
        self.ends = self.endpoint_count(hyper)
        self.classes = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1].out_features
        self.objective = SimplexObjective(task, self.compose, pull_back=self.compose_grad)

    @staticmethod
    def endpoint_count(hp) -> int:
        return hp.dim + 1

    # -- the simplex -----------------------------------------------------------------------
    def compose(self, flat: list[torch.Tensor], alpha: torch.Tensor) -> list[torch.Tensor]:
        """The model's parameters at α from the flat layout (shared, then endpoints): one set
        (α of shape (M + 1,)) or stacked sets (tensors (K, ...), α (K, M + 1))."""
        p = len(self.plain)
        out: list[Any] = [None] * (p + len(self.simplex))
        for j, i in enumerate(self.plain):
            out[i] = flat[j]
        for s, i in enumerate(self.simplex):
            ends = flat[p + s * self.ends : p + (s + 1) * self.ends]
            w = 0
            for m, t in enumerate(ends):
                a = alpha[..., m].to(t.dtype)
                w = w + (a.view(-1, *[1] * (t.dim() - 1)) if alpha.dim() == 2 else a) * t
            out[i] = w
        return out

    def compose_grad(self, flat: list[torch.Tensor], alpha: torch.Tensor, g: list) -> list:
        """``compose``'s adjoint for stacked sets: from the gradients g at the model's parameters
        w_α (None where one has none), those of the flat layout: a shared parameter takes its
        own, endpoint m of a simplex layer α_m times its layer's."""
        p = len(self.plain)
        out: list[Any] = [None] * len(flat)
        for j, i in enumerate(self.plain):
            out[j] = g[i]
        for s, i in enumerate(self.simplex):
            if g[i] is None:
                continue
            shape = (-1,) + (1,) * (g[i].dim() - 1)
            for m in range(self.ends):
                out[p + s * self.ends + m] = g[i] * alpha[..., m].to(g[i].dtype).view(shape)
        return out

    def centroid(self) -> torch.Tensor:
        return torch.full((self.ends,), 1.0 / self.ends, dtype=torch.float64)

    def endpoints_of(self, flat, s: int) -> list[torch.Tensor]:
        p = len(self.plain)
        return flat[p + s * self.ends : p + (s + 1) * self.ends]

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        base = params_of(self.model_fn(0))
        inits = [base] + [params_of(self.model_fn(m)) for m in range(1, self.ends)]
        flat = [base[i] for i in self.plain] + [inits[m][i] for i in self.simplex for m in range(self.ends)]
        d = self.ends
        return SimplexServer(
            flat,
            int(rng.integers(2**31)),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, self.classes, dtype=torch.long),
            torch.zeros(0, d, dtype=torch.float64),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, d, dtype=torch.float64),
        )

    def prepare_at(self) -> int | None:
        """0-based round before which the preparation runs (None: never)."""
        return None if self.hp.start_round is None else self.hp.start_round - 1

    def stats_request(self, server, round_):
        if len(server.ids) == 0:
            return StatsRequest("all", None)  # every client's label counts, once
        return None

    def client_stats(self, state, received, data, ctx):
        counts = torch.bincount(data.train_y.cpu(), minlength=self.classes)[: self.classes]
        return state, PerClient({ctx.cid: counts})

    def absorb_stats(self, server, reduced, round_):
        ids = sorted(reduced)
        server.ids = torch.tensor(ids, dtype=torch.long)
        server.counts = torch.stack([reduced[c] for c in ids]).long()
        return server

    def _prepared(self, server, round_: int):
        """The server state with clusters and subregions, made when round t̃'s clients are
        selected (evaluations before it score the centroid)."""
        t = self.prepare_at()
        if server.prepared or t is None or round_ < t or len(server.ids) == 0:
            return server
        hp = self.hp
        counts = server.counts.numpy()
        alpha = simplex.lda_alphas(counts, self.ends, hp.lda_restarts, server.seed, hp.lda_input)
        z, centres = simplex.cluster(
            alpha, min(hp.clusters, len(alpha)), hp.distance, hp.cluster_inits, rng=np.random.default_rng(server.seed)
        )
        eta = float(hp.rho * simplex.mean_l1_to_uniform(centres).mean())
        server.alpha = torch.from_numpy(alpha)
        server.z = torch.from_numpy(z)
        server.centres = torch.from_numpy(centres)
        server.eta, server.prepared = eta, True
        if hp.local_at == "subregion_mean":  # Monte Carlo, 20 000 exact draws from a fixed stream
            g = torch.Generator().manual_seed(server.seed)
            server.means = torch.stack([simplex.sample_ball(g, mu, eta, 20000).mean(0) for mu in server.centres])
        return server

    def cluster_of(self, server) -> dict[int, int]:
        return {int(c): int(g) for c, g in zip(server.ids, server.z)} if server.prepared else {}

    def select(self, server, round_, sampled, candidates, rng):
        self._prepared(server, round_)
        z = self.cluster_of(server)
        return {int(c): z.get(int(c), 0) for c in sampled}

    def message(self, server, round_):
        if not server.prepared:
            return Message(server.params)
        at = server.centres if server.means is None else server.means
        return Message(
            server.params,
            {
                c: torch.cat([mu, torch.tensor([server.eta], dtype=torch.float64), a])
                for c, (mu, a) in enumerate(zip(server.centres, at))
            },
        )

    def eval_groups(self, server, cids):
        """Each client's cluster (Floco: its own point); a client the preparation did not see
        (``eval.unseen_fraction``) gets none (-1) and is scored at the centroid."""
        z = self.cluster_of(server)
        return {int(c): z.get(int(c), -1) for c in cids} if z else {}

    def centers(self, server):
        if not server.prepared:
            return None
        return [self.compose(server.params, mu) for mu in server.centres]

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.model.weight == 0:
            return server
        mean = reduced.model.mean(server.params[0].dtype)
        if getattr(self.hp, "server_weights", "participants") == "all":
            total = float(server.counts.sum())
            share = reduced.model.weight / total if total > 0 else 1.0
            mean = [p + share * (m - p) for p, m in zip(server.params, mean)]
        server.params = mean
        return server

    def round_metrics(self, reduced):
        if reduced is None:
            return {}
        return {
            "total_variance": reduced.averaged.variance(),
            "total_variance_endpoints": float(np.mean([h.variance() for h in reduced.endpoints])),
        }

    def report(self, results, server):
        if not server.prepared:
            return {}
        return {
            "simplex": {
                "alpha": {int(c): [float(v) for v in a] for c, a in zip(server.ids, server.alpha)},
                "cluster": {int(c): int(g) for c, g in zip(server.ids, server.z)},
                "centres": [[float(v) for v in mu] for mu in server.centres],
                "eta": server.eta,
            }
        }

    # -- client ----------------------------------------------------------------------------
    def _draws(self, part, pool: int):
        """(generator, steps) -> α per step (steps, M + 1): from the client's subregion (its
        group's part: centre and η), or the whole simplex before the preparation."""
        d, hp = self.ends, self.hp

        def draw(generator, steps):
            n = pool if pool > 0 else steps
            if part is None:
                a = simplex.uniform(generator, n, d)
            elif hp.sampler == "exact":
                a = simplex.sample_ball(generator, part[:d], float(part[d]), n)
            else:
                a = simplex.sample_ball_floco(generator, part[:d], float(part[d]), n)
            if pool > 0:
                a = a[torch.arange(steps) % pool]
            return a.to(torch.float32)

        return draw

    def reply(self, new, old, n: int) -> SimplexReply:
        """The parameters weighted by n_k, with the statistics of each endpoint's head update
        and of their mean."""
        s = self.simplex.index(self.head())
        deltas = [a - b for a, b in zip(self.endpoints_of(new, s), self.endpoints_of(old, s))]
        return SimplexReply(
            Weighted(new, float(n)), [UpdateStats.of(d) for d in deltas], UpdateStats.of(sum(deltas) / len(deltas))
        )

    def train(self, state, received, data, ctx):
        glob = received.shared
        (fit,) = yield [self.job(glob, data, ctx, draws=self._draws(received.part, self.hp.alpha_pool))]
        return state, self.reply(fit.params, glob, data.num_train), fit.loss

    def alpha_of(self, part) -> torch.Tensor:
        """Where the client's personalized model sits: its cluster's centre or subregion mean
        (``local_at``), or before the preparation the centroid. A group's part holds the
        centre, η and that point."""
        return self.centroid() if part is None else part[self.ends + 1 :]

    def global_model(self, state, received):
        """w at the centroid, in the model's layout (``global_*``; the local update's start)."""
        return self.compose(received.shared, self.centroid())

    def evaluate(self, state, received, data, ctx):
        glob = received.shared
        mine = glob if state is None else state.params
        local, cent = self.outputs(
            [self.compose(mine, self.alpha_of(received.part)), self.compose(glob, self.centroid())],
            data.test_x,
            ctx.device,
        )
        return {**self.task.scores(local, data.test_y), **self.task.scores(cent, data.test_y, "global_")}

    def personalize(self, received, data, ctx):
        return None


class SosicFLPlus(Personal, SosicFL):
    name = "sosicfl+"
    summary = "SosicFL+ (Grinwald et al. 2024): SosicFL with Ditto on the simplex (a personal copy per client)"
    Hyper = SosicFLPlusHyper
    paper = "Grinwald, Wiesner & Nakajima, arXiv 2024"
    family = "clustered"
    personal = "a personal copy of the simplex endpoints (personal: all, of every parameter)"
    sends = "the shared parameters and the M + 1 simplex endpoints, weighted by n_k; once, its label counts"
