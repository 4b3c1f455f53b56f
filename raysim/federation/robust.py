"""Byzantine-robust aggregation ("defences"): rules that combine one round's client updates so
that f arbitrary (Byzantine) clients move the result little. The arithmetic lives in
``robust_rules``; here are the rules' options, their limits and one entry point, ``aggregate``.

Inputs: U, the round's updates θ_k − θ as a float64 tensor (K, d), rows in client-id order; w, their
sample counts (K,); f, the number of Byzantine clients the rule assumes. Every rule returns a
``Verdict``: the aggregate (d,) float64 and ``kept``, the clients it accepted (K,) bool, for the rules
that select or flag clients (None for the coordinate-wise ones and the clipping rules). Randomness
comes only from the ``torch.Generator`` the caller passes (seeded from raysim.rng), never the global
one. Only ``mean`` and ``geometric_median`` use w; the others weigh every client the same, as their
papers do (a client's sample count is its own claim, so a robust rule cannot trust it).

Rules (``DEFENCES``; memory is beyond the K × d input, c = ``chunk`` columns or d without one):

- ``mean``: Σ w_k U_k / Σ w_k, FedAvg's average, the baseline. O(d).
- ``median``: coordinate-wise median (Yin, Chen, Ramchandran & Bartlett, ICML 2018), the mean of
  the two middle values for even K. O(K·c).
- ``trimmed_mean``: coordinate-wise mean after dropping the b largest and b smallest values (Yin
  et al. 2018), b = f, or ⌊βK⌋ with the option β (the paper's fraction). O(K·c).
- ``krum`` / ``multi_krum`` (Blanchard, El Mhamdi, Guerraoui & Stainer, NeurIPS 2017): score_i =
  Σ of the squared distances to its K − f − 2 nearest others; Krum returns the update of lowest
  score, Multi-Krum the plain mean of the m lowest (the paper leaves m free; default K − f, the
  usual choice; scores computed once, as the paper's Multi-Krum); ties go to the lower client id.
  Needs 2f + 2 < K. The K × K distance matrix from a Gram matrix centred on the coordinate-wise
  median, accumulated over column blocks (never a K × K × d tensor): O(K² + K·c).
- ``geometric_median``: RFA (Pillutla, Kakade & Harchaoui, IEEE TSP 2022), the smoothed Weiszfeld
  algorithm from the α-weighted mean, α = w / Σw: z ← Σ β_k U_k / Σ β_k, β_k = α_k / max(ν, ‖z −
  U_k‖), stopped when the objective Σ α_k ‖z − U_k‖ moves by less than ftol times itself. Defaults
  of the official code (krishnap25/RFA): maxiter 4, ν 1e-5, ftol 1e-6. O(K + d + K·c).
- ``bulyan`` (El Mhamdi, Guerraoui & Rouault, ICML 2018): θ = K − 2f updates selected by Krum
  applied repeatedly to those left (each time with f and the remaining count r), then each
  coordinate the mean of the β = θ − 2f selected values closest to their median. Needs
  K ≥ 4f + 3. Where r − f − 2 < 1 (the last selection for f = 1, the last two for f = 0) the
  nearest neighbour scores (the paper leaves it open; an empty sum would make every score 0).
  O(K² + θ·c).
- ``centered_clipping`` (Karimireddy, He & Jaggi, ICML 2021): v ← v + (1/K) Σ (x_i − v)·min(1,
  τ/‖x_i − v‖), L times, from ``center`` (the previous round's aggregate: the momentum the paper
  clips around; zero if None). Defaults of the official code (epfml/byzantine-robust-optimizer,
  its CIFAR-10 runs): τ = 100, L = 1; τ is in the units of the updates, so set it per task.
  O(d + K·c).
- ``norm_clipping`` (Sun, Kairouz, Suresh & McMahan, "Can you really backdoor federated
  learning?", 2019): each update clipped to norm M, the plain mean (``weighted``: by w), plus
  N(0, σ²I) ("weak DP") when σ > 0. M = 0.33, one of the bounds of the paper's EMNIST runs (0.1,
  0.17, 0.33 as FedML's port notes them; M is in the units of the updates: set it per task),
  σ = 0 (the paper's weak-DP runs use 0.025). O(d).
- ``dnc`` (Divide-and-Conquer, Shejwalkar & Houmansadr, NDSS 2021): ``niters`` times, b
  coordinates drawn without replacement, the subsample centred, the scores (x_i − μ)·v squared on
  its top right singular vector v, the ⌊c·f⌋ highest removed; the mean of the clients kept every
  time. The authors released no DnC code (their repository holds the attacks): b = 10 000 and
  c = 1.0 as Blades takes them (FLPoison subsamples 20 % of d), niters = 5 (FLPoison's; Blades 1).
  O(K·min(b, d) + d) (the subsample and its SVD, the drawn indices).
- ``signguard`` (Xu, Huang, Song, Zhang & Xu, ICDCS 2022): the norm filter L·med < ‖x_i‖ < R·med
  around the median norm (L = 0.1, R = 3.0), the sign statistics (shares of positive, zero and
  negative coordinates on ⌊fraction·d⌋ of them, fraction 0.1, each divided by its largest value
  over the clients) clustered by MeanShift (bandwidth estimated at quantile 0.5, bin seeding,
  orphans left out) and the largest cluster kept: the official code (JianXu95/SignGuard), with its
  DBSCAN alternative as ``clustering: dbscan``; kept = norm filter ∩ cluster, each clipped to the
  median norm, averaged. The official code takes a contiguous block at a random start
  (``subset: block``, the default); ``random`` scatters the coordinates, the paper's wording.
  Departures: the median norm is the usual one (mean of the two middle norms for even K; the
  code's torch.median takes the lower), and the bandwidth is estimated on all K points (the code
  subsamples 50, the same for K ≤ 50). O(K·c + d).
- ``fltrust`` (Cao, Fang, Liu & Gong, NDSS 2021): TS_i = ReLU(cos(g_i, g_0)) with the server's
  root update g_0 (``root``), each g_i rescaled to ‖g_0‖, Σ TS_i ĝ_i / Σ TS_i; 0 when every TS_i
  is 0; kept = TS_i > 0. O(K + d).
- ``flame`` (Nguyen et al., USENIX Security 2022): HDBSCAN (sklearn, precomputed cosine
  distances, min_cluster_size K//2 + 1, min_samples 1, allow_single_cluster) and the largest
  cluster kept (noise points are not); each kept update clipped to S_t, the median of all K
  norms; their mean plus N(0, (λ·S_t)² I), λ = 0.001 (the paper's for image tasks; the authors
  released no code, so the paper is the reference; FLPoison's port scales the noise by each
  tensor's std instead). The paper
  clusters the local models θ + U_k; without the global model (``model``) the rule clusters the
  updates (``cluster_on: updates``, the default, since U is what it is given), with it
  ``cluster_on: models`` is the paper's. No client admitted: the aggregate is the noise alone.
  O(K² + K·c + d).

Pre-aggregators (``PREAGGREGATORS``, applied before a rule by ``preaggregate``):

- ``bucketing`` (Karimireddy, He & Jaggi, ICLR 2022): a random permutation from the generator,
  consecutive buckets of s (the last shorter), each bucket's plain mean (``weighted``: by w) and
  its weight Σ w. The rule then sees ⌈K/s⌉ inputs and the caller passes it the same f: a
  Byzantine client spoils at most its own bucket, so at most f of the ⌈K/s⌉ means are bad, the
  paper's count (its fraction δ becomes sδ); the rule's limits then apply to ⌈K/s⌉
  (``Preaggregator.inputs``): Krum with K = 20, f = 4 and s = 2 sees 10 inputs and is refused.
  ``Mixed.groups`` maps a bucket (and a kept one) back to its clients. O(⌈K/s⌉·K + output).
- ``nnm`` (Nearest Neighbour Mixing, Allouah et al., AISTATS 2023): each update replaced by the
  mean of its K − f nearest updates, itself included; K inputs, weights unchanged. O(K² + output).

Gossip (one node's view: its model x_i (d,), its n_i neighbours' X (n_i, d), its mixing weights):

- ``clipped_gossip`` (He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via
  ClippedGossip", 2022): x_i ← w_ii x_i + Σ_j w_ij (x_i + CLIP(x_j − x_i, τ_i)), which is the
  paper's x_i + Σ_j w_ij CLIP(x_j − x_i, τ_i) when the weights sum to 1. τ fixed, or adaptive:
  the farthest neighbours whose weights reach δ_i (the weight the node gives Byzantine
  neighbours) are clipped to the distance of the farthest one left; δ None clips the single
  farthest to the second farthest distance, the official code's rule
  (epfml/byzantine-robust-decentralized-optimizer, ``sorted(distances)[-2]``). O(n_i·d).
- ``bridge_trimmed_mean`` (BRIDGE-T, Yang & Bajwa 2019; Fang, Yang & Bajwa 2022):
  coordinate-wise, the b largest and b smallest neighbour values dropped and the rest averaged
  with the node's own value, Σ / (n_i − 2b + 1) (``screen: neighbours``, the paper's);
  ``screen: all`` trims the n_i + 1 values, the node's own included. Needs n_i ≥ 2b + 1.
  O(n_i·c).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from raysim.federation import robust_rules as rr


@dataclass(frozen=True)
class Verdict:
    """A rule's result: the aggregate update (d,) float64, and the clients it kept (K,) bool, or
    None for a rule that flags no client."""

    aggregate: torch.Tensor
    kept: torch.Tensor | None = None


@dataclass(frozen=True)
class Mixed:
    """A pre-aggregator's output: the updates the rule sees (K', d), their weights (K',), and
    each one's clients (``groups[j]``: the client ids mixed into row j's bucket; NNM: ``(j,)``)."""

    updates: torch.Tensor
    weights: torch.Tensor
    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Inputs:
    """What a rule is given besides its options."""

    U: torch.Tensor
    w: torch.Tensor
    f: int
    generator: torch.Generator | None = None
    center: torch.Tensor | None = None
    root: torch.Tensor | None = None
    model: torch.Tensor | None = None
    chunk: int | None = None


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class NoParams:
    """A rule without options."""


@dataclass(frozen=True)
class TrimmedMeanParams:
    beta: float | None = field(
        default=None,
        metadata={"min": 0.0, "lt": 0.5, "help": "trim ⌊βK⌋ from each end instead of f (Yin et al.'s β)"},
    )


@dataclass(frozen=True)
class MultiKrumParams:
    m: int | None = field(default=None, metadata={"min": 1, "help": "updates averaged; null: K − f"})


@dataclass(frozen=True)
class GeometricMedianParams:
    nu: float = field(default=1e-5, metadata={"gt": 0.0, "help": "ν, the smoothing (smallest distance divided by)"})
    maxiter: int = field(default=4, metadata={"min": 1, "help": "most Weiszfeld iterations"})
    ftol: float = field(default=1e-6, metadata={"min": 0.0, "help": "stop when the objective moves by less"})


@dataclass(frozen=True)
class CenteredClippingParams:
    tau: float = field(default=100.0, metadata={"gt": 0.0, "help": "τ, the clipping radius around the centre"})
    L: int = field(default=1, metadata={"min": 1, "help": "clipping iterations"})


@dataclass(frozen=True)
class NormClippingParams:
    M: float = field(default=0.33, metadata={"gt": 0.0, "help": "the norm each update is clipped to"})
    sigma: float = field(default=0.0, metadata={"min": 0.0, "help": "std of the weak-DP noise on the mean"})
    weighted: bool = field(default=False, metadata={"help": "average by sample counts, not equally"})


@dataclass(frozen=True)
class DnCParams:
    niters: int = field(default=5, metadata={"min": 1, "help": "subsampling iterations"})
    b: int = field(default=10_000, metadata={"min": 1, "help": "coordinates subsampled"})
    c: float = field(default=1.0, metadata={"min": 0.0, "help": "filtering fraction: ⌊c·f⌋ removed"})


@dataclass(frozen=True)
class SignGuardParams:
    lower: float = field(default=0.1, metadata={"min": 0.0, "help": "L: kept if its norm is above L × the median"})
    upper: float = field(default=3.0, metadata={"gt": 0.0, "help": "R: kept if its norm is below R × the median"})
    fraction: float = field(default=0.1, metadata={"gt": 0.0, "max": 1.0, "help": "share of coordinates"})
    subset: str = field(default="block", metadata={"choices": ("block", "random"), "help": "how they are drawn"})
    clustering: str = field(
        default="meanshift", metadata={"choices": ("meanshift", "dbscan"), "help": "the sign features' clustering"}
    )


@dataclass(frozen=True)
class FlameParams:
    lam: float = field(default=0.001, metadata={"min": 0.0, "help": "λ: the noise's std is λ × the median norm"})
    cluster_on: str = field(
        default="updates", metadata={"choices": ("updates", "models"), "help": "models: θ + U_k (needs the model)"}
    )


@dataclass(frozen=True)
class FLTrustParams:
    root_size: int = field(
        default=100,
        metadata={
            "min": 1,
            "help": "samples drawn from the pool before the partition for the server's root set (the paper's 100)",
        },
    )


@dataclass(frozen=True)
class BucketingParams:
    s: int = field(default=2, metadata={"min": 1, "help": "bucket size"})
    weighted: bool = field(default=False, metadata={"help": "bucket means weighted by sample counts"})


@dataclass(frozen=True)
class ClippedGossipParams:
    tau: float | None = field(default=None, metadata={"gt": 0.0, "help": "fixed τ; null: the adaptive rule"})
    delta: float | None = field(
        default=None, metadata={"min": 0.0, "help": "δ_i, the Byzantine weight clipped; null: the farthest neighbour"}
    )


@dataclass(frozen=True)
class BridgeParams:
    screen: str = field(
        default="neighbours", metadata={"choices": ("neighbours", "all"), "help": "which values are trimmed"}
    )


def field_error(name: str, params: Any) -> str | None:
    """The first option of ``params`` outside its range (metadata min, max, gt, lt, choices)."""
    for fl in fields(params):
        v, meta = getattr(params, fl.name), fl.metadata
        if v is None or isinstance(v, bool) or not meta:
            continue
        bad = (
            ("choices" in meta and v not in meta["choices"] and f"one of {', '.join(map(str, meta['choices']))}")
            or ("min" in meta and v < meta["min"] and f"≥ {meta['min']}")
            or ("max" in meta and v > meta["max"] and f"≤ {meta['max']}")
            or ("gt" in meta and v <= meta["gt"] and f"> {meta['gt']}")
            or ("lt" in meta and v >= meta["lt"] and f"< {meta['lt']}")
        )
        if bad:
            return f"{name}.{fl.name} must be {bad} (got {v})"
    return None


# ----------------------------------------------------------------------------- limits


def _krum_limit(name: str) -> Callable[[int, int, Any], str | None]:
    def limit(K: int, f: int, p: Any) -> str | None:
        if not 2 * f + 2 < K:
            return f"{name} needs 2f + 2 < K (K = {K}, f = {f})"
        m = getattr(p, "m", None)
        if m is not None and m > K:
            return f"{name} needs m ≤ K (K = {K}, m = {m})"
        return None

    return limit


def _trim(K: int, f: int, p: TrimmedMeanParams) -> int:
    return math.floor(p.beta * K) if p.beta is not None else f


def _trimmed_limit(K: int, f: int, p: TrimmedMeanParams) -> str | None:
    b = _trim(K, f, p)
    return None if 2 * b < K else f"trimmed_mean needs 2b < K (K = {K}, b = {b})"


def _bulyan_limit(K: int, f: int, p: Any) -> str | None:
    return None if K >= 4 * f + 3 else f"bulyan needs K ≥ 4f + 3 (K = {K}, f = {f})"


def _dnc_limit(K: int, f: int, p: DnCParams) -> str | None:
    drop = int(p.c * f)
    return None if drop < K else f"dnc needs ⌊c·f⌋ < K (K = {K}, ⌊c·f⌋ = {drop})"


def _signguard_limit(K: int, f: int, p: SignGuardParams) -> str | None:
    return None if p.lower < p.upper else f"signguard needs lower < upper (lower = {p.lower}, upper = {p.upper})"


def _flame_limit(K: int, f: int, p: Any) -> str | None:
    return None if K >= 2 else f"flame needs K ≥ 2 (HDBSCAN's smallest cluster is 2; K = {K})"


def _no_limit(K: int, f: int, p: Any) -> str | None:
    return None


# ----------------------------------------------------------------------------- the rules on Inputs


def _generator(inp: Inputs, what: str) -> torch.Generator:
    if inp.generator is None:
        raise ValueError(f"{what} draws at random: pass a torch.Generator (generator=...)")
    return inp.generator


def _mean(inp: Inputs, p: NoParams) -> Verdict:
    return Verdict(rr.weighted_mean(inp.U, inp.w))


def _median(inp: Inputs, p: NoParams) -> Verdict:
    return Verdict(rr.coordinate_median(inp.U, inp.chunk))


def _trimmed_mean(inp: Inputs, p: TrimmedMeanParams) -> Verdict:
    return Verdict(rr.trimmed_mean(inp.U, _trim(inp.U.shape[0], inp.f, p), inp.chunk))


def _krum(inp: Inputs, p: NoParams) -> Verdict:
    agg, kept, _ = rr.krum(inp.U, inp.f, 1, inp.chunk)
    return Verdict(agg, kept)


def _multi_krum(inp: Inputs, p: MultiKrumParams) -> Verdict:
    m = p.m if p.m is not None else inp.U.shape[0] - inp.f
    agg, kept, _ = rr.krum(inp.U, inp.f, m, inp.chunk)
    return Verdict(agg, kept)


def _geometric_median(inp: Inputs, p: GeometricMedianParams) -> Verdict:
    z, _ = rr.smoothed_weiszfeld(inp.U, inp.w / inp.w.sum(), p.nu, p.maxiter, p.ftol, inp.chunk)
    return Verdict(z)


def _bulyan(inp: Inputs, p: NoParams) -> Verdict:
    agg, kept, _ = rr.bulyan(inp.U, inp.f, inp.chunk)
    return Verdict(agg, kept)


def _centered_clipping(inp: Inputs, p: CenteredClippingParams) -> Verdict:
    center = inp.center if inp.center is not None else inp.U.new_zeros(inp.U.shape[1])
    return Verdict(rr.centered_clipping(inp.U, center.to(inp.U), p.tau, p.L, inp.chunk))


def _norm_clipping(inp: Inputs, p: NormClippingParams) -> Verdict:
    U, K = inp.U, inp.U.shape[0]
    share = inp.w / inp.w.sum() if p.weighted else U.new_full((K,), 1 / K)
    agg = rr.weighted_rows(share * rr.clip_factors(torch.linalg.vector_norm(U, dim=1), p.M), U)
    if p.sigma > 0:
        agg = agg + p.sigma * rr.normal(U.shape[1], _generator(inp, "norm_clipping's noise"), U)
    return Verdict(agg)


def _dnc(inp: Inputs, p: DnCParams) -> Verdict:
    gen = _generator(inp, "dnc's subsampling") if p.b < inp.U.shape[1] else inp.generator
    agg, kept = rr.dnc(inp.U, inp.f, p.niters, p.b, p.c, gen)
    return Verdict(agg, kept)


def _signguard(inp: Inputs, p: SignGuardParams) -> Verdict:
    d = inp.U.shape[1]
    gen = _generator(inp, "signguard's coordinates") if max(1, int(p.fraction * d)) < d else inp.generator
    agg, kept = rr.signguard(inp.U, p.lower, p.upper, p.fraction, p.subset, p.clustering, gen, inp.chunk)
    return Verdict(agg, kept)


def _fltrust(inp: Inputs, p: FLTrustParams) -> Verdict:
    if inp.root is None:
        raise ValueError("fltrust needs the server's root update g_0 (root=...)")
    agg, kept, _ = rr.fltrust(inp.U, inp.root.to(inp.U))
    return Verdict(agg, kept)


def _flame(inp: Inputs, p: FlameParams) -> Verdict:
    if p.cluster_on == "models" and inp.model is None:
        raise ValueError("flame with cluster_on: models needs the global model θ (model=...)")
    model = inp.model.to(inp.U) if p.cluster_on == "models" and inp.model is not None else None
    gen = _generator(inp, "flame's noise") if p.lam > 0 else None
    agg, kept, _ = rr.flame(inp.U, p.lam, model, gen, inp.chunk)
    return Verdict(agg, kept)


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Defence:
    """A robust rule: its name, paper, options (``params``, a frozen dataclass), whether it needs f
    and flags clients (``Verdict.kept``), and what it is given besides U, w and f."""

    name: str
    cite: str
    params: type
    needs_f: bool
    flags: bool
    run: Callable[[Inputs, Any], Verdict]
    limit: Callable[[int, int, Any], str | None] = _no_limit
    needs_root: bool = False
    uses_center: bool = False

    def check(self, K: int, f: int, params: Any = None) -> str | None:
        """A one-line reason why the rule cannot run on K updates assuming f Byzantine, or None."""
        p = self.params() if params is None else params
        if not isinstance(p, self.params):
            return f"{self.name} takes {self.params.__name__}, not {type(p).__name__}"
        if K < 1 or f < 0:
            return f"{self.name} needs K ≥ 1 and f ≥ 0 (K = {K}, f = {f})"
        return field_error(self.name, p) or self.limit(K, f, p)


DEFENCES: dict[str, Defence] = {
    d.name: d
    for d in (
        Defence("mean", "McMahan et al., AISTATS 2017 (FedAvg)", NoParams, False, False, _mean),
        Defence("median", "Yin, Chen, Ramchandran & Bartlett, ICML 2018", NoParams, False, False, _median),
        Defence("trimmed_mean", "Yin et al., ICML 2018", TrimmedMeanParams, True, False, _trimmed_mean, _trimmed_limit),
        Defence("krum", "Blanchard et al., NeurIPS 2017", NoParams, True, True, _krum, _krum_limit("krum")),
        Defence(
            "multi_krum",
            "Blanchard et al., NeurIPS 2017",
            MultiKrumParams,
            True,
            True,
            _multi_krum,
            _krum_limit("multi_krum"),
        ),
        Defence(
            "geometric_median",
            "Pillutla, Kakade & Harchaoui, IEEE TSP 2022 (RFA)",
            GeometricMedianParams,
            False,
            False,
            _geometric_median,
        ),
        Defence("bulyan", "El Mhamdi, Guerraoui & Rouault, ICML 2018", NoParams, True, True, _bulyan, _bulyan_limit),
        Defence(
            "centered_clipping",
            "Karimireddy, He & Jaggi, ICML 2021",
            CenteredClippingParams,
            False,
            False,
            _centered_clipping,
            uses_center=True,
        ),
        Defence(
            "norm_clipping", "Sun, Kairouz, Suresh & McMahan, 2019", NormClippingParams, False, False, _norm_clipping
        ),
        Defence("dnc", "Shejwalkar & Houmansadr, NDSS 2021", DnCParams, True, True, _dnc, _dnc_limit),
        Defence("signguard", "Xu et al., ICDCS 2022", SignGuardParams, False, True, _signguard, _signguard_limit),
        Defence("fltrust", "Cao, Fang, Liu & Gong, NDSS 2021", FLTrustParams, False, True, _fltrust, needs_root=True),
        Defence("flame", "Nguyen et al., USENIX Security 2022", FlameParams, False, True, _flame, _flame_limit),
    )
}


def _validate(U: torch.Tensor, w: torch.Tensor, chunk: int | None) -> None:
    if U.dim() != 2 or U.dtype != torch.float64:
        raise ValueError(f"robust: the updates must be a float64 (K, d) tensor, not {U.dtype} {tuple(U.shape)}")
    if w.shape != (U.shape[0],):
        raise ValueError(f"robust: w must have one weight per update ({U.shape[0]}), not shape {tuple(w.shape)}")
    if bool((w < 0).any()) or not float(w.sum()) > 0:
        raise ValueError("robust: the weights must be non-negative with a positive sum")
    if bool(torch.isfinite(U.sum(dim=1)).all()):  # a NaN or ±inf anywhere spoils its row's sum
        return
    bad = torch.zeros(U.shape[0], dtype=torch.bool, device=U.device)
    for sl in rr.blocks(U.shape[1], chunk):
        bad |= ~torch.isfinite(U[:, sl]).all(dim=1)
    if bool(bad.any()):
        raise ValueError(f"robust: non-finite updates from clients {torch.nonzero(bad).flatten().tolist()}")


def aggregate(
    name: str,
    U: torch.Tensor,
    w: torch.Tensor,
    f: int = 0,
    params: Any = None,
    *,
    generator: torch.Generator | None = None,
    center: torch.Tensor | None = None,
    root: torch.Tensor | None = None,
    model: torch.Tensor | None = None,
    chunk: int | None = None,
) -> Verdict:
    """Aggregate one round's updates U (K, d) float64 with the rule ``name``: w their sample counts,
    f the Byzantine clients assumed, ``params`` the rule's options (None: its defaults),
    ``generator`` its draws, ``center`` centered clipping's (the previous aggregate), ``root``
    FLTrust's g_0, ``model`` the global θ (FLAME's ``cluster_on: models``), ``chunk`` the columns
    per block. ValueError with the rule's reason when it cannot run."""
    if name not in DEFENCES:
        raise ValueError(f"unknown defence {name!r}; one of {', '.join(DEFENCES)}")
    rule = DEFENCES[name]
    p = rule.params() if params is None else params
    _validate(U, w, chunk)
    for what, v in (("center", center), ("root", root), ("model", model)):
        if v is not None and v.shape != (U.shape[1],):
            raise ValueError(f"robust: {what} must be a ({U.shape[1]},) vector, not shape {tuple(v.shape)}")
    reason = rule.check(U.shape[0], f, p)
    if reason:
        raise ValueError(reason)
    return rule.run(Inputs(U, w.to(U), f, generator, center, root, model, chunk), p)


