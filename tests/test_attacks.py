"""Byzantine attacks (raysim/federation/attacks.py, model poisoning; raysim/federation/poisoning.py,
data poisoning): each crafted update against its paper's formula, computed by hand on tiny inputs
or independently with numpy/scipy here (Min-Max's and Min-Sum's γ by a brute-force search, Fang's
λ by its bound and an inline Krum, Mimic's direction by an eigendecomposition), the randomness
through the generator, the data transforms pixel by pixel, the metrics on hand examples, and each
``check``'s refusals."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from raysim.federation import attacks as A
from raysim.federation import poisoning as P


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def honest(n=6, d=5, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)) + np.linspace(0.5, -0.3, d)


def krum_np(U, f):
    """Krum (Blanchard et al. 2017), written here independently: the row whose n − f − 2 nearest
    others have the smallest sum of squared distances; its kept mask."""
    U = np.asarray(U)
    n = len(U)
    D = ((U[:, None, :] - U[None, :, :]) ** 2).sum(-1)
    scores = [np.sort(np.delete(D[i], i))[: n - f - 2].sum() for i in range(n)]
    kept = np.zeros(n, dtype=bool)
    kept[int(np.argmin(scores))] = True
    return kept


# ----------------------------------------------------------------------------- ALIE


@pytest.mark.parametrize(
    "n, m, s, cdf",
    [
        (50, 10, 16, 34 / 50),  # ⌊25 + 1⌋ − 10 = 16, Φ⁻¹(34/50) ≈ 0.4677
        (20, 4, 7, 13 / 20),  # ⌊10 + 1⌋ − 4 = 7, Φ⁻¹(0.65) ≈ 0.3853
        (5, 2, 1, 4 / 5),  # ⌊2.5 + 1⌋ − 2 = 1, Φ⁻¹(0.8) ≈ 0.8416
        (7, 3, 1, 6 / 7),  # ⌊3.5 + 1⌋ − 3 = 1, Φ⁻¹(6/7) ≈ 1.0676
    ],
)
def test_alie_z_is_the_papers_from_the_supporters_needed(n, m, s, cdf):
    assert n // 2 + 1 - m == s
    assert A.alie_z(n, m) == pytest.approx(norm.ppf(cdf), abs=1e-12)


def test_alie_z_by_hand_and_refused_for_a_majority():
    assert A.alie_z(50, 10) == pytest.approx(0.4677, abs=1e-4)
    with pytest.raises(ValueError, match="give z"):
        A.alie_z(10, 6)  # s = ⌊5 + 1⌋ − 6 = 0: the attackers need nobody


def test_alie_sends_mean_minus_z_std_of_the_benign_updates():
    H = t64([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]])
    M = torch.zeros(2, 2, dtype=torch.float64)
    # μ = (3, 4); deviations (−2, 0, 2) and (−2, −2, 4): σ² = 8/2 = 4 and 24/2 = 12 (n − 1 = 2)
    # n = 3 + 2 = 5, m = 2: s = 1, z = Φ⁻¹(4/5) ≈ 0.8416; μ − zσ ≈ (3 − 1.6832, 4 − 2.9154)
    z = norm.ppf(0.8)
    out = A.alie(H, M, A.ALIEParams(), gen())
    expected = t64([3 - 2 * z, 4 - math.sqrt(12) * z])
    assert out.updates.shape == (2, 2)
    assert torch.allclose(out.updates, expected.expand(2, 2), atol=1e-12)
    assert out.updates[0].tolist() == pytest.approx([1.3168, 1.0846], abs=1e-4)
    assert out.info["z"] == pytest.approx(z)
    # z given: μ − 1.5σ = (0, 4 − 1.5√12)
    given = A.alie(H, M, A.ALIEParams(z=1.5), gen()).updates
    assert torch.allclose(given, t64([0.0, 4 - 1.5 * math.sqrt(12)]).expand(2, 2))


def test_alie_with_its_own_estimate_uses_the_attackers_updates():
    H = t64([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0]])
    M = t64([[0.0, 0.0], [2.0, 4.0]])  # μ = (1, 2); σ² = 2/1 and 8/1
    z = norm.ppf(0.8)  # still n = 5, m = 2
    out = A.alie(H, M, A.ALIEParams(estimate="own"), gen()).updates
    assert torch.allclose(out, t64([1 - math.sqrt(2) * z, 2 - math.sqrt(8) * z]).expand(2, 2))


# ----------------------------------------------------------------------------- IPM, sign flip, Gaussian


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    H = t64([[1.0, 2.0], [3.0, -4.0]])  # mean (2, −1)
    M = torch.zeros(3, 2, dtype=torch.float64)
    assert A.ipm(H, M, A.IPMParams(epsilon=0.5), gen()).updates.tolist() == [[-1.0, 0.5]] * 3
    assert torch.allclose(A.ipm(H, M, A.IPMParams(), gen()).updates, t64([[-0.2, 0.1]] * 3))  # ε = 0.1


def test_sign_flip_sends_minus_s_times_its_own_update():
    M = t64([[1.0, -2.0], [0.5, 3.0]])
    assert A.sign_flip(None, M, A.SignFlipParams(s=2.0), gen()).updates.tolist() == [[-2.0, 4.0], [-1.0, -6.0]]
    assert A.sign_flip(None, M, A.SignFlipParams(), gen()).updates.tolist() == [[-1.0, 2.0], [-0.5, -3.0]]


def test_gaussian_noise_has_its_moments_and_comes_from_the_generator():
    M = torch.zeros(4000, 3, dtype=torch.float64)
    x = A.gaussian(None, M, A.GaussianParams(mu=0.5, sigma=2.0), gen(1)).updates.numpy()
    # 12 000 draws: the mean's standard error is 2/√12000 ≈ 0.018, the std's ≈ 2/√24000 ≈ 0.013
    assert abs(x.mean() - 0.5) < 0.08 and abs(x.std() - 2.0) < 0.06
    assert np.abs(x.mean(0) - 0.5).max() < 0.15  # each coordinate (4000 draws: 0.032)
    d = A.gaussian(None, M, A.GaussianParams(), gen(1)).updates.numpy()  # μ = 0, σ = 1
    assert abs(d.mean()) < 0.04 and abs(d.std() - 1.0) < 0.03
    again = A.gaussian(None, M, A.GaussianParams(mu=0.5, sigma=2.0), gen(1)).updates.numpy()
    other = A.gaussian(None, M, A.GaussianParams(mu=0.5, sigma=2.0), gen(2)).updates.numpy()
    assert np.array_equal(x, again) and not np.array_equal(x, other)


# ----------------------------------------------------------------------------- Min-Max, Min-Sum


def perturbation_np(H, kind):
    mu = H.mean(0)
    return {"std": -H.std(0, ddof=1), "unit_vec": -mu / np.linalg.norm(mu), "sign": -np.sign(mu)}[kind]


def feasible(H, g, p, objective):
    """Shejwalkar & Houmansadr's constraint at γ = g (a vector of γ), by direct norms."""
    mal = H.mean(0) + np.asarray(g)[..., None] * p  # (..., d)
    dist2 = ((mal[..., None, :] - H) ** 2).sum(-1)  # (..., n)
    pair = ((H[:, None] - H[None]) ** 2).sum(-1)
    if objective == "min_max":
        return dist2.max(-1) <= pair.max()
    return dist2.sum(-1) <= pair.sum(1).max()


