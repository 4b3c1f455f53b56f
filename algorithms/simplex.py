"""Solution-simplex geometry shared by SosicFL and Floco.

Notation as the published SosicFL: M is the simplex *dimension*, so points α ∈ Δ^M have M + 1
coordinates (one per endpoint), α ≥ 0, Σα = 1.

- ``uniform``: α ~ U(Δ^M) (Dir(1, …, 1), as normalized Exp(1) draws).
- ``mean_l1_to_uniform``: δ(μ), the mean L1 distance from μ to a uniform point of the simplex,
  in closed form δ(μ) = (2/(M+1))·Σ_i (1 − μ_i)^{M+1} (each coordinate of a uniform point is
  Beta(1, M); ‖α − μ‖₁ = 2Σ_i(α_i − μ_i)⁺). The paper integrates it on a grid; a test checks
  that the two agree.
- ``sample_ball``: α uniform on R = {α ∈ Δ^M : ‖α − μ‖₁ ≤ η}, exactly: ‖α − μ‖₁ ≤ η implies
  α_i ≥ μ_i − η/2, so proposals l + s·Dir(1) (l = max(μ − η/2, 0), s = 1 − Σl) are uniform on a
  sub-simplex containing R; those inside the ball are kept. Every sample lies on the simplex.
- ``sample_ball_floco``: the official Floco code's formula, μ + r·u/‖u‖₁ with u ~ U(−1, 1)^{M+1}
  and r ~ U(0, ρ): neither uniform nor on the simplex (kept to reproduce Floco's numbers).
- ``lda_alphas``: SosicFL's projection of the clients' label counts onto Δ^M, scikit-learn's
  online-variational-Bayes LDA with M + 1 topics (documents = clients, words = labels), the
  best of ``restarts`` seeded fits by ``score``. Mini-batches of a tenth of the clients (10
  online updates a pass, as Hoffman et al.'s online VB): scikit-learn's default batch of 128
  holds all of ≤ 128 clients, which makes each pass one damped batch step, and single fits
  then merge two 5-fold groups into one topic 5 times in 6 (measured: 5/32 fits found the 5
  groups, against 24/32 with mini-batches of 10).
- ``cluster``: "Hilbert simplex clustering with the L1 distance" (Nielsen & Sun 2019), as raysim
  reads it (the paper gives no more): k-means++ seeding and Lloyd iterations under the chosen
  distance (``l1``, or the Hilbert metric ρ(p, q) = max_i log(p_i/q_i) − min_i log(p_i/q_i)),
  centres the members' means (points of the simplex), the best of ``n_init`` seedings by the
  summed distance to the centres.
- ``project_simplex`` and ``riesz_energy``: Floco's placement of clients on the simplex.
- ``SimplexObjective``: the loop's objective for a simplex model, the task's loss at w_α (the
  method gives the composition of the endpoints and its adjoint).

Every random draw comes from a generator the caller passes (derived from the run's seed).
"""

from __future__ import annotations

import numpy as np
import torch

from raysim.core.loop import Supervised


def uniform(generator: torch.Generator, n: int, dim: int, dtype=torch.float64) -> torch.Tensor:
    """n points uniform on the simplex with ``dim`` = M + 1 coordinates: (n, dim)."""
    e = -torch.log1p(-torch.rand(n, dim, generator=generator, dtype=torch.float64))  # Exp(1)
    return (e / e.sum(1, keepdim=True)).to(dtype)


def mean_l1_to_uniform(mu: np.ndarray) -> np.ndarray:
    """δ(μ) = E‖α − μ‖₁ for α ~ U(Δ^M), per row of ``mu`` (…, M + 1), in closed form."""
    mu = np.asarray(mu, dtype=np.float64)
    d = mu.shape[-1]
    return (2.0 / d) * ((1.0 - mu) ** d).sum(-1)


def sample_ball(
    generator: torch.Generator, mu: torch.Tensor, eta: float, n: int, max_proposals: int = 1 << 22
) -> torch.Tensor:
    """n points uniform on {α ∈ Δ^M : ‖α − μ‖₁ ≤ η} (exact rejection from the sub-simplex
    α ≥ max(μ − η/2, 0)): (n, M + 1) float64."""
    mu = torch.as_tensor(mu, dtype=torch.float64).cpu()  # drawn on the CPU, as the generator
    d = mu.shape[0]
    lo = (mu - eta / 2).clamp_min(0.0)
    s = float(1.0 - lo.sum())
    out, have, tried = [], 0, 0
    batch = max(64, 2 * n)
    while have < n:
        prop = lo + s * uniform(generator, batch, d)
        keep = prop[(prop - mu).abs().sum(1) <= eta + 1e-12]
        out.append(keep)
        have += keep.shape[0]
        tried += batch
        if tried > max_proposals and have < n:
            raise ValueError(
                f"the subregion (η = {eta:g} in Δ^{d - 1}) accepts too few proposals; "
                f"use a larger rho or fewer endpoints"
            )
        batch = min(4 * batch, max_proposals)
    return torch.cat(out)[:n]


