"""Generated datasets: the FedEM synthetic mixture, a Gaussian timing dataset, sklearn digits.

FedEM synthetic — Marfoq, Neglia, Bellet, Kameni & Vidal, "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021, App. I.1.5, and the official generator
(github.com/omarfoq/FedEM, data/synthetic/generate_data.py): M components θ_m ~ U(-1,1)^dim;
client t has mixture weights π_t ~ Dir(alpha·1) and
n_t = min(int(lognormal(4, 2)) + min_samples, max_samples) samples; each sample x ~ U(-1,1)^dim
comes from a component m ~ π_t and is labelled y = round(sigmoid(x·θ_m + ε)), ε ~ N(0, noise²).

``legacy_overwrite: true`` reproduces the official generator's bug: its write index never
advances, so component m labels rows [0, n_m) with θ_m (overwriting earlier components; the last
write wins) and rows past the largest block keep label 0, giving P(y=1) ≈ 0.36 instead of ≈ 0.5.
The paper's synthetic numbers came from that data; the default is the generator as described.

Differences from the official script, by design: every draw comes from a stream derived from
(seed, "synthetic", what, cid), so any client is generated alone and in any order; and each
client's n_t samples are split into train/val/test by ``Splits`` (the script drew a separate
5 000-sample test set per client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysim.core.data import ClientData
from raysim.rng import generator

from .base import DataError, FederatedSource, GroupParams, PooledSource, Splits, split_client


@dataclass(frozen=True)
class SyntheticParams:
    dim: int = field(default=150, metadata={"min": 1, "help": "input dimension"})
    classes: int = field(default=2, metadata={"choices": (2,), "help": "binary labels only"})
    components: int = field(default=3, metadata={"min": 1, "help": "mixture components M"})
    alpha: float = field(default=0.4, metadata={"gt": 0.0, "help": "Dirichlet concentration of π_t"})
    min_samples: int = field(default=50, metadata={"min": 1, "help": "added to int(lognormal(4, 2))"})
    max_samples: int = field(default=1000, metadata={"min": 1, "help": "cap on a client's samples"})
    noise: float = field(default=0.1, metadata={"min": 0.0, "help": "std of ε in the logit"})
    legacy_overwrite: bool = field(default=False, metadata={"help": "reproduce the official label bug"})


def _labels(x: np.ndarray, theta: np.ndarray, noise: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.round(1.0 / (1.0 + np.exp(-(x @ theta + noise)))).astype(np.int64)


class SyntheticMixture(FederatedSource):
    def __init__(self, params: SyntheticParams, clients: int, splits: Splits, seed: int):
        if params.max_samples < params.min_samples:
            raise DataError(
                f"synthetic: max_samples ({params.max_samples}) is below min_samples "
                f"({params.min_samples}); set data.max_samples >= data.min_samples"
            )
        self.p, self.splits, self.seed = params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (params.dim,), 2
        self.theta = generator(seed, "synthetic", "theta").uniform(-1, 1, (params.components, params.dim))

    def num_samples(self, cid: int) -> int:
        g = generator(self.seed, "synthetic", "size", cid)
        return int(min(int(g.lognormal(4, 2)) + self.p.min_samples, self.p.max_samples))

    def mixture_weights(self, cid: int) -> np.ndarray:
        """π_t of client ``cid``."""
        return generator(self.seed, "synthetic", "pi", cid).dirichlet(np.full(self.p.components, self.p.alpha))

    def raw(self, cid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x float32, y int64, component whose θ labelled each row; -1: never labelled, legacy
        only), shuffled, before the train/test split. Labels are computed on the float32 x."""
        p = self.p
        n = self.num_samples(cid)
        g = generator(self.seed, "synthetic", "samples", cid)
        counts = g.multinomial(n, self.mixture_weights(cid))
        x = g.uniform(-1, 1, (n, p.dim)).astype(np.float32)
        x64 = x.astype(np.float64)
        y = np.zeros(n, dtype=np.int64)
        comp = np.full(n, -1, dtype=np.int64)
        start = 0
        for m, c in enumerate(counts):
            rows = slice(0, c) if p.legacy_overwrite else slice(start, start + c)
            y[rows] = _labels(x64[rows], self.theta[m], g.normal(0.0, p.noise, c))
            comp[rows] = m
            start += c
        order = g.permutation(n)
        return x[order], y[order], comp[order]

    def component_of(self, cid: int) -> np.ndarray:
        """Component index of each of ``raw(cid)``'s rows (-1 where legacy left label 0)."""
        return self.raw(cid)[2]

    def client(self, cid: int) -> ClientData:
        x, y, _ = self.raw(cid)
        return split_client(cid, x, y, self.splits, self.seed)


@dataclass(frozen=True)
class GaussianParams:
    samples: int = field(default=64, metadata={"min": 1, "help": "samples per client (before the split)"})
    features: tuple[int, ...] = field(default=(150,), metadata={"min": 1, "help": "per-sample shape, e.g. [1, 28, 28]"})
    classes: int = field(default=2, metadata={"min": 2, "help": "labels uniform in [0, classes)"})


class Gaussian(FederatedSource):
    """Standard-normal features and uniform labels from generator(seed, "gaussian", cid):
    a timing workload with no signal."""

    def __init__(self, params: GaussianParams, clients: int, splits: Splits, seed: int):
        self.p, self.splits, self.seed = params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, tuple(params.features), params.classes

    def num_samples(self, cid: int) -> int:
        return self.p.samples

    def client(self, cid: int) -> ClientData:
        g = generator(self.seed, "gaussian", cid)
        x = g.standard_normal((self.p.samples, *self.p.features), dtype=np.float32)
        y = g.integers(0, self.p.classes, self.p.samples, dtype=np.int64)
        return split_client(cid, x, y, self.splits, self.seed)


@dataclass(frozen=True)
class DigitsParams(GroupParams):
    pass


class Digits(PooledSource):
    """scikit-learn's bundled handwritten digits (1 797 8x8 images scaled to [0, 1], 10 classes;
    UCI optdigits): real data present on every machine, pooled and split by the partitioner."""

    name = "digits"
    input_shape, num_classes, image_shape = (64,), 10, (8, 8)

    def __init__(self, params: DigitsParams, clients: int, partition, splits: Splits, seed: int):
        super().__init__(clients, partition, splits, seed, params)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        x, y = load_digits()
        return (x / 16.0).astype(np.float32), y.astype(np.int64)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``load_digits(return_X_y=True)``, read from the file it reads
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels then the label per row) without
    importing ``sklearn.datasets``, which imports SciPy's statistics and pandas: 1.1 s of CPU
    in the driver and in every host, a tenth of the quickstart on 2 cores. Where the file is
    not found (another scikit-learn layout), scikit-learn's own loader; a test holds the two
    equal."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations or [""]), "")) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        from sklearn.datasets import load_digits as sk_load_digits

        return sk_load_digits(return_X_y=True)
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)
