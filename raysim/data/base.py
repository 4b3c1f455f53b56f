"""Data-layer basics: the FederatedSource interface, pooled sources, per-client splits, DataError.

Building a source is cheap and deterministic. The engine builds one in the driver, calls
``prepare`` (a pooled dataset's partition, a file cache's build) and hands copies to the host
actors; each host then asks only for its own clients. Per-client datasets generate a
client's data on demand from streams derived from (seed, ..., cid); pooled datasets run the
partitioner once and ship the index arrays with the source, while the pool itself is
memory-mapped from a local cache in each process, so ``client(cid)`` reads only its rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from raysim.core.data import ClientData, Pixels
from raysim.errors import BadInput
from raysim.rng import generator


class DataError(BadInput):
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
    input_shape: tuple[int, ...]  # per-sample shape, e.g. (150,) or (1, 28, 28)
    num_classes: int  # classification: classes; regression: target dimension
    task: str = "classification"  # a raysim.core.tasks.TASKS key
    input_kind: str = "features"  # "features": float inputs; "tokens": integer ids < vocab_size
    vocab_size: int = 0  # tokens: the number of distinct ids
    class_names: list[str] | None = None  # how a class id reads (characters), where not plain numbers
    # images whose clients hold uint8 pixels (a quarter of float32's memory): the model's inputs are
    # (x / 255 - mean) / std per channel, computed for each batch as it is gathered (Pixels)
    pixels: Pixels | None = None

    @property
    def num_outputs(self) -> int:
        """Width of the model's output layer."""
        return self.num_classes

    def client(self, cid: int) -> ClientData:
        raise NotImplementedError

    def num_samples(self, cid: int) -> int:
        """Samples of client ``cid`` before the train/val/test split."""
        raise NotImplementedError

    def client_name(self, cid: int) -> str | None:
        """The client's name in the data (a writer, a role), where the data name clients."""
        return None

    # Clients as mixtures of source distributions (partition kind ``mixture``): a clustered
    # method's models are scored on each source's held-out set, and its estimates compared
    # with the true shares.
    num_sources: int = 0

    def source_test(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out (inputs, targets) of source ``s``."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Do now, once, the work every process would otherwise repeat (a pooled dataset's
        partition, a file cache's build), so that copies of this source (pickled to the host
        actors) carry it or find it done."""

    def true_shares(self, cid: int) -> np.ndarray | None:
        """Share of each source (or group) in client ``cid``'s train split, (S,); None when
        the data do not say."""
        return None


def _half_up(v: float) -> int:
    return int(math.floor(v + 0.5))


def split_sizes(n: int, splits: Splits) -> tuple[int, int, int]:
    """The sizes of the (train, val, test) splits of a client's n samples (``split_index``)."""
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
    return n_train, n_val, n - n_train - n_val


