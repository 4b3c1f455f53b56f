"""Byzantine-robust aggregation (raysim/federation/robust.py): every rule on a few vectors in R² or
R³ whose result is worked out by hand in the comments (or by scipy / numpy written here
independently), each rule's limits refused with its message, the same draws for the same seed,
and the robust rules ignoring four far outliers among twenty honest updates while the mean does not."""

import math
from dataclasses import fields, is_dataclass

import numpy as np
import pytest
import scipy.optimize
import torch

from raysim.federation import robust
from raysim.federation import robust_rules as rr
from raysim.federation.robust import aggregate


def T(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def ones(k: int) -> torch.Tensor:
    return torch.ones(k, dtype=torch.float64)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def as64(a) -> torch.Tensor:
    return a.double() if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a, dtype=np.float64))


def close(a, b, tol=1e-9) -> bool:
    return torch.allclose(as64(a), as64(b), atol=tol)


# ----------------------------------------------------------------------------- coordinate-wise


def test_mean_weighs_by_sample_counts():
    U = T([[1, 0], [3, 6]])
    # (1·(1, 0) + 3·(3, 6)) / 4 = (10, 18) / 4
    assert close(aggregate("mean", U, T([1, 3])).aggregate, [2.5, 4.5])
    assert aggregate("mean", U, T([1, 3])).kept is None


def test_median_and_trimmed_mean_coordinate_by_coordinate():
    U = T([[0, 10], [1, -1], [2, 4], [6, 5], [100, 6], [-50, 7]])
    # column 0 sorted: −50, 0, 1, 2, 6, 100 → median (1 + 2)/2 = 1.5; f = 1 drops −50 and 100:
    #   (0 + 1 + 2 + 6)/4 = 2.25
    # column 1 sorted: −1, 4, 5, 6, 7, 10 → median 5.5; trimmed (4 + 5 + 6 + 7)/4 = 5.5
    for chunk in (None, 1):
        assert close(aggregate("median", U, ones(6), chunk=chunk).aggregate, [1.5, 5.5])
        assert close(aggregate("trimmed_mean", U, ones(6), 1, chunk=chunk).aggregate, [2.25, 5.5])
    # the odd-K median is the middle value: without the last row, 0, 1, 2, 6, 100 → 2; −1, 4, 5, 6, 10 → 5
    assert close(aggregate("median", U[:5], ones(5)).aggregate, [2, 5])
    # β = 0.34: ⌊0.34·6⌋ = 2 from each end: column 0 keeps 1, 2 → 1.5; column 1 keeps 5, 6 → 5.5
    p = robust.TrimmedMeanParams(beta=0.34)
    assert close(aggregate("trimmed_mean", U, ones(6), 0, p).aggregate, [1.5, 5.5])
    # β = 0.2 trims ⌊1.2⌋ = 1, as f = 1 does
    p = robust.TrimmedMeanParams(beta=0.2)
    assert close(aggregate("trimmed_mean", U, ones(6), 0, p).aggregate, [2.25, 5.5])


# ----------------------------------------------------------------------------- Krum, Multi-Krum, Bulyan

KRUM_U = [[0, 0], [1, 0], [0, 2], [2, 2], [10, 10]]


def test_krum_scores_and_selection():
    U = T(KRUM_U)
    # squared distances: d01 = 1, d02 = 4, d03 = 8, d04 = 200, d12 = 5, d13 = 5, d14 = 181,
    # d23 = 4, d24 = 164, d34 = 128. K = 5, f = 1: each score sums the K − f − 2 = 2 smallest:
    # x0: 1 + 4 = 5; x1: 1 + 5 = 6; x2: 4 + 4 = 8; x3: 4 + 5 = 9; x4: 128 + 164 = 292
    D = rr.squared_distances(U)
    assert close(D[0], [0, 1, 4, 8, 200]) and close(D[3], [8, 5, 4, 0, 128])
    assert close(rr.krum_scores(D, 1), [5, 6, 8, 9, 292])
    v = aggregate("krum", U, ones(5), 1)
    assert close(v.aggregate, [0, 0]) and v.kept.tolist() == [True, False, False, False, False]


