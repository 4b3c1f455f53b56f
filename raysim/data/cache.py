"""Arrays parsed once from a dataset's files into a local cache that later processes memory-map.

Used by every file-backed dataset (LEAF JSON, Fashion-MNIST IDX): the first process to need the
data parses the source files and writes numpy arrays; every later process (each host actor, the
driver, the next run) opens them with ``mmap_mode="r"``, so a host reads only the pages of its
own clients' rows and nothing is parsed or decompressed again.

- Where: ``<root>/.raysim-cache/<name>/`` when that folder can be written, else
  ``$XDG_CACHE_HOME/raysim/<name>-<hash>/`` (``~/.cache/raysim/...`` without
  ``XDG_CACHE_HOME``), ``<hash>`` a hash of the absolute data root. A valid cache is used
  wherever it is found, read-only or not; when neither folder can be written, the process
  parses into memory (this process only) and goes on.
- What: one ``.npy`` per array and ``index.json``: the source files it was built from (name,
  size, mtime), each array's shape, dtype, size and mtime, and the dataset's own metadata
  (e.g. LEAF's writers and row offsets, so counting samples reads only the index). Arrays are
  loaded without pickle (``allow_pickle=False``).
- When rebuilt: whenever a source file is added, removed, or changes size or mtime, or the
  cache is missing, incomplete or altered. The build is atomic (temporary files in the same
  folder, ``os.replace``, the index last, so a crash never leaves a cache that looks valid) and
  safe under concurrency (an ``fcntl`` lock on ``lock`` in the cache folder; whoever gets it
  second finds the cache built and uses it).
- To delete it: ``rm -r <root>/.raysim-cache`` (or ``~/.cache/raysim/<name>-*``); it is rebuilt
  on next use.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: build without a lock
    fcntl = None

from raysim.cachedir import user_cache

from .base import DataError

FORMAT = 2
_RESERVED = ("format", "root", "files", "arrays", "specs")


@dataclass
class Plan:
    """What a parser hands the cache: the dataset's metadata (JSON-able, kept in the index),
    each array's (shape, dtype), and ``fill(name, out)`` writing array ``name`` into ``out``."""

    meta: dict[str, Any]
    specs: dict[str, tuple[tuple[int, ...], Any]]
    fill: Callable[[str, np.ndarray], None]


@dataclass
class Cached:
    """An opened cache: its metadata, and its arrays memory-mapped on first use (so reading
    the metadata alone touches no array)."""

    what: str  # the dataset's name, for messages
    folder: Path | None  # None: parsed into memory, no cache folder could be written
    meta: dict[str, Any]
    specs: dict[str, tuple[tuple[int, ...], np.dtype]]
    _arrays: dict[str, np.ndarray] | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            arrays = {}
            for k, (shape, dtype) in self.specs.items():
                try:
                    a = np.load(self.folder / f"{k}.npy", mmap_mode="r", allow_pickle=False)
                except (OSError, EOFError, ValueError) as e:
                    raise DataError(
                        f"{self.what}: the cache in {self.folder} is damaged ({k}.npy: "
                        f"{type(e).__name__}); delete that folder and run again"
                    ) from None
                if (a.shape, a.dtype) != (shape, dtype):
                    raise DataError(
                        f"{self.what}: the cache in {self.folder} is damaged ({k}.npy is "
                        f"{a.dtype}{a.shape}); delete that folder and run again"
                    )
                arrays[k] = a
            self._arrays = arrays
        return self._arrays


def file_rows(paths) -> list[list]:
    """[name, size, mtime_ns] of each file: what a cache built from them depends on."""
    return [[p.name, *stat(p)] for p in paths]


def stat(path: Path) -> list[int]:
    st = path.stat()
    return [int(st.st_size), int(st.st_mtime_ns)]


def dirs(root: Path, name: str) -> list[Path]:
    """Candidate cache folders, preferred first: beside the data, then the user's cache."""
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return [root / ".raysim-cache" / name, user_cache() / f"{name}-{key}"]


def writable(path: Path) -> bool:
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


def _specs(doc: dict) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (tuple(int(d) for d in shape), np.dtype(dtype)) for k, (shape, dtype) in doc.items()}


def _open(what: str, folder: Path, sig: Any) -> Cached | None:
    """The cache in ``folder`` if it is complete and built from exactly the files of ``sig``
    (reads the index and stats the arrays; their contents are left alone)."""
    try:
        index = json.loads((folder / "index.json").read_text())
        if index.get("format") != FORMAT or index.get("files") != sig:
            return None
        specs = _specs(index["specs"])
        if set(index["arrays"]) != set(specs) or any(index["arrays"][k] != stat(folder / f"{k}.npy") for k in specs):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Cached(what, folder, {k: v for k, v in index.items() if k not in _RESERVED}, specs)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _build(root: Path, folder: Path, sig: Any, plan: Plan) -> None:
    """Write ``plan``'s arrays and the index into ``folder`` (the caller holds its lock)."""
    for stale in folder.glob("*.tmp*"):  # left by a builder that crashed (we hold the lock)
        stale.unlink(missing_ok=True)
    tag = f"tmp{os.getpid()}.{uuid.uuid4().hex[:8]}"
    written: list[tuple[Path, Path]] = []
    try:
        for k, (shape, dtype) in plan.specs.items():
            final, tmp = folder / f"{k}.npy", folder / f"{k}.{tag}.npy"
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=tuple(shape))
            plan.fill(k, out)
            out.flush()
            del out
            _fsync(tmp)
            written.append((tmp, final))
        index = {
            **plan.meta,
            "format": FORMAT,
            "root": str(root.resolve()),
            "files": sig,
            "specs": {k: [list(shape), np.dtype(dtype).str] for k, (shape, dtype) in plan.specs.items()},
            "arrays": {final.stem: stat(tmp) for tmp, final in written},
        }  # rename keeps both
        tmp_index = folder / f"index.json.{tag}"
        tmp_index.write_text(json.dumps(index))
        _fsync(tmp_index)
        written.append((tmp_index, folder / "index.json"))
        (folder / "index.json").unlink(missing_ok=True)  # no old index over new arrays
        for tmp, final in written:  # the index last
            os.replace(tmp, final)
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        for leftover in folder.glob(f"*.{tag}*"):
            leftover.unlink(missing_ok=True)


def _in_memory(what: str, plan: Plan) -> Cached:
    arrays = {}
    for k, (shape, dtype) in plan.specs.items():
        arrays[k] = out = np.empty(tuple(shape), dtype)
        plan.fill(k, out)
        out.flags.writeable = False
    specs = {k: (tuple(int(d) for d in shape), np.dtype(dtype)) for k, (shape, dtype) in plan.specs.items()}
    return Cached(what, None, plan.meta, specs, arrays)


class Lock:
    """An exclusive ``fcntl`` lock on a file (a no-op where fcntl is missing)."""

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


def load(what: str, root: Path, sig: Any, parse: Callable[[], Plan]) -> Cached:
    """The cache of ``root``'s data named ``what``, built from files ``sig`` (JSON-able; any
    change rebuilds), calling ``parse`` only when no valid cache exists."""
    candidates = dirs(root, what)
    for d in candidates:
        cached = _open(what, d, sig)
        if cached is not None:
            return cached
    for d in candidates:
        if not writable(d):
            continue
        try:
            with Lock(d / "lock"):
                cached = _open(what, d, sig)  # someone else may have built it meanwhile
                if cached is None:
                    _build(root, d, sig, parse())
                    cached = _open(what, d, sig)
        except OSError:
            continue
        if cached is not None:
            return cached
    return _in_memory(what, parse())
