"""Client-level differential privacy of the server's model average: DP-FedAvg (McMahan,
Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018,
Algorithm 1 with its fixed-denominator estimator and flat clipping).

Each sampled client's update Δ_k = θ_k − θ (every floating-point tensor of the model the server
sent, as one vector) is clipped on its host to L2 norm at most C, c_k = Δ_k · min(1, C/‖Δ_k‖).
The server adds Gaussian noise of standard deviation z·C to the sum of the clipped updates and
divides by K, the clients a round samples (not by how many replied, and not by their sample
counts: every client weighs the same, so one client's influence is bounded by C):

    θ ← θ + (Σ_k c_k + N(0, z²C² I)) / K

The noise is drawn by the server from (seed, "privacy", round), so a run is the same on any
number of hosts and resumes exactly. The privacy spent is computed after every round with
Google's ``dp_accounting`` (its Rényi-DP accountant) for the run's sampling:

- ``accounting: sampled`` (default): what raysim does, K of the N training clients drawn
  without replacement each round; neighbouring datasets replace one client's data, so the sum's
  sensitivity is 2C (noise multiplier z/2 for the accountant; Wang, Balle & Kasiviswanathan,
  AISTATS 2019, Theorem 27);
- ``accounting: poisson``: each client joins a round with probability q = K/N and neighbours add
  or remove a client (sensitivity C, multiplier z): the statement DP-FedAvg's paper and most FL
  libraries make. raysim still samples exactly K, so this figure is the literature's, not a
  guarantee of the run; it is offered to compare with published ε.

A client's Δ_k is its trained model minus the message, so this applies to methods whose reply is
one model averaged into the global one (FedAvg and what keeps its reply and aggregate: FedProx,
Ditto's global model, ...): ``Algorithm.averages_one_model`` says which.

Sample-level DP (``level: sample``, DP-SGD, Abadi et al., CCS 2016) happens in the training loop
(``raysim.core.loop``, ``chain.Chain.private_step``): each sample's gradient clipped to C, noise
of std z·C on the batch's sum, from a seed each job draws from its client's generator. Here is
only its accountant, ``sample_epsilon``.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core.replies import Weighted, model_update


@dataclass
class ClippedUpdate:
    """A client's reply under privacy: its clipped update with weight 1 and, only where the run
    needs them, two statistics summed over clients by the reduction: ``below``, b_k − ½ with
    b_k = 1 when its update was within C (adaptive clipping's count, centred as Andrew et al. do
    so that one client moves the sum by ½, or ``exact_metrics``), and ``norm``, its norm before
    clipping rounded to float32 (``exact_metrics`` only). None where not sent."""

    update: Weighted
    below: float | None = None
    norm: float | None = None


def clip(
    reply: Any, shared: list[torch.Tensor], bound: float, count: bool = False, norm: bool = False
) -> ClippedUpdate:
    """A client's reply (``Weighted`` of its trained model) as its update from ``shared`` clipped
    to L2 norm ``bound`` over all floating-point tensors (the others are not sent: zeros);
    ``count``: with its centred indicator b_k − ½; ``norm``: with its norm before clipping."""
    deltas = [
        torch.zeros_like(s, dtype=torch.float32) if d is None else d
        for d, s in zip(model_update(reply, shared, "privacy"), shared)
    ]
    size = math.sqrt(sum(float(d.double().square().sum()) for d in deltas))
    factor = min(1.0, bound / size) if size > 0 else 1.0
    if factor < 1.0:
        deltas = [d * factor for d in deltas]
    below = (0.5 if factor >= 1.0 else -0.5) if count else None
    # float32 terms: their float64 sum is exact, so the mean is the same on any number of hosts
    return ClippedUpdate(Weighted(deltas, 1.0), below, float(np.float32(size)) if norm else None)


def privatize(
    reduced: ClippedUpdate, shared: list[torch.Tensor], k: int, bound: float, multiplier: float, seed: int, round_: int
) -> tuple[Weighted, dict[str, float]]:
    """The server's side: the sum of the round's clipped updates plus N(0, (z·C)²) noise, over
    ``k``, added to ``shared``; returned as the one-model ``Weighted`` the method's aggregate
    takes (its mean is the new model), with the exact clipping metrics (``dp_clipped``, the share
    of updates clipped; ``dp_update_norm``, their mean norm) where the hosts sent them
    (``exact_metrics``)."""
    g = rng.generator(seed, "privacy", round_)
    values = []
    for s, total in zip(shared, reduced.update.values):
        if not s.is_floating_point():
            values.append(s.double())
            continue
        noise = torch.from_numpy(g.standard_normal(tuple(s.shape))) * (multiplier * bound)
        values.append(s.double() + (total.double() + noise) / k)
    n = reduced.update.weight
    metrics = {}
    if n and reduced.norm is not None:
        metrics = {
            "dp_clipped": float(np.float32(0.5 - reduced.below / n)),
            "dp_update_norm": float(np.float32(reduced.norm / n)),
        }
    return Weighted(values, 1.0), metrics


def reported_loss(loss: float, n: int, cfg) -> tuple[float, int]:
    """What a host tells the server of a client's training loss: (loss, train size); under
    privacy, unless ``debug_exact_metrics``, nothing but whether it is finite (a diverged run
    stops): (inf, n) if not, else (nan, 0), which the mean over clients leaves out."""
    if cfg is None or cfg.debug_exact_metrics:
        return loss, n
    return (loss, n) if not math.isfinite(loss) else (math.nan, 0)


# the smallest non-zero noise multiplier a scenario may give (raysim.scenario.config): below it ε is
# above 10^5 for any useful run, and the accountant overflows towards 1e-200
MIN_NOISE = 0.01


def count_std(cfg, k: int) -> float:
    """σ_b, the std of adaptive clipping's count noise: the scenario's, or K/20 (Andrew et al.)."""
    return cfg.count_noise if cfg.count_noise is not None else k / 20


# how far one client moves the sum of the count's terms b_k − ½, in units of the updates' C:
# ½ when one client is added or removed (its term is ±½); replacing one moves it by 1, which
# the accountant's replace-one statement counts as 2 × ½, as it counts the updates' 2C
COUNT_SENSITIVITY = 0.5


def update_multiplier(cfg, k: int) -> float:
    """The noise multiplier of the updates' sum: z, or with adaptive clipping z_Δ, the share of z's
    budget the count leaves, (z^-2 − (σ_b / s_b)^-2)^-1/2 with s_b = ½, the centred count's
    sensitivity (Andrew et al., Theorem 1: (z^-2 − (2σ_b)^-2)^-1/2), so that the two Gaussian
    sums together are one mechanism of multiplier z (``accountant_multiplier``)."""
    z = cfg.noise_multiplier
    if cfg.target_quantile is None or z == 0:
        return z
    rest = z**-2 - (count_std(cfg, k) / COUNT_SENSITIVITY) ** -2
    if rest <= 0:
        raise ValueError(
            f"privacy.count_noise: σ_b = {count_std(cfg, k):g} leaves no noise for the updates; "
            f"it must exceed noise_multiplier / 2 = {z / 2:g}"
        )
    return rest**-0.5


def accountant_multiplier(cfg, k: int) -> float:
    """The multiplier the accountant is given: the one Gaussian mechanism the round's released
    sums make together. Fixed C: z. Adaptive: the updates' sum (sensitivity C, noise z_Δ·C) and
    the count's (sensitivity s_b = ½, noise σ_b) compose as one of multiplier
    (z_Δ^-2 + (σ_b / s_b)^-2)^-1/2, computed here from the noise the run adds (not assumed to be z)."""
    z_update = update_multiplier(cfg, k)
    if cfg.target_quantile is None or z_update == 0:
        return z_update
    return (z_update**-2 + (count_std(cfg, k) / COUNT_SENSITIVITY) ** -2) ** -0.5


# the largest change of log C in one round (adaptive clipping): exp's argument stays finite
# however large the count's noise; no setting validation accepts reaches it in practice
MAX_LOG_STEP = 50.0


def next_clip(clip: float, below: float, k: int, cfg, seed: int, round_: int) -> tuple[float, float]:
    """Adaptive clipping's step (Andrew et al., Algorithm 1 with geometric updates): from the
    sum of the centred indicators Σ(b_k − ½), the noisy share b̃ = (Σ(b_k − ½) + N(0, σ_b²)) / K + ½
    of updates within C, and C·exp(−η_C (b̃ − γ)); (the next C, b̃)."""
    noise = rng.generator(seed, "privacy", "count", round_).standard_normal() * count_std(cfg, k)
    share = (below + float(noise)) / k + 0.5
    step = max(-MAX_LOG_STEP, min(MAX_LOG_STEP, -cfg.clip_lr * (share - cfg.target_quantile)))
    return clip * math.exp(step), share


def epsilon(rounds: int, clients: int, k: int, multiplier: float, delta: float, accounting: str) -> float:
    """ε after ``rounds`` rounds of K = ``k`` of ``clients`` with noise multiplier z, at δ
    (the Rényi-DP accountant of ``dp_accounting``); inf without noise. The rounds are identical
    events, so their RDP is ``rounds`` times one round's, computed once per run's settings."""
    if multiplier <= 0:
        return math.inf
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    orders, one = _round_rdp(clients, k, multiplier, accounting)
    return float(rdp.compute_epsilon(orders, rounds * one, delta)[0])


def sample_epsilon(
    rounds: np.ndarray, sizes: np.ndarray, epochs: int, batch: int, multiplier: float, delta: float
) -> float:
    """Sample-level DP (DP-SGD, ``level: sample``): the largest over clients of ε at δ, client k
    having trained in ``rounds[k]`` rounds on its ``sizes[k]`` samples, n of them taking
    epochs·⌈n/B⌉ steps a round, each step the Poisson-subsampled Gaussian mechanism at rate
    q = min(1, B/n) with multiplier z (Abadi et al.; Mironov, Talwar & Zhang 2019 for its RDP).
    A straggler's shortened round is counted whole. 0 before any client trained; inf without
    noise."""
    eps = client_epsilons(rounds, sizes, epochs, batch, multiplier, delta)
    return float(eps.max()) if len(eps) else 0.0


def client_epsilons(
    rounds: np.ndarray, sizes: np.ndarray, epochs: int, batch: int, multiplier: float, delta: float
) -> np.ndarray:
    """``sample_epsilon``'s ε of each client (0 for one that never trained or holds no samples),
    computed once per distinct (rounds, samples)."""
    rounds, sizes = np.asarray(rounds, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    if multiplier <= 0:
        return np.full(len(sizes), math.inf)
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    out = np.zeros(len(sizes))
    used = (rounds > 0) & (sizes > 0)
    pairs = np.stack([rounds[used], sizes[used]], axis=1)
    if len(pairs):
        unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
        eps = np.empty(len(unique))
        for i, (r, n) in enumerate(unique.tolist()):
            orders, one = _step_rdp(min(1.0, batch / n), multiplier)
            eps[i] = rdp.compute_epsilon(orders, r * epochs * -(-n // batch) * one, delta)[0]
        out[used] = eps[inverse.reshape(-1)]
    return out


def step_event(rate: float, multiplier: float):
    """(a fresh ``dp_accounting`` RDP accountant, one DP-SGD step's DpEvent)."""
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    return rdp.RdpAccountant(), dpa.PoissonSampledDpEvent(rate, dpa.GaussianDpEvent(multiplier))


@functools.lru_cache(maxsize=4096)
def _step_rdp(rate: float, multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP of one DP-SGD step at each order)."""
    return _rdp_of(*step_event(rate, multiplier))


@functools.lru_cache(maxsize=16)
def _round_rdp(clients: int, k: int, multiplier: float, accounting: str) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP of one round at each order), from the accountant composed with one round
    (the test suite holds ``epsilon`` to the accountant composed with all of them)."""
    return _rdp_of(*accountant_event(clients, k, multiplier, accounting, 1))


def _rdp_of(acc, event) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of ``acc`` composed with ``event``."""
    quiet = logging.getLogger("absl")  # orders whose series does not converge are left out, warned
    level = quiet.level  # once per order; the bound from the others stands
    quiet.setLevel(logging.ERROR)
    try:
        acc.compose(event)
    finally:
        quiet.setLevel(level)
    return np.asarray(acc._orders, dtype=np.float64), np.asarray(acc._rdp, dtype=np.float64)


def accountant_event(clients: int, k: int, multiplier: float, accounting: str, rounds: int):
    """(a fresh ``dp_accounting`` RDP accountant, the DpEvent of ``rounds`` rounds) for the run's
    sampling: the library's own path, which ``epsilon`` takes a shortcut through."""
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    if accounting == "poisson":
        return rdp.RdpAccountant(), dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(min(1.0, k / clients), dpa.GaussianDpEvent(multiplier)), rounds
        )
    return (
        rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE),
        dpa.SelfComposedDpEvent(
            dpa.SampledWithoutReplacementDpEvent(clients, min(k, clients), dpa.GaussianDpEvent(multiplier / 2)), rounds
        ),
    )


