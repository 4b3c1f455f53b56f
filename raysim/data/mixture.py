"""Clients as mixtures of S source distributions (soft clustered FL).

Ruan & Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local Updating",
AAAI 2022, §6 and the official ``clients_preparation.py``. Client k holds n_k ~ U{min_size ..
max_size} samples, n_ks of them from source s:

- ``10:90`` / ``30:70``: the first half of the clients (k < N/2) hold a share p = 0.1 / 0.3 of
  source 0, the other half 1 − p;
- ``linear``: client k holds a share (k + 0.5)/N of source 0;
- ``random``: shares ~ Dir(1) over the S sources (the paper's uniform spacings), any S.

Counts are ⌊share·n_k⌋ for every source but the last, which takes the remainder (the official
code's rounding). Each source also has a held-out test set (``holdout`` samples) on which
cluster models are scored against the sources (FedSoft's center/source table).

Sources are either generated (``RegressionMixture``: FedSoft's synthetic linear regression) or
views of one labelled pool (``PooledSource`` with ``partition: {kind: mixture}``: source s is
the pool rotated by s·90° or with its labels permuted, IFCA's and FedSoft's image setups).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import generator

from .base import DataError, FederatedSource, Splits, split_client, train_shares

SCHEMES = ("10:90", "30:70", "linear", "random")


@dataclass(frozen=True)
class MixtureParams:
    scheme: str = field(
        default="10:90",
        metadata={
            "choices": SCHEMES,
            "help": "10:90 / 30:70: two client halves; linear: share (k+0.5)/N; random: Dir(1)",
        },
    )
    sources: int = field(default=2, metadata={"min": 1, "help": "source distributions S (10:90, 30:70, linear: 2)"})
    min_size: int = field(default=100, metadata={"min": 1, "help": "n_k ~ U{min_size..max_size}"})
    max_size: int = field(
        default=200,
        metadata={
            "min": 1,
            "help": (
                "largest n_k: a client's samples drawn uniformly from min_size to max_size (inclusive; ≥ min_size)"
            ),
        },
    )
    holdout: int = field(default=5000, metadata={"min": 1, "help": "held-out test samples per source"})


def problem(params: MixtureParams) -> tuple[str, str] | None:
    """(partition key, what is wrong) for settings no scheme can honour, or None."""
    if params.scheme != "random" and params.sources != 2:
        return (
            "sources",
            f"{params.sources}: scheme {params.scheme} mixes 2 sources; use scheme random for {params.sources}",
        )
    if params.max_size < params.min_size:
        return ("max_size", f"{params.max_size} is below partition.min_size ({params.min_size})")
    return None


def check(params: MixtureParams) -> None:
    p = problem(params)
    if p is not None:
        raise ValueError(f"partition.{p[0]} = {p[1]}")


def shares(params: MixtureParams, clients: int, rng: np.random.Generator) -> np.ndarray:
    """(clients, S) nominal share of each source per client."""
    check(params)
    k = np.arange(clients)
    if params.scheme in ("10:90", "30:70"):
        p = float(params.scheme.split(":")[0]) / 100
        a = np.where(k < clients / 2, p, 1 - p)
        return np.stack([a, 1 - a], axis=1)
    if params.scheme == "linear":
        a = (k + 0.5) / clients
        return np.stack([a, 1 - a], axis=1)
    return rng.dirichlet(np.ones(params.sources), size=clients)


def plan(params: MixtureParams, clients: int, rng: np.random.Generator) -> np.ndarray:
    """(clients, S) sample counts n_ks: sizes n_k ~ U{min..max}, ⌊share·n_k⌋ per source, the
    last source taking the remainder."""
    sh = shares(params, clients, rng)
    sizes = rng.integers(params.min_size, params.max_size + 1, size=clients)
    counts = np.floor(sh * sizes[:, None] + 1e-9).astype(np.int64)
    counts[:, -1] = sizes - counts[:, :-1].sum(axis=1)
    return counts


def source_labels(counts: np.ndarray) -> np.ndarray:
    """Per-sample source ids of a client with counts n_ks: n_k0 zeros, then n_k1 ones, ..."""
    return np.repeat(np.arange(len(counts)), counts)


@dataclass
class MixtureParts:
    """A pool split as a mixture: per client its pool indices and each sample's source; the
    pool indices of the held-out set (shared by every source, each seeing it its own way)."""

    parts: list[np.ndarray]
    sources: list[np.ndarray]
    holdout: np.ndarray


def mixture(labels: np.ndarray, num_clients: int, params: MixtureParams, rng: np.random.Generator) -> MixtureParts:
    """Split a pool: ``holdout`` samples first (held out), then each client's n_k samples,
    without replacement; the first n_k0 of a client's samples come from source 0, and so on."""
    counts = plan(params, num_clients, rng)
    need = params.holdout + int(counts.sum())
    if need > len(labels):
        raise ValueError(
            f"needs {need} samples ({params.holdout} held out + {int(counts.sum())} for the clients) "
            f"but the pool holds {len(labels)}; lower data.clients, partition.max_size or "
            f"partition.holdout"
        )
    perm = rng.permutation(len(labels))
    holdout, rest = np.sort(perm[: params.holdout]), perm[params.holdout :]
    ends = np.cumsum(counts.sum(axis=1))
    parts = [rest[e - int(c.sum()) : e].astype(np.int64) for e, c in zip(ends, counts)]
    return MixtureParts(parts, [source_labels(c) for c in counts], holdout.astype(np.int64))


