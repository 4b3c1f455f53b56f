"""The arithmetic of the Byzantine-robust rules of ``raysim.federation.robust``: plain functions of
one round's updates U (K × d, float64, row k client k's), their sample counts w and f, returning
the aggregate (d,) and, for the rules that select clients, the mask of those kept (K,). The
papers, the choices and each rule's memory are stated in ``robust``'s docstring; this module
only computes. Every random draw comes from the ``torch.Generator`` passed in.

``chunk`` (columns per block, None: all at once) bounds the temporaries of the coordinate-wise
and distance computations to K × chunk numbers.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def blocks(d: int, chunk: int | None) -> Iterator[slice]:
    """The column slices of a d-wide matrix, ``chunk`` at a time (None or ≥ d: one slice)."""
    step = d if not chunk or chunk >= d else chunk
    for a in range(0, d, max(step, 1)):
        yield slice(a, min(a + step, d))


def median_rows(x: torch.Tensor) -> torch.Tensor:
    """The median over dim 0 of each column: the middle value, or the mean of the two middle
    ones for an even count (torch.median returns the lower one; the upper is −median(−x)).
    A selection, not a sort: a third of the time for K = 1 000."""
    low = torch.median(x, dim=0).values
    if x.shape[0] % 2:
        return low
    return (low - torch.median(-x, dim=0).values) / 2


def median_1d(x: torch.Tensor) -> float:
    """The median of a vector (mean of the two middle values for an even length)."""
    return float(median_rows(x.reshape(-1, 1))[0])


def weighted_rows(c: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Σ_k c_k U_k, a (d,) vector: a matrix product, no K × d temporary."""
    return (c.to(U.dtype).unsqueeze(0) @ U).squeeze(0)