# ----------------------------------------------------------------------------- pre-aggregators


def _bucketing(U: torch.Tensor, w: torch.Tensor, f: int, p: BucketingParams, gen, chunk) -> Mixed:
    if gen is None:
        raise ValueError("bucketing draws its permutation: pass a torch.Generator (generator=...)")
    groups = rr.bucket_groups(U.shape[0], p.s, gen)
    means, weights = rr.bucket_means(U, w, groups, p.weighted)
    return Mixed(means, weights, tuple(tuple(g) for g in groups))


def _nnm(U: torch.Tensor, w: torch.Tensor, f: int, p: NoParams, gen, chunk) -> Mixed:
    return Mixed(rr.nearest_neighbour_mixing(U, f, chunk), w.clone(), tuple((k,) for k in range(U.shape[0])))


def _nnm_limit(K: int, f: int, p: Any) -> str | None:
    return None if f < K else f"nnm needs f < K (K = {K}, f = {f})"


@dataclass(frozen=True)
class Preaggregator:
    """A step before the rule: its name, paper, options, whether it needs f, and how many
    updates the rule then sees (``inputs``: the K the rule's ``check`` must be given)."""

    name: str
    cite: str
    params: type
    needs_f: bool
    run: Callable[..., Mixed]
    outputs: Callable[[int, Any], int]
    limit: Callable[[int, int, Any], str | None] = _no_limit

    def inputs(self, K: int, params: Any = None) -> int:
        return self.outputs(K, self.params() if params is None else params)

    def check(self, K: int, f: int, params: Any = None) -> str | None:
        p = self.params() if params is None else params
        if K < 1 or f < 0:
            return f"{self.name} needs K ≥ 1 and f ≥ 0 (K = {K}, f = {f})"
        return field_error(self.name, p) or self.limit(K, f, p)


