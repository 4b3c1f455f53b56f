"""Compressed uploads: each client sends its update Δ_k = θ_k − θ (every floating-point tensor of
the model the server sent, as one vector of d numbers) through a compressor C, and the server
averages the models θ + C(Δ_k) as the method does. What a client would put on the wire is
counted (``upload_bytes``), with float32 values and int32 indices:

- ``qsgd`` (Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient SGD via
  Gradient Quantization and Encoding", NeurIPS 2017), per bucket of b consecutive coordinates
  of the vector (the last one shorter; b = ``bucket``, or d with 0 or null): ‖u‖·sign(v_i)·ξ_i/s,
  u the bucket of v_i and ξ_i the integer l = ⌊s|v_i|/‖u‖⌋ rounded up to l + 1 with probability
  s|v_i|/‖u‖ − l, so E[C(v)] = v; each bucket's norm in 32 bits and each coordinate's sign and
  level in 1 + ⌈log2(s + 1)⌉ bits (fixed-length, an upper bound on the paper's Elias coding).
  The buckets run over the concatenated tensors, not per tensor, so the bytes depend on d alone
  (the virtual clock knows them before a round) and no tensor shorter than b gets a norm of its
  own. FedPAQ (Reisizadeh et al., AISTATS 2020) is FedAvg with this upload.
- ``topk``: the k = ⌈ratio·d⌉ coordinates of largest magnitude, as (index, value) pairs (biased:
  use it with error feedback).
- ``randk``: k coordinates drawn uniformly, scaled by d/k so that E[C(v)] = v; the indices come
  from a seed both sides know, so only the values are sent. With error feedback they are sent
  unscaled: error feedback needs a compressor that shrinks what it keeps back
  (‖C(v) − v‖² ≤ (1 − k/d)‖v‖², Stich et al.'s rand-k with memory), and the scaled one multiplies
  it by up to d/k.
- ``none``: the update as it is (4d bytes): the baseline's traffic.

With ``error_feedback`` (Stich, Cordonnier & Jaggi, NeurIPS 2018; Karimireddy et al., ICML
2019) a client adds what its compressor dropped last time before compressing, and keeps the new
remainder: p = Δ_k + e_k, sends C(p), e_k ← p − C(p). The remainder is the client's own state,
kept on its host and written to checkpoints. It applies to the sparsifiers (topk, randk
unscaled); QSGD is unbiased and is refused with it.

With a ``topology`` (decentralized runs) the section is CHOCO-gossip (Koloskova, Stich & Jaggi,
"Decentralized Stochastic Optimization and Gossip Algorithms with Compressed Communication",
ICML 2019): every client keeps a public copy x̂_i of its model that its neighbours hold too,
sends only the compressed difference q_i = Q(x_i − x̂_i) after its local step (all holders add
it: x̂_i ← x̂_i + q_i), and mixes with the copies, x_i ← x_i + γ Σ_j w_ij (x̂_j − x̂_i), γ the
``gossip_step``. The copies start at the common initial model, are client state kept on the
hosts and written to checkpoints (``gossip_estimate``; raysim/engine/host.py).

Random draws come from (seed, "compress", round, client): the same run on any number of hosts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raysim import rng
from raysim.core.replies import Weighted, float_numbers, model_update


@dataclass
class Upload:
    """A client's reply under compression: the model the server reconstructs from what it sent
    (weighted as the method weighs it) and the bytes it sent. Summed over clients."""

    model: Weighted
    nbytes: float


def unflat(vec: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """``vec`` back in ``like``'s floating-point shapes (zeros for the other tensors)."""
    out, at = [], 0
    for t in like:
        if t.is_floating_point():
            out.append(vec[at : at + t.numel()].view(t.shape).to(t.dtype))
            at += t.numel()
        else:
            out.append(torch.zeros_like(t))
    return out


def kept(d: int, ratio: float) -> int:
    """k, the coordinates topk and randk send of d."""
    return min(d, max(1, math.ceil(ratio * d)))


def bucket_size(d: int, bucket: int | None) -> int:
    """b, the coordinates of each of QSGD's buckets of a vector of d (0 or None: the whole vector)."""
    return min(bucket, d) if bucket else d


def sent_bytes(d: int, kind: str, levels: int, ratio: float, bucket: int | None = 0) -> float:
    """The bytes a client sends for an update of d numbers (it depends on d only)."""
    if kind == "qsgd":
        norms = math.ceil(d / bucket_size(d, bucket)) if d else 0
        return 4.0 * norms + math.ceil(d * (1 + math.ceil(math.log2(levels + 1))) / 8)
    if kind == "topk":
        return 8.0 * kept(d, ratio)
    if kind == "randk":
        return 4.0 * kept(d, ratio)
    return 4.0 * d