def brute_gamma(H, p, objective, top=20.0):
    """The largest feasible γ in [0, top): a grid of 1e-3, then one of 1e-7 past its last point."""
    coarse = np.arange(0.0, top, 1e-3)
    ok = feasible(H, coarse, p, objective)
    last = int(np.flatnonzero(ok).max())
    assert ok[: last + 1].all()  # the feasible γ ≥ 0 are an interval from 0 (the constraint is convex in γ)
    fine = coarse[last] + np.arange(0.0, 1e-3, 1e-7)
    return fine[feasible(H, fine, p, objective)].max()


@pytest.mark.parametrize("objective", ["min_max", "min_sum"])
@pytest.mark.parametrize("kind", ["std", "unit_vec", "sign"])
def test_min_max_and_min_sum_find_the_largest_gamma_a_grid_finds(objective, kind):
    H = honest()
    params = A.MinMaxParams(perturbation=kind)
    out = getattr(A, objective)(t64(H), torch.zeros(3, 5, dtype=torch.float64), params, gen())
    gamma, p = out.info["gamma"], perturbation_np(H, kind)
    best = brute_gamma(H, p, objective)
    assert 0 < best < 2 * params.gamma_init - 1  # inside the search's reach
    assert best - 2 * params.tau <= gamma <= best + 1e-7  # the search stops within 2τ below γ*
    assert feasible(H, gamma, p, objective) and not feasible(H, gamma + 3 * params.tau, p, objective)
    assert np.allclose(out.updates.numpy(), np.tile(H.mean(0) + gamma * p, (3, 1)), atol=1e-12)