# layers whose outputs for one sample depend on the others of its batch, on running statistics
# or on random draws: DP-SGD's per-sample gradients (one sample's forward pass) are not theirs
_COUPLED = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.RNNBase,
    torch.nn.modules.dropout._DropoutNd,
)


def per_sample_problem(model: torch.nn.Module, x: torch.Tensor | None = None) -> str | None:
    """Why DP-SGD cannot train ``model`` sample by sample (None: it can). By its layers: buffers
    (running statistics), batch or instance norm, recurrent layers, any dropout (``_DropoutNd``:
    alpha and feature dropout too). With a few inputs ``x`` (validation gives the first client's),
    by what it does in training mode, which catches a plugin's own layers: two passes over the
    same batch must agree (no random masks), each sample's outputs must not depend on the rest
    of its batch, and a pass must change no buffer."""
    if any(True for _ in model.buffers()):
        return "holds buffers (running statistics)"
    kind = next((type(m).__name__ for m in model.modules() if isinstance(m, _COUPLED)), None)
    if kind:
        return f"has a layer of type {kind}"
    if x is None or len(x) < 2:
        return None
    was = model.training
    model.train()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            first, again = model(x), model(x)
            alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    finally:
        model.train(was)
    if not torch.equal(first, again):
        return "gives different outputs in two passes over the same batch (a random layer)"
    if not torch.allclose(first, alone, rtol=1e-4, atol=1e-5):
        return "gives a sample outputs that depend on the other samples of its batch"
    return None


def default_delta(clients: int) -> float:
    """δ when the scenario gives none: N^-1.1, below 1/N as the usual rule asks."""
    return float(np.power(float(clients), -1.1))
