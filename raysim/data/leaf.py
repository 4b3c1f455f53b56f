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

- Where: ``<root>/.raysim-cache/leaf_femnist/`` when that folder can be written, else
  ``$XDG_CACHE_HOME/raysim/leaf_femnist-<hash>/`` (``~/.cache/raysim/...`` without
  ``XDG_CACHE_HOME``), ``<hash>`` a hash of the absolute data root. A valid cache is used
  wherever it is found, read-only or not; when neither folder can be written, the process
  parses the JSON into memory (as before the cache) and goes on.
- What: ``train_x.npy`` / ``test_x.npy`` (float32, N x 1 x 28 x 28), ``train_y.npy`` /
  ``test_y.npy`` (int64, N), each writer's rows contiguous, writers in sorted order, and
  ``index.json``: the writers, their row offsets into the train and test arrays (so
  ``num_samples`` reads only the index), the JSON files (name, size, mtime) it was built from
  and the arrays' own sizes and mtimes. Loaded without pickle (``allow_pickle=False``).
- When rebuilt: whenever a JSON file is added, removed, or changes size or mtime, or the cache
  is missing, incomplete or altered. The build is atomic (temporary files in the same folder,
  ``os.replace``, the index last, so a crash never leaves a cache that looks valid) and safe
  under concurrency (an ``fcntl`` lock on ``lock`` in the cache folder; whoever gets it second
  finds the cache built and uses it).
- To delete it: ``rm -r <root>/.raysim-cache`` (or the ``leaf_femnist-*`` folder under
  ``~/.cache/raysim``); it is rebuilt on next use.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

try:
    import fcntl
except ImportError:            # not POSIX: build without a lock
    fcntl = None

from raysim.core.data import ClientData
from raysim.rng import generator

from .base import DataError, FederatedSource, Splits, split_client

HOW = ("produce it with LEAF (github.com/TalwalkarLab/leaf): cd leaf/data/femnist && "
       "./preprocess.sh -s niid --sf 0.15 -k 0 -t sample --tf 0.8  (FedEM's setup: 15 % of writers, "
       "80/20 train/test per writer), then set data.root to leaf/data/femnist/data")

CACHE_FORMAT = 1
PIXELS = 784
_SUBS = ("train", "test")
_ARRAYS = ("train_x", "train_y", "test_x", "test_y")


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
# The cache


def _signature(root: Path) -> dict[str, list]:
    """The JSON files the cache depends on: per folder, [name, size, mtime_ns] in sorted order.
    Raises DataError when a folder is missing."""
    for sub in _SUBS:
        if not (root / sub).is_dir():
            raise DataError(f"leaf_femnist: no {sub}/ folder under {root}; {HOW}")
    sig = {}
    for sub in _SUBS:
        rows = []
        for f in sorted((root / sub).glob("*.json")):
            st = f.stat()
            rows.append([f.name, int(st.st_size), int(st.st_mtime_ns)])
        sig[sub] = rows
    return sig


def _cache_dirs(root: Path) -> list[Path]:
    """Candidate cache folders, preferred first: beside the data, then the user's cache."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return [root / ".raysim-cache" / "leaf_femnist", base / "raysim" / f"leaf_femnist-{key}"]


def _writable(path: Path) -> bool:
    """Whether ``path`` is (or can be made) a folder this process can write in."""
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    if not (p.is_dir() and os.access(p, os.W_OK | os.X_OK)):
        return False
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


@dataclass
class _Cache:
    """The opened cache: writers, row offsets (W+1 each) and, opened on first use, the
    memory-mapped arrays (so counting samples reads only the index)."""

    folder: Path | None       # None: parsed into memory, no cache folder could be written
    names: list[str]
    train_off: np.ndarray
    test_off: np.ndarray
    _arrays: dict[str, np.ndarray] | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            want = _want(self.train_off, self.test_off)
            arrays = {}
            for k in _ARRAYS:
                try:
                    a = np.load(self.folder / f"{k}.npy", mmap_mode="r", allow_pickle=False)
                except (OSError, EOFError, ValueError) as e:
                    raise DataError(f"leaf_femnist: the cache in {self.folder} is damaged ({k}.npy: "
                                    f"{type(e).__name__}); delete that folder and run again") from None
                if (a.shape, a.dtype) != want[k]:
                    raise DataError(f"leaf_femnist: the cache in {self.folder} is damaged ({k}.npy is "
                                    f"{a.dtype}{a.shape}); delete that folder and run again")
                arrays[k] = a
            self._arrays = arrays
        return self._arrays

    def rows(self, i: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Writer i's (train, test) (inputs, labels): views into the memory-mapped arrays."""
        a, b = int(self.train_off[i]), int(self.train_off[i + 1])
        c, d = int(self.test_off[i]), int(self.test_off[i + 1])
        ar = self.arrays()
        return (ar["train_x"][a:b], ar["train_y"][a:b]), (ar["test_x"][c:d], ar["test_y"][c:d])

    def count(self, i: int) -> int:
        return int(self.train_off[i + 1] - self.train_off[i] + self.test_off[i + 1] - self.test_off[i])


def _want(train_off: np.ndarray, test_off: np.ndarray) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    n_train, n_test = int(train_off[-1]), int(test_off[-1])
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    return {"train_x": ((n_train, 1, 28, 28), f32), "train_y": ((n_train,), i64),
            "test_x": ((n_test, 1, 28, 28), f32), "test_y": ((n_test,), i64)}


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [int(st.st_size), int(st.st_mtime_ns)]