def test_min_sum_gamma_matches_its_closed_form():
    # Σ_i ‖μ + γp − ∇_i‖² = nγ²‖p‖² + Σ_i ‖μ − ∇_i‖² (the cross term vanishes about the mean), so
    # γ* = √((max_i Σ_j ‖∇_i − ∇_j‖² − Σ_i ‖μ − ∇_i‖²) / (n‖p‖²))
    H = honest(8, 4, seed=3)
    p = perturbation_np(H, "std")
    bound = ((H[:, None] - H[None]) ** 2).sum(-1).sum(1).max()
    spread = ((H - H.mean(0)) ** 2).sum()
    exact = math.sqrt((bound - spread) / (len(H) * (p @ p)))
    gamma = A.min_sum(t64(H), torch.zeros(1, 4, dtype=torch.float64), A.MinMaxParams(), gen()).info["gamma"]
    assert exact - 2e-5 <= gamma <= exact
    # the official code's threshold, min_i Σ_j ‖∇_i − ∇_j‖² (bound: code): a smaller γ
    low = ((H[:, None] - H[None]) ** 2).sum(-1).sum(1).min()
    exact_code = math.sqrt(max(0.0, low - spread) / (len(H) * (p @ p)))
    code = A.min_sum(t64(H), torch.zeros(1, 4, dtype=torch.float64), A.MinMaxParams(bound="code"), gen()).info["gamma"]
    assert exact_code - 2e-5 <= code <= exact_code and code < gamma


def test_the_search_is_algorithm_1s_halving():
    # ok(γ) ⇔ γ ≤ 3, from γ_init = 4: 4 ✗ → 2 ✓ → 3 ✓ → 3.5 ✗ → 3.25 ✗ → 3.125 ✗ → ... 3 + 2^-k
    tried = []

    def ok(g):
        tried.append(g)
        return g <= 3.0

    assert A.search_gamma(ok, 4.0, 0.1) == 3.0
    assert tried == [4.0, 2.0, 3.0, 3.5, 3.25, 3.125]  # stops when |γ_succ − γ| = 0.0625 ≤ τ
    assert A.search_gamma(lambda g: False, 10.0, 1e-5) == 0.0  # nothing feasible: μ itself


# ----------------------------------------------------------------------------- Fang


FANG_H = [
    # coordinate: 0 mean > 0, w_min > 0 | 1 mean > 0, w_min < 0 | 2 mean < 0, w_max > 0 |
    # 3 mean < 0, w_max < 0 | 4 mean = 0
    [1.0, -1.0, -1.0, -1.0, 1.0],
    [2.0, 2.0, -2.0, -2.0, -1.0],
    [3.0, 3.0, -3.0, -3.0, 2.0],
    [4.0, 4.0, 4.0, -4.0, -2.0],
]


