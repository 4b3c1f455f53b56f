"""Where a LEAF dataset's samples are (``raysim.data.leaf``'s layouts): LEAF's JSON folders,
TensorFlow Federated's HDF5 pairs, Flower Datasets' parquet exports. Each layout gives the files
a cache depends on and, per split, chunks ``(where, [(user, raw x, raw y)])`` read one at a
time (a JSON file, a user), which ``_decode`` turns into arrays with the dataset's format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np

from . import cache
from .base import DataError
from .shakespeare import to_ids

_SUBS = ("train", "test")


class SampleFormat(Protocol):
    """What a layout needs of a dataset's format (``raysim.data.leaf.Format``)."""

    name: str
    how: str

    def x(self, raw, meta: dict) -> np.ndarray: ...

    def y(self, raw) -> np.ndarray: ...


def _load_json(f: Path, what: str) -> dict:
    try:
        doc = json.loads(f.read_text())
        doc["users"], doc["user_data"]  # noqa: B018 (the keys must be there)
        return doc
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise DataError(
            f"leaf_{what}: {f} is not a LEAF JSON file (needs users, num_samples, "
            f"user_data with x and y): {type(e).__name__}"
        ) from None


class JsonLayout:
    """LEAF's own output: ``train/*.json`` and ``test/*.json``."""

    def __init__(self, root: Path, fmt: SampleFormat):
        self.root, self.fmt = root, fmt
        for sub in _SUBS:
            if not (root / sub).is_dir():
                raise DataError(
                    f"leaf_{fmt.name}: no {sub}/ folder under {root} (nor TensorFlow Federated "
                    f"HDF5 or Flower Datasets parquet files); {fmt.how}"
                )

    def files(self) -> dict[str, list]:
        return {sub: cache.file_rows(sorted((self.root / sub).glob("*.json"))) for sub in _SUBS}

    def chunks(self, sub: str):
        files = sorted((self.root / sub).glob("*.json"))
        if not files:
            raise DataError(f"leaf_{self.fmt.name}: no JSON files in {self.root / sub}; {self.fmt.how}")
        for f in files:
            doc = _load_json(f, self.fmt.name)
            try:
                users = [(u, doc["user_data"][u]["x"], doc["user_data"][u]["y"]) for u in doc["users"]]
            except (KeyError, TypeError) as e:
                raise DataError(
                    f"leaf_{self.fmt.name}: {f} is not a LEAF JSON file (needs users, num_samples, "
                    f"user_data with x and y): {type(e).__name__}"
                ) from None
            del doc
            yield f, users


class TffLayout:
    """TensorFlow Federated's HDF5 pairs (``*train*.h5`` and ``*test*.h5``):

    - FEMNIST, ``fed_emnist_{train,test}.h5`` (or the digits-only pair):
      ``examples/<client>/pixels`` (n, 28, 28) and ``.../label`` (n,);
    - Shakespeare, ``shakespeare_{train,test}.h5``: ``examples/<role>/snippets``, the role's
      lines; each split's lines are joined by LEAF's rule (``role_text``) and cut into
      80-character windows with the next character as target."""

    def __init__(self, root: Path, fmt: SampleFormat):
        self.root, self.fmt = root, fmt
        if fmt.name not in ("femnist", "shakespeare"):
            raise DataError(
                f"leaf_{fmt.name}: {root} holds HDF5 files; raysim reads TensorFlow Federated's "
                "FEMNIST and Shakespeare files only (datasets leaf_femnist, leaf_shakespeare)"
            )
        self.paths = {sub: _one(root, f"*{sub}*.h5", f"leaf_{fmt.name}") for sub in _SUBS}

    def files(self) -> dict[str, list]:
        return {sub: cache.file_rows([self.paths[sub]]) for sub in _SUBS}

    def chunks(self, sub: str):
        import h5py

        path = self.paths[sub]
        try:
            with h5py.File(path, "r") as h5:
                examples = h5["examples"]
                for u in sorted(examples):
                    g = examples[u]
                    if self.fmt.name == "femnist":
                        yield f"{path}:examples/{u}", [(u, g["pixels"][()], g["label"][()])]
                    else:
                        yield f"{path}:examples/{u}", [(u, *_windows(g["snippets"][()]))]
        except (OSError, KeyError) as e:
            needs = "pixels and label" if self.fmt.name == "femnist" else "snippets"
            raise DataError(
                f"leaf_{self.fmt.name}: {path} is not TensorFlow Federated's {self.fmt.name} file "
                f"(needs examples/<client>/{needs}): {e}"
            ) from None


def _windows(snippets) -> tuple[np.ndarray, np.ndarray]:
    """A role's lines (bytes or str) -> LEAF's windows as ids: (n, 80) uint8 and (n,) targets."""
    import torch

    from .shakespeare import role_text, windows

    lines = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.asarray(snippets).reshape(-1)]
    x, y = windows(torch.from_numpy(to_ids(role_text(lines))))
    return x.contiguous().numpy(), y.numpy()