def test_multi_krum_averages_the_m_lowest_scores():
    U = T(KRUM_U)
    # m = 3: x0, x1, x2 (scores 5, 6, 8): ((0, 0) + (1, 0) + (0, 2))/3 = (1/3, 2/3)
    v = aggregate("multi_krum", U, ones(5), 1, robust.MultiKrumParams(m=3))
    assert close(v.aggregate, [1 / 3, 2 / 3]) and v.kept.tolist() == [True, True, True, False, False]
    # default m = K − f = 4: x0..x3: (3, 4)/4
    v = aggregate("multi_krum", U, ones(5), 1)
    assert close(v.aggregate, [0.75, 1.0]) and v.kept.tolist() == [True, True, True, True, False]


def test_bulyan_selects_by_repeated_krum_then_averages_the_values_nearest_the_median():
    U = T([[0, 0], [1, 0], [0, 2], [1, 1], [3, -2], [9, 9], [-9, 3]])
    # K = 7, f = 1: θ = 5 selected, β = 3 averaged. Squared distances (rows x0..x4):
    #   x0: ·, 1, 4, 2, 13, 162, 90      x1: 1, ·, 5, 1, 8, 145, 109     x2: 4, 5, ·, 2, 25, 130, 82
    #   x3: 2, 1, 2, ·, 13, 128, 104     x4: 13, 8, 25, 13, ·, 157, 169  x5–x6: 360
    # step 1 (7 left, 4 neighbours): x0 1+2+4+13 = 20, x1 1+1+5+8 = 15, x2 36, x3 1+2+2+13 = 18,
    #   x4 59, x5 560, x6 385 → x1
    # step 2 (6 left, 3): x0 2+4+13 = 19, x2 2+4+25 = 31, x3 2+2+13 = 17, x4 51, ... → x3
    # step 3 (5 left, 2): x0 4+13 = 17, x2 4+25 = 29, x4 13+25 = 38, x5 287, x6 172 → x0
    # step 4 (4 left: 4 − f − 2 = 1): nearest neighbour: x2 25, x4 25, x5 130, x6 82 → x2 (lower id)
    # step 5 (3 left: 3 − f − 2 = 0, so the nearest neighbour again): x4 157, x5 157, x6 169 → x4
    _, kept, chosen = rr.bulyan(U, 1, None)
    assert chosen == [1, 3, 0, 2, 4]
    # selected rows (1, 0), (1, 1), (0, 0), (0, 2), (3, −2):
    # column 0: 1, 1, 0, 0, 3, median 1, the 3 nearest 1, 1, 0 → 2/3
    # column 1: 0, 1, 0, 2, −2, median 0, the 3 nearest 0, 0, 1 → 1/3
    for chunk in (None, 1):
        v = aggregate("bulyan", U, ones(7), 1, chunk=chunk)
        assert close(v.aggregate, [2 / 3, 1 / 3])
        assert v.kept.tolist() == [True] * 5 + [False] * 2


def test_bulyans_coordinate_step_on_its_own():
    S = T([[1, 0], [2, 5], [4, 1], [10, -2], [3, 3]])
    # column 0: 1, 2, 4, 10, 3 → median 3, distances 2, 1, 1, 7, 0 → 3, 2, 4 → 3
    # column 1: 0, 5, 1, −2, 3 → median 1, distances 1, 4, 0, 3, 2 → 1, 0, 3 → 4/3
    assert close(rr.closest_to_median_mean(S, 3), [3, 4 / 3])


# ----------------------------------------------------------------------------- geometric median


def test_weiszfeld_keeps_the_centre_of_an_equilateral_triangle():
    c = np.array([2.0, 1.0])
    pts = np.array([c + [1, 0], c + [-0.5, math.sqrt(3) / 2], c + [-0.5, -math.sqrt(3) / 2]])
    # the three unit vectors from the centre sum to 0: it is the fixed point z = Σ β x / Σ β
    p = robust.GeometricMedianParams(maxiter=50, ftol=0.0)
    assert close(aggregate("geometric_median", T(pts), ones(3), params=p).aggregate, c, 1e-12)