@pytest.mark.parametrize("against", ["trimmed_mean", "median"])
@pytest.mark.parametrize(
    "b, intervals",
    [
        # s = sign(mean): (+, +, −, −, 0); w_min = (1, −1, ·, ·), w_max = (·, ·, 4, −1)
        # s > 0, w_min = 1 > 0: [1/b, 1]; w_min = −1: [−b, −1]; s < 0, w_max = 4: [4, 4b]; −1: [−1, −1/b]
        (2.0, [(0.5, 1.0), (-2.0, -1.0), (4.0, 8.0), (-1.0, -0.5)]),
        (3.0, [(1 / 3, 1.0), (-3.0, -1.0), (4.0, 12.0), (-1.0, -1 / 3)]),
    ],
)
def test_fang_against_trimmed_mean_and_median_deviates_against_each_coordinates_sign(against, b, intervals):
    H = t64(FANG_H)
    out = A.fang(H, torch.zeros(500, 5, dtype=torch.float64), A.FangParams(against=against, b=b), gen()).updates
    x = out.numpy()
    for j, (lo, hi) in enumerate(intervals):
        assert (x[:, j] >= lo).all() and (x[:, j] <= hi).all(), j
        assert x[:, j].min() < lo + 0.02 * (hi - lo) and x[:, j].max() > hi - 0.02 * (hi - lo), j  # uniform over it
    assert (x[:, 0] > 0).all() and (x[:, 0] <= H[:, 0].min().item()).all()  # below every benign value, same sign
    assert (x[:, 1] < 0).all() and (x[:, 2] > 0).all() and (x[:, 3] < 0).all()
    assert (x[:, 2] >= H[:, 2].max().item()).all() and (x[:, 3] >= H[:, 3].max().item()).all()  # above: s < 0
    assert (x[:, 4] == 0).all()  # no direction
    assert len(np.unique(x[:, 0])) == 500  # every attacker draws its own values
    same = A.fang(H, torch.zeros(500, 5, dtype=torch.float64), A.FangParams(against=against, b=b), gen()).updates
    assert torch.equal(out, same)


def fang_bound_np(H, m):
    """λ ≤ min_i Σ_{n − m − 2 nearest benign} ‖∇_l − ∇_i‖ / ((n − 2m − 1)√d) + max_i ‖∇_i‖/√d."""
    nh, d = H.shape
    n = nh + m
    dist = np.sqrt(((H[:, None] - H[None]) ** 2).sum(-1))
    near = [np.sort(np.delete(dist[i], i))[: n - m - 2].sum() for i in range(nh)]
    return min(near) / ((n - 2 * m - 1) * math.sqrt(d)) + np.linalg.norm(H, axis=1).max() / math.sqrt(d)


def test_fang_against_krum_halves_lambda_from_the_bound_until_krum_keeps_a_crafted_update():
    H = honest(8, 6, seed=1)
    m = 2
    s = np.sign(H.mean(0))
    bound = fang_bound_np(H, m)
    # the first λ = bound/2^k whose m copies of −λs Krum (f = m) selects
    k = next(k for k in range(60) if krum_np(np.vstack([np.tile(-bound / 2**k * s, (m, 1)), H]), m)[:m].any())
    calls = []

    def krum(U):
        calls.append(U.clone())
        return torch.from_numpy(krum_np(U.numpy(), m))

    out = A.fang(t64(H), torch.zeros(m, 6, dtype=torch.float64), A.FangParams(against="krum"), gen(), krum)
    lam = out.info["lambda"]
    assert lam == pytest.approx(bound / 2**k, rel=1e-12) and len(calls) == k + 1
    U = out.updates.numpy()
    assert np.allclose(U[0], -lam * s, atol=1e-15)
    assert np.abs(U[1:] - U[0]).max() <= 1e-5 / 6 and not np.array_equal(U[1], U[0])  # ε/d noise
    assert krum_np(np.vstack([U, H]), m)[:m].any()  # the crafted updates, sent, are what Krum keeps
    assert torch.equal(calls[0][:m], t64(np.tile(-bound * s, (m, 1)))) and torch.equal(calls[0][m:], t64(H))