@dataclass(frozen=True)
class RegressionParams:
    dim: int = field(default=10, metadata={"min": 1, "help": "input dimension d"})
    weight_var: float = field(default=10.0, metadata={"gt": 0.0, "help": "w_s ~ N(0, weight_var·I)"})
    noise: float = field(default=1.0, metadata={"min": 0.0, "help": "std of the label noise"})


class RegressionMixture(FederatedSource):
    """FedSoft's synthetic linear regression (§6, the official ``datawrappers/lr.py``): S
    sources with w_s ~ N(0, weight_var·I); a sample of source s is x ~ N(0, I_d),
    y = ⟨w_s, x⟩ + ε, ε ~ N(0, noise²). Clients mix the sources by ``partition`` (kind
    mixture); their samples come from (seed, "regression", "samples", cid), so any client is
    generated alone. Task: regression (MSE), target dimension 1."""

    task = "regression"

    def __init__(self, params: RegressionParams, clients: int, partition, splits: Splits, seed: int):
        if partition is None or not isinstance(partition.params, MixtureParams):
            raise DataError("regression_mixture: needs data.partition.kind: mixture")
        self.p, self.mix, self.splits, self.seed = params, partition.params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (params.dim,), 1
        self.num_sources = self.mix.sources
        try:
            self.counts = plan(self.mix, clients, generator(seed, "partition"))
        except ValueError as e:
            raise DataError(f"regression_mixture: {e}") from None
        self.w = generator(seed, "regression", "w").normal(
            0.0, np.sqrt(params.weight_var), (self.num_sources, params.dim)
        )

    def _sample(self, g: np.random.Generator, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = g.standard_normal((len(src), self.p.dim))
        y = np.einsum("nd,nd->n", x, self.w[src]) + g.normal(0.0, self.p.noise, len(src))
        return x.astype(np.float32), y.astype(np.float32)

    def num_samples(self, cid: int) -> int:
        return int(self.counts[cid].sum())

    def sources_of(self, cid: int) -> np.ndarray:
        return source_labels(self.counts[cid])

    def client(self, cid: int) -> ClientData:
        x, y = self._sample(generator(self.seed, "regression", "samples", cid), self.sources_of(cid))
        return split_client(cid, x, y, self.splits, self.seed, target_dtype=torch.float32)

    def source_test(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._sample(generator(self.seed, "regression", "holdout", s), np.full(self.mix.holdout, s))
        return torch.from_numpy(x), torch.from_numpy(y)

    def true_shares(self, cid: int) -> np.ndarray:
        return train_shares(cid, self.sources_of(cid), self.num_sources, self.splits, self.seed)

    def best_fit_mse(self, cid: int) -> float:
        """Population MSE of the best single linear model for the client's train mixture:
        noise² + Σ_s u_s‖w_s − w̄‖² with w̄ = Σ_s u_s w_s (two sources: 1 + p(1−p)‖w_A − w_B‖²)."""
        u = self.true_shares(cid)
        wbar = u @ self.w
        return float(self.p.noise**2 + (u * ((self.w - wbar) ** 2).sum(axis=1)).sum())