def test_weiszfeld_matches_scipys_minimisation_of_the_weighted_distance_sum():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(6, 3)) * [1.0, 2.0, 0.5]
    w = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 2.0])
    a = w / w.sum()

    def objective(z):
        return float((a * np.linalg.norm(X - z, axis=1)).sum())

    best = scipy.optimize.minimize(objective, X.mean(0), method="Nelder-Mead", options={"xatol": 1e-11, "fatol": 1e-14})
    p = robust.GeometricMedianParams(nu=1e-12, maxiter=2000, ftol=0.0)
    for chunk in (None, 2):
        z = aggregate("geometric_median", T(X), T(w), params=p, chunk=chunk).aggregate.numpy()
        assert np.allclose(z, best.x, atol=1e-6)
        # optimality: Σ α_i (z − x_i)/‖z − x_i‖ = 0
        assert np.allclose((a[:, None] * (z - X) / np.linalg.norm(z - X, axis=1)[:, None]).sum(0), 0, atol=1e-8)
    # RFA's defaults stop after at most 4 iterations: close, not exact
    z4 = aggregate("geometric_median", T(X), T(w)).aggregate.numpy()
    assert objective(z4) < objective(X.mean(0)) and objective(z4) - best.fun < 1e-2


def test_a_heavy_point_is_the_weighted_geometric_median():
    # on a line, weights 1, 1, 5 at 0, 1, 10: 5 > (1 + 1 + 5)/2, so the median is the point at 10
    p = robust.GeometricMedianParams(maxiter=200, ftol=0.0)
    z = aggregate("geometric_median", T([[0, 0], [1, 0], [10, 0]]), T([1, 1, 5]), params=p).aggregate
    assert close(z, [10, 0], 1e-4)


# ----------------------------------------------------------------------------- clipping rules


def test_one_centered_clipping_step_by_hand():
    U = T([[3, 4], [0, 0.5], [-2, 0]])
    p = robust.CenteredClippingParams(tau=1.0, L=1)
    # from 0: (3, 4) has norm 5 → (0.6, 0.8); (0, 0.5) stays; (−2, 0) → (−1, 0); sum (−0.4, 1.3), / 3
    assert close(aggregate("centered_clipping", U, ones(3), params=p).aggregate, [-0.4 / 3, 1.3 / 3])
    # from v = (1, 0): x − v = (2, 4) (norm 2√5) → (1, 2)/√5; (−1, 0.5) (norm √5/2) → (−2, 1)/√5;
    # (−3, 0) → (−1, 0); the sum (−1 − 1/√5, 3/√5), / 3 added to v: (2/3 − 1/(3√5), 1/√5)
    s5 = math.sqrt(5)
    v = aggregate("centered_clipping", U, ones(3), params=p, center=T([1, 0])).aggregate
    assert close(v, [2 / 3 - 1 / (3 * s5), 1 / s5])


def test_norm_clipping_clips_then_averages_and_adds_weak_dp_noise():
    U = T([[3, 4], [0, 0.5]])
    p = robust.NormClippingParams(M=1.0)
    # (3, 4) → (0.6, 0.8); (0, 0.5) stays: the plain mean (0.3, 0.65)
    assert close(aggregate("norm_clipping", U, T([1, 3]), params=p).aggregate, [0.3, 0.65])
    # weighted by (1, 3): 0.25·(0.6, 0.8) + 0.75·(0, 0.5) = (0.15, 0.575)
    p = robust.NormClippingParams(M=1.0, weighted=True)
    assert close(aggregate("norm_clipping", U, T([1, 3]), params=p).aggregate, [0.15, 0.575])
    # σ = 0.5 on a 20 000-dimensional zero update: the noise's std is σ
    Z = torch.zeros(3, 20_000, dtype=torch.float64)
    p = robust.NormClippingParams(M=1.0, sigma=0.5)
    noisy = aggregate("norm_clipping", Z, ones(3), params=p, generator=seeded(1)).aggregate
    assert abs(float(noisy.std()) - 0.5) < 0.01 and abs(float(noisy.mean())) < 0.02


# ----------------------------------------------------------------------------- DnC