def test_fang_against_krum_gives_up_below_the_threshold_and_sends_the_attackers_own_updates():
    H, M = t64(honest(8, 6, seed=1)), t64(honest(2, 6, seed=9))

    def never(U):  # keeps only the last (honest) row
        kept = torch.zeros(U.shape[0], dtype=torch.bool)
        kept[-1] = True
        return kept

    out = A.fang(H, M, A.FangParams(against="krum", threshold=1e-3), gen(), never)
    assert torch.equal(out.updates, M) and out.info["lambda"] == 0.0
    # a defence that answers with the indices it kept is understood too
    out = A.fang(H, M, A.FangParams(against="krum"), gen(), lambda U: torch.tensor([0]))
    assert out.info["lambda"] == pytest.approx(fang_bound_np(H.numpy(), 2))
    with pytest.raises(ValueError, match="aggregator"):
        A.fang(H, M, A.FangParams(against="krum"), gen())


# ----------------------------------------------------------------------------- Mimic


MIMIC_H = [[-3.0, 0.1], [-1.0, 0.0], [0.5, -0.1], [4.0, 0.0], [0.0, 0.05]]  # spread along e1


def test_mimic_copies_the_honest_update_farthest_along_the_top_direction():
    H = t64(MIMIC_H)
    out = A.mimic(H, torch.zeros(3, 2, dtype=torch.float64), A.MimicParams(), gen())
    z = out.state.z.numpy()
    assert abs(z[0]) > 0.999 and np.linalg.norm(z) == pytest.approx(1.0)  # ±e1, the obvious direction
    chosen = 3 if z[0] > 0 else 0  # the largest ∇_i·z: x = 4 along +e1, x = −3 along −e1
    assert out.state.target == chosen and out.info["target"] == chosen
    assert torch.equal(out.updates, H[chosen].expand(3, 2))
    assert out.state.rounds == 1 and torch.allclose(out.state.mu, H.mean(0))


def test_mimic_fixes_its_target_after_the_warmup_and_follows_the_client_id():
    H = t64(MIMIC_H)
    first = A.mimic(H, torch.zeros(2, 2, dtype=torch.float64), A.MimicParams(warmup=1), gen(), ids=[10, 11, 12, 13, 14])
    target = first.state.target
    assert target in (10, 13)
    # round 2: other values, the same clients in another order; the target's update is copied
    H2 = t64([[9.0, 0.0], [-9.0, 0.0], [0.0, 0.0], [1.0, 1.0], [2.0, 0.0]])
    ids2 = [14, 13, 12, 11, 10]
    second = A.mimic(H2, torch.zeros(2, 2, dtype=torch.float64), A.MimicParams(warmup=1), gen(), first.state, ids2)
    assert second.state.target == target and torch.equal(second.state.z, first.state.z)
    assert torch.equal(second.updates[0], H2[ids2.index(target)]) and second.state.rounds == 2
    # the target not sampled: chosen again along z, kept
    ids3 = [20, 21, 22, 23, 24]
    third = A.mimic(H2, torch.zeros(1, 2, dtype=torch.float64), A.MimicParams(warmup=1), gen(), second.state, ids3)
    expect = ids3[int(np.argmax(H2.numpy() @ first.state.z.numpy()))]
    assert third.state.target == expect and torch.equal(third.updates[0], H2[ids3.index(expect)])


def test_mimic_warmup_averages_z_towards_the_top_principal_direction():
    rng = np.random.default_rng(4)
    top = np.array([0.6, 0.8, 0.0])
    state, p = None, A.MimicParams(warmup=4)
    for t in range(4):  # during the warm-up the target is chosen again every round
        H = rng.normal(size=(30, 3)) * 0.2 + rng.normal(size=(30, 1)) * 3.0 * top
        out = A.mimic(t64(H), torch.zeros(1, 3, dtype=torch.float64), p, gen(t), state)
        state = out.state
        assert out.state.target == int(np.argmax(H @ state.z.numpy()))
    C = np.cov(H.T)
    v = np.linalg.eigh(C)[1][:, -1]
    assert abs(state.z.numpy() @ v) > 0.995 and abs(state.z.numpy() @ top) > 0.99
    assert state.rounds == 4


# ----------------------------------------------------------------------------- detection


