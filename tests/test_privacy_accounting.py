"""raysim's ε (raysim/federation/privacy.py) against references it did not compute: figures published with
their settings, dp_accounting's PLD accountant and Opacus's RDP code on the same mechanism, and
the Rényi DP of the Poisson-subsampled Gaussian written out here by hand.

The hand reference:

- RDP at an integer order α (Mironov, Talwar & Zhang, "Rényi Differential Privacy of the Sampled
  Gaussian Mechanism", 2019, Section 3.3): ε(α) = 1/(α−1) · log Σ_{k=0}^{α} C(α,k) (1−q)^{α−k}
  q^k exp((k²−k)/(2σ²)). At other orders it is the same quantity, 1/(α−1) · log E_{z~N(0,σ²)}
  [((1−q) + q·exp((2z−1)/(2σ²)))^α], integrated numerically.
- (ε, δ) from RDP: the conversion dp_accounting uses (Canonne, Kamath & Steinke 2020,
  Proposition 12; Balle et al. 2020, Eq. 20), ε = min over orders of
  ρ(α) + log(1 − 1/α) − log(αδ)/(α − 1), over dp_accounting's default orders (1.1 to 10.9 by
  0.1, 11 to 63, 128 to 1024), so that a difference can only come from the RDP itself.
- The moments accountant of Abadi et al. (and TensorFlow Privacy's older get_privacy_spent)
  converts with the classic bound ρ(α) + log(1/δ)/(α − 1) (Mironov 2017, Proposition 3). That
  one reproduces the published figures below, which lets those figures be checked at all.

Sampling: ``accounting: poisson`` and level-sample DP-SGD are Poisson-subsampled Gaussians with
add/remove neighbours; ``accounting: sampled`` with K = N is the plain Gaussian of sensitivity 2C,
whose RDP is α·2/z² a round.
"""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from raysim.federation import privacy

DELTA = 1e-5
GRID = [1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def rdp_int(alpha: int, q: float, sigma: float) -> float:
    """The Poisson-subsampled Gaussian's RDP at integer order ``alpha``: the closed form, in log space."""
    if q == 1.0:
        return alpha / (2 * sigma**2)
    logs = [
        math.log(math.comb(alpha, k)) + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)
        for k in range(alpha + 1)
    ]
    top = max(logs)
    return (top + math.log(sum(math.exp(t - top) for t in logs))) / (alpha - 1)


def rdp_integral(alpha: float, q: float, sigma: float) -> float:
    """The same RDP at any order > 1, from its definition, E over N(0, σ²) of the likelihood
    ratio to the power α, integrated numerically."""

    def integrand(z):
        ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
        return math.exp(stats.norm.logpdf(z, scale=sigma) + alpha * ratio)

    value, _ = integrate.quad(
        integrand, -40 * sigma, alpha + 40 * sigma, points=[0.0, 0.5, alpha], limit=200, epsabs=0, epsrel=1e-12
    )
    return math.log(value) / (alpha - 1)


def tight_conversion(rdp: float, alpha: float) -> float:
    """ε at DELTA from RDP ``rdp`` at order ``alpha``: Canonne, Kamath & Steinke's bound."""
    return rdp + math.log1p(-1 / alpha) - math.log(DELTA * alpha) / (alpha - 1)


def classic_conversion(rdp: float, alpha: float) -> float:
    """ε at DELTA from RDP at ``alpha``: Mironov's bound, the moments accountant's."""
    return rdp + math.log(1 / DELTA) / (alpha - 1)


def hand_epsilon(q: float, sigma: float, steps: int, convert=tight_conversion, orders=GRID) -> float:
    """min over ``orders`` of ``convert``(steps·RDP(α), α): integer orders by the closed form;
    fractional ones (below 11) by the integral, searched within one of the best integer order
    (ε(α) has one minimum in α for these mechanisms)."""
    ints = [a for a in orders if float(a).is_integer()]
    eps = {a: convert(steps * rdp_int(int(a), q, sigma), a) for a in ints}
    best = min(eps, key=eps.get)
    for a in orders:
        if not float(a).is_integer() and abs(a - best) < 1:
            eps[a] = convert(steps * rdp_integral(a, q, sigma), a)
    return min(eps.values())


