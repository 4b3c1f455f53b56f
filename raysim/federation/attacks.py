"""Byzantine model-poisoning attacks: what m malicious clients send instead of their updates in a
round. Every attack is a function of

- H, the round's honest updates θ_k − θ, a float64 tensor (n_h, d), rows in client-id order: what an
  omniscient attacker sees (None for an attack that does not read it);
- M, the malicious clients' own honestly-computed updates (m, d): what each attacker trained on its
  own data (m, the number of attackers this round, is its row count; n = n_h + m the round's clients);
- the attack's frozen ``Params`` and a ``torch.Generator``, the only source of randomness;

returning a ``Crafted``: the m crafted updates (m, d) float64, row i attacker i's, and what the
attack found (``info``: Min-Max's γ, Fang's λ, ...). Attacks that simulate the defence take it as
``aggregator``, a callable U (K, d) -> kept (K,) bool (or the indices kept), so that this module does
not import the defences; Mimic keeps a ``MimicState`` that the caller passes back each round.
``ATTACKS`` is the registry; ``Attack.check`` refuses an invalid setting in one line.

- ``gaussian``: every attacker sends noise N(μ, σ²I) in place of its update (FLPoison's convention,
  μ = 0, σ = 1; Blades' noise attack is the same with N(0.1, 0.1²)); Blanchard et al., NeurIPS 2017,
  the Gaussian Byzantine workers of Krum's paper.
- ``sign_flip``: −s·(own update), s = 1 (Blades cites Li et al., "RSA", AAAI 2019, for it).
- ``alie`` (Baruch, Baruch & Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed
  Learning", NeurIPS 2019): every attacker sends μ − z·σ, μ_j and σ_j the coordinate-wise mean and
  standard deviation of the benign updates (``estimate: benign``, H: what the official code of
  Karimireddy et al. and Blades do; ``own``: of the attackers' own updates M, for an attacker that
  does not see the others', H then giving only n), σ with the n − 1 denominator (torch.std, the codes').
  z is the paper's: s = ⌊n/2 + 1⌋ − m supporters needed, z = Φ⁻¹((n − s)/n), n the round's clients;
  the option ``z`` overrides it. (Karimireddy et al.'s code uses Φ⁻¹((n − m − s)/(n − m)) instead.)
- ``ipm`` (Xie, Koyejo & Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
  Manipulation", UAI 2020): −ε·mean(H), ε = 0.1, the small-ε setting as Karimireddy et al. (ICLR
  2022) run it (epsilon=0.1 in their official code).
- ``min_max`` and ``min_sum`` (Shejwalkar & Houmansadr, "Manipulating the Byzantine: Optimizing Model
  Poisoning Attacks and Defenses for Federated Learning", NDSS 2021, AGR-agnostic attacks): ∇m = μ +
  γ·∇p, μ = mean(H), ∇p the ``perturbation``: ``std`` −std(H) (the default: the official notebooks
  run dev_type='std'), ``unit_vec`` −μ/‖μ‖, ``sign`` −sign(μ). γ is the largest
  that keeps max_i ‖∇m − ∇_i‖ ≤ max_{i,j} ‖∇_i − ∇_j‖ (Min-Max) or Σ_i ‖∇m − ∇_i‖² ≤ max_i Σ_j
  ‖∇_i − ∇_j‖² (Min-Sum; the official code compares with the min over i instead of the paper's
  max: ``bound: code``), ∇_i the honest updates, found by Algorithm 1's search: γ = γ_init, step = γ_init; while
  |γ_succ − γ| > τ: on success γ_succ = γ, γ += step/2, else γ −= step/2; step /= 2 (the official
  code's halving). γ_init = 10, τ = 1e-5 as in the code; γ is at most 2γ_init. Every attacker sends ∇m.
- ``fang`` (Fang, Cao, Jia & Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated
  Learning", USENIX Security 2020, full knowledge), on updates (the paper's models less the global
  model), s = sign(mean(H)) the direction the benign updates move each coordinate:
  ``against: trimmed_mean`` or ``median`` (the paper attacks the median with the trimmed mean's
  construction): per coordinate with s_j < 0 each attacker draws uniformly in [w_max, b·w_max] if
  w_max > 0, else [w_max, w_max/b]; with s_j > 0 in [w_min/b, w_min] if w_min > 0, else [b·w_min,
  w_min]; w_max, w_min the largest and smallest benign values (H), b = 2; s_j = 0 gives 0 (Fang's code).
  Fang's code takes s and the extremes over every client's before-attack update, the attackers' own
  included; here both over H, the benign updates, as Blades does.
  ``against: krum``: w'_1 = −λ·s with λ from the paper's bound, λ_max = min_i Σ_{l ∈ Γ_i} ‖∇_l −
  ∇_i‖ / ((n − 2m − 1)√d) + max_i ‖∇_i‖ / √d (Γ_i the n − m − 2 benign updates nearest ∇_i, i over
  the benign), halved until the simulated Krum (``aggregator``: the caller's, with its f), given m
  copies of w'_1 (first) and H, keeps a copy, or λ falls below ``threshold`` (1e-5): then the attack
  gives up, as Fang's code does, and the attackers send their own updates (``info['lambda']`` = 0).
  Attackers 2..m send w'_1 plus noise uniform in [−ε/d, ε/d] per coordinate, ε = ``epsilon`` = 1e-5
  (Fang's code; 0: exact copies).
- ``mimic`` (Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
  Bucketing", ICLR 2022): every attacker sends a copy of one honest client's update, the one that
  maximises ∇_i·z, z the top principal direction of the honest updates estimated during the first
  ``warmup`` rounds (1, the official code's default): in the first round μ = mean(H) and z one power
  step from a Gaussian draw, z ∝ Σ_i ((∇_i − μ)·z₀)(∇_i − μ); in round t < warmup μ and z are running
  averages, μ ← (tμ + mean(H))/(t + 1), z ← (tz + c/‖c‖)/(t + 1) normalised, c = Σ_i ((∇_i − μ)·z)(∇_i
  − μ); the target is chosen anew each warm-up round and fixed afterwards. The target is kept as a
  client id (``ids``, H's clients); a round in which it is not sampled (the paper has every client
  in every round) chooses again by the same rule, with z as it is, and keeps the new one.

``detection`` scores a defence that flags clients: precision and recall of the flagged (not kept)
against the malicious.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch

from raysim.federation.robust import field_error  # one check of options against their metadata

Aggregator = Callable[[torch.Tensor], Any]  # U (K, d) -> kept (K,) bool, or the indices kept


@dataclass(frozen=True)
class Crafted:
    """An attack's result: the crafted updates (m, d) float64, what it found (γ, λ, the target), and
    Mimic's state for the next round (None for the other attacks)."""

    updates: torch.Tensor
    info: dict[str, float] = field(default_factory=dict)
    state: MimicState | None = None