def test_detection_precision_and_recall_by_hand_with_the_0_over_0_cases():
    kept = [True, False, False, True, True]
    bad = [False, False, True, True, False]
    # flagged {1, 2}, malicious {2, 3}: one hit; precision 1/2, recall 1/2
    assert A.detection(kept, bad) == (0.5, 0.5)
    assert A.detection([False, False, True], [True, True, False]) == (1.0, 1.0)
    assert A.detection([False, True, True], [True, True, False]) == (1.0, 0.5)  # flagged {0}, missed 1
    p, r = A.detection([True, True, True], [True, False, False])  # nobody flagged: precision 0/0
    assert math.isnan(p) and r == 0.0
    p, r = A.detection([False, True, True], [False, False, False])  # nobody malicious: recall 0/0
    assert p == 0.0 and math.isnan(r)
    p, r = A.detection(None, [False, False])  # a defence that flags no one, no attacker
    assert math.isnan(p) and math.isnan(r)


# ----------------------------------------------------------------------------- registry and checks


def test_every_attack_is_called_the_same_way_through_the_registry():
    H, M = t64(honest(8, 4)), t64(honest(2, 4, seed=5))
    assert set(A.ATTACKS) == {"gaussian", "sign_flip", "alie", "ipm", "min_max", "min_sum", "fang", "mimic"}
    for name, attack in A.ATTACKS.items():
        p = attack.Params()
        assert attack.check(p, 10, 2) is None, name
        out = attack(H if attack.omniscient(p) else None, M, p, gen(), state=None)
        assert out.updates.shape == (2, 4) and out.updates.dtype == torch.float64, name
        assert attack.paper
    assert not A.ATTACKS["gaussian"].omniscient(A.GaussianParams()) and A.ATTACKS["ipm"].omniscient(A.IPMParams())
    fang = A.ATTACKS["fang"]
    assert fang.needs_defence(A.FangParams(against="krum")) and not fang.needs_defence(A.FangParams())
    krum = fang(H, M, A.FangParams(against="krum"), gen(), aggregator=lambda U: torch.from_numpy(krum_np(U, 2)))
    assert krum.info["lambda"] > 0
    assert A.ATTACKS["mimic"].stateful and A.ATTACKS["mimic"](H, M, A.MimicParams(), gen()).state.rounds == 1


@pytest.mark.parametrize(
    "name, params, n, m, message",
    [
        ("gaussian", A.GaussianParams(sigma=-1.0), 10, 2, "gaussian.sigma must be ≥ 0.0 (got -1.0)"),
        ("sign_flip", A.SignFlipParams(s=0.0), 10, 2, "sign_flip.s must be > 0.0 (got 0.0)"),
        ("alie", A.ALIEParams(estimate="all"), 10, 2, "alie.estimate must be one of benign, own (got all)"),
        ("alie", A.ALIEParams(), 10, 6, "alie.z must be given when the attackers are a majority"),
        ("alie", A.ALIEParams(estimate="own"), 10, 1, "alie.estimate: own needs at least 2 attackers"),
        ("alie", A.ALIEParams(), 3, 2, "alie.estimate: benign needs at least 2 honest clients"),
        ("ipm", A.IPMParams(epsilon=0.0), 10, 2, "ipm.epsilon must be > 0.0 (got 0.0)"),
        ("ipm", A.IPMParams(), 2, 2, "ipm: needs at least 1 honest clients in a round (got n − m = 0)"),
        (
            "min_max",
            A.MinMaxParams(perturbation="noise"),
            10,
            2,
            "min_max.perturbation must be one of std, unit_vec, sign (got noise)",
        ),
        ("min_sum", A.MinMaxParams(tau=0.0), 10, 2, "min_sum.tau must be > 0.0 (got 0.0)"),
        ("min_max", A.MinMaxParams(), 3, 2, "min_max: needs at least 2 honest clients in a round (got n − m = 1)"),
        ("fang", A.FangParams(against="mean"), 10, 2, "fang.against must be one of trimmed_mean, median, krum"),
        ("fang", A.FangParams(b=1.0), 10, 2, "fang.b must be > 1.0 (got 1.0)"),
        ("fang", A.FangParams(against="krum"), 5, 2, "fang.against: krum needs n > 2m + 1 clients in a round"),
        ("mimic", A.MimicParams(warmup=0), 10, 2, "mimic.warmup must be ≥ 1 (got 0)"),
        ("mimic", A.MimicParams(), 10, 0, "mimic: needs at least one attacker in a round (got m = 0)"),
        ("ipm", A.GaussianParams(), 10, 2, "ipm: its options are IPMParams, not GaussianParams"),
    ],
)
def test_check_refuses_an_invalid_setting_in_one_line_naming_it(name, params, n, m, message):
    got = A.ATTACKS[name].check(params, n, m)
    assert got is not None and got.startswith(message) and "\n" not in got, got