def masked_mean(U: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The plain mean of the rows in ``mask`` (each first multiplied by ``scale``); zeros if the
    mask is empty."""
    n = int(mask.sum())
    if n == 0:
        return U.new_zeros(U.shape[1])
    c = mask.to(U.dtype) / n
    return weighted_rows(c if scale is None else c * scale, U)


def distances_to(U: torch.Tensor, z: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """‖U_k − z‖ for every row, a block of columns at a time."""
    acc = U.new_zeros(U.shape[0])
    for sl in blocks(U.shape[1], chunk):
        acc += (U[:, sl] - z[sl]).square().sum(dim=1)
    return acc.sqrt()


def gram(U: torch.Tensor, chunk: int | None, centre: bool) -> torch.Tensor:
    """U Uᵀ (K × K), accumulated over column blocks; ``centre``: of U minus its coordinate-wise
    median (the same distances, less cancellation in n_i + n_j − 2 G_ij however far a few
    updates are, and exact on small integers)."""
    K = U.shape[0]
    G = U.new_zeros(K, K)
    for sl in blocks(U.shape[1], chunk):
        B = U[:, sl]
        if centre:
            B = B - median_rows(B)
        G += B @ B.T
    return G


def squared_distances(U: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """The K × K matrix of ‖U_i − U_j‖² from the centred Gram matrix (never a K × K × d
    tensor), zero on the diagonal. O(K² + K·chunk) memory."""
    G = gram(U, chunk, centre=True)
    n = G.diagonal()
    D = (n.unsqueeze(0) + n.unsqueeze(1) - 2 * G).clamp_min(0)
    D.fill_diagonal_(0)
    return D


# ----------------------------------------------------------------------------- the rules


def weighted_mean(U: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Σ w_k U_k / Σ w_k: FedAvg's average."""
    return weighted_rows(w / w.sum(), U)


def coordinate_median(U: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Each coordinate's median over the K updates."""
    out = U.new_empty(U.shape[1])
    for sl in blocks(U.shape[1], chunk):
        out[sl] = median_rows(U[:, sl])
    return out


def trimmed_mean(U: torch.Tensor, b: int, chunk: int | None) -> torch.Tensor:
    """Each coordinate's mean of its K − 2b middle values (the b largest and b smallest dropped):
    the column sum less the b largest and b smallest (``topk``, not a sort: 1.6 times faster for
    K = 1 000, b = 200), over K − 2b."""
    K = U.shape[0]
    out = U.new_empty(U.shape[1])
    for sl in blocks(U.shape[1], chunk):
        X = U[:, sl]
        total = X.sum(dim=0)
        if b:
            total = total - X.topk(b, dim=0).values.sum(dim=0) - X.topk(b, dim=0, largest=False).values.sum(dim=0)
        out[sl] = total / (K - 2 * b)
    return out


def krum_scores(D: torch.Tensor, f: int, at_least: int = 0) -> torch.Tensor:
    """Krum's score of each of the n rows of D (squared distances): the sum of its
    max(n − f − 2, ``at_least``) smallest squared distances to the others (0 when that is 0)."""
    n = D.shape[0]
    k = min(max(n - f - 2, at_least), n - 1)
    if k <= 0:
        return D.new_zeros(n)
    others = D + torch.diag(D.new_full((n,), float("inf")))
    return others.sort(dim=1).values[:, :k].sum(dim=1)


def krum(U: torch.Tensor, f: int, m: int, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-Krum: the plain mean of the m updates of lowest score (m = 1: Krum, the update
    itself); ties go to the lower client id. (aggregate, kept, scores)."""
    scores = krum_scores(squared_distances(U, chunk), f)
    order = torch.argsort(scores, stable=True)[:m]
    kept = torch.zeros(U.shape[0], dtype=torch.bool, device=U.device)
    kept[order] = True
    agg = U[order[0]].clone() if m == 1 else masked_mean(U, kept)
    return agg, kept, scores


def smoothed_weiszfeld(
    U: torch.Tensor, alpha: torch.Tensor, nu: float, maxiter: int, ftol: float, chunk: int | None
) -> tuple[torch.Tensor, int]:
    """RFA's geometric median: from the α-weighted mean, z ← Σ β_k U_k / Σ β_k with
    β_k = α_k / max(ν, ‖z − U_k‖), until the objective Σ α_k ‖z − U_k‖ changes by less than
    ftol times itself, or ``maxiter`` iterations. (z, iterations run)."""
    z = weighted_rows(alpha, U)
    dist = distances_to(U, z, chunk)
    obj = float((alpha * dist).sum())
    for it in range(1, maxiter + 1):
        beta = alpha / dist.clamp_min(nu)
        z = weighted_rows(beta / beta.sum(), U)
        dist = distances_to(U, z, chunk)
        prev, obj = obj, float((alpha * dist).sum())
        if abs(prev - obj) < ftol * obj:
            return z, it
    return z, maxiter


def closest_to_median_mean(S: torch.Tensor, beta: int) -> torch.Tensor:
    """Bulyan's coordinate-wise step on the selected rows S (θ × c): in each column, the mean
    of the β values closest to the column's median (ties: the earlier row)."""
    med = median_rows(S)
    idx = torch.argsort((S - med).abs(), dim=0, stable=True)[:beta]
    return S.gather(0, idx).mean(dim=0)


def bulyan(U: torch.Tensor, f: int, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Bulyan: θ = K − 2f updates chosen by Krum applied again and again to those not yet
    chosen (each time with f and the remaining count r, its score over max(r − f − 2, 1)
    neighbours: where r − f − 2 < 1 the nearest one decides; ties go to the lower client id),
    then coordinate-wise the mean of the β = θ − 2f of them closest to the median. (aggregate,
    kept, the selection in order)."""
    K = U.shape[0]
    theta, beta = K - 2 * f, K - 4 * f
    D = squared_distances(U, chunk)
    remaining = list(range(K))
    chosen: list[int] = []
    for _ in range(theta):
        sub = D[remaining][:, remaining]
        j = int(torch.argmin(krum_scores(sub, f, at_least=1)))
        chosen.append(remaining.pop(j))
    kept = torch.zeros(K, dtype=torch.bool, device=U.device)
    kept[chosen] = True
    rows = torch.tensor(chosen, device=U.device)
    out = U.new_empty(U.shape[1])
    for sl in blocks(U.shape[1], chunk):
        out[sl] = closest_to_median_mean(U[rows, sl], beta)
    return out, kept, chosen


def clip_factors(norms: torch.Tensor, bound: float) -> torch.Tensor:
    """min(1, bound / ‖x‖) for each norm (1 for a zero vector, which stays zero)."""
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(norms > bound, bound / safe, torch.ones_like(norms))


def centered_clipping(U: torch.Tensor, center: torch.Tensor, tau: float, iters: int, chunk: int | None) -> torch.Tensor:
    """v ← v + (1/K) Σ_i (x_i − v)·min(1, τ/‖x_i − v‖), ``iters`` times from ``center``; the sum
    is (Σ c_i x_i − (Σ c_i) v)/K, one matrix product per iteration."""
    K = U.shape[0]
    v = center.clone()
    for _ in range(iters):
        c = clip_factors(distances_to(U, v, chunk), tau)
        v = v + (weighted_rows(c, U) - c.sum() * v) / K
    return v


def dnc_scores(S: torch.Tensor) -> torch.Tensor:
    """DnC's outlier scores of the rows of a subsample S (centred in place): ((s_i − μ)·v)², v
    the top right singular vector of the centred S. From the smaller Gram matrix, not an SVD:
    with K ≤ b rows, S v = σ u for u the top eigenvector of S Sᵀ (eigenvalue σ²), so the scores
    are σ² u_i²; otherwise v is the top eigenvector of Sᵀ S. (The same numbers as the SVD's to
    rounding, at a fifteenth of its time for K = 1 000, b = 10 000.)"""
    S -= S.mean(dim=0)
    K, b = S.shape
    if K <= b:
        lam, Q = torch.linalg.eigh(S @ S.T)
        return lam[-1].clamp_min(0) * Q[:, -1].square()
    lam, Q = torch.linalg.eigh(S.T @ S)
    return (S @ Q[:, -1]).square()


def dnc(
    U: torch.Tensor, f: int, niters: int, b: int, c: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Divide-and-Conquer: ``niters`` times, b coordinates drawn without replacement (all of
    them if b ≥ d), the subsample centred, its top right singular vector v, the scores
    ((x_i − μ)·v)², the ⌊c·f⌋ highest removed; the clients kept every time, averaged."""
    K, d = U.shape
    drop = int(c * f)
    kept = torch.ones(K, dtype=torch.bool, device=U.device)
    for _ in range(niters):
        if b >= d:
            S = U.clone()
        else:
            assert gen is not None
            idx = torch.randperm(d, generator=gen, device=gen.device)[:b].sort().values
            S = U[:, idx.to(U.device)]
        scores = dnc_scores(S)
        good = torch.zeros(K, dtype=torch.bool, device=U.device)
        good[torch.argsort(scores, stable=True)[: K - drop]] = True
        kept &= good
    return masked_mean(U, kept), kept


def sign_features(
    U: torch.Tensor, fraction: float, subset: str, gen: torch.Generator | None, chunk: int | None
) -> np.ndarray:
    """SignGuard's K × 3 features: the shares of positive, zero and negative coordinates among
    ⌊fraction·d⌋ of them (a block at a random start, or scattered at random), each column
    divided by its largest value over the clients (+1e-8), as the official code does."""
    K, d = U.shape
    b = max(1, int(fraction * d))
    if b >= d:
        cols = torch.arange(d, device=U.device)
    elif subset == "block":
        assert gen is not None
        start = int(torch.randint(0, d - b + 1, (1,), generator=gen, device=gen.device))
        cols = torch.arange(start, start + b, device=U.device)
    else:
        assert gen is not None
        cols = torch.randperm(d, generator=gen, device=gen.device)[:b].sort().values.to(U.device)
    counts = U.new_zeros(K, 3)
    for sl in blocks(b, chunk):
        B = U[:, cols[sl]]
        counts += torch.stack([(B > 0).sum(1), (B == 0).sum(1), (B < 0).sum(1)], dim=1).to(U.dtype)
    share = counts / b
    return (share / (share.max(dim=0).values + 1e-8)).cpu().numpy()


def largest_cluster(labels: np.ndarray) -> np.ndarray:
    """The mask of the most populated cluster (label ≥ 0; the first on ties); all False when
    every point is noise."""
    good = labels[labels >= 0]
    if good.size == 0:
        return np.zeros(labels.shape, dtype=bool)
    return labels == np.bincount(good).argmax()


def sign_clusters(feats: np.ndarray, clustering: str) -> np.ndarray:
    """The labels of the clustering of SignGuard's features: MeanShift with the bandwidth
    sklearn estimates at quantile 0.5, bin seeding and orphans left out (the official code's
    default), or DBSCAN(eps = 0.05, min_samples = 2) (its alternative). A zero bandwidth (at
    least half the points coincide with others) is mean shift's limit: equal features, one
    cluster."""
    from sklearn.cluster import DBSCAN, MeanShift, estimate_bandwidth

    if clustering == "dbscan":
        return DBSCAN(eps=0.05, min_samples=2).fit(feats).labels_
    bandwidth = float(estimate_bandwidth(feats, quantile=0.5)) if len(feats) > 1 else 0.0
    if not bandwidth > 0:
        return np.unique(feats, axis=0, return_inverse=True)[1].reshape(-1)
    return MeanShift(bandwidth=bandwidth, bin_seeding=True, cluster_all=False).fit(feats).labels_


def signguard(
    U: torch.Tensor,
    lower: float,
    upper: float,
    fraction: float,
    subset: str,
    clustering: str,
    gen: torch.Generator | None,
    chunk: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SignGuard: the norm filter lower·med < ‖x_i‖ < upper·med (med the median norm), the
    largest cluster of the sign features, their intersection; those kept clipped to the median
    norm and averaged."""
    norms = torch.linalg.vector_norm(U, dim=1)
    med = median_1d(norms)
    by_norm = (norms > lower * med) & (norms < upper * med)
    feats = sign_features(U, fraction, subset, gen, chunk)
    by_sign = torch.from_numpy(largest_cluster(sign_clusters(feats, clustering))).to(U.device)
    kept = by_norm & by_sign
    return masked_mean(U, kept, clip_factors(norms, med)), kept


def fltrust(U: torch.Tensor, root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FLTrust: TS_i = ReLU(cos(g_i, g_0)), each g_i rescaled to ‖g_0‖, Σ TS_i ĝ_i / Σ TS_i (0 if
    every TS_i is 0; a zero vector's cosine counts as 0). (aggregate, kept = TS > 0, TS)."""
    n0 = float(torch.linalg.vector_norm(root))
    norms = torch.linalg.vector_norm(U, dim=1)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    cos = (U @ root) / (safe * n0) if n0 > 0 else U.new_zeros(U.shape[0])
    ts = torch.where(norms > 0, cos.clamp_min(0), torch.zeros_like(cos))
    total = float(ts.sum())
    if total == 0:
        return U.new_zeros(U.shape[1]), ts > 0, ts
    return weighted_rows(ts * n0 / safe / total, U), ts > 0, ts


def cosine_distances(U: torch.Tensor, model: torch.Tensor | None, chunk: int | None) -> np.ndarray:
    """1 − cos between the rows (of U, or of the models θ + U_k when ``model`` θ is given:
    expanded as θ·θ + θ·U_i + θ·U_j + U_i·U_j, no K × d copy), in [0, 2], zero on the
    diagonal; a zero vector is at distance 1 from every other."""
    G = gram(U, chunk, centre=False)
    if model is not None:
        t = U @ model
        G = G + t.unsqueeze(0) + t.unsqueeze(1) + float(model @ model)
    n = G.diagonal().clamp_min(0).sqrt()
    outer = n.unsqueeze(0) * n.unsqueeze(1)
    cos = torch.where(outer > 0, G / torch.where(outer > 0, outer, torch.ones_like(outer)), torch.zeros_like(G))
    D = (1 - cos).clamp(0, 2)
    D.fill_diagonal_(0)
    return D.cpu().numpy()


def flame(
    U: torch.Tensor,
    lam: float,
    model: torch.Tensor | None,
    gen: torch.Generator | None,
    chunk: int | None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """FLAME: HDBSCAN (precomputed cosine distances, min_cluster_size K//2 + 1, min_samples 1, a
    single cluster allowed) keeps its largest cluster; each kept update clipped to S_t, the
    median of all K norms; their mean plus N(0, (λ S_t)² I). (aggregate, kept, S_t)."""
    from sklearn.cluster import HDBSCAN

    K = U.shape[0]
    D = cosine_distances(U, model, chunk)
    labels = (
        HDBSCAN(metric="precomputed", min_cluster_size=K // 2 + 1, min_samples=1, allow_single_cluster=True, copy=True)
        .fit(D)
        .labels_
    )
    kept = torch.from_numpy(largest_cluster(labels)).to(U.device)
    norms = torch.linalg.vector_norm(U, dim=1)
    s_t = median_1d(norms)
    agg = masked_mean(U, kept, clip_factors(norms, s_t))
    if lam > 0:
        assert gen is not None
        agg = agg + lam * s_t * normal(U.shape[1], gen, U)
    return agg, kept, s_t


def normal(d: int, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """d standard normal draws from ``gen`` (on its device), as ``like``'s dtype and device."""
    return torch.randn(d, generator=gen, dtype=torch.float64, device=gen.device).to(like.device, like.dtype)


# ----------------------------------------------------------------------------- pre-aggregators


def bucket_groups(K: int, s: int, gen: torch.Generator) -> list[list[int]]:
    """The buckets: a random permutation of the K clients cut into consecutive groups of s (the
    last one shorter)."""
    perm = torch.randperm(K, generator=gen, device=gen.device).tolist()
    return [perm[a : a + s] for a in range(0, K, s)]


def bucket_means(
    U: torch.Tensor, w: torch.Tensor, groups: list[list[int]], weighted: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each bucket's mean (plain, or weighted by w: plain where its weights are all 0) and its
    weight Σ w over its members, as one (buckets × K) @ (K × d) product."""
    A = U.new_zeros(len(groups), U.shape[0])
    for g, members in enumerate(groups):
        idx = torch.tensor(members, device=U.device)
        mass = w[idx].sum()
        share = w[idx] / mass if weighted and mass > 0 else U.new_full((len(members),), 1 / len(members))
        A[g, idx] = share
    weights = torch.stack([w[torch.tensor(m, device=U.device)].sum() for m in groups])
    return A @ U, weights


def nearest_neighbour_mixing(U: torch.Tensor, f: int, chunk: int | None) -> torch.Tensor:
    """NNM: each update replaced by the mean of its K − f nearest updates, itself included (ties:
    the lower client id), as one (K × K) @ (K × d) product."""
    K = U.shape[0]
    D = squared_distances(U, chunk)
    D.fill_diagonal_(-1.0)  # itself first, even beside an identical update
    near = torch.argsort(D, dim=1, stable=True)[:, : K - f]
    A = U.new_zeros(K, K)
    A.scatter_(1, near, 1.0 / (K - f))
    return A @ U


# ----------------------------------------------------------------------------- gossip


def adaptive_radius(dist: torch.Tensor, weights: torch.Tensor, delta: float | None) -> float:
    """ClippedGossip's τ_i: the neighbours sorted from the farthest, the fewest m of them whose
    weights reach δ_i (δ None: m = 1, the official code's ``sorted(distances)[-2]``); τ_i the
    distance of the farthest neighbour left unclipped (the nearest one's when m covers all)."""
    order = torch.argsort(dist, descending=True, stable=True)
    d_sorted = dist[order]
    n = d_sorted.numel()
    if delta is None:
        m = 1
    else:
        reach = torch.cumsum(weights[order], 0) >= delta - 1e-12
        m = 0 if delta <= 0 else (int(torch.nonzero(reach)[0]) + 1 if bool(reach.any()) else n)
    return float(d_sorted[min(m, n - 1)])


def clipped_gossip(
    x: torch.Tensor, X: torch.Tensor, w: torch.Tensor, w_self: float, tau: float | None, delta: float | None
) -> tuple[torch.Tensor, float]:
    """x ← w_ii x + Σ_j w_ij (x + CLIP(x_j − x, τ)), i.e. x + Σ_j w_ij CLIP(x_j − x, τ) when the
    weights sum to 1. (the new x, τ used)."""
    dist = distances_to(X, x, None)
    radius = adaptive_radius(dist, w, delta) if tau is None else tau
    c = w * clip_factors(dist, radius)
    total = w_self + float(w.sum())
    return total * x + weighted_rows(c, X) - c.sum() * x, radius


def bridge(x: torch.Tensor, X: torch.Tensor, b: int, screen: str, chunk: int | None) -> torch.Tensor:
    """BRIDGE-T: coordinate-wise, the b largest and b smallest neighbour values dropped and the
    rest averaged with the node's own, Σ / (n − 2b + 1) (``screen`` "neighbours", the paper's);
    or the trimmed mean of all n + 1 values, the node's own included in the trimming ("all")."""
    n = X.shape[0]
    out = x.new_empty(x.shape[0])
    for sl in blocks(x.shape[0], chunk):
        if screen == "all":
            out[sl] = trimmed_mean(torch.cat([x[sl].unsqueeze(0), X[:, sl]]), b, None)
        else:
            mid = X[:, sl].sort(dim=0).values[b : n - b]
            out[sl] = (x[sl] + mid.sum(dim=0)) / (n - 2 * b + 1)
    return out
