"""MOCHA — Smith, Chiang, Sanjabi & Talwalkar, "Federated Multi-Task Learning", NeurIPS 2017,
following the authors' MATLAB code (github.com/gingsmith/fmtl, ``opt/run_mocha.m``,
``util/compute_primal.m``, ``util/compute_dual.m``).

One linear model w_t per training client t (a task), coupled through a task-relationship
matrix. With Σ = Ω⁻¹ (m × m, Σ ⪰ 0, tr Σ = 1) and W = [w_1 .. w_m], the primal problem is

    min_{W, Σ}  P(W; Σ) = Σ_t (1/n_t) Σ_i ℓ(w_tᵀ x_ti, y_ti) + (λ/2) tr(W Ω Wᵀ),

the paper's problem min Σ_t Σ_i ℓ_t + R(W, Ω) with the regularizer as fmtl's ``compute_primal``
computes it, R = (λ/2) tr(W Ω Wᵀ) (no separate ‖W‖²_F term), and, as there, each task's *mean*
loss where the paper sums (tasks weigh equally whatever their sizes; λ scales accordingly). For fixed Σ its dual, over one variable α_ti per training sample, is

    max_α  D(α) = Σ_t (1/n_t) Σ_i −ℓ*(−α_ti) − (1/2λ) tr(B Σ Bᵀ),    b_t = (1/n_t) X_tᵀ α_t,

with the primal-dual map W(α) = B Σ / λ (w_t = (1/λ) Σ_s Σ_ts b_s) and P(W(α)) − D(α) ≥ 0, zero
at the optimum (the duality gap). Losses (y the label):

- classification, hinge (fmtl's): ℓ(z) = max(0, 1 − y z) on labels 0/1 read as y = −1/+1;
  −ℓ*(−α) = y α for y α ∈ [0, 1] (α_ti = y_ti a_ti, a_ti ∈ [0, 1]);
- regression, squared (not in fmtl; added here): ℓ(z) = ½ (z − y)², −ℓ*(−α) = y α − ½ α².

A round (one of fmtl's inner iterations, ``mocha_inner_iters``):

1. client t receives w_t, Σ_tt and σ' (fmtl's ``rho``) and approximately maximizes its local
   subproblem, the dual restricted to Δα_t with the other tasks' coupling bounded by σ':

       G_t(Δα_t) = (1/n_t) Σ_i −ℓ*(−α_ti − Δα_ti) − (1/n_t) w_tᵀ X_tᵀ Δα_t
                   − (σ' Σ_tt / 2λ n_t²) ‖X_tᵀ Δα_t‖²,

   by ⌊n_t · ``sdca_frac``⌋ SDCA coordinate steps in a random order (fmtl: one random
   permutation, cycled). With u = w_t + σ' Δw_t, Δw_t = Σ_tt X_tᵀ Δα_t / (λ n_t), and
   q_i = σ' Σ_tt ‖x_i‖² / (λ n_t), the exact maximizer over coordinate i is

       hinge (fmtl):   α_i ← y_i · clip(y_i α_i + (1 − y_i x_iᵀ u) / q_i, 0, 1)
       squared:        α_i ← α_i + (y_i − α_i − x_iᵀ u) / (1 + q_i)

   (the squared step derived here: ∂G_t/∂δ = (1/n_t)(y_i − α_i − δ − x_iᵀ u − q_i δ) = 0; an
   all-zero x_i, q_i = 0, gets the limit α_i = y_i in both). The client keeps α_t (its state,
   on its host) and sends Δb_t = X_tᵀ Δα_t / n_t (the paper's Δv_t = X_t Δα_t, per-task mean);
2. the server: B ← B + ΔB and W ← W + ΔB Σ / λ (fmtl's "combine updates globally"); a client
   that was not sampled contributes Δb_t = 0.

Every ``omega_every`` rounds (fmtl's ``mocha_inner_iters``: Σ is updated after each outer
iteration) the server updates the task relationships in closed form,

    Σ = (Wᵀ W)^{1/2} / tr((Wᵀ W)^{1/2}),   Ω = Σ⁻¹,   σ' = max_t Σ_s |Σ_ts| / Σ_tt

(W is d × m as in fmtl, so Wᵀ W is m × m; σ' as fmtl recomputes it after each update), with
fmtl's safeguard: when Wᵀ W has a negative eigenvalue (rounding, when rank W < m), every
eigenvalue ≤ 1e-7 is raised to 1e-7 first. The square root is V diag(√e) Vᵀ of the
symmetric eigendecomposition (what MATLAB's ``sqrtm`` gives for a symmetric PSD matrix). A
W = 0 (nothing trained yet) leaves Σ as it is. Σ starts at I/m and σ' at 1 (fmtl).

Where fmtl and the paper differ (``w_map``):

- ``dual`` (default, the paper's Algorithm 1): after an Ω update the server recomputes
  W = W(α) = B Σ / λ with the new Σ, so W always is the primal point of the current duals and
  the duality gap certifies it;
- ``fmtl``: as ``run_mocha.m``, W is only ever incremented (W += ΔB Σ / λ with the Σ in force),
  so after an Ω update W keeps the increments made under the old Σ and W ≠ W(α). Once the
  local SDCA has converged (α_t optimal for w_t: a fixed point whatever Σ_tt and σ'), an Ω
  update then changes nothing: on the synthetic data of ``scenarios/synthetic_mocha.yaml`` it
  stays at the independent local SVMs' validation accuracy (66.6 %, against 79.8 % for
  ``dual``).

Defaults and their source: λ = 1e-4 (fmtl's ``optimization_driver.m``; its ``model_driver.m``
picks λ by 5-fold cross validation from {1e-5, 1e-4, 1e-3, 0.01, 0.1, 10}: tune it on a
validation split, as FedEM's authors did by grid search); ``sdca_frac`` = 0.5
(``model_driver.m``'s ``mocha_sdca_frac``; ``optimization_driver.m`` uses 1.0);
``omega_every`` = 100 (``model_driver.m``'s ``mocha_inner_iters``: 10 outer × 100 inner).

Model and data: the scenario's model must be ``linear`` (a single Linear layer), checked when
the algorithm is built (``ValueError``: ``check`` does not see the model). Its ``bias`` decides
the intercept: with ``bias: true`` (the linear model's default) a constant feature 1 is appended
to every x, so the intercept is a coordinate of w_t and regularized with it; ``bias: false``
uses x as it is, as fmtl does (it appends nothing). Binary classification only (2 classes, the
hinge loss of fmtl; more classes are refused rather than reduced one-vs-rest) or scalar
regression (1 output). The model's initial weights are not used: W starts at 0, as in fmtl.

The personalized model w_t lives in the server state (row t of W) and reaches client t as its
part of the message (group t); the client keeps only its duals α_t. Evaluation scores w_t on
the client's test split with ``task.scores``: a classification client's outputs are the logits
(−s/2, s/2) of its margin s = w_tᵀ x, so ``accuracy`` is that of sign(s) (s = 0 counts as
class 0) and ``ece``/``test_loss`` are those of the logistic reading p(y = 1) = sigmoid(s) of
the SVM margin (the hinge loss has no probabilities of its own); a regression client's output is
s (``mse``). MOCHA has no global model, so there are no ``global_*`` metrics; the training loss
reported is the client's mean ℓ at the w_t it received. A client that never trained
(``eval.unseen_fraction``) has no w_t and is refused. Decentralized: no (W and Σ are central).

Determinism: the SDCA order comes from the client's context generator (seed, round, client),
the local steps run in float64 on the CPU, replies are per client (``PerClient``, no sums) and
the server's float64 math runs once: the same numbers for any number of hosts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .base import Algorithm, Message, PerClient, StatsRequest

EIG_FLOOR = 1e-7  # fmtl: eigenvalues of WᵀW raised to this when any is negative


@dataclass(frozen=True)
class MochaHyper:
    lam: float = field(
        default=1e-4,
        metadata={
            "gt": 0.0,
            "help": "λ of the regularizer (λ/2)·tr(W Ω Wᵀ) (fmtl optimization_driver: 1e-4; tune it on val)",
        },
    )
    sdca_frac: float = field(
        default=0.5,
        metadata={
            "gt": 0.0,
            "help": "local SDCA coordinate steps a round, as a fraction of the client's training samples (fmtl: 0.5)",
        },
    )
    omega_every: int = field(
        default=100,
        metadata={"min": 1, "help": "rounds between Ω updates (fmtl model_driver: 100 inner iterations per outer)"},
    )
    w_map: str = field(
        default="dual",
        metadata={
            "choices": ("dual", "fmtl"),
            "help": "dual: W = B Σ/λ recomputed after an Ω update (the paper); fmtl: W only incremented (run_mocha.m)",
        },
    )


@dataclass
class MochaServer:
    ids: torch.Tensor  # (m,) the training clients' ids, ascending (empty until counted)
    b: torch.Tensor  # (m, d) float64: b_t = X_tᵀ α_t / n_t
    w: torch.Tensor  # (m, d) float64: the personalized models w_t (rows)
    sigma: torch.Tensor  # (m, m) float64: Σ = Ω⁻¹, trace 1
    rho: float = 1.0  # σ'
    omega_updates: int = 0  # Ω updates made so far


@dataclass
class MochaState:
    alpha: torch.Tensor  # (n_t,) float64: the client's dual variables


def sqrt_psd(a: np.ndarray) -> np.ndarray:
    """(Wᵀ W)^{1/2} as fmtl takes it: a symmetric matrix's eigenvalues, when any is negative,
    have those ≤ 1e-7 raised to 1e-7; then V diag(√e) Vᵀ."""
    a = (a + a.T) / 2
    e, v = np.linalg.eigh(a)
    if e.min() < 0:
        e = np.where(e <= EIG_FLOOR, EIG_FLOOR, e)
    return (v * np.sqrt(np.maximum(e, 0.0))) @ v.T


def omega_update(w: np.ndarray) -> tuple[np.ndarray, float] | None:
    """(Σ, σ') from the models W (rows w_t, (m, d)): Σ = (WᵀW)^{1/2} / tr(·) and σ' =
    max_t Σ_s |Σ_ts| / Σ_tt; None when the trace is 0 (W = 0)."""
    sq = sqrt_psd(w @ w.T)
    tr = float(np.trace(sq))
    if not tr > 0:
        return None
    sigma = sq / tr
    diag = np.diag(sigma)
    ok = diag > 0  # a zero row of W can leave Σ_tt = 0: that task takes no σ' of its own
    rho = float(np.max(np.abs(sigma).sum(1)[ok] / diag[ok]))
    return sigma, rho


def sdca(
    x: np.ndarray,
    y: np.ndarray,
    alpha: np.ndarray,
    w: np.ndarray,
    sigma_tt: float,
    rho: float,
    lam: float,
    order: np.ndarray,
    loss: str,
) -> np.ndarray:
    """The local solver: SDCA coordinate steps on ``x`` (n, d), labels ``y`` (±1 for hinge),
    duals ``alpha`` (updated in place) from the model ``w``, over the coordinates ``order``;
    returns Δb = X_tᵀ Δα / n."""
    n = x.shape[0]
    u = w.copy()  # w_t + σ' Δw_t
    db = np.zeros_like(w)
    step = rho * sigma_tt / (lam * n)  # Δu per unit Δα: σ' Σ_tt x / (λ n)
    q = step * np.einsum("ij,ij->i", x, x)  # the coordinates' curvatures
    hinge = loss == "hinge"
    for i in order:
        xi, yi, old = x[i], y[i], alpha[i]
        qi = q[i]
        if hinge:
            new = yi * min(1.0, max(0.0, yi * old + (1.0 - yi * float(xi @ u)) / qi)) if qi > 0 else yi
        else:
            new = old + (yi - old - float(xi @ u)) / (1.0 + qi)
        delta = new - old
        if delta != 0.0:
            alpha[i] = new
            u += (step * delta) * xi
            db += delta * xi
    return db / n


class _NoJobs:
    def fit(self, jobs):
        raise RuntimeError("mocha trains no torch model: its client steps yield no jobs")


class Mocha(Algorithm):
    name = "mocha"
    unseen = False  # one task per training client: none for a newcomer
    summary = (
        "MOCHA (Smith et al. 2017): federated multi-task linear models, primal-dual SDCA with learned task relations Ω"
    )
    paper = "Smith et al., NeurIPS 2017"
    family = "personalized"
    personal = "its dual variables α_t, one per training sample (the server keeps its linear model w_t)"
    sends = "Δb_t = X_tᵀ Δα_t / n_t"
    Hyper = MochaHyper
    ClientState = MochaState
    decentralized = False
    no_gossip = "the task relationship Σ and the dual step are central"

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        model = model_fn()
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        plain = all(isinstance(m, (torch.nn.Linear, torch.nn.Flatten, torch.nn.Sequential)) for m in model.modules())
        if len(layers) != 1 or not plain:
            raise ValueError(
                f"mocha trains linear models only; use model: {{name: linear}} "
                f"(got a {type(model).__name__} with {len(layers)} linear layers)"
            )
        layer = layers[0]
        if task.name == "classification":
            if layer.out_features != 2:
                raise ValueError(
                    f"mocha: binary classification only (fmtl's hinge loss on ±1 labels); "
                    f"the data have {layer.out_features} classes"
                )
            self.loss = "hinge"
        elif task.name == "regression":
            if layer.out_features != 1:
                raise ValueError(
                    f"mocha: scalar regression only (squared loss); the targets have {layer.out_features} dimensions"
                )
            self.loss = "squared"
        else:
            raise ValueError(f"mocha: no loss for the task {task.name!r}")
        self.bias = layer.bias is not None
        self.dim = layer.in_features + int(self.bias)

    def warm_up(self, input_shape, device):
        return None  # no torch model is trained

    def trainer(self, device):
        return _NoJobs()  # the host's loop asks for one; MOCHA's steps yield no jobs

    # -- features --------------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> np.ndarray:
        """x (decoded, where stored as an image source's pixels) as float64 rows, with the
        constant feature 1 appended when the model has a bias."""
        x = self.decode(x) if self.decode is not None else x
        f = x.detach().reshape(x.shape[0], -1).to("cpu", torch.float64).numpy()
        return np.concatenate([f, np.ones((f.shape[0], 1))], 1) if self.bias else f

    def targets(self, y: torch.Tensor) -> np.ndarray:
        t = y.detach().reshape(-1).to("cpu", torch.float64).numpy()
        return 2.0 * t - 1.0 if self.loss == "hinge" else t

    def mean_loss(self, z: np.ndarray, y: np.ndarray) -> float:
        if len(y) == 0:
            return 0.0
        if self.loss == "hinge":
            return float(np.maximum(0.0, 1.0 - y * z).mean())
        return float((0.5 * (z - y) ** 2).mean())

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        f64 = torch.float64
        return MochaServer(
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, self.dim, dtype=f64),
            torch.zeros(0, self.dim, dtype=f64),
            torch.zeros(0, 0, dtype=f64),
        )

    def stats_request(self, server, round_):
        return StatsRequest("all") if len(server.ids) == 0 else None  # the m tasks, once

    def client_stats(self, state, received, data, ctx):
        return state, PerClient({ctx.cid: float(data.num_train)})

    def absorb_stats(self, server, reduced, round_):
        ids = sorted(int(c) for c in reduced)
        m, f64 = len(ids), torch.float64
        return MochaServer(
            torch.tensor(ids, dtype=torch.long),
            torch.zeros(m, self.dim, dtype=f64),
            torch.zeros(m, self.dim, dtype=f64),
            torch.eye(m, dtype=f64) / m,
            1.0,
            0,
        )

    def select(self, server, round_, sampled, candidates, rng):
        return {int(c): int(c) for c in sampled}  # each client is its own group: its w_t

    def eval_groups(self, server, cids):
        known = {int(c) for c in server.ids}
        return {int(c): int(c) if int(c) in known else -1 for c in cids}

    def message(self, server, round_):
        extra = torch.tensor([0.0, server.rho], dtype=torch.float64)
        parts = {}
        for k, c in enumerate(server.ids.tolist()):
            e = extra.clone()
            e[0] = server.sigma[k, k]
            parts[c] = torch.cat([server.w[k], e])
        return Message(None, parts)

    def aggregate(self, server, reduced, round_):
        if len(server.ids) == 0:
            return server
        index = {c: k for k, c in enumerate(server.ids.tolist())}
        lam = self.hp.lam
        b, w, sigma, rho, updates = server.b, server.w, server.sigma, server.rho, server.omega_updates
        if reduced:
            db = torch.zeros_like(b)
            for c, d in reduced.items():
                db[index[int(c)]] = d.to(torch.float64)
            b = b + db
            w = w + sigma @ db / lam
        if (round_ + 1) % self.hp.omega_every == 0:
            new = omega_update(w.numpy())
            if new is not None:
                sigma, rho = torch.from_numpy(new[0]), new[1]
                updates += 1
                if self.hp.w_map == "dual":
                    w = sigma @ b / lam
        return replace(server, b=b, w=w, sigma=sigma, rho=rho, omega_updates=updates)

    # -- client ----------------------------------------------------------------------------
    def unpack(self, part) -> tuple[np.ndarray, float, float]:
        """(w_t, Σ_tt, σ') from a client's part of the message."""
        p = part.detach().to("cpu", torch.float64).numpy()
        return p[: self.dim], float(p[self.dim]), float(p[self.dim + 1])

    def order(self, n: int, ctx) -> np.ndarray:
        """The round's coordinates: ⌊n · sdca_frac⌋ steps through one random permutation of the
        n samples, cycled (fmtl's ``tperm``)."""
        steps = math.floor(n * self.hp.sdca_frac)
        perm = torch.randperm(n, generator=ctx.generator).numpy()
        return perm[np.arange(steps) % n] if n else perm

    def train(self, state, received, data, ctx):
        if received.part is None:
            raise ValueError(f"mocha: client {ctx.cid} has no model (not among the counted training clients)")
        w, sigma_tt, rho = self.unpack(received.part)
        x, y = self.features(data.train_x), self.targets(data.train_y)
        n = len(y)
        alpha = np.zeros(n) if state is None else state.alpha.to("cpu", torch.float64).numpy().copy()
        loss = self.mean_loss(x @ w, y)
        db = (
            sdca(x, y, alpha, w, sigma_tt, rho, self.hp.lam, self.order(n, ctx), self.loss) if n else np.zeros(self.dim)
        )
        return MochaState(torch.from_numpy(alpha)), PerClient({ctx.cid: torch.from_numpy(db)}), loss

    def evaluate(self, state, received, data, ctx):
        w = np.zeros(self.dim) if received.part is None else self.unpack(received.part)[0]
        s = torch.from_numpy(self.features(data.test_x) @ w).to(data.test_y.device)
        out = torch.stack([-s / 2, s / 2], -1) if self.loss == "hinge" else s[:, None]
        return self.task.scores(out, data.test_y)

    def personalize(self, received, data, ctx):
        raise ValueError(
            "mocha learns a model only for the training clients (one task each); use eval.unseen_fraction: 0"
        )