def test_check_accepts_the_limits_themselves():
    assert A.ATTACKS["fang"].check(A.FangParams(against="krum"), 6, 2) is None  # 6 > 5
    assert A.ATTACKS["fang"].check(A.FangParams(), 3, 2) is None  # trimmed mean: one honest client
    assert A.ATTACKS["alie"].check(A.ALIEParams(), 10, 5) is None  # s = 6 − 5 = 1
    assert A.ATTACKS["alie"].check(A.ALIEParams(z=1.0), 10, 6) is None  # z given: no supporters needed
    assert A.ATTACKS["gaussian"].check(A.GaussianParams(), 2, 2) is None  # needs nobody honest


# ----------------------------------------------------------------------------- data poisoning


def test_flip_labels_reverse_and_target_pairs():
    y = torch.tensor([0, 3, 9, 5])
    assert P.flip_labels(y, 10).tolist() == [9, 6, 0, 4]  # C − 1 − y
    assert P.flip_labels(torch.tensor([1, 7, 2, 1]), 10, "target", [(1, 7), (7, 1)]).tolist() == [7, 1, 2, 7]
    assert y.tolist() == [0, 3, 9, 5]  # not in place
    with pytest.raises(ValueError, match="reverse or target"):
        P.flip_labels(y, 10, "random")


