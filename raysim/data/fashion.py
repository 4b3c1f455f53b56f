"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747) from the standard IDX files.

Train (60 000) and test (10 000) are pooled (70 000 images) and split among clients by the
scenario's partitioner; each client's share is then split into train/val/test. Inputs are
the uint8 pixels, shape (1, 28, 28), which the loop turns into x/255 normalized with the
dataset's mean 0.2860 and std 0.3530 batch by batch (``raysim.core.data.Pixels``). Files may
be gzip-compressed (``NAME.gz``). The default root is where Debian's ``dataset-fashion-mnist``
package installs them (as ``.gz``).

IDX format (LeCun's MNIST page): 4-byte magic 0x00 0x00 <type> <ndim> (type 0x08 = uint8; so
0x00000803 for images, 0x00000801 for labels), ndim big-endian uint32 sizes, then the data.

The files are read and decompressed once, into ``<root>/.raysim-cache/fashion_mnist/`` (or
``~/.cache/raysim/fashion_mnist-<hash>/``; see ``raysim.data.cache``): ``x.npy`` (uint8,
70 000 x 28 x 28, train then test) and ``y.npy`` (int64). Every process memory-maps them, so a
host reads only its own clients' rows; any change of an IDX file rebuilds the cache.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysim.core.data import Pixels

from . import cache
from .base import DataError, GroupParams, PooledSource, Splits

IMAGES, LABELS = (
    ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte"),
    ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"),
)
FILES = (IMAGES[0], LABELS[0], IMAGES[1], LABELS[1])
MEAN, STD = 0.2860, 0.3530
INSTALL = (
    "install them with `sudo apt-get install dataset-fashion-mnist` or set data.root to a "
    "folder holding the four IDX files"
)


@dataclass(frozen=True)
class FashionParams(GroupParams):
    root: str = field(
        default="/usr/share/datasets/fashion-mnist", metadata={"help": "folder of the four IDX files (plain or .gz)"}
    )


def find_files(root: Path) -> list[Path]:
    """The four IDX files under ``root`` (plain name preferred over .gz), or DataError."""
    found = {}
    for name in FILES:
        for cand in (root / name, root / f"{name}.gz"):
            if cand.is_file():
                found[name] = cand
                break
    if not found:
        raise DataError(
            f"fashion_mnist: no IDX files under {root} (looked for {'[.gz], '.join(FILES)}[.gz]); {INSTALL}"
        )
    missing = [n for n in FILES if n not in found]
    if missing:
        raise DataError(
            f"fashion_mnist: {root} lacks {'[.gz], '.join(missing)}[.gz] "
            f"(found {', '.join(p.name for p in found.values())}); {INSTALL}"
        )
    return [found[n] for n in FILES]


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes with ``ndim`` dimensions (magic 0x000008NN)."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip, whatever the name says
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"fashion_mnist: cannot read {path}: {e}; {INSTALL}") from None
    magic = 0x800 | ndim
    if len(raw) < 4 + 4 * ndim or int.from_bytes(raw[:4], "big") != magic:
        got = f"0x{int.from_bytes(raw[:4], 'big'):08x}" if len(raw) >= 4 else "a short header"
        raise DataError(
            f"fashion_mnist: {path} is not an IDX file of {ndim}-d unsigned bytes "
            f"(bad magic number: expected 0x{magic:08x}, got {got}); {INSTALL}"
        )
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(
            f"fashion_mnist: {path} holds {data.size} data bytes but its header says "
            f"{'x'.join(map(str, dims))}; the file is truncated or corrupt; {INSTALL}"
        )
    return data.reshape(dims)


def _plan(paths: list[Path]) -> cache.Plan:
    """Read and check the four IDX files: the pool (images uint8 N x 28 x 28, then labels
    int64 N), train before test."""
    tr_x, tr_y, te_x, te_y = (read_idx(p, 3 if i % 2 == 0 else 1) for i, p in enumerate(paths))
    for imgs, labs, pi, pl in ((tr_x, tr_y, paths[0], paths[1]), (te_x, te_y, paths[2], paths[3])):
        if imgs.shape[1:] != (28, 28):
            raise DataError(f"fashion_mnist: {pi} holds {imgs.shape[1]}x{imgs.shape[2]} images, expected 28x28")
        if imgs.shape[0] != labs.shape[0]:
            raise DataError(f"fashion_mnist: {pi} has {imgs.shape[0]} images but {pl} has {labs.shape[0]} labels")
        if labs.size and labs.max() > 9:
            raise DataError(f"fashion_mnist: {pl} holds label {labs.max()}, expected 0..9")
    n, parts = len(tr_y) + len(te_y), {"x": (tr_x, te_x), "y": (tr_y, te_y)}

    def fill(key: str, out: np.ndarray) -> None:
        np.concatenate(parts[key], out=out, casting="unsafe")

    return cache.Plan(
        {"train": len(tr_y), "test": len(te_y)}, {"x": ((n, 28, 28), np.uint8), "y": ((n,), np.int64)}, fill
    )


class FashionMNIST(PooledSource):
    name = "fashion_mnist"
    input_shape, num_classes, image_shape = (1, 28, 28), 10, (28, 28)
    pixels = Pixels((MEAN,), (STD,))

    def __init__(self, params: FashionParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(clients, partition, splits, seed, params)
        self.root = Path(params.root)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        paths = find_files(self.root)
        arrays = cache.load(self.name, self.root, cache.file_rows(paths), lambda: _plan(paths)).arrays()
        return arrays["x"], arrays["y"]
