"""Data-layer basics: the FederatedSource interface, pooled sources, per-client splits, DataError.

Building a source is cheap and deterministic: the engine builds one in every host process and
each host then asks only for its own clients. Per-client datasets generate a client's data on
demand from streams derived from (seed, ..., cid); pooled datasets load their pool and run the
partitioner once, lazily, and ``client(cid)`` slices it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import generator


class DataError(Exception):
    """Missing or malformed data; the message is one line saying where we looked and what to do."""


@dataclass(frozen=True)
class Splits:
    """Fractions of each client's samples for train / val / test (summing to 1)."""

    train: float = 0.8
    val: float = 0.0
    test: float = 0.2

    def __post_init__(self):
        if min(self.train, self.val, self.test) < 0 or abs(self.train + self.val + self.test - 1) > 1e-6:
            raise ValueError(f"splits {self.train}/{self.val}/{self.test} must be >= 0 and sum to 1")


class FederatedSource:
    """A federated dataset: ``client(cid)`` gives one client's split shard, deterministically."""

    num_clients: int
    input_shape: tuple[int, ...]   # per-sample shape, e.g. (150,) or (1, 28, 28)
    num_classes: int               # classification: classes; regression: target dimension
    task: str = "classification"   # a raysim.core.tasks.TASKS key

    @property
    def num_outputs(self) -> int:
        """Width of the model's output layer."""
        return self.num_classes

    def client(self, cid: int) -> ClientData:
        raise NotImplementedError

    def num_samples(self, cid: int) -> int:
        """Samples of client ``cid`` before the train/val/test split."""
        raise NotImplementedError


def _half_up(v: float) -> int:
    return int(math.floor(v + 0.5))


def split_client(cid: int, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                 splits: Splits, seed: int, target_dtype: torch.dtype = torch.int64) -> ClientData:
    """Shuffle a client's n samples with generator(seed, "split", cid); train takes the first
    round(n·train) (half up), val the next round(n·val), test the rest.

    With n >= 2, train and test each keep at least one sample when their fraction is > 0
    (taken from val first, then from the larger of the two). Targets become ``target_dtype``
    (int64 class ids; float32 for regression).
    """
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x)
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y, dtype=target_dtype)
    n = int(y.shape[0])
    if int(x.shape[0]) != n:
        raise ValueError(f"client {cid}: {x.shape[0]} inputs but {n} labels")
    n_train = min(_half_up(n * splits.train), n)
    n_val = min(_half_up(n * splits.val), n - n_train)
    if n >= 2:
        if splits.train > 0 and n_train == 0:
            n_train, n_val = 1, min(n_val, n - 1)
        if splits.test > 0 and n_train + n_val == n:
            if n_val > 0:
                n_val -= 1
            else:
                n_train -= 1
    perm = torch.from_numpy(generator(seed, "split", cid).permutation(n))
    tr, va, te = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    return ClientData(cid, x[tr], y[tr], x[va], y[va], x[te], y[te])


@dataclass(frozen=True)
class GroupParams:
    """Clients in groups that see the data differently (clustered FL): client k belongs to
    group k mod ``groups``; group g's images are rotated by g·90° (``rotate``, IFCA's rotated
    MNIST) or its labels permuted by a permutation drawn for g (``permute_labels``; group 0
    keeps both as they are)."""

    groups: int = field(default=1, metadata={"min": 1, "max": 4, "help": "client groups (1: none)"})
    group_transform: str = field(default="rotate", metadata={"choices": ("rotate", "permute_labels")})


class PooledSource(FederatedSource):
    """A labelled pool split among clients by a partitioner (lazily, once per instance).

    Subclasses set ``name``, ``input_shape``, ``num_classes`` and ``image_shape`` (for
    rotations) and implement ``load`` (the pool: inputs and int64 labels) and, where the stored
    inputs need it, ``to_float``. ``groups`` (GroupParams) transforms each group's shards.
    """

    name = "pool"
    image_shape: tuple[int, int] | None = None

    def __init__(self, clients: int, partition, splits: Splits, seed: int, groups: GroupParams | None = None):
        if partition is None:
            raise ValueError(f"{self.name} is a pooled dataset and needs a partition")
        self.num_clients, self.partition, self.splits, self.seed = clients, partition, splits, seed
        self.groups = groups or GroupParams()
        self._pool: tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None = None

    def group_of(self, cid: int) -> int:
        """The client's true group (what a clustered method should recover)."""
        return cid % self.groups.groups

    def transform(self, x: np.ndarray, y: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
        if group == 0:
            return x, y
        if self.groups.group_transform == "rotate":
            h, w = self.image_shape
            return np.ascontiguousarray(np.rot90(x.reshape(-1, h, w), k=group, axes=(1, 2)).reshape(x.shape)), y
        perm = generator(self.seed, "label_permutation", group).permutation(self.num_classes)
        return x, perm[y]

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def to_float(self, x: np.ndarray) -> np.ndarray:
        """Stored inputs of some samples -> float32 model inputs."""
        return x.astype(np.float32, copy=False)

    def pool(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(inputs, labels, one index array per client), computed on first use."""
        if self._pool is None:
            from . import PARTITIONERS
            x, y = self.load()
            spec = PARTITIONERS[self.partition.kind]
            try:
                parts = spec.fn(y, self.num_clients, self.partition.params, generator(self.seed, "partition"))
            except ValueError as e:
                raise DataError(f"{self.name}: partition {self.partition.kind}: {e}") from None
            self._pool = (x, y, parts)
        return self._pool

    def num_samples(self, cid: int) -> int:
        return len(self.pool()[2][cid])

    def client(self, cid: int) -> ClientData:
        x, y, parts = self.pool()
        idx = parts[cid]
        xs, ys = self.transform(self.to_float(x[idx]), y[idx], self.group_of(cid))
        return split_client(cid, xs, ys, self.splits, self.seed)