def test_dnc_scores_on_the_obvious_singular_vector():
    U = T([[-1, 1], [1, 1], [0, -2], [10, 0]])
    # μ = (2.5, 0); centred x: −3.5, −1.5, −2.5, 7.5; centred y: 1, 1, −2, 0 (Σy = 0 and Σxy = 0),
    # so CᵀC = diag(77, 6) and the top right singular vector is (1, 0): scores x² = 12.25, 2.25, 6.25, 56.25
    assert close(rr.dnc_scores(U.clone()), [12.25, 2.25, 6.25, 56.25])
    # f = 1, c = 1: the highest (x3) removed; the mean of the others ((−1 + 1 + 0)/3, (1 + 1 − 2)/3) = 0
    v = aggregate("dnc", U, ones(4), 1, robust.DnCParams(niters=1))
    assert v.kept.tolist() == [True, True, True, False] and close(v.aggregate, [0, 0])
    # c = 2: ⌊2·1⌋ = 2 removed (56.25 and 12.25): the mean of (1, 1) and (0, −2)
    v = aggregate("dnc", U, ones(4), 1, robust.DnCParams(niters=1, c=2.0))
    assert v.kept.tolist() == [False, True, True, False] and close(v.aggregate, [0.5, -0.5])


@pytest.mark.parametrize("shape", [(7, 30), (30, 7)])
def test_dnc_scores_from_the_gram_matrix_equal_numpys_svd(shape):
    # the hand case above has K > b (4 rows, 2 columns); here both regimes against numpy's SVD
    S = np.random.default_rng(1).normal(size=shape)
    C = S - S.mean(axis=0)
    v = np.linalg.svd(C, full_matrices=False)[2][0]
    expected = (C @ v) ** 2
    assert np.allclose(rr.dnc_scores(torch.from_numpy(S.copy())).numpy(), expected, rtol=1e-9, atol=1e-12)


def test_dnc_keeps_the_intersection_over_its_subsamples():
    # 6 clients in R^40: x4 is off in coordinates 0–19, x5 in 20–39; one coordinate at a time
    # (b = 1) over 30 draws, each draw removes the 2 highest, and a client survives only if
    # it was never removed: the two outliers never are kept
    U = torch.zeros(6, 40, dtype=torch.float64)
    U[:4] = torch.linspace(-0.1, 0.1, 4, dtype=torch.float64).unsqueeze(1)
    U[4, :20] = 50.0
    U[5, 20:] = -50.0
    v = aggregate("dnc", U, ones(6), 2, robust.DnCParams(niters=30, b=1), generator=seeded(0))
    assert not v.kept[4] and not v.kept[5]
    # one draw sees one outlier's coordinates: the other one survives it
    one = aggregate("dnc", U, ones(6), 2, robust.DnCParams(niters=1, b=1), generator=seeded(0))
    assert bool(one.kept[4]) != bool(one.kept[5])


# ----------------------------------------------------------------------------- SignGuard, FLTrust, FLAME


def test_signguard_drops_a_sign_flipped_and_an_oversized_update():
    base = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 2.0, -1.0, 0.0])
    scale = [1.0, 1.2, 0.9, 1.1, 1.05]
    honest = [a * base for a in scale]
    U = np.array(honest + [-1.0 * base, 10.0 * base])  # x5 flips every sign, x6 is 10× longer
    # signs: honest and x6 share 6/8 positive, 1/8 zero, 1/8 negative; x5 has 1/8 positive, 6/8
    # negative: its features stand alone, the other six coincide (one cluster); x6's norm
    # 10‖base‖ > 3 × the median norm (1.05‖base‖): the norm filter drops it
    p = robust.SignGuardParams(fraction=1.0)
    v = aggregate("signguard", T(U), ones(7), params=p)
    assert v.kept.tolist() == [True] * 5 + [False, False]
    norms = np.linalg.norm(U, axis=1)
    med = np.median(norms)  # the fourth of 0.9, 1, 1, 1.05, 1.1, 1.2, 10 (× ‖base‖): 1.05‖base‖
    assert math.isclose(med, 1.05 * np.linalg.norm(base))
    clipped = [u * min(1.0, med / np.linalg.norm(u)) for u in honest]  # 1.2 and 1.1 shrink to 1.05
    assert close(v.aggregate, np.mean(clipped, axis=0))


