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
    """A client's reply under privacy: its clipped update with weight 1, whether it was
    clipped (1.0 or 0.0) and its norm before clipping. Summed over clients by the reduction."""
    update: Weighted
    clipped: float
    norm: float


def clip(reply: Any, shared: list[torch.Tensor], bound: float) -> ClippedUpdate:
    """A client's reply (``Weighted`` of its trained model) as its update from ``shared`` clipped
    to L2 norm ``bound`` over all floating-point tensors (the others are not sent: zeros)."""
    deltas = [torch.zeros_like(s, dtype=torch.float32) if d is None else d
              for d, s in zip(model_update(reply, shared, "privacy"), shared)]
    norm = math.sqrt(sum(float(d.double().square().sum()) for d in deltas))
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    if factor < 1.0:
        deltas = [d * factor for d in deltas]
    return ClippedUpdate(Weighted(deltas, 1.0), 1.0 if factor < 1.0 else 0.0, norm)


def privatize(reduced: ClippedUpdate, shared: list[torch.Tensor], k: int, bound: float, multiplier: float,
              seed: int, round_: int) -> tuple[Weighted, dict[str, float]]:
    """The server's side: the sum of the round's clipped updates plus N(0, (z·C)²) noise, over
    ``k``, added to ``shared``; returned as the one-model ``Weighted`` the method's aggregate
    takes (its mean is the new model), with the round's clipping metrics."""
    g = rng.generator(seed, "privacy", round_)
    values = []
    for s, total in zip(shared, reduced.update.values):
        if not s.is_floating_point():
            values.append(s.double())
            continue
        noise = torch.from_numpy(g.standard_normal(tuple(s.shape))) * (multiplier * bound)
        values.append(s.double() + (total.double() + noise) / k)
    n = reduced.update.weight
    metrics = {"dp_clipped": reduced.clipped / n, "dp_update_norm": reduced.norm / n} if n else {}
    return Weighted(values, 1.0), metrics


def count_std(cfg, k: int) -> float:
    """σ_b, the std of adaptive clipping's count noise: the scenario's, or K/20 (Andrew et al.)."""
    return cfg.count_noise if cfg.count_noise is not None else k / 20


def update_multiplier(cfg, k: int) -> float:
    """The noise multiplier of the updates' sum: z, or with adaptive clipping z_Δ, the share of z's
    budget the count leaves, (z^-2 − (2σ_b)^-2)^-1/2 (Andrew et al., Theorem 1: the two Gaussian
    sums together are one mechanism of multiplier z, so ε is the fixed clipping's)."""
    z = cfg.noise_multiplier
    if cfg.target_quantile is None or z == 0:
        return z
    rest = z ** -2 - (2 * count_std(cfg, k)) ** -2
    if rest <= 0:
        raise ValueError(f"privacy.count_noise: σ_b = {count_std(cfg, k):g} leaves no noise for the updates; "
                         f"it must exceed noise_multiplier / 2 = {z / 2:g}")
    return rest ** -0.5


def next_clip(clip: float, unclipped: float, k: int, cfg, seed: int, round_: int) -> tuple[float, float]:
    """Adaptive clipping's step (Andrew et al., Algorithm 1 with geometric updates): the noisy
    share b̃ = (unclipped + N(0, σ_b²)) / K of updates within C, and C·exp(−η_C (b̃ − γ));
    (the next C, b̃)."""
    noise = rng.generator(seed, "privacy", "count", round_).standard_normal() * count_std(cfg, k)
    share = (unclipped + float(noise)) / k
    return clip * math.exp(-cfg.clip_lr * (share - cfg.target_quantile)), share


def epsilon(rounds: int, clients: int, k: int, multiplier: float, delta: float, accounting: str) -> float:
    """ε after ``rounds`` rounds of K = ``k`` of ``clients`` with noise multiplier z, at δ
    (the Rényi-DP accountant of ``dp_accounting``); inf without noise. The rounds are identical
    events, so their RDP is ``rounds`` times one round's, computed once per run's settings."""
    if multiplier <= 0:
        return math.inf
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    orders, one = _round_rdp(clients, k, multiplier, accounting)
    return float(rdp.compute_epsilon(orders, rounds * one, delta)[0])


def sample_epsilon(rounds: np.ndarray, sizes: np.ndarray, epochs: int, batch: int, multiplier: float,
                   delta: float) -> float:
    """Sample-level DP (DP-SGD, ``level: sample``): the largest over clients of ε at δ, client k
    having trained in ``rounds[k]`` rounds on its ``sizes[k]`` samples, n of them taking
    epochs·⌈n/B⌉ steps a round, each step the Poisson-subsampled Gaussian mechanism at rate
    q = min(1, B/n) with multiplier z (Abadi et al.; Mironov, Talwar & Zhang 2019 for its RDP).
    A straggler's shortened round is counted whole. 0 before any client trained; inf without
    noise."""
    eps = client_epsilons(rounds, sizes, epochs, batch, multiplier, delta)
    return float(eps.max()) if len(eps) else 0.0


def client_epsilons(rounds: np.ndarray, sizes: np.ndarray, epochs: int, batch: int, multiplier: float,
                    delta: float) -> np.ndarray:
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
    quiet = logging.getLogger("absl")        # orders whose series does not converge are left out, warned
    level = quiet.level                      # once per order; the bound from the others stands
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
            dpa.PoissonSampledDpEvent(min(1.0, k / clients), dpa.GaussianDpEvent(multiplier)), rounds)
    return (rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE), dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(clients, min(k, clients), dpa.GaussianDpEvent(multiplier / 2)), rounds))


def default_delta(clients: int) -> float:
    """δ when the scenario gives none: N^-1.1, below 1/N as the usual rule asks."""
    return float(np.power(float(clients), -1.1))