@dataclass(frozen=True)
class MimicState:
    """What Mimic keeps between rounds: μ and z (d,), the target client, the rounds seen."""

    mu: torch.Tensor | None = None
    z: torch.Tensor | None = None
    target: int | None = None
    rounds: int = 0


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class GaussianParams:
    mu: float = field(default=0.0, metadata={"help": "μ, the noise's mean"})
    sigma: float = field(default=1.0, metadata={"min": 0.0, "help": "σ, the noise's standard deviation"})


@dataclass(frozen=True)
class SignFlipParams:
    s: float = field(default=1.0, metadata={"gt": 0.0, "help": "the attackers send −s × their own update"})


@dataclass(frozen=True)
class ALIEParams:
    z: float | None = field(default=None, metadata={"help": "z; null: the paper's Φ⁻¹((n − s)/n)"})
    estimate: str = field(
        default="benign",
        metadata={"choices": ("benign", "own"), "help": "μ and σ of the honest updates, or of the attackers' own"},
    )


@dataclass(frozen=True)
class IPMParams:
    epsilon: float = field(default=0.1, metadata={"gt": 0.0, "help": "ε: the attackers send −ε × the honest mean"})


@dataclass(frozen=True)
class MinMaxParams:
    perturbation: str = field(
        default="std",
        metadata={"choices": ("std", "unit_vec", "sign"), "help": "∇p: −std, −μ/‖μ‖ or −sign(μ)"},
    )
    gamma_init: float = field(default=10.0, metadata={"gt": 0.0, "help": "γ_init, where the search starts"})
    tau: float = field(default=1e-5, metadata={"gt": 0.0, "help": "τ, the search's tolerance"})
    bound: str = field(
        default="paper",
        metadata={
            "choices": ("paper", "code"),
            "help": "Min-Sum: the threshold max_i Σ_j ‖∇_i − ∇_j‖² (paper) or the official code's min_i",
        },
    )