PREAGGREGATORS: dict[str, Preaggregator] = {
    "bucketing": Preaggregator(
        "bucketing",
        "Karimireddy, He & Jaggi, ICLR 2022",
        BucketingParams,
        False,
        _bucketing,
        lambda K, p: math.ceil(K / p.s),
    ),
    "nnm": Preaggregator("nnm", "Allouah et al., AISTATS 2023", NoParams, True, _nnm, lambda K, p: K, _nnm_limit),
}


def preaggregate(
    name: str,
    U: torch.Tensor,
    w: torch.Tensor,
    f: int = 0,
    params: Any = None,
    *,
    generator: torch.Generator | None = None,
    chunk: int | None = None,
) -> Mixed:
    """The updates, weights and groups pre-aggregator ``name`` gives the rule (see ``Mixed``)."""
    if name not in PREAGGREGATORS:
        raise ValueError(f"unknown pre-aggregator {name!r}; one of {', '.join(PREAGGREGATORS)}")
    step = PREAGGREGATORS[name]
    p = step.params() if params is None else params
    _validate(U, w, chunk)
    reason = step.check(U.shape[0], f, p)
    if reason:
        raise ValueError(reason)
    return step.run(U, w.to(U), f, p, generator, chunk)


# ----------------------------------------------------------------------------- gossip