def sample_ball_floco(generator: torch.Generator, mu: torch.Tensor, rho: float, n: int) -> torch.Tensor:
    """The official Floco sampler: μ + r·u/‖u‖₁, u ~ U(−1, 1)^{M+1}, r ~ U(0, ρ): (n, M + 1)."""
    mu = torch.as_tensor(mu, dtype=torch.float64).cpu()  # drawn on the CPU, as the generator
    u = 2 * torch.rand(n, mu.shape[0], generator=generator, dtype=torch.float64) - 1
    u = u / u.abs().sum(1, keepdim=True)
    r = rho * torch.rand(n, 1, generator=generator, dtype=torch.float64)
    return mu + r * u


def lda_alphas(
    counts: np.ndarray, topics: int, restarts: int, seed: int, input: str = "counts", max_iter: int = 10
) -> np.ndarray:
    """Each client's topic weights α_k ∈ Δ^M (M + 1 = ``topics``) from its label counts
    (K, L): the best of ``restarts`` online LDA fits (random_state seed + r) by ``score``."""
    from sklearn.decomposition import LatentDirichletAllocation

    x = np.asarray(counts, dtype=np.float64)
    if input == "proportions":
        x = x / np.maximum(x.sum(1, keepdims=True), 1.0)
    best, best_score = None, -np.inf
    for r in range(restarts):
        lda = LatentDirichletAllocation(
            n_components=topics,
            learning_method="online",
            max_iter=max_iter,
            batch_size=max(1, -(-len(x) // 10)),
            random_state=seed + r,
        )
        lda.fit(x)
        score = lda.score(x)
        if score > best_score:
            best, best_score = lda, score
    alpha = best.transform(x)
    return alpha / alpha.sum(1, keepdims=True)


def distances(p: np.ndarray, q: np.ndarray, kind: str) -> np.ndarray:
    """Distances between every row of p (n, d) and every row of q (m, d): (n, m). ``l1`` or
    ``hilbert`` (points clipped at 1e-12 inside the open simplex)."""
    if kind == "l1":
        return np.abs(p[:, None, :] - q[None, :, :]).sum(-1)
    lg = np.log(np.clip(p, 1e-12, None))[:, None, :] - np.log(np.clip(q, 1e-12, None))[None, :, :]
    return lg.max(-1) - lg.min(-1)


def cluster(
    alpha: np.ndarray,
    k: int,
    distance: str = "l1",
    n_init: int = 10,
    iters: int = 100,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Centre-based clustering of simplex points (n, d) into k clusters: (assignments (n,),
    centres (k, d)). Each of ``n_init`` runs: k-means++ seeding (D² sampling under the
    distance), then Lloyd iterations (assign to the nearest centre, centre = the members'
    mean, an empty cluster keeps its centre) until the assignment is stable; the run with the
    least summed distance wins (ties: the earlier)."""
    rng = rng or np.random.default_rng(0)
    a = np.asarray(alpha, dtype=np.float64)
    n = a.shape[0]
    if k > n:
        raise ValueError(f"{k} clusters need at least {k} clients, got {n}")
    best = (np.inf, None, None)
    for _ in range(n_init):
        centres = [a[rng.integers(n)]]
        for _ in range(1, k):
            d2 = distances(a, np.array(centres), distance).min(1) ** 2
            p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
            centres.append(a[rng.choice(n, p=p)])
        c = np.array(centres)
        z = None
        for _ in range(iters):
            new = distances(a, c, distance).argmin(1)
            if z is not None and (new == z).all():
                break
            z = new
            c = np.array([a[z == j].mean(0) if (z == j).any() else c[j] for j in range(k)])
        cost = float(distances(a, c, distance)[np.arange(n), z].sum())
        if cost < best[0] - 1e-12:
            best = (cost, z, c)
    return best[1].astype(np.int64), best[2]


def project_simplex(v: np.ndarray, z: float = 1.0) -> np.ndarray:
    """Euclidean projection of each row of v onto {β ≥ 0, Σβ = z} (sort-based; Duchi et al. 2008)."""
    v = np.atleast_2d(np.asarray(v, dtype=np.float64))
    u = -np.sort(-v, axis=1)
    css = np.cumsum(u, axis=1) - z
    ind = np.arange(1, v.shape[1] + 1)
    rho = (u - css / ind > 0).sum(1)
    theta = css[np.arange(v.shape[0]), rho - 1] / rho
    return np.maximum(v - theta[:, None], 0.0)


def riesz_energy(points: np.ndarray, s: float = 2.0, floor: float = 1e-4) -> float:
    """log of the mean Riesz s-energy 1/‖β_i − β_j‖^s over pairs i < j (distances floored),
    as Floco's code scores a placement (lower: more evenly spread)."""
    p = np.asarray(points, dtype=np.float64)
    iu = np.triu_indices(p.shape[0], 1)
    d = np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(-1))[iu]
    return float(np.log(np.mean(1.0 / np.maximum(d, floor) ** s)))


class SimplexObjective(Supervised):
    """The task's loss at w_α: the job's parameters are the shared ones then the endpoints, and
    this step's draw α (K, M + 1) mixes them. ``pull_back``: the adjoint of ``compose`` (the
    gradient at w_α taken back to the flat layout in closed form)."""

    def __init__(self, task, compose, trainable=None, pull_back=None):
        super().__init__(task)
        self.compose, self.pull_back = compose, pull_back
        self.trainable = trainable

    def model_params(self, params, draws):
        return self.compose(params, draws)
