"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from the standard IDX files.

Train (60 000) and test (10 000) are pooled and split among clients by the scenario's
partitioner; each client's share is then split into train/val/test. Files may be gzip-compressed.
The default root is where Debian's `dataset-fashion-mnist` package puts them.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from algorithms.base import ClientData
from raysim.rng import generator

from .base import DataError, FederatedSource, Splits, split_client

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MEAN, STD = 0.2860, 0.3530
INSTALL = ("install them with `sudo apt-get install dataset-fashion-mnist` or set data.root to a "
           "folder holding the four IDX files")


@dataclass(frozen=True)
class FashionParams:
    root: str = field(default="/usr/share/datasets/fashion-mnist", metadata={"help": "folder of the IDX files"})


def _find(root: Path, name: str) -> Path:
    for cand in (root / name, root / f"{name}.gz"):
        if cand.is_file():
            return cand
    raise DataError(f"fashion_mnist: no {name}[.gz] under {root}; {INSTALL}")


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (uint8 data): magic 0x0000 08 NDIM, big-endian dims, then the bytes."""
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] not in (1, 3):
        raise DataError(f"fashion_mnist: {path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"fashion_mnist: {path} holds {data.size} bytes, its header says {tuple(dims)}")
    return data.reshape(tuple(dims))


class FashionMNIST(FederatedSource):
    def __init__(self, params: FashionParams, clients: int, partition, splits: Splits, seed: int):
        if partition is None:
            raise ValueError("fashion_mnist needs a partition")
        self.root = Path(params.root)
        self.partition, self.splits, self.seed = partition, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (1, 28, 28), 10
        self._pool = None

    def pool(self):
        if self._pool is None:
            from . import PARTITIONERS
            if not self.root.is_dir():
                raise DataError(f"fashion_mnist: {self.root} does not exist (looked for {FILES[0]}[.gz] "
                                f"and three more IDX files); {INSTALL}")
            arrays = [read_idx(_find(self.root, f)) for f in FILES]
            images = np.concatenate([arrays[0], arrays[2]])
            labels = np.concatenate([arrays[1], arrays[3]]).astype(np.int64)
            if images.ndim != 3 or images.shape[0] != labels.shape[0]:
                raise DataError(f"fashion_mnist: images {images.shape} and labels {labels.shape} under "
                                f"{self.root} do not match")
            spec = PARTITIONERS[self.partition.kind]
            try:
                parts = spec.fn(labels, self.num_clients, self.partition.params,
                                generator(self.seed, "partition"))
            except ValueError as e:
                raise DataError(f"fashion_mnist: {e}") from None
            self._pool = (images, labels, parts)
        return self._pool

    def num_samples(self, cid: int) -> int:
        return len(self.pool()[2][cid])

    def client(self, cid: int) -> ClientData:
        images, labels, parts = self.pool()
        idx = parts[cid]
        x = ((images[idx].astype(np.float32) / 255.0 - MEAN) / STD)[:, None]
        return split_client(cid, x, labels[idx], self.splits, self.seed)