def one_dp_sgd_client(n: int, batch: int, rounds: int, epochs: int, sigma: float) -> float:
    """raysim's ε of one DP-SGD client (``client_epsilons``)."""
    return float(privacy.client_epsilons(np.array([rounds]), np.array([n]), epochs, batch, sigma, DELTA)[0])


def gaussian_exact_epsilon(mu: float) -> float:
    """The exact ε at DELTA of a Gaussian mechanism with sensitivity/σ = μ (Balle & Wang, ICML
    2018, Theorem 8): δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), solved for ε."""

    def excess(e):
        return stats.norm.cdf(mu / 2 - e / mu) - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu) - DELTA

    return optimize.brentq(excess, 0.0, 100.0)


# --- the reference itself -------------------------------------------------------------------


def test_the_closed_form_and_the_integral_agree_at_integer_orders():
    for alpha in (2, 3, 5, 10, 20):
        assert rdp_int(alpha, 0.1, 1.1) == pytest.approx(rdp_integral(alpha, 0.1, 1.1), rel=1e-9)
    # q = 1: the plain Gaussian, α/(2σ²); q → 0: nothing is learnt
    assert rdp_int(4, 1.0, 2.0) == 0.5
    assert rdp_int(4, 1e-12, 2.0) == pytest.approx(0.0, abs=1e-9)


# --- 1. published figures -------------------------------------------------------------------


def test_abadi_et_al_s_moments_accountant_example():
    """Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016), Section 3.1: "with
    L = 0.01N, σ = 4, δ = 10⁻⁵, and T = 10000, we have ε ≈ 1.26 using the moments accountant"
    (ε ≈ 9.34 by strong composition). The moments accountant's log moments at λ ≤ 32 are the
    RDP at orders λ + 1 ≤ 33 with the classic conversion; by hand that gives 1.2586.

    raysim's ε must be below 1.26 (a tighter conversion of the same RDP) and close to it: the two
    conversions differ at order α by log α/(α−1) + log(α/(α−1)), 0.21 to 0.24 at the orders 17 to
    20 where the minima fall, so raysim may be up to 0.25 lower (+0.005 for the paper's rounding)."""
    assert hand_epsilon(0.01, 4.0, 10000, classic_conversion, range(2, 34)) == pytest.approx(1.26, abs=0.005)
    rounds = privacy.epsilon(10000, 100, 1, 4.0, DELTA, "poisson")  # q = K/N = 0.01, one step a round
    steps = one_dp_sgd_client(10000, 100, 100, 1, 4.0)  # q = 100/10000, 100 steps a round
    for eps in (rounds, steps):
        assert 1.26 - 0.25 <= eps <= 1.26 + 0.005