def test_stamp_writes_the_pattern_pixel_by_pixel():
    x = torch.zeros(2, 1, 5, 5)
    plus = P.stamp(x, P.pattern("plus", 3))  # bottom-right corner: rows and columns 2..4
    expected = [
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 0, 1, 0],
    ]
    assert plus[0, 0].tolist() == expected and plus[1, 0].tolist() == expected
    assert x.abs().sum() == 0  # not in place
    ones = torch.ones(1, 5, 5)  # (N, H, W), a 2×2 square at (1, 0) of value 0.5
    sq = P.stamp(ones, P.pattern("square", 2), (1, 0), 0.5)
    assert sq[0].tolist() == [
        [1, 1, 1, 1, 1],
        [0.5, 0.5, 1, 1, 1],
        [0.5, 0.5, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
    ]
    flat = P.stamp(torch.zeros(2, 25), P.pattern("plus", 3), image_shape=(1, 5, 5))  # (N, D)
    assert torch.equal(flat.view(2, 1, 5, 5), plus)
    rgb = P.stamp(torch.zeros(1, 3, 5, 5), P.pattern("square", 1), (0, 4), (0.1, 0.2, 0.3))  # a value per channel
    assert rgb[0, :, 0, 4].tolist() == pytest.approx([0.1, 0.2, 0.3]) and rgb.sum().item() == pytest.approx(0.6)
    with pytest.raises(ValueError, match="does not fit"):
        P.stamp(x, P.pattern("square", 3), (3, 3))
    with pytest.raises(ValueError, match="odd size"):
        P.pattern("plus", 4)


def test_poison_stamps_and_relabels_the_fraction_drawn():
    x = torch.rand(20, 1, 5, 5, generator=gen(3))
    y = torch.arange(20) % 4
    trigger = P.place(P.pattern("square", 2), None, (5, 5))  # rows and columns 3, 4
    xs, ys, idx = P.poison(x, y, 3, 0.25, gen(7), trigger)
    assert len(idx) == 5 and len(set(idx.tolist())) == 5  # ⌊0.25·20⌋ distinct samples
    rest = [i for i in range(20) if i not in set(idx.tolist())]
    assert (ys[idx] == 3).all() and torch.equal(ys[rest], y[rest]) and torch.equal(xs[rest], x[rest])
    assert (xs[idx][:, 0, 3:, 3:] == 1).all() and torch.equal(xs[idx][:, 0, :3], x[idx][:, 0, :3])
    assert torch.equal(P.poison(x, y, 3, 0.25, gen(7), trigger)[2], idx)  # the generator decides
    assert len(P.poison(x, y, 3, 0.33, gen(7), trigger)[2]) == 6  # ⌊6.6⌋


def test_dba_parts_are_the_official_layout_and_their_union_is_the_global_trigger():
    parts = P.dba_parts((28, 28))  # MNIST: 1×4 bars, gap 2: rows 0 and 3, columns 0 and 6
    pixels = [sorted(map(tuple, p.nonzero().tolist())) for p in parts]
    assert pixels == [
        [(0, 0), (0, 1), (0, 2), (0, 3)],
        [(0, 6), (0, 7), (0, 8), (0, 9)],
        [(3, 0), (3, 1), (3, 2), (3, 3)],
        [(3, 6), (3, 7), (3, 8), (3, 9)],
    ]
    cifar = P.dba_parts((32, 32), size=6, gap=3)  # rows 0 and 4, columns 0 and 9
    assert [tuple(p.nonzero()[0].tolist()) for p in cifar] == [(0, 0), (0, 9), (4, 0), (4, 9)]
    glob = P.union(parts)
    assert int(glob.sum()) == 16 and all(bool(glob[r, c]) for p in pixels for r, c in p)
    assert torch.equal(P.dba_local(parts, 5), parts[1]) and torch.equal(P.dba_local(parts, 2), parts[2])
    x = torch.zeros(1, 1, 28, 28)
    each = x
    for p in parts:  # the attackers' parts stamped one after the other = the global trigger at once
        each = P.apply(each, p)
    assert torch.equal(each, P.apply(x, glob))
    square = P.place(P.pattern("square", 4), (1, 1), (6, 6))
    rows = P.split_trigger(square, 4)  # a 4×4 square in 4: its rows
    assert [sorted({r for r, _ in p.nonzero().tolist()}) for p in rows] == [[1], [2], [3], [4]]
    assert torch.equal(P.union(rows), square) and sum(int(p.sum()) for p in rows) == 16
    assert [int(p.sum()) for p in P.split_trigger(P.place(P.pattern("plus", 3), (0, 0), (3, 3)), 2)] == [3, 2]


def test_boost_replaces_the_model_when_the_others_cancel():
    delta = t64([1.0, -2.0])
    assert P.boost(delta, clients=10, server_lr=0.5).tolist() == [20.0, -40.0]  # γ = 10/0.5
    assert P.boost(delta, gamma=3.0).tolist() == [3.0, -6.0]
    # G + η/n (γΔ + 0 + ... + 0) = G + Δ = X with γ = n/η: n = 4, η = 1
    G = t64([0.5, 0.5])
    assert torch.allclose(G + 1.0 / 4 * P.boost(delta, clients=4), G + delta)
    with pytest.raises(ValueError, match="gamma"):
        P.boost(delta)


def test_attack_success_rate_leaves_out_the_target_class():
    pred = torch.tensor([2, 2, 0, 2, 1])
    y = torch.tensor([0, 2, 1, 3, 1])
    # target 2: input 1 (true 2) left out; of inputs 0, 2, 3, 4, inputs 0 and 3 predicted 2: 2/4
    assert P.attack_success_rate(pred, y, 2) == 0.5
    assert P.attack_success_rate(torch.tensor([1, 1]), torch.tensor([0, 0]), 1) == 1.0
    assert math.isnan(P.attack_success_rate(torch.tensor([2, 0]), torch.tensor([2, 2]), 2))