def check_clipped_gossip(n: int, params: ClippedGossipParams = ClippedGossipParams()) -> str | None:
    """Why ClippedGossip cannot mix a node with n neighbours, or None."""
    return field_error("clipped_gossip", params) or (None if n >= 1 else "clipped_gossip needs a neighbour (n_i = 0)")


def clipped_gossip(
    x: torch.Tensor,
    X: torch.Tensor,
    w: torch.Tensor,
    w_self: float,
    params: ClippedGossipParams = ClippedGossipParams(),
) -> torch.Tensor:
    """ClippedGossip's step at node i: its model x (d,), its neighbours' X (n_i, d), their mixing
    weights w (n_i,) and its own w_self."""
    reason = check_clipped_gossip(X.shape[0], params)
    if reason:
        raise ValueError(reason)
    out, _ = rr.clipped_gossip(x, X, w.to(X), w_self, params.tau, params.delta)
    return out


def check_bridge(n: int, b: int, params: BridgeParams = BridgeParams()) -> str | None:
    """Why BRIDGE cannot screen n neighbours trimming b from each end, or None."""
    if b < 0:
        return f"bridge needs b ≥ 0 (b = {b})"
    return field_error("bridge", params) or (
        None if n >= 2 * b + 1 else f"bridge needs n_i ≥ 2b + 1 neighbours (n_i = {n}, b = {b})"
    )