def test_fltrust_weights_are_relu_cosines_and_each_update_takes_the_root_norm():
    g0 = T([1, 0])
    U = T([[2, 0], [0, 3], [-1, 0], [1, 1]])
    # cosines with g0: 1, 0, −1, 1/√2 → TS = 1, 0, 0, 1/√2; rescaled to ‖g0‖ = 1: (1, 0) and
    # (1, 1)/√2; Σ TS ĝ / Σ TS = ((1, 0) + (1/2, 1/2)) / (1 + 1/√2)
    _, _, ts = rr.fltrust(U, g0)
    assert close(ts, [1, 0, 0, 1 / math.sqrt(2)])
    v = aggregate("fltrust", U, ones(4), root=g0)
    assert close(v.aggregate, [1.5 / (1 + 1 / math.sqrt(2)), 0.5 / (1 + 1 / math.sqrt(2))])
    assert v.kept.tolist() == [True, False, False, True]
    # every cosine ≤ 0: the aggregate is 0 and nobody is kept
    v = aggregate("fltrust", T([[-1, 0], [0, 2]]), ones(2), root=g0)
    assert close(v.aggregate, [0, 0]) and not v.kept.any()


def test_flame_keeps_the_majority_cluster_and_clips_to_the_median_norm():
    honest = [[1, 1, 0], [1.1, 0.9, 0], [0.9, 1.1, 0.1], [2, 2, 0]]
    U = np.array(honest + [[-3, 0, 3], [0, -5, 5]], dtype=float)
    # cosine distances among the four honest updates ≤ 0.023, from them to the two others ≥ 1.39,
    # between those two 0.5: HDBSCAN (min_cluster_size 6//2 + 1 = 4) keeps the four, and the two,
    # too few for a cluster, fall out as noise
    v = aggregate("flame", T(U), ones(6), params=robust.FlameParams(lam=0.0))
    assert v.kept.tolist() == [True] * 4 + [False] * 2
    norms = np.linalg.norm(U, axis=1)  # √2, 1.4213, 1.4248, 2√2, 3√2, 5√2
    s_t = np.median(norms)  # (1.4248 + 2.8284)/2, the median of all six
    clipped = [u * min(1.0, s_t / np.linalg.norm(u)) for u in U[:4]]  # only (2, 2, 0) shrinks
    assert close(v.aggregate, np.mean(clipped, axis=0))
    # λ = 0.01 on 20 000 zero-mean coordinates: the added noise has std λ·S_t
    big = torch.cat([T(U), torch.zeros(6, 19_997, dtype=torch.float64)], dim=1)
    noisy = aggregate("flame", big, ones(6), params=robust.FlameParams(lam=0.01), generator=seeded(2)).aggregate
    assert abs(float(noisy[3:].std()) / (0.01 * s_t) - 1) < 0.02


def test_flame_on_the_models_matches_clustering_the_stacked_models():
    rng = np.random.default_rng(3)
    theta = rng.normal(size=5)
    U = rng.normal(size=(5, 5))
    M = U + theta  # the local models
    n = np.linalg.norm(M, axis=1)
    expected = np.clip(1 - (M @ M.T) / np.outer(n, n), 0, 2)
    np.fill_diagonal(expected, 0)
    assert np.allclose(rr.cosine_distances(T(U), T(theta), None), expected)
    with pytest.raises(ValueError, match="needs the global model"):
        aggregate("flame", T(U), ones(5), params=robust.FlameParams(lam=0.0, cluster_on="models"))


# ----------------------------------------------------------------------------- pre-aggregators


def test_bucketing_means_follow_the_generators_permutation():
    U = T([[0, 0], [2, 0], [0, 4], [6, 6], [10, -10]])
    w = T([1, 2, 3, 4, 5])
    perm = torch.randperm(5, generator=seeded(3)).tolist()  # what the same seed draws
    groups = [perm[0:2], perm[2:4], perm[4:5]]
    mixed = robust.preaggregate("bucketing", U, w, generator=seeded(3))
    assert [list(g) for g in mixed.groups] == groups
    X, wn = U.numpy(), w.numpy()
    assert close(mixed.updates, [X[g].mean(axis=0) for g in groups])
    assert close(mixed.weights, [wn[g].sum() for g in groups])
    weighted = robust.preaggregate("bucketing", U, w, params=robust.BucketingParams(weighted=True), generator=seeded(3))
    assert close(weighted.updates, [(wn[g, None] * X[g]).sum(0) / wn[g].sum() for g in groups])
    # the rule then sees ⌈5/2⌉ = 3 inputs: Krum with f = 1 on 3 is refused (2f + 2 = 4)
    assert robust.PREAGGREGATORS["bucketing"].inputs(5) == 3
    assert robust.DEFENCES["krum"].check(3, 1) == "krum needs 2f + 2 < K (K = 3, f = 1)"


