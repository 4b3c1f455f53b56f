"""FEMNIST in LEAF's JSON format (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018).

LEAF writes ``train/*.json`` and ``test/*.json``; each file is
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``.
One writer is one client (natural partition); clients are the writers in sorted order, the
first ``data.clients`` of them. With ``leaf_split: true`` (default) a client's train/test are
LEAF's, and ``data.splits.val`` carves a validation share out of its train part; with ``false``
both are pooled and split by ``data.splits``.

The JSON is parsed once, into a local cache of numpy arrays; after that every process (each
host actor and the driver) memory-maps the arrays and ``client(cid)`` copies only that writer's
rows, so a host reads only its own clients' pages and nothing is parsed again.

The cache (``raysim.data.cache``: where it lives, when it is rebuilt, how to delete it) is
``<root>/.raysim-cache/leaf_femnist/`` (or ``~/.cache/raysim/leaf_femnist-<hash>/``):
``train_x.npy`` / ``test_x.npy`` (float32, N x 1 x 28 x 28) and ``train_y.npy`` / ``test_y.npy``
(int64, N), each writer's rows contiguous, writers in sorted order; its ``index.json`` lists the
writers and their row offsets into the train and test arrays, so ``num_samples`` reads only the
index. Any change of a JSON file (added, removed, other size or mtime) rebuilds it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import generator

from . import cache
from .base import DataError, FederatedSource, Splits, split_client

HOW = ("produce it with LEAF (github.com/TalwalkarLab/leaf): cd leaf/data/femnist && "
       "./preprocess.sh -s niid --sf 0.15 -k 0 -t sample --tf 0.8  (FedEM's setup: 15 % of writers, "
       "80/20 train/test per writer), then set data.root to leaf/data/femnist/data")

PIXELS = 784
_SUBS = ("train", "test")


@dataclass(frozen=True)
class LeafParams:
    root: str = field(default="data/femnist", metadata={"help": "folder with LEAF's train/ and test/ JSON folders"})
    leaf_split: bool = True


def _read_folder(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every writer of the folder's JSON files -> (float32 inputs (n, 784), int64 labels (n,));
    a writer in several files keeps the last (files in sorted order)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"leaf_femnist: no JSON files in {folder}; {HOW}")
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
            for u in doc["users"]:
                d = doc["user_data"][u]
                x, y = d["x"], d["y"]
                try:
                    xa = np.asarray(x, dtype=np.float32).reshape(-1, PIXELS)
                    ya = np.asarray(y, dtype=np.int64).reshape(-1)
                except ValueError:
                    raise DataError(f"leaf_femnist: {f}: writer {u}'s x is not a list of {PIXELS}-pixel "
                                    f"images or its y not a list of class ids") from None
                if len(xa) != len(ya):
                    raise DataError(f"leaf_femnist: {f}: writer {u} has {len(xa)} inputs but {len(ya)} labels")
                users[u] = (xa, ya)
            del doc
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise DataError(f"leaf_femnist: {f} is not a LEAF JSON file (needs users, num_samples, "
                            f"user_data with x and y): {type(e).__name__}") from None
    return users


# ---------------------------------------------------------------------------------------------
# The cache (raysim.data.cache): arrays train_x, train_y, test_x, test_y, each writer's rows
# contiguous, and in the index the writers and their row offsets


def _signature(root: Path) -> dict[str, list]:
    """The JSON files the cache depends on: per folder, [name, size, mtime_ns] in sorted order.
    Raises DataError when a folder is missing."""
    for sub in _SUBS:
        if not (root / sub).is_dir():
            raise DataError(f"leaf_femnist: no {sub}/ folder under {root}; {HOW}")
    return {sub: cache.file_rows(sorted((root / sub).glob("*.json"))) for sub in _SUBS}


class _Writers:
    """The opened cache seen as writers: names, row offsets (W+1 each) and their rows."""

    def __init__(self, cached: cache.Cached):
        self.cached, self.folder = cached, cached.folder
        self.names = [str(n) for n in cached.meta["writers"]]
        self.train_off = np.asarray(cached.meta["train_offsets"], dtype=np.int64)
        self.test_off = np.asarray(cached.meta["test_offsets"], dtype=np.int64)
        if len(self.train_off) != len(self.names) + 1 or len(self.test_off) != len(self.names) + 1:
            raise DataError(f"leaf_femnist: the cache in {self.folder} is damaged (offsets do not match "
                            "the writers); delete that folder and run again")

    def arrays(self) -> dict[str, np.ndarray]:
        return self.cached.arrays()

    def rows(self, i: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Writer i's (train, test) (inputs, labels): views into the memory-mapped arrays."""
        a, b = int(self.train_off[i]), int(self.train_off[i + 1])
        c, d = int(self.test_off[i]), int(self.test_off[i + 1])
        ar = self.arrays()
        return (ar["train_x"][a:b], ar["train_y"][a:b]), (ar["test_x"][c:d], ar["test_y"][c:d])

    def count(self, i: int) -> int:
        return int(self.train_off[i + 1] - self.train_off[i] + self.test_off[i + 1] - self.test_off[i])