def bridge_trimmed_mean(
    x: torch.Tensor, X: torch.Tensor, b: int, params: BridgeParams = BridgeParams(), chunk: int | None = None
) -> torch.Tensor:
    """BRIDGE-T's screened mean at a node: its model x (d,), its neighbours' X (n_i, d), b the
    values trimmed from each end."""
    reason = check_bridge(X.shape[0], b, params)
    if reason:
        raise ValueError(reason)
    return rr.bridge(x, X, b, params.screen, chunk)


@dataclass(frozen=True)
class GossipRule:
    """A robust mixing rule for gossip (``defence.rule`` with a topology): its name, paper, options,
    whether it takes b (the values trimmed from each end: ``defence.f``) and its one node's step
    (``mix(x, X, w, w_self, b, params, chunk)``)."""

    name: str
    cite: str
    params: type
    needs_f: bool
    mix: Callable[..., torch.Tensor]
    check: Callable[[int, int, Any], str | None]


GOSSIP_RULES: dict[str, GossipRule] = {
    g.name: g
    for g in (
        GossipRule(
            "clipped_gossip",
            "He, Karimireddy & Jaggi, 2022 (ClippedGossip)",
            ClippedGossipParams,
            False,
            lambda x, X, w, w_self, b, p, chunk: clipped_gossip(x, X, w, w_self, p),
            lambda n, b, p: check_clipped_gossip(n, p),
        ),
        GossipRule(
            "bridge_trimmed_mean",
            "Yang & Bajwa 2019; Fang, Yang & Bajwa 2022 (BRIDGE-T)",
            BridgeParams,
            True,
            lambda x, X, w, w_self, b, p, chunk: bridge_trimmed_mean(x, X, b, p, chunk),
            lambda n, b, p: check_bridge(n, b, p),
        ),
    )
}