def test_nnm_replaces_each_update_by_the_mean_of_its_k_minus_f_nearest():
    U = T([[0, 0], [1, 0], [3, 0], [10, 0]])
    # f = 1: the 3 nearest, itself included. 0: {0, 1, 3}; 1: {1, 0 (1), 3 (2)}; 3: {3, 1 (2),
    # 0 (3)}; 10: {10, 3 (7), 1 (9)} → 4/3, 4/3, 4/3, 14/3
    mixed = robust.preaggregate("nnm", U, T([1, 2, 3, 4]), 1)
    assert close(mixed.updates, [[4 / 3, 0], [4 / 3, 0], [4 / 3, 0], [14 / 3, 0]])
    assert close(mixed.weights, [1, 2, 3, 4])
    # an identical twin does not push an update out of its own neighbourhood
    twin = robust.preaggregate("nnm", T([[5, 5], [5, 5], [0, 0]]), ones(3), 2)
    assert close(twin.updates, [[5, 5], [5, 5], [0, 0]])


# ----------------------------------------------------------------------------- gossip


def test_one_clipped_gossip_step_by_hand():
    x = T([0, 0])
    X = T([[1, 0], [0, 2], [3, 4]])
    w = T([0.25, 0.25, 0.25])
    # τ = 1: (1, 0) stays, (0, 2) → (0, 1), (3, 4) → (0.6, 0.8); 0.25·(1.6, 1.8) = (0.4, 0.45)
    out = robust.clipped_gossip(x, X, w, 0.25, robust.ClippedGossipParams(tau=1.0))
    assert close(out, [0.4, 0.45])
    # adaptive (δ null): distances 1, 2, 5; the farthest is clipped to the second's, τ = 2:
    # (3, 4) → (1.2, 1.6); 0.25·((1, 0) + (0, 2) + (1.2, 1.6)) = (0.55, 0.9)
    assert close(robust.clipped_gossip(x, X, w, 0.25), [0.55, 0.9])
    # δ = 0.5: the two farthest (weights 0.25 + 0.25) are clipped to the nearest's distance, τ = 1
    out = robust.clipped_gossip(x, X, w, 0.25, robust.ClippedGossipParams(delta=0.5))
    assert close(out, [0.4, 0.45])
    # from x = (1, 1) with τ = 1 the node keeps 0.25 of itself: x + Σ w CLIP(x_j − x)
    # x_j − x: (0, −1) stays, (−1, 1) → (−1, 1)/√2, (2, 3) → (2, 3)/√13
    out = robust.clipped_gossip(T([1, 1]), X, w, 0.25, robust.ClippedGossipParams(tau=1.0))
    s2, s13 = math.sqrt(2), math.sqrt(13)
    assert close(out, [1 + 0.25 * (-1 / s2 + 2 / s13), 1 + 0.25 * (-1 + 1 / s2 + 3 / s13)])


def test_bridge_trims_b_neighbour_values_from_each_end_by_hand():
    x = T([20, 5])
    X = T([[1, 1], [2, -3], [10, 2], [-4, 0], [3, 100]])
    # the paper's: neighbours' column 0: 1, 2, 10, −4, 3 → drop 10 and −4 → (1 + 2 + 3 + own 20)/4 = 6.5
    #              column 1: 1, −3, 2, 0, 100 → drop 100 and −3 → (1 + 2 + 0 + own 5)/4 = 2
    assert close(robust.bridge_trimmed_mean(x, X, 1), [6.5, 2])
    # screen "all": column 0 of 20, 1, 2, 10, −4, 3 drops 20 and −4 → (1 + 2 + 10 + 3)/4 = 4;
    # column 1 of 5, 1, −3, 2, 0, 100 drops 100 and −3 → (5 + 1 + 2 + 0)/4 = 2
    p = robust.BridgeParams(screen="all")
    assert close(robust.bridge_trimmed_mean(x, X, 1, p), [4, 2])
    assert close(robust.bridge_trimmed_mean(x, X, 1, p, chunk=1), [4, 2])