def qsgd(v: torch.Tensor, levels: int, gen: torch.Generator, bucket: int | None) -> torch.Tensor:
    """QSGD's C(v): each bucket's coordinates scaled by s/‖bucket‖ and rounded at random to a
    neighbouring integer, unbiased (a bucket of zeros stays zeros). One uniform draw per
    coordinate, in order: with one bucket the draws, and so the numbers, are those of the
    whole-vector quantizer."""
    d = v.numel()
    b = bucket_size(d, bucket)
    x = v.double()
    rows = torch.nn.functional.pad(x, (0, -d % b)).view(-1, b)
    norm = torch.linalg.vector_norm(rows, dim=1, keepdim=True).expand(-1, b).reshape(-1)[:d]
    scaled = x.abs() * levels / torch.where(norm > 0, norm, 1.0)
    low = scaled.floor()
    up = torch.rand(d, generator=gen, dtype=torch.float64) < (scaled - low)
    return (torch.sign(x) * (low + up) * norm / levels).float()


def compress(
    v: torch.Tensor,
    kind: str,
    levels: int,
    ratio: float,
    gen: torch.Generator,
    unbiased: bool = True,
    bucket: int | None = 0,
) -> torch.Tensor:
    """C(v) for a float32 vector ``v`` (``gen``: the client's draws this round); ``unbiased``
    False: randk's values unscaled, the contractive form error feedback needs; ``bucket``:
    QSGD's bucket size (0 or None: the whole vector)."""
    d = v.numel()
    if kind == "none" or d == 0:
        return v
    if kind == "qsgd":
        return qsgd(v, levels, gen, bucket)
    k = kept(d, ratio)
    out = torch.zeros_like(v)
    if kind == "topk":
        idx = v.abs().topk(k, sorted=False).indices
        out[idx] = v[idx]
    elif kind == "randk":
        idx = torch.randperm(d, generator=gen)[:k]
        out[idx] = v[idx] * (d / k) if unbiased else v[idx]
    else:
        raise ValueError(f"unknown compressor {kind!r}")
    return out


def gossip_estimate(x: torch.Tensor, estimate: torch.Tensor, cfg, seed: int, round_: int, cid: int) -> torch.Tensor:
    """CHOCO-gossip's public copy after a round: x̂ + Q(x − x̂), Q the scenario's compressor in
    its contractive form (Koloskova, Stich & Jaggi, ICML 2019: topk; randk unscaled; QSGD
    divided by τ = 1 + min(b/s², √b/s), b its bucket size: each bucket's variance is within
    that share of its squared norm, so the whole vector's is), from (seed, "compress", round,
    client)."""
    v = (x - estimate).float().cpu()
    q = compress(
        v,
        cfg.compress,
        cfg.levels,
        cfg.ratio,
        rng.torch_generator(seed, "compress", round_, cid),
        unbiased=False,
        bucket=cfg.bucket,
    )
    if cfg.compress == "qsgd":
        b = bucket_size(v.numel(), cfg.bucket)
        q = q / (1 + min(b / cfg.levels**2, math.sqrt(b) / cfg.levels))
    return estimate + q.to(estimate.device, estimate.dtype)


def upload(
    reply: Weighted, shared: list[torch.Tensor], cfg, residual: torch.Tensor | None, seed: int, round_: int, cid: int
) -> tuple[Upload, torch.Tensor | None]:
    """A client's ``Weighted`` reply of its trained model as the server receives it compressed
    (``cfg``: the scenario's communication section), and the client's new remainder (error
    feedback; None without it)."""
    nbytes = sent_bytes(float_numbers(shared), cfg.compress, cfg.levels, cfg.ratio, cfg.bucket)
    if cfg.compress == "none" and not cfg.error_feedback:
        return Upload(reply, nbytes), None  # the model itself: the run's numbers unchanged
    delta = torch.cat(
        [d.reshape(-1).float().cpu() for d in model_update(reply, shared, "compression") if d is not None]
    )
    if cfg.error_feedback and residual is not None:
        delta = delta + residual
    sent = compress(
        delta,
        cfg.compress,
        cfg.levels,
        cfg.ratio,
        rng.torch_generator(seed, "compress", round_, cid),
        unbiased=not cfg.error_feedback,
        bucket=cfg.bucket,
    )
    remainder = delta - sent if cfg.error_feedback else None
    device = shared[0].device
    model = [s + d.to(device) if s.is_floating_point() else s for s, d in zip(shared, unflat(sent, shared))]
    return Upload(Weighted(model, reply.weight), nbytes), remainder