@dataclass(frozen=True)
class FangParams:
    against: str = field(
        default="trimmed_mean",
        metadata={"choices": ("trimmed_mean", "median", "krum"), "help": "the defence the attack is crafted for"},
    )
    b: float = field(default=2.0, metadata={"gt": 1.0, "help": "b: the values lie within a factor b of w_max/w_min"})
    threshold: float = field(default=1e-5, metadata={"gt": 0.0, "help": "krum: the smallest λ tried"})
    epsilon: float = field(default=1e-5, metadata={"min": 0.0, "help": "krum: the copies' noise, ±ε/d per coordinate"})


@dataclass(frozen=True)
class MimicParams:
    warmup: int = field(default=1, metadata={"min": 1, "help": "rounds estimating z; the target is fixed after"})


# ----------------------------------------------------------------------------- helpers


def _copies(v: torch.Tensor, m: int) -> torch.Tensor:
    return v.reshape(1, -1).expand(m, -1).clone()


def _uniform(shape: tuple[int, ...], g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.rand(shape, generator=g, dtype=torch.float64, device=g.device).to(like.device)


def _gaussian(shape: tuple[int, ...], g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64, device=g.device).to(like.device)


def _sq_distances(X: torch.Tensor) -> torch.Tensor:
    """‖x_i − x_j‖² (n, n) from the Gram matrix of the rows centred on their mean (exact zeros on
    the diagonal, no negatives)."""
    C = X - X.mean(0)
    sq = C.square().sum(1)
    D = (sq[:, None] + sq[None, :] - 2.0 * (C @ C.T)).clamp_min_(0.0)
    return D.fill_diagonal_(0.0)


# ----------------------------------------------------------------------------- the attacks


def gaussian(H: torch.Tensor | None, M: torch.Tensor, p: GaussianParams, g: torch.Generator) -> Crafted:
    """N(μ, σ²I) noise (m, d) in place of the updates."""
    return Crafted(p.mu + p.sigma * _gaussian(tuple(M.shape), g, M))


def sign_flip(H: torch.Tensor | None, M: torch.Tensor, p: SignFlipParams, g: torch.Generator) -> Crafted:
    """Each attacker's own update times −s."""
    return Crafted(-p.s * M.double())


def alie_z(n: int, m: int) -> float:
    """The paper's z for n clients of which m attack: s = ⌊n/2 + 1⌋ − m, z = Φ⁻¹((n − s)/n)
    (needs s ≥ 1: with m ≥ ⌊n/2 + 1⌋ the attackers are a majority and z is infinite)."""
    s = n // 2 + 1 - m
    if s < 1:
        raise ValueError(f"alie: m = {m} attackers of n = {n} need no supporters (s = {s}); give z")
    return NormalDist().inv_cdf((n - s) / n)


def alie(H: torch.Tensor, M: torch.Tensor, p: ALIEParams, g: torch.Generator) -> Crafted:
    """μ − z·σ, coordinate-wise over the benign updates (or the attackers' own), for every attacker."""
    m = M.shape[0]
    X = (M if p.estimate == "own" else H).double()
    n = m + H.shape[0]  # with estimate: own, H gives only the round's count
    z = alie_z(n, m) if p.z is None else p.z
    return Crafted(_copies(X.mean(0) - z * X.std(0), m), {"z": z})


def ipm(H: torch.Tensor, M: torch.Tensor, p: IPMParams, g: torch.Generator) -> Crafted:
    """−ε × the honest mean, for every attacker."""
    return Crafted(_copies(-p.epsilon * H.double().mean(0), M.shape[0]))


def perturbation(H: torch.Tensor, kind: str) -> torch.Tensor:
    """Shejwalkar & Houmansadr's ∇p for honest updates H: −std(H), −μ/‖μ‖ (0 for μ = 0), −sign(μ)."""
    mu = H.mean(0)
    if kind == "std":
        return -H.std(0)
    if kind == "unit_vec":
        norm = torch.linalg.vector_norm(mu)
        return -mu / norm if norm > 0 else torch.zeros_like(mu)
    if kind == "sign":
        return -torch.sign(mu)
    raise ValueError(f"unknown perturbation {kind!r}")


def search_gamma(ok: Callable[[float], bool], gamma_init: float, tau: float) -> float:
    """Algorithm 1's search (the official code's steps): the last γ found to satisfy ``ok``, 0 if
    none; from γ_init, each step half the previous, up on success and down on failure."""
    gamma, step, succ = gamma_init, gamma_init, 0.0
    while abs(succ - gamma) > tau:
        if ok(gamma):
            succ = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return succ


def _agr_agnostic(H: torch.Tensor, M: torch.Tensor, p: MinMaxParams, objective: str) -> Crafted:
    """∇m = μ + γ∇p with γ from the search; ‖∇m − ∇_i‖² = γ²‖∇p‖² − 2γ ∇p·x_i + ‖x_i‖², x_i = ∇_i − μ."""
    H = H.double()
    mu, dev = H.mean(0), perturbation(H, p.perturbation)
    X = H - mu
    pp, px, xx = float(dev @ dev), X @ dev, X.square().sum(1)
    D = _sq_distances(H)
    if objective == "min_max":
        bound = float(D.max())

        def ok(gamma: float) -> bool:
            return float((gamma * gamma * pp - 2 * gamma * px + xx).max()) <= bound
    else:
        sums = D.sum(1)
        bound = float(sums.max() if p.bound == "paper" else sums.min())

        def ok(gamma: float) -> bool:
            return float((gamma * gamma * pp - 2 * gamma * px + xx).sum()) <= bound

    gamma = search_gamma(ok, p.gamma_init, p.tau)
    return Crafted(_copies(mu + gamma * dev, M.shape[0]), {"gamma": gamma})


def min_max(H: torch.Tensor, M: torch.Tensor, p: MinMaxParams, g: torch.Generator) -> Crafted:
    """Min-Max: μ + γ∇p no farther from any honest update than the two farthest honest ones."""
    return _agr_agnostic(H, M, p, "min_max")


def min_sum(H: torch.Tensor, M: torch.Tensor, p: MinMaxParams, g: torch.Generator) -> Crafted:
    """Min-Sum: μ + γ∇p with its squared distances to the honest updates summing to no more than
    the largest such sum of an honest update."""
    return _agr_agnostic(H, M, p, "min_sum")


def _fang_trim(H: torch.Tensor, m: int, b: float, g: torch.Generator) -> Crafted:
    """The directed deviation for the trimmed mean and the median: values beyond the benign extreme
    on the side opposite to s, within a factor b of it, drawn uniformly."""
    s = torch.sign(H.mean(0))
    wmax, wmin = H.max(0).values, H.min(0).values
    w = torch.where(s < 0, wmax, wmin)  # the extreme the attackers go beyond
    far = torch.where((s < 0) == (w > 0), b * w, w / b)  # further away from the benign values
    lo, hi = torch.minimum(w, far), torch.maximum(w, far)
    crafted = lo + _uniform((m, H.shape[1]), g, H) * (hi - lo)
    return Crafted(torch.where(s == 0, 0.0, crafted))


def fang_lambda_max(H: torch.Tensor, m: int) -> float:
    """Fang et al.'s upper bound on λ against Krum, for n = n_h + m clients (needs n > 2m + 1)."""
    n, d = H.shape[0] + m, H.shape[1]
    dist = _sq_distances(H).sqrt_()
    dist.fill_diagonal_(math.inf)  # Γ_i: the n − m − 2 nearest other benign updates
    near = dist.sort(1).values[:, : n - m - 2].sum(1)
    far = torch.linalg.vector_norm(H, dim=1).max()
    return float(near.min() / ((n - 2 * m - 1) * math.sqrt(d)) + far / math.sqrt(d))


def _kept_crafted(kept: Any, m: int) -> bool:
    """Whether a defence's answer (mask, or indices) keeps one of the first m rows."""
    k = torch.as_tensor(kept)
    return bool(k[:m].any()) if k.dtype == torch.bool else bool((k < m).any())


def _fang_krum(H: torch.Tensor, M: torch.Tensor, p: FangParams, g: torch.Generator, aggregator: Aggregator) -> Crafted:
    """−λ·s with λ halved from the bound until the simulated Krum keeps a crafted copy."""
    m, d = M.shape
    s = torch.sign(H.mean(0))
    lam = fang_lambda_max(H, m)
    while lam >= p.threshold:
        w1 = -lam * s
        if _kept_crafted(aggregator(torch.cat([_copies(w1, m), H])), m):
            noise = (2 * _uniform((m - 1, d), g, H) - 1) * (p.epsilon / d)
            return Crafted(torch.cat([w1[None], w1 + noise]), {"lambda": lam})
        lam /= 2
    return Crafted(M.double().clone(), {"lambda": 0.0})


def fang(
    H: torch.Tensor, M: torch.Tensor, p: FangParams, g: torch.Generator, aggregator: Aggregator | None = None
) -> Crafted:
    """Fang et al.'s full-knowledge attack on the defence ``p.against`` (krum: ``aggregator``, the
    simulated Krum, U -> kept)."""
    H = H.double()
    if p.against != "krum":
        return _fang_trim(H, M.shape[0], p.b, g)
    if aggregator is None:
        raise ValueError("fang against krum simulates the defence: give its aggregator")
    return _fang_krum(H, M, p, g, aggregator)


def _power_step(H: torch.Tensor, mu: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """c/‖c‖, c = Σ_i ((∇_i − μ)·z)(∇_i − μ) (z itself when c = 0)."""
    X = H - mu
    c = X.T @ (X @ z)
    norm = torch.linalg.vector_norm(c)
    return c / norm if norm > 0 else z


def mimic(
    H: torch.Tensor,
    M: torch.Tensor,
    p: MimicParams,
    g: torch.Generator,
    state: MimicState | None = None,
    ids: Sequence[int] | None = None,
) -> Crafted:
    """Copies of the honest update with the largest ∇_i·z; ``state`` from the previous round (None
    in the first), ``ids`` the client ids of H's rows (default 0..n_h − 1)."""
    H = H.double()
    ids = list(range(H.shape[0])) if ids is None else [int(i) for i in ids]
    st = state or MimicState()
    t, mu, z, target = st.rounds, st.mu, st.z, st.target
    if t == 0 or mu is None or z is None:
        mu = H.mean(0)
        z = _power_step(H, mu, _gaussian((H.shape[1],), g, H))
    elif t < p.warmup:
        mu = (t * mu + H.mean(0)) / (t + 1)
        z = (t * z + _power_step(H, mu, z)) / (t + 1)
        z = z / torch.linalg.vector_norm(z).clamp_min(1e-300)
    if t < p.warmup or target not in ids:
        target = ids[int(torch.argmax(H @ z))]
    row = H[ids.index(target)]
    return Crafted(_copies(row, M.shape[0]), {"target": float(target)}, MimicState(mu, z, target, t + 1))


# ----------------------------------------------------------------------------- detection


def detection(kept: Any, malicious: Any) -> tuple[float, float]:
    """(precision, recall) of a defence's flags: flagged = not kept, positives = malicious, both (K,)
    bool (``kept`` None: a defence that flags no one). 0/0 is nan: precision when no client is
    flagged, recall when no client is malicious, values a mean over rounds leaves out."""
    bad = torch.as_tensor(malicious, dtype=torch.bool)
    flagged = torch.zeros_like(bad) if kept is None else ~torch.as_tensor(kept, dtype=torch.bool)
    hits = int((flagged & bad).sum())
    n_flagged, n_bad = int(flagged.sum()), int(bad.sum())
    return (hits / n_flagged if n_flagged else math.nan, hits / n_bad if n_bad else math.nan)


# ----------------------------------------------------------------------------- registry


def _always(p: Any) -> bool:
    return True


def _never(p: Any) -> bool:
    return False


def _honest(k: int) -> Callable[[Any, int, int], str | None]:
    """The limit 'at least k honest clients in a round'."""

    def limits(p: Any, n: int, m: int) -> str | None:
        return None if n - m >= k else f"needs at least {k} honest clients in a round (got n − m = {n - m})"

    return limits


def _alie_limits(p: ALIEParams, n: int, m: int) -> str | None:
    if p.estimate == "own" and m < 2:
        return f"alie.estimate: own needs at least 2 attackers for a standard deviation (got m = {m})"
    if p.estimate == "benign" and n - m < 2:
        return f"alie.estimate: benign needs at least 2 honest clients in a round (got n − m = {n - m})"
    if p.z is None and n // 2 + 1 - m < 1:
        return f"alie.z must be given when the attackers are a majority (m = {m} of n = {n}: s = ⌊n/2 + 1⌋ − m < 1)"
    return None


def _fang_limits(p: FangParams, n: int, m: int) -> str | None:
    if p.against == "krum" and n <= 2 * m + 1:
        return f"fang.against: krum needs n > 2m + 1 clients in a round, its bound's n − 2m − 1 (got n = {n}, m = {m})"
    return _honest(1)(p, n, m)


@dataclass(frozen=True)
class Attack:
    """A model-poisoning attack: its function, its paper and options, whether it reads the honest
    updates (``omniscient``) and needs the simulated defence (``needs_defence``), both for given
    options, whether it keeps a ``MimicState`` (``stateful``), and its limits on a round's n clients
    of which m attack."""

    name: str
    paper: str
    Params: type
    craft: Callable[..., Crafted]
    omniscient: Callable[[Any], bool] = _always
    needs_defence: Callable[[Any], bool] = _never
    stateful: bool = False
    limits: Callable[[Any, int, int], str | None] = _honest(1)

    def check(self, params: Any, n: int, m: int) -> str | None:
        """None, or one line naming the option (or count) that is wrong and what is allowed."""
        if not isinstance(params, self.Params):
            return f"{self.name}: its options are {self.Params.__name__}, not {type(params).__name__}"
        if m < 1:
            return f"{self.name}: needs at least one attacker in a round (got m = {m})"
        bad = field_error(self.name, params) or self.limits(params, n, m)
        if bad is None or bad.startswith(f"{self.name}."):
            return bad
        return f"{self.name}: {bad}"

    def __call__(
        self,
        H: torch.Tensor | None,
        M: torch.Tensor,
        params: Any,
        generator: torch.Generator,
        aggregator: Aggregator | None = None,
        state: MimicState | None = None,
        ids: Sequence[int] | None = None,
    ) -> Crafted:
        extra: dict[str, Any] = {}
        if self.needs_defence(params):
            extra["aggregator"] = aggregator
        if self.stateful:
            extra.update(state=state, ids=ids)
        return self.craft(H, M, params, generator, **extra)


ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in (
        Attack(
            "gaussian",
            "Blanchard et al., NeurIPS 2017 (FLPoison's Gaussian attack)",
            GaussianParams,
            gaussian,
            omniscient=_never,
            limits=_honest(0),
        ),
        Attack(
            "sign_flip", "Li et al., AAAI 2019 (RSA)", SignFlipParams, sign_flip, omniscient=_never, limits=_honest(0)
        ),
        Attack("alie", "Baruch, Baruch & Goldberg, NeurIPS 2019", ALIEParams, alie, limits=_alie_limits),
        Attack("ipm", "Xie, Koyejo & Gupta, UAI 2020", IPMParams, ipm),
        Attack("min_max", "Shejwalkar & Houmansadr, NDSS 2021", MinMaxParams, min_max, limits=_honest(2)),
        Attack("min_sum", "Shejwalkar & Houmansadr, NDSS 2021", MinMaxParams, min_sum, limits=_honest(2)),
        Attack(
            "fang",
            "Fang, Cao, Jia & Gong, USENIX Security 2020",
            FangParams,
            fang,
            needs_defence=lambda p: p.against == "krum",
            limits=_fang_limits,
        ),
        Attack("mimic", "Karimireddy, He & Jaggi, ICLR 2022", MimicParams, mimic, stateful=True),
    )
}