class ParquetLayout:
    """A Flower Datasets export (``flwrlabs/femnist``, ``flwrlabs/shakespeare``) as parquet
    files: one table of all samples, FEMNIST's columns ``writer_id``, ``image`` (PNG) and
    ``character``; Shakespeare's ``character_id``, ``x`` and ``y``. It has no test split: a
    user's samples are split as the dataset's rule says (``LeafSource.client``)."""

    COLUMNS = {"femnist": ("writer_id", "image", "character"), "shakespeare": ("character_id", "x", "y")}

    def __init__(self, root: Path, fmt: SampleFormat):
        self.root, self.fmt = root, fmt
        if fmt.name not in self.COLUMNS:
            raise DataError(
                f"leaf_{fmt.name}: {root} holds parquet files; raysim reads Flower Datasets' "
                "FEMNIST and Shakespeare exports only (datasets leaf_femnist, leaf_shakespeare)"
            )
        self.paths = sorted(p for p in root.rglob("*.parquet") if ".raysim-cache" not in p.parts)

    def files(self) -> dict[str, list]:
        return {"train": [[str(p.relative_to(self.root)), *cache.stat(p)] for p in self.paths], "test": []}

    def chunks(self, sub: str):
        if sub == "test":
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        user_col, x_col, y_col = self.COLUMNS[self.fmt.name]
        rows: dict[str, tuple[list, list]] = {}
        for path in self.paths:
            try:
                table = pq.read_table(path, columns=[user_col, x_col, y_col])
            except (OSError, pa.ArrowException, KeyError):
                try:
                    found = f" (it has {', '.join(pq.read_schema(path).names)})"
                except (OSError, pa.ArrowException):
                    found = " (it is not a parquet file)"
                raise DataError(
                    f"leaf_{self.fmt.name}: {path} is not Flower Datasets' {self.fmt.name} export: "
                    f"needs columns {', '.join(self.COLUMNS[self.fmt.name])}{found}"
                ) from None
            us, xs, ys = (table.column(c).to_pylist() for c in (user_col, x_col, y_col))
            if self.fmt.name == "femnist":
                xs = [_png(v, path) for v in xs]
            for u, x, y in zip(us, xs, ys):
                r = rows.setdefault(str(u), ([], []))
                r[0].append(x)
                r[1].append(y)
        for u in sorted(rows):
            yield f"{self.root}: user {u}", [(u, *rows[u])]


def _png(value, where) -> np.ndarray:
    """A Flower image cell ({"bytes": PNG, ...}) as float32 pixels in [0, 1] (LEAF's scale)."""
    import io

    from PIL import Image

    try:
        data = value["bytes"] if isinstance(value, dict) else value
        return np.asarray(Image.open(io.BytesIO(data)).convert("L"), dtype=np.float32) / np.float32(255.0)
    except (OSError, TypeError, KeyError, ValueError):
        raise DataError(f"leaf_femnist: {where}: an image cell is not a PNG") from None


def _one(root: Path, pattern: str, what: str) -> Path:
    found = sorted(root.glob(pattern))
    if len(found) != 1:
        raise DataError(
            f"{what}: expected one file {pattern} in {root}, found {', '.join(p.name for p in found) or 'none'}"
        )
    return found[0]


def layout(root: Path, fmt: SampleFormat):
    """The layout of the data under ``root``: LEAF's train/ and test/ folders, TFF's HDF5
    pair, or Flower Datasets' parquet files; DataError saying what was looked for."""
    if (root / "train").is_dir() or (root / "test").is_dir():
        return JsonLayout(root, fmt)
    if list(root.glob("*.h5")):
        return TffLayout(root, fmt)
    if root.is_dir() and any(".raysim-cache" not in p.parts for p in root.rglob("*.parquet")):
        return ParquetLayout(root, fmt)
    return JsonLayout(root, fmt)  # says which folder is missing and how to make it


def _decode(chunks, fmt: SampleFormat, meta: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Chunks of raw users -> user -> (inputs, int64 labels); a user met twice keeps the last."""
    what = f"leaf_{fmt.name}"
    users: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for where, items in chunks:
        for u, x, y in items:
            try:
                xa, ya = fmt.x(x, meta), fmt.y(y)
            except (ValueError, TypeError, IndexError) as e:
                raise DataError(f"{what}: {where}: user {u}'s x or y does not hold {fmt.name} samples ({e})") from None
            if len(xa) != len(ya):
                raise DataError(f"{what}: {where}: user {u} has {len(xa)} inputs but {len(ya)} labels")
            users[str(u)] = (xa, ya)
    return users