@pytest.mark.parametrize("sigma,epochs,published,conversion_gap", [(1.12, 60, 2.92, 0.45), (1.2, 10, 1.20, 0.3)])
def test_tensorflow_privacys_mnist_tutorial_figures(sigma, epochs, published, conversion_gap):
    """TensorFlow Privacy, tutorials/README.md, "Select Parameters" (privacy ε at δ = 1e-5):
    noise multiplier 1.12 for 60 epochs gives 2.92 (the default setting), 1.2 for 10 epochs 1.20;
    tutorials/mnist_dpsgd_tutorial.py: batch 256 of 60 000 (q = 256/60000), 60000 // 256 = 234
    steps an epoch, the classic conversion (rdp_accountant.get_privacy_spent of the time). The
    hand RDP with that conversion gives 2.9199 and 1.1978. raysim, with the tighter conversion,
    must be below and within that conversion's gain at the optimal orders, log α/(α−1) +
    log(α/(α−1)): 0.43 at α = 8 (first row), 0.26 at α = 15 (second). (The table's third row,
    σ = 0.6, has its optimum at a fractional order below 3, which the tutorial's grid and
    this one do not share, so it is left out.)"""
    steps = epochs * (60000 // 256)
    assert hand_epsilon(256 / 60000, sigma, steps, classic_conversion) == pytest.approx(published, abs=0.005)
    eps = privacy.epsilon(steps, 60000, 256, sigma, DELTA, "poisson")
    assert published - conversion_gap <= eps <= published + 0.005


# --- 2. a second accountant: PLD (tight) on the same DpEvent --------------------------------

PLD_SLACK = 0.15


def pld_epsilon(event) -> float:
    """dp_accounting's PLD accountant (pessimistic, discretization 1e-3) on ``event``."""
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize(
    "rounds,clients,k,z", [(10000, 100, 1, 4.0), (14040, 60000, 256, 1.12)], ids=["abadi", "tf-tutorial"]
)
def test_poisson_accounting_is_above_the_pld_accountant_and_within_its_slack(rounds, clients, k, z):
    """PLD accounting is tight up to its discretization; RDP is an upper bound. So
    pld ≤ raysim ≤ pld·(1 + 0.15). The slack: on the plain Gaussian, where the exact ε is known
    (next test), the RDP route costs 8 to 9 % at ε from 1 to 4, and subsampling at these rates
    keeps it there (measured: 7.9 % and 8.6 %). 15 % leaves room for that and for the PLD's
    discretization."""
    import dp_accounting as dpa

    round_ = dpa.PoissonSampledDpEvent(k / clients, dpa.GaussianDpEvent(z))
    pld = pld_epsilon(dpa.SelfComposedDpEvent(round_, rounds))
    eps = privacy.epsilon(rounds, clients, k, z, DELTA, "poisson")
    assert pld <= eps <= pld * (1 + PLD_SLACK)


@pytest.mark.parametrize("rounds,z", [(1, 4.0), (10, 8.0)])
def test_sampled_with_every_client_is_the_gaussian_within_the_conversions_cost(rounds, z):
    """K = N under ``sampled``: no subsampling, T rounds of the Gaussian with sensitivity 2C and
    noise zC, one Gaussian with μ = 2√T/z, whose exact ε is Balle & Wang's. PLD (on the same
    mechanism as a Gaussian event of multiplier z/2: dp_accounting's PLD does not take
    sampling without replacement) matches it; raysim's RDP ε is above it by the conversion's
    cost, 5 to 10 % here (8.7 % and 8.3 %)."""
    import dp_accounting as dpa

    exact = gaussian_exact_epsilon(2 * math.sqrt(rounds) / z)
    pld = pld_epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z / 2), rounds))
    eps = privacy.epsilon(rounds, 20, 20, z, DELTA, "sampled")
    assert exact <= pld <= exact * (1 + 1e-3)
    assert exact * 1.05 <= eps <= exact * 1.10


# --- 2b. Opacus's RDP analysis (a separate implementation of the same RDP) ------------------


def opacus_epsilon(q: float, sigma: float, steps: int) -> float:
    from opacus.accountants.analysis import rdp as opacus_rdp

    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=GRID)
    return float(opacus_rdp.get_privacy_spent(orders=GRID, rdp=rdp, delta=DELTA)[0])


def test_opacus_rdp_gives_raysims_epsilon():
    """Opacus's ``accountants.analysis.rdp`` on the same orders and conversion: the same ε where
    the optimum is an integer order (Abadi's setting: 17); where it is fractional (one client,
    n = 100, B = 10, 10 steps, σ = 1.1: order 5.3) raysim is at most 1e-4 above, never below
    (see test_fractional_orders_...)."""
    assert privacy.epsilon(10000, 100, 1, 4.0, DELTA, "poisson") == pytest.approx(
        opacus_epsilon(0.01, 4.0, 10000), rel=1e-9
    )
    reference = opacus_epsilon(0.1, 1.1, 10)
    assert reference <= one_dp_sgd_client(100, 10, 1, 1, 1.1) <= reference * (1 + 1e-4)


# --- 3. by hand -----------------------------------------------------------------------------


