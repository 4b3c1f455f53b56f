"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747) from the standard IDX files.

Train (60 000) and test (10 000) are pooled (70 000 images) and split among clients by the
scenario's partitioner; each client's share is then split into train/val/test. Inputs are
uint8/255 as float32 of shape (1, 28, 28), normalized with the dataset's mean 0.2860 and std
0.3530. Files may be gzip-compressed (``NAME.gz``). The default root is where Debian's
``dataset-fashion-mnist`` package installs them (as ``.gz``).

IDX format (LeCun's MNIST page): 4-byte magic 0x00 0x00 <type> <ndim> (type 0x08 = uint8; so
0x00000803 for images, 0x00000801 for labels), ndim big-endian uint32 sizes, then the data.
"""
from __future__ import annotations

import functools
import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .base import DataError, GroupParams, PooledSource, Splits

IMAGES, LABELS = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte"), ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte")
FILES = (IMAGES[0], LABELS[0], IMAGES[1], LABELS[1])
MEAN, STD = 0.2860, 0.3530
INSTALL = ("install them with `sudo apt-get install dataset-fashion-mnist` or set data.root to a "
           "folder holding the four IDX files")


@dataclass(frozen=True)
class FashionParams(GroupParams):
    root: str = field(default="/usr/share/datasets/fashion-mnist",
                      metadata={"help": "folder of the four IDX files (plain or .gz)"})


def find_files(root: Path) -> list[Path]:
    """The four IDX files under ``root`` (plain name preferred over .gz), or DataError."""
    found = {}
    for name in FILES:
        for cand in (root / name, root / f"{name}.gz"):
            if cand.is_file():
                found[name] = cand
                break
    if not found:
        raise DataError(f"fashion_mnist: no IDX files under {root} (looked for "
                        f"{'[.gz], '.join(FILES)}[.gz]); {INSTALL}")
    missing = [n for n in FILES if n not in found]
    if missing:
        raise DataError(f"fashion_mnist: {root} lacks {'[.gz], '.join(missing)}[.gz] "
                        f"(found {', '.join(p.name for p in found.values())}); {INSTALL}")
    return [found[n] for n in FILES]


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes with ``ndim`` dimensions (magic 0x000008NN)."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":          # gzip, whatever the name says
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"fashion_mnist: cannot read {path}: {e}; {INSTALL}") from None
    magic = 0x800 | ndim
    if len(raw) < 4 + 4 * ndim or int.from_bytes(raw[:4], "big") != magic:
        got = f"0x{int.from_bytes(raw[:4], 'big'):08x}" if len(raw) >= 4 else "a short header"
        raise DataError(f"fashion_mnist: {path} is not an IDX file of {ndim}-d unsigned bytes "
                        f"(bad magic number: expected 0x{magic:08x}, got {got}); {INSTALL}")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"fashion_mnist: {path} holds {data.size} data bytes but its header says "
                        f"{'x'.join(map(str, dims))}; the file is truncated or corrupt; {INSTALL}")
    return data.reshape(dims)


@functools.lru_cache(maxsize=1)
def _load(paths: tuple[Path, ...], stamps: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (images uint8 N x 28 x 28, labels int64 N); cached per process while files are unchanged."""
    tr_x, tr_y, te_x, te_y = (read_idx(p, 3 if i % 2 == 0 else 1) for i, p in enumerate(paths))
    for imgs, labs, pi, pl in ((tr_x, tr_y, paths[0], paths[1]), (te_x, te_y, paths[2], paths[3])):
        if imgs.shape[1:] != (28, 28):
            raise DataError(f"fashion_mnist: {pi} holds {imgs.shape[1]}x{imgs.shape[2]} images, expected 28x28")
        if imgs.shape[0] != labs.shape[0]:
            raise DataError(f"fashion_mnist: {pi} has {imgs.shape[0]} images but {pl} has {labs.shape[0]} labels")
        if labs.size and labs.max() > 9:
            raise DataError(f"fashion_mnist: {pl} holds label {labs.max()}, expected 0..9")
    x, y = np.concatenate([tr_x, te_x]), np.concatenate([tr_y, te_y]).astype(np.int64)
    x.flags.writeable = y.flags.writeable = False
    return x, y


class FashionMNIST(PooledSource):
    name = "fashion_mnist"
    input_shape, num_classes, image_shape = (1, 28, 28), 10, (28, 28)

    def __init__(self, params: FashionParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(clients, partition, splits, seed, params)
        self.root = Path(params.root)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        paths = tuple(find_files(self.root))
        stamps = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
        return _load(paths, stamps)

    def to_float(self, x: np.ndarray) -> np.ndarray:
        return ((x.astype(np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD))[:, None]