# ----------------------------------------------------------------------------- limits


def test_each_rule_refuses_the_settings_it_cannot_run_with_its_reason():
    D = robust.DEFENCES
    assert D["krum"].check(10, 4) == "krum needs 2f + 2 < K (K = 10, f = 4)"
    assert D["krum"].check(11, 4) is None
    assert D["multi_krum"].check(10, 3, robust.MultiKrumParams(m=11)) == "multi_krum needs m ≤ K (K = 10, m = 11)"
    assert D["bulyan"].check(10, 2) == "bulyan needs K ≥ 4f + 3 (K = 10, f = 2)"
    assert D["bulyan"].check(11, 2) is None
    assert D["trimmed_mean"].check(4, 2) == "trimmed_mean needs 2b < K (K = 4, b = 2)"
    assert D["dnc"].check(3, 3) == "dnc needs ⌊c·f⌋ < K (K = 3, ⌊c·f⌋ = 3)"
    assert D["flame"].check(1, 0).startswith("flame needs K ≥ 2")
    assert D["signguard"].check(5, 0, robust.SignGuardParams(lower=3.0, upper=2.0)).startswith("signguard needs")
    assert D["trimmed_mean"].check(6, 0, robust.TrimmedMeanParams(beta=0.6)) == (
        "trimmed_mean.beta must be < 0.5 (got 0.6)"
    )
    assert D["signguard"].check(6, 0, robust.SignGuardParams(subset="all")) == (
        "signguard.subset must be one of block, random (got all)"
    )
    assert D["median"].check(5, 0, robust.DnCParams()) == "median takes NoParams, not DnCParams"
    assert robust.check_bridge(2, 1) == "bridge needs n_i ≥ 2b + 1 neighbours (n_i = 2, b = 1)"
    assert robust.check_bridge(3, 1) is None
    assert robust.PREAGGREGATORS["nnm"].check(3, 3) == "nnm needs f < K (K = 3, f = 3)"
    with pytest.raises(ValueError, match=r"krum needs 2f \+ 2 < K \(K = 5, f = 2\)"):
        aggregate("krum", T(KRUM_U), ones(5), 2)
    with pytest.raises(ValueError, match=r"bridge needs n_i ≥ 2b \+ 1"):
        robust.bridge_trimmed_mean(T([0, 0]), T([[1, 1], [2, 2]]), 1)
    with pytest.raises(ValueError, match="fltrust needs the server's root update"):
        aggregate("fltrust", T(KRUM_U), ones(5))
    with pytest.raises(ValueError, match="pass a torch.Generator"):
        robust.preaggregate("bucketing", T(KRUM_U), ones(5))
    with pytest.raises(ValueError, match="non-finite updates from clients"):
        aggregate("median", T([[0, 1], [math.nan, 0]]), ones(2))
    with pytest.raises(ValueError, match="float64"):
        aggregate("median", torch.zeros(3, 2), ones(3))
    with pytest.raises(ValueError, match="unknown defence"):
        aggregate("nope", T(KRUM_U), ones(5))