def split_index(cid: int, n: int, splits: Splits, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train, val, test) positions among a client's n samples: a permutation from
    generator(seed, "split", cid); train takes the first round(n·train) (half up), val the next
    round(n·val), test the rest. With n >= 2, train and test each keep at least one sample when
    their fraction is > 0 (taken from val first, then from the larger of the two)."""
    n_train, n_val, _ = split_sizes(n, splits)
    perm = torch.from_numpy(generator(seed, "split", cid).permutation(n))
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


def train_shares(cid: int, sources: np.ndarray, num_sources: int, splits: Splits, seed: int) -> np.ndarray:
    """Share of each source in the client's train split, given each of its samples' source
    (what an importance estimate targets)."""
    tr, _, _ = split_index(cid, len(sources), splits, seed)
    counts = np.bincount(sources[tr.numpy()], minlength=num_sources).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def split_client(
    cid: int,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    splits: Splits,
    seed: int,
    target_dtype: torch.dtype = torch.int64,
    input_dtype: torch.dtype | None = torch.float32,
) -> ClientData:
    """A client's n samples split by ``split_index``. Inputs become ``input_dtype`` (float32
    features; uint8 token ids; None: as they are, e.g. an image source's uint8 pixels), targets
    ``target_dtype`` (int64 class ids; float32 for regression)."""
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x)
    x = torch.as_tensor(x, dtype=input_dtype)
    y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y, dtype=target_dtype)
    n = int(y.shape[0])
    if int(x.shape[0]) != n:
        raise ValueError(f"client {cid}: {x.shape[0]} inputs but {n} labels")
    tr, va, te = split_index(cid, n, splits, seed)
    return ClientData(cid, x[tr], y[tr], x[va], y[va], x[te], y[te])


@dataclass(frozen=True)
class GroupParams:
    """Clients in groups that see the data differently (clustered FL): client k belongs to
    group k mod ``groups``; group g's images are rotated by g·90° (``rotate``, IFCA's rotated
    MNIST) or its labels permuted by a permutation drawn for g (``permute_labels``; group 0
    keeps both as they are)."""

    groups: int = field(default=1, metadata={"min": 1, "max": 4, "help": "client groups (1: none)"})
    group_transform: str = field(
        default="rotate",
        metadata={
            "choices": ("rotate", "permute_labels"),
            "help": (
                "how group g (with partition kind mixture: source g) sees the data: rotate: images turned g·90° "
                "(IFCA's rotated MNIST; at most 4); permute_labels: labels permuted by a seeded permutation per g; "
                "group 0 as it is"
            ),
        },
    )


class PooledSource(FederatedSource):
    """A labelled pool split among clients by a partitioner (lazily, once per instance).

    Subclasses set ``name``, ``input_shape``, ``num_classes`` and ``image_shape`` (for
    rotations) and implement ``load`` (the pool: inputs and int64 labels) and, where the stored
    inputs are images, ``pixels``. ``groups`` (GroupParams) transforms each group's shards.
    With partition kind ``mixture`` the groups are sources instead: every client mixes them,
    source s seeing the pool through transform s (``mixture.py``).
    """

    name = "pool"
    image_shape: tuple[int, int] | None = None
    # FLTrust's root set (``defence.root_size``): that many pool samples drawn from (seed, "root")
    # before the partition, so that no client holds them; the server trains on them (``root_set``)
    root_size = 0

    def __init__(self, clients: int, partition, splits: Splits, seed: int, groups: GroupParams | None = None):
        if partition is None:
            raise ValueError(f"{self.name} is a pooled dataset and needs a partition")
        self.num_clients, self.partition, self.splits, self.seed = clients, partition, splits, seed
        self.groups = groups or GroupParams()
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # the pool, loaded on first use
        self._parts: Any = None  # the partition, made once
        self._root = np.zeros(0, dtype=np.int64)  # FLTrust's root samples (root_size of them)
        if partition.kind == "mixture":
            s = partition.params.sources
            if self.groups.groups > 1:
                raise DataError(
                    f"{self.name}: data.groups = {self.groups.groups} with a mixture partition; "
                    f"the mixture's sources are the groups: set data.partition.sources instead"
                )
            if self.groups.group_transform == "rotate" and s > 4:
                raise DataError(
                    f"{self.name}: data.partition.sources = {s}: rotations give at most 4 sources "
                    f"(0/90/180/270°); use data.group_transform: permute_labels for more"
                )
            self.num_sources = s

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

    def stored(self, x: np.ndarray) -> np.ndarray:
        """Pool inputs of some samples -> what a client holds: an image source's uint8 pixels
        shaped as the model's inputs (``pixels`` turns them into floats batch by batch),
        otherwise float32 features."""
        if self.pixels is not None:
            return x.reshape(len(x), *self.input_shape)
        return x.astype(np.float32, copy=False)

    def pool(self) -> tuple[np.ndarray, np.ndarray, Any]:
        """(inputs, labels, the partition: one index array per client, or MixtureParts); the
        pool is loaded (memory-mapped where the dataset has a cache) and partitioned on first use."""
        if self._arrays is None:
            self._arrays = self.load()
        if self._parts is None:
            from . import partitioner

            spec = partitioner(self.partition.kind)  # built-in or plugin (raysim.plugins)
            extra = {}
            for need in spec.needs:  # e.g. pachinko's coarse labels
                value = getattr(self, need, None)
                if value is None:
                    from . import DATASETS

                    fits = [n for n, d in DATASETS.items() if d.pooled and hasattr(d.build, need)]
                    raise DataError(
                        f"{self.name}: partition {self.partition.kind} needs {need.replace('_', ' ')}, "
                        f"which this dataset has not; datasets with them: {', '.join(fits)}"
                    )
                extra[need.split("_")[0]] = value
            labels = self._arrays[1]
            keep = None
            if self.root_size:
                n = len(labels)
                if not 0 < self.root_size < n:
                    raise DataError(f"{self.name}: defence.root_size = {self.root_size}: the pool holds {n} samples")
                root = np.sort(generator(self.seed, "root").choice(n, self.root_size, replace=False))
                keep = np.setdiff1d(np.arange(n), root)
                self._root = root
                labels = labels[keep]
                extra = {k: v[keep] if isinstance(v, np.ndarray) and len(v) == n else v for k, v in extra.items()}
            try:
                parts = spec.fn(
                    labels, self.num_clients, self.partition.params, generator(self.seed, "partition"), **extra
                )
            except ValueError as e:
                raise DataError(f"{self.name}: partition {self.partition.kind}: {e}") from None
            self._parts = parts if keep is None else [keep[np.asarray(p, dtype=np.int64)] for p in parts]
        return (*self._arrays, self._parts)

    def prepare(self) -> None:
        self.pool()

    def __getstate__(self):
        # a copy carries the partition, not the pool: the receiver maps (or loads) the pool
        # itself and reads only its clients' rows
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    def _indices(self, cid: int) -> np.ndarray:
        parts = self.pool()[2]
        return parts.parts[cid] if self.num_sources else parts[cid]

    def num_samples(self, cid: int) -> int:
        return len(self._indices(cid))

    def _view(self, idx: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pool samples ``idx`` as stored inputs and labels, each seen through its source's transform."""
        x, y, _ = self.pool()
        xs, ys = self.stored(x[idx]), y[idx]
        if not (sources != 0).any():
            return xs, ys
        xs, ys = np.array(xs), np.array(ys)
        for s in np.unique(sources[sources != 0]):
            m = sources == s
            xs[m], ys[m] = self.transform(xs[m], ys[m], int(s))
        return xs, ys

    def client(self, cid: int) -> ClientData:
        idx = self._indices(cid)
        if self.num_sources:
            xs, ys = self._view(idx, self.pool()[2].sources[cid])
        else:
            xs, ys = self.transform(self.stored(self.pool()[0][idx]), self.pool()[1][idx], self.group_of(cid))
        return split_client(cid, xs, ys, self.splits, self.seed, input_dtype=None)

    def root_set(self, cid: int) -> ClientData:
        """FLTrust's root set as a shard that is all training data (``cid``: the id its random
        streams use); the samples no client holds."""
        x, y, _ = self.pool()
        idx = self._root
        xs = torch.from_numpy(np.ascontiguousarray(self.stored(x[idx])))
        ys = torch.from_numpy(np.asarray(y[idx], dtype=np.int64))
        return ClientData(cid, xs, ys, xs[:0], ys[:0], xs[:0], ys[:0])

    def source_test(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.pool()[2].holdout
        xs, ys = self._view(idx, np.full(len(idx), s))
        return torch.from_numpy(np.ascontiguousarray(xs)), torch.from_numpy(np.asarray(ys, dtype=np.int64))

    def true_shares(self, cid: int) -> np.ndarray | None:
        parts = self.pool()[2]
        if getattr(parts, "groups", None) is not None:  # a partition into known groups (nfold)
            return np.eye(int(parts.groups.max()) + 1)[parts.groups[cid]]
        if not self.num_sources:  # groups: all of a client's data is its group's
            return np.eye(self.groups.groups)[self.group_of(cid)] if self.groups.groups > 1 else None
        return train_shares(cid, self.pool()[2].sources[cid], self.num_sources, self.splits, self.seed)