def _open(folder: Path, sig: dict) -> _Cache | None:
    """The cache in ``folder`` if it is complete and built from exactly the files of ``sig``
    (reads the index and stats the arrays; their contents are left alone)."""
    try:
        index = json.loads((folder / "index.json").read_text())
        if (index.get("format") != CACHE_FORMAT or index.get("files") != sig
                or any(not sig[s] for s in _SUBS)):
            return None
        if any(index["arrays"][k] != _stat(folder / f"{k}.npy") for k in _ARRAYS):
            return None
        names = [str(n) for n in index["writers"]]
        train_off = np.asarray(index["train_offsets"], dtype=np.int64)
        test_off = np.asarray(index["test_offsets"], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if len(train_off) != len(names) + 1 or len(test_off) != len(names) + 1:
        return None
    return _Cache(folder, names, train_off, test_off)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(root: Path) -> tuple[list[str], dict[str, np.ndarray], dict[str, dict]]:
    """(writers in sorted order, per folder their row offsets (W+1), per folder writer -> arrays)."""
    train, test = _read_folder(root / "train"), _read_folder(root / "test")
    names = sorted(set(train) | set(test))
    users = {"train": train, "test": test}
    offsets = {sub: np.concatenate([[0], np.cumsum([len(users[sub][n][1]) if n in users[sub] else 0
                                                    for n in names])]).astype(np.int64) for sub in _SUBS}
    return names, offsets, users


def _fill(out: np.ndarray, sub: str, kind: str, names, offsets, users) -> None:
    for i, name in enumerate(names):
        a, b = int(offsets[sub][i]), int(offsets[sub][i + 1])
        if b > a:
            x, y = users[sub][name]
            out[a:b] = x.reshape(-1, 1, 28, 28) if kind == "x" else y


def _shape(sub: str, kind: str, offsets) -> tuple[tuple[int, ...], type]:
    n = int(offsets[sub][-1])
    return ((n, 1, 28, 28), np.float32) if kind == "x" else ((n,), np.int64)


def _in_memory(root: Path) -> _Cache:
    """No cache folder can be written: parse into memory (this process only)."""
    names, offsets, users = _parse(root)
    arrays = {}
    for sub in _SUBS:
        for kind in ("x", "y"):
            shape, dtype = _shape(sub, kind, offsets)
            arrays[f"{sub}_{kind}"] = out = np.empty(shape, dtype)
            _fill(out, sub, kind, names, offsets, users)
    return _Cache(None, names, offsets["train"], offsets["test"], arrays)


def _build(root: Path, folder: Path, sig: dict) -> None:
    """Parse the JSON and write the cache into ``folder`` (the caller holds its lock)."""
    names, offsets, users = _parse(root)
    for stale in folder.glob("*.tmp*"):        # left by a builder that crashed (we hold the lock)
        stale.unlink(missing_ok=True)
    tag = f"tmp{os.getpid()}.{uuid.uuid4().hex[:8]}"
    written: list[tuple[Path, Path]] = []
    try:
        for sub in _SUBS:
            for kind in ("x", "y"):
                shape, dtype = _shape(sub, kind, offsets)
                final, tmp = folder / f"{sub}_{kind}.npy", folder / f"{sub}_{kind}.{tag}.npy"
                out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
                _fill(out, sub, kind, names, offsets, users)
                out.flush()
                del out
                _fsync(tmp)
                written.append((tmp, final))
        index = {"format": CACHE_FORMAT, "root": str(root.resolve()), "files": sig,
                 "arrays": {final.stem: _stat(tmp) for tmp, final in written},   # rename keeps both
                 "writers": names, "train_offsets": offsets["train"].tolist(),
                 "test_offsets": offsets["test"].tolist()}
        tmp_index = folder / f"index.json.{tag}"
        tmp_index.write_text(json.dumps(index))
        _fsync(tmp_index)
        written.append((tmp_index, folder / "index.json"))
        (folder / "index.json").unlink(missing_ok=True)     # no old index over new arrays
        for tmp, final in written:                          # the index last
            os.replace(tmp, final)
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        for leftover in folder.glob(f"*.{tag}*"):
            leftover.unlink(missing_ok=True)


class _Lock:
    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def load_cache(root: Path) -> _Cache:
    """The data of ``root``'s JSON as an opened cache, parsing and writing it first if needed."""
    sig = _signature(root)
    if not all(sig[sub] for sub in _SUBS):      # a folder without JSON: the parser says so
        for sub in _SUBS:
            _read_folder(root / sub)
    dirs = _cache_dirs(root)
    for d in dirs:
        cache = _open(d, sig)
        if cache is not None:
            return cache
    for d in dirs:
        if not _writable(d):
            continue
        try:
            with _Lock(d / "lock"):
                cache = _open(d, sig)           # someone else may have built it meanwhile
                if cache is None:
                    _build(root, d, sig)
                    cache = _open(d, sig)
        except OSError:
            continue
        if cache is not None:
            return cache
    return _in_memory(root)


# ---------------------------------------------------------------------------------------------


class LeafFEMNIST(FederatedSource):
    def __init__(self, params: LeafParams, clients: int, partition, splits: Splits, seed: int):
        self.root, self.leaf_split = Path(params.root), params.leaf_split
        self.splits, self.seed = splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (1, 28, 28), 62
        self._cache: _Cache | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None             # never ship the memory maps; reopen on the other side
        return state

    def cache(self) -> _Cache:
        if self._cache is None:
            cache = load_cache(self.root)
            if len(cache.names) < self.num_clients:
                raise DataError(f"leaf_femnist: {self.root} holds {len(cache.names)} writers, the scenario asks "
                                f"for data.clients = {self.num_clients}")
            self._cache = cache
        return self._cache

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
