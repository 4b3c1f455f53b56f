"""Image datasets from files the user holds (nothing is downloaded): CIFAR-10, CIFAR-100 and
EMNIST, pooled (train and test together) and split among clients by the scenario's partitioner.

- **CIFAR-10 / CIFAR-100** (Krizhevsky 2009) in their *binary* versions, the ones that need
  no unpickling: ``cifar-10-batches-bin/`` (``data_batch_1..5.bin``, ``test_batch.bin``: per
  image 1 label byte and 3 072 pixel bytes) and ``cifar-100-binary/`` (``train.bin``,
  ``test.bin``: a coarse and a fine label byte, then the pixels). The Python versions that
  torchvision downloads are pickles, which raysim never loads; the error says which archive
  to fetch instead. Inputs are (3, 32, 32) scaled to [0, 1] and normalized per channel with
  the training set's mean and std (clients hold the uint8 pixels; each batch is normalized as
  it is gathered: ``raysim.core.data.Pixels``). CIFAR-100 keeps each image's coarse label (20
  superclasses), which the ``pachinko`` partitioner uses (FedEM's split: alpha 0.4, beta 10).
- **EMNIST** (Cohen et al. 2017) from the gzip IDX files of NIST's distribution (or
  torchvision's ``EMNIST/raw/`` copy): ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}
  -ubyte[.gz]``; ``split``: byclass (62 classes, FedEM's), bymerge, balanced (47), letters (26),
  digits, mnist (10). Images are stored transposed and are turned upright; letters' labels
  1..26 become 0..25. ``fraction`` keeps a seeded share of the pool (FedEM used 10 %).

Files are read once into a cache (``raysim.data.cache``) that every process memory-maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysim.core.data import Pixels
from raysim.rng import generator

from . import cache
from .base import DataError, GroupParams, PooledSource, Splits
from .fashion import read_idx

CIFAR = {
    "cifar10": dict(
        folder="cifar-10-batches-bin",
        files=[f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"],
        labels=1,
        classes=10,
        pickled="cifar-10-batches-py",
        archive="cifar-10-binary.tar.gz",
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
    ),
    "cifar100": dict(
        folder="cifar-100-binary",
        files=["train.bin", "test.bin"],
        labels=2,
        classes=100,
        pickled="cifar-100-python",
        archive="cifar-100-binary.tar.gz",
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
    ),
}
PIXELS = 3 * 32 * 32


@dataclass(frozen=True)
class CifarParams(GroupParams):
    root: str = field(
        default="data/cifar",
        metadata={"help": "folder holding cifar-10-batches-bin/ or cifar-100-binary/ (or those folders themselves)"},
    )


def _cifar_files(name: str, root: Path) -> list[Path]:
    spec = CIFAR[name]
    folder = root if all((root / f).is_file() for f in spec["files"]) else root / spec["folder"]
    missing = [f for f in spec["files"] if not (folder / f).is_file()]
    if not missing:
        return [folder / f for f in spec["files"]]
    how = (
        f"download {spec['archive']} from https://www.cs.toronto.edu/~kriz/cifar.html and extract it into "
        f"{root} (giving {root / spec['folder']}/)"
    )
    if (root / spec["pickled"]).is_dir():
        raise DataError(
            f"{name}: {root / spec['pickled']} is the pickled Python version, which raysim does not "
            f"load (unpickling runs code); {how}"
        )
    raise DataError(f"{name}: no {', '.join(missing)} under {folder}; {how}")


def _cifar_plan(name: str, files: list[Path]) -> cache.Plan:
    spec = CIFAR[name]
    record = spec["labels"] + PIXELS
    parts = []
    for f in files:
        raw = np.fromfile(f, dtype=np.uint8)
        if raw.size % record:
            raise DataError(
                f"{name}: {f} holds {raw.size} bytes, not a whole number of {record}-byte records "
                f"({spec['labels']} label byte(s) + {PIXELS} pixels); the file is truncated or not "
                f"from {spec['archive']}"
            )
        parts.append(raw.reshape(-1, record))
    recs = np.concatenate(parts)
    fine = recs[:, spec["labels"] - 1].astype(np.int64)
    if fine.max(initial=0) >= spec["classes"]:
        raise DataError(f"{name}: label {fine.max()} in {files[0].parent}, expected 0..{spec['classes'] - 1}")
    arrays = {"x": recs[:, spec["labels"] :].reshape(-1, 3, 32, 32), "y": fine}
    if spec["labels"] == 2:
        arrays["coarse"] = recs[:, 0].astype(np.int64)

    def fill(key: str, out: np.ndarray) -> None:
        out[...] = arrays[key]

    return cache.Plan(
        {"train": int(sum(len(p) for p in parts[:-1])), "test": len(parts[-1])},
        {k: (v.shape, v.dtype) for k, v in arrays.items()},
        fill,
    )


class _Cifar(PooledSource):
    input_shape, image_shape = (3, 32, 32), (32, 32)

    def __init__(self, params: CifarParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(clients, partition, splits, seed, params)
        self.root = Path(params.root)
        spec = CIFAR[self.name]
        self.num_classes = spec["classes"]
        self.pixels = Pixels(spec["mean"], spec["std"])

    def _arrays_cached(self) -> dict[str, np.ndarray]:
        files = _cifar_files(self.name, self.root)
        return cache.load(self.name, self.root, cache.file_rows(files), lambda: _cifar_plan(self.name, files)).arrays()

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        a = self._arrays_cached()
        return a["x"], a["y"]


class CIFAR10(_Cifar):
    name = "cifar10"


class CIFAR100(_Cifar):
    name = "cifar100"

    @property
    def coarse_labels(self) -> np.ndarray:
        """Fine label f's coarse label (20 superclasses), as the files pair them."""
        a = self._arrays_cached()
        out = np.full(100, -1, dtype=np.int64)
        out[np.asarray(a["y"])] = np.asarray(a["coarse"])
        return out


EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


@dataclass(frozen=True)
class EmnistParams(GroupParams):
    root: str = field(
        default="data/emnist", metadata={"help": "folder with the emnist-*-ubyte[.gz] files (or gzip/, EMNIST/raw/)"}
    )
    split: str = field(
        default="byclass",
        metadata={
            "choices": tuple(EMNIST_SPLITS),
            "help": (
                "the EMNIST split whose files are read: byclass (62 classes, FedEM's), bymerge or balanced (47), "
                "letters (26), digits or mnist (10)"
            ),
        },
    )
    fraction: float = field(
        default=1.0, metadata={"gt": 0.0, "max": 1.0, "help": "seeded share of the pool kept (FedEM: 0.1)"}
    )


def _emnist_files(root: Path, split: str) -> list[Path]:
    names = [f"emnist-{split}-{s}-{k}-ubyte" for s in ("train", "test") for k in ("images-idx3", "labels-idx1")]
    for folder in (root, root / "gzip", root / "EMNIST" / "raw"):
        found = [next((p for p in (folder / n, folder / f"{n}.gz") if p.is_file()), None) for n in names]
        if all(found):
            return found
    raise DataError(
        f"emnist: no {names[0]}[.gz] (and its three siblings) under {root}, {root / 'gzip'} or "
        f"{root / 'EMNIST' / 'raw'}; download gzip.zip from NIST's EMNIST page "
        "(https://www.nist.gov/itl/products-and-services/emnist-dataset) and unzip it into data.root"
    )


def _emnist_plan(files: list[Path], split: str) -> cache.Plan:
    tr_x, tr_y, te_x, te_y = (read_idx(p, 3 if i % 2 == 0 else 1) for i, p in enumerate(files))
    x = np.concatenate([tr_x, te_x]).transpose(0, 2, 1)  # stored column-major: upright
    y = np.concatenate([tr_y, te_y]).astype(np.int64) - (1 if split == "letters" else 0)
    if y.min(initial=0) < 0 or y.max(initial=0) >= EMNIST_SPLITS[split]:
        raise DataError(
            f"emnist: labels {y.min()}..{y.max()} in {files[1]} do not fit split {split} "
            f"({EMNIST_SPLITS[split]} classes); is data.split right?"
        )

    def fill(key: str, out: np.ndarray) -> None:
        out[...] = x if key == "x" else y

    return cache.Plan(
        {"train": len(tr_y), "test": len(te_y)}, {"x": (x.shape, np.uint8), "y": (y.shape, np.int64)}, fill
    )


class EMNIST(PooledSource):
    name = "emnist"
    input_shape, image_shape = (1, 28, 28), (28, 28)
    pixels = Pixels((0.0,), (1.0,))  # x / 255

    def __init__(self, params: EmnistParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(clients, partition, splits, seed, params)
        self.root, self.split, self.fraction = Path(params.root), params.split, params.fraction
        self.num_classes = EMNIST_SPLITS[params.split]

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        files = _emnist_files(self.root, self.split)
        a = cache.load(
            f"emnist_{self.split}", self.root, cache.file_rows(files), lambda: _emnist_plan(files, self.split)
        ).arrays()
        x, y = a["x"], a["y"]
        if self.fraction < 1.0:
            keep = np.sort(generator(self.seed, "emnist_fraction").permutation(len(y))[: int(len(y) * self.fraction)])
            x, y = x[keep], y[keep]
        return x, y