def test_the_registry_describes_every_rule():
    names = {"mean", "median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "bulyan"}
    names |= {"centered_clipping", "norm_clipping", "dnc", "signguard", "fltrust", "flame"}
    assert set(robust.DEFENCES) == names and set(robust.PREAGGREGATORS) == {"bucketing", "nnm"}
    for name, rule in robust.DEFENCES.items():
        assert rule.name == name and rule.cite
        assert is_dataclass(rule.params) and rule.params.__dataclass_params__.frozen
        assert all("help" in f.metadata for f in fields(rule.params))
        flags = name in {"krum", "multi_krum", "bulyan", "dnc", "signguard", "fltrust", "flame"}
        assert rule.flags == flags
        assert rule.needs_f == (name in {"trimmed_mean", "krum", "multi_krum", "bulyan", "dnc"})


# ----------------------------------------------------------------------------- determinism


def test_the_same_seed_gives_the_same_draws_and_another_seed_others():
    rng = np.random.default_rng(11)
    U = T(rng.normal(size=(12, 300)))
    w = ones(12)
    runs = [
        ("dnc", 2, robust.DnCParams(niters=3, b=20)),
        ("signguard", 0, robust.SignGuardParams(fraction=0.2, subset="random")),
        ("signguard", 0, robust.SignGuardParams(fraction=0.2)),
        ("norm_clipping", 0, robust.NormClippingParams(sigma=0.1)),
        ("flame", 0, robust.FlameParams(lam=0.1)),
    ]
    for name, f, p in runs:
        a = aggregate(name, U, w, f, p, generator=seeded(4))
        b = aggregate(name, U, w, f, p, generator=seeded(4))
        assert torch.equal(a.aggregate, b.aggregate), name
        assert a.kept is None or torch.equal(a.kept, b.kept), name
    for name in ("norm_clipping", "flame"):
        p = dict((n, q) for n, _, q in runs)[name]
        assert not torch.equal(
            aggregate(name, U, w, 0, p, generator=seeded(4)).aggregate,
            aggregate(name, U, w, 0, p, generator=seeded(5)).aggregate,
        )
    a = robust.preaggregate("bucketing", U, w, generator=seeded(4))
    b = robust.preaggregate("bucketing", U, w, generator=seeded(4))
    c = robust.preaggregate("bucketing", U, w, generator=seeded(5))
    assert torch.equal(a.updates, b.updates) and a.groups == b.groups and a.groups != c.groups
    # the global generator is left alone
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    aggregate("dnc", U, w, 2, robust.DnCParams(b=20), generator=seeded(4))
    assert torch.equal(torch.rand(1), before)


def test_chunking_changes_nothing():
    rng = np.random.default_rng(12)
    U = T(rng.normal(size=(11, 37)))
    w = T(rng.uniform(1, 5, size=11))
    for name, f in [("median", 0), ("trimmed_mean", 2), ("krum", 2), ("multi_krum", 2), ("bulyan", 2)]:
        a, b = aggregate(name, U, w, f), aggregate(name, U, w, f, chunk=5)
        assert close(a.aggregate, b.aggregate, 1e-12), name
    for name in ("geometric_median", "centered_clipping", "flame"):
        a, b = aggregate(name, U, w, 0, generator=seeded(1)), aggregate(name, U, w, 0, generator=seeded(1), chunk=4)
        assert close(a.aggregate, b.aggregate, 1e-10), name
    p = robust.SignGuardParams(fraction=1.0)
    assert close(
        aggregate("signguard", U, w, params=p).aggregate, aggregate("signguard", U, w, params=p, chunk=3).aggregate
    )
    assert close(robust.preaggregate("nnm", U, w, 2).updates, robust.preaggregate("nnm", U, w, 2, chunk=6).updates)


# ----------------------------------------------------------------------------- end to end


def test_the_robust_rules_ignore_four_far_outliers_that_move_the_mean():
    rng = np.random.default_rng(0)
    mu = np.array([1.0, -1.0, 2.0, 0.0, 0.5])
    honest = mu + 0.05 * rng.normal(size=(20, 5))
    outliers = mu + 50.0 + rng.normal(size=(4, 5))
    U = T(np.vstack([honest, outliers]))
    w, f = ones(24), 4
    target = honest.mean(axis=0)

    def miss(name, params=None):
        return float(np.linalg.norm(aggregate(name, U, w, f, params).aggregate.numpy() - target))

    assert miss("mean") > 15  # 4/24 of the way to the outliers, about 50·√5·4/24 ≈ 18.6
    for name in ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "bulyan"):
        assert miss(name) < 0.1, name
    # centered clipping from 0 with τ = 0.5: each step moves at most τ; the outliers pull
    # 4/24·τ/(20/24) = 0.1 off the honest centre at its fixed point
    assert miss("centered_clipping", robust.CenteredClippingParams(tau=0.5, L=30)) < 0.15
    kept = aggregate("multi_krum", U, w, f).kept
    assert kept[:20].all() and not kept[20:].any()