def _parse(root: Path) -> tuple[list[str], dict[str, np.ndarray], dict[str, dict]]:
    """(writers in sorted order, per folder their row offsets (W+1), per folder writer -> arrays)."""
    train, test = _read_folder(root / "train"), _read_folder(root / "test")
    names = sorted(set(train) | set(test))
    users = {"train": train, "test": test}
    offsets = {sub: np.concatenate([[0], np.cumsum([len(users[sub][n][1]) if n in users[sub] else 0
                                                    for n in names])]).astype(np.int64) for sub in _SUBS}
    return names, offsets, users


def _plan(root: Path) -> cache.Plan:
    names, offsets, users = _parse(root)

    def fill(key: str, out: np.ndarray) -> None:
        sub, kind = key.split("_")
        for i, name in enumerate(names):
            a, b = int(offsets[sub][i]), int(offsets[sub][i + 1])
            if b > a:
                x, y = users[sub][name]
                out[a:b] = x.reshape(-1, 1, 28, 28) if kind == "x" else y

    specs = {}
    for sub in _SUBS:
        n = int(offsets[sub][-1])
        specs[f"{sub}_x"], specs[f"{sub}_y"] = ((n, 1, 28, 28), np.float32), ((n,), np.int64)
    meta = {"writers": names, "train_offsets": offsets["train"].tolist(), "test_offsets": offsets["test"].tolist()}
    return cache.Plan(meta, specs, fill)


def load_cache(root: Path) -> _Writers:
    """The data of ``root``'s JSON as an opened cache, parsing and writing it first if needed."""
    sig = _signature(root)
    if not all(sig[sub] for sub in _SUBS):      # a folder without JSON: the parser says so
        for sub in _SUBS:
            _read_folder(root / sub)
    return _Writers(cache.load("leaf_femnist", root, sig, lambda: _plan(root)))


# ---------------------------------------------------------------------------------------------


class LeafFEMNIST(FederatedSource):
    def __init__(self, params: LeafParams, clients: int, partition, splits: Splits, seed: int):
        self.root, self.leaf_split = Path(params.root), params.leaf_split
        self.splits, self.seed = splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (1, 28, 28), 62
        self._cache: _Writers | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None             # never ship the memory maps; reopen on the other side
        return state

    def cache(self) -> _Writers:
        if self._cache is None:
            writers = load_cache(self.root)
            if len(writers.names) < self.num_clients:
                raise DataError(f"leaf_femnist: {self.root} holds {len(writers.names)} writers, the scenario asks "
                                f"for data.clients = {self.num_clients}")
            self._cache = writers
        return self._cache

    def prepare(self) -> None:
        self.cache()

    def users(self):
        """[(writer, (train x, train y), (test x, test y))] of the clients, as read-only views
        into the memory-mapped cache (inputs (n, 1, 28, 28) float32, labels int64)."""
        c = self.cache()
        return [(c.names[i], *c.rows(i)) for i in range(self.num_clients)]

    def num_samples(self, cid: int) -> int:
        c = self.cache()
        return c.count(range(self.num_clients)[cid])

    def client(self, cid: int) -> ClientData:
        c = self.cache()
        (trx, try_), (tex, tey) = c.rows(range(self.num_clients)[cid])
        # copy this writer's rows out of the memory map (only its pages are read)
        trx, try_, tex, tey = (np.array(a) for a in (trx, try_, tex, tey))
        if not self.leaf_split:
            return split_client(cid, np.concatenate([trx, tex]), np.concatenate([try_, tey]), self.splits, self.seed)
        n_val = int(round(self.splits.val * len(try_)))
        perm = generator(self.seed, "split", cid).permutation(len(try_))
        va, tr = perm[:n_val], perm[n_val:]
        t = torch.from_numpy
        return ClientData(cid, t(trx[tr]), t(try_[tr]), t(trx[va]), t(try_[va]), t(tex), t(tey))