def test_poisson_client_accounting_matches_the_hand_rdp():
    """20 rounds, 5 of 100 clients (q = 0.05), z = 2: the optimum is the integer order 21, where
    the closed form is exact: the same ε to rounding (0.59991)."""
    assert privacy.epsilon(20, 100, 5, 2.0, DELTA, "poisson") == pytest.approx(hand_epsilon(0.05, 2.0, 20), rel=1e-9)


def test_adaptive_clipping_is_the_poisson_rdp_of_both_noisy_sums_together():
    """Andrew et al.'s adaptive clipping, z = 1, count noise σ_b = 0.6, 10 of 100 clients a round
    (q = 0.1), 100 rounds. By hand: the update is noised at z_Δ = (z⁻² − (2σ_b)⁻²)^−½ and the
    centred count (sensitivity ½) at σ_b/½ = 1.2; the two Gaussian queries on one sample are one
    Gaussian of RDP α/2 · (z_Δ⁻² + 1.2⁻²) = α/(2z²) before subsampling. So ε is the hand RDP of
    the subsampled Gaussian at σ = 1 — what raysim logs as dp_epsilon for this run's settings."""
    from raysim.scenario.sections import PrivacyCfg

    z, sigma_b = 1.0, 0.6
    z_delta = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    together = (z_delta**-2 + (sigma_b / 0.5) ** -2) ** -0.5
    assert together == pytest.approx(1.0, rel=1e-12)
    cfg = PrivacyCfg(noise_multiplier=z, target_quantile=0.5, count_noise=sigma_b)
    assert privacy.update_multiplier(cfg, 10) == pytest.approx(z_delta, rel=1e-12)
    eps = privacy.epsilon(100, 100, 10, privacy.accountant_multiplier(cfg, 10), DELTA, "poisson")
    hand = hand_epsilon(0.1, together, 100)  # 7.8993; the optimum is a fractional order,
    assert hand <= eps <= hand * (1 + 1e-3)  # where dp_accounting is 6e-4 above (see below)


@pytest.mark.parametrize("rounds,z", [(10, 1.0), (100, 5.0), (1, 0.8)])
def test_sampled_with_every_client_is_alpha_two_over_z_squared_a_round(rounds, z):
    """K = N: each round is the Gaussian of sensitivity 2C and noise zC, RDP α·2/z² at every
    order, T·α·2/z² after T rounds, converted over the same orders."""
    hand = min(tight_conversion(rounds * 2 * a / z**2, a) for a in GRID)
    assert privacy.epsilon(rounds, 20, 20, z, DELTA, "sampled") == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize(
    "n,batch,rounds,sigma,tolerance",
    [
        (100, 10, 1, 1.1, 1e-4),  # q = 0.1, 10 steps; optimum at order 5.3
        (100, 10, 5, 1.0, 1e-3),  # 50 steps; optimum at order 3.7
    ],
)
def test_fractional_orders_dp_sgd_matches_the_hand_rdp_from_just_above(n, batch, rounds, sigma, tolerance):
    """One DP-SGD client, n samples at batch B for ``rounds`` rounds of one epoch:
    rounds·⌈n/B⌉ Poisson-subsampled Gaussian steps at q = B/n. The optimum falls at a
    fractional order, where the hand RDP is the integral. Found here: raysim's ε is above
    the exact one, by 2e-5 (first case) and 7.6e-4 (second) relative. The cause is not in
    raysim. dp_accounting 0.6.0's ``_compute_log_a_frac`` takes the binomial coefficients
    C(α, i) through ``gammaln``, that is by absolute value, and adds every term of the series.
    For fractional α the coefficients alternate in sign once i > α + 1, so the sum is an upper
    bound on A_α. Opacus keeps the signs and agrees with the integral to 1e-12. At order 3.7
    (q = 0.1, σ = 1) the RDP is 0.048421 against 0.048332 exact. The error only ever makes
    the bound looser, so raysim's ε stays a valid guarantee. The tolerance records its size."""
    hand = hand_epsilon(batch / n, sigma, rounds * -(-n // batch))
    assert hand <= one_dp_sgd_client(n, batch, rounds, 1, sigma) <= hand * (1 + tolerance)
