"""Generated datasets: the FedEM synthetic mixture and a Gaussian timing dataset.

FedEM synthetic — Marfoq et al., "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021, App. I.1.5 and the official generator: M components
θ_m ~ U(-1,1)^dim; client t has mixture weights π_t ~ Dir(alpha) and
n_t = min(int(lognormal(4, 2)) + min_samples, max_samples) samples; each sample x ~ U(-1,1)^dim
is drawn from a component m ~ π_t and labelled y = round(sigmoid(x·θ_m + ε)), ε ~ N(0, noise²).

``legacy_overwrite: true`` reproduces the official generator's bug: its write index never
advances, so component m labels rows [0, count_m) (overwriting earlier components) and rows past
the largest block keep label 0 (P(y=1) ≈ 0.36 instead of ≈ 0.5). The paper's synthetic numbers
came from that data; the default is the generator as described.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from algorithms.base import ClientData
from raysim.rng import generator

from .base import FederatedSource, Splits, split_client


@dataclass(frozen=True)
class SyntheticParams:
    dim: int = field(default=150, metadata={"min": 1})
    classes: int = field(default=2, metadata={"choices": (2,), "help": "binary labels"})
    components: int = field(default=3, metadata={"min": 1})
    alpha: float = field(default=0.4, metadata={"gt": 0.0, "help": "Dirichlet concentration of π_t"})
    min_samples: int = field(default=50, metadata={"min": 1})
    max_samples: int = field(default=1000, metadata={"min": 1})
    noise: float = field(default=0.1, metadata={"min": 0.0})
    legacy_overwrite: bool = False


class SyntheticMixture(FederatedSource):
    def __init__(self, params: SyntheticParams, clients: int, splits: Splits, seed: int):
        if params.max_samples < params.min_samples:
            raise ValueError("max_samples must be >= min_samples")
        self.p, self.splits, self.seed = params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (params.dim,), 2
        self.theta = generator(seed, "synthetic", "theta").uniform(-1, 1, (params.components, params.dim))

    def num_samples(self, cid: int) -> int:
        g = generator(self.seed, "synthetic", "size", cid)
        return int(min(int(g.lognormal(4, 2)) + self.p.min_samples, self.p.max_samples))

    def mixture_weights(self, cid: int) -> np.ndarray:
        return generator(self.seed, "synthetic", "pi", cid).dirichlet(np.full(self.p.components, self.p.alpha))

    def raw(self, cid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, component of each row) before the train/test split."""
        p = self.p
        n = self.num_samples(cid)
        g = generator(self.seed, "synthetic", "samples", cid)
        counts = g.multinomial(n, self.mixture_weights(cid))
        x = g.uniform(-1, 1, (n, p.dim))
        y = np.zeros(n, dtype=np.int64)
        comp = np.full(n, -1, dtype=np.int64)
        start = 0
        for m, c in enumerate(counts):
            rows = slice(0, c) if p.legacy_overwrite else slice(start, start + c)
            logits = x[rows] @ self.theta[m] + g.normal(0.0, p.noise, c)
            y[rows] = np.round(1.0 / (1.0 + np.exp(-logits))).astype(np.int64)
            comp[rows] = m
            start += c
        order = g.permutation(n)
        return x[order].astype(np.float32), y[order], comp[order]

    def client(self, cid: int) -> ClientData:
        x, y, _ = self.raw(cid)
        return split_client(cid, x, y, self.splits, self.seed)


@dataclass(frozen=True)
class GaussianParams:
    samples: int = field(default=64, metadata={"min": 1, "help": "samples per client (before the split)"})
    features: tuple[int, ...] = field(default=(150,), metadata={"min": 1, "help": "per-sample shape"})
    classes: int = field(default=2, metadata={"min": 2})


class Gaussian(FederatedSource):
    """Standard-normal features and uniform labels: a timing workload with no signal."""

    def __init__(self, params: GaussianParams, clients: int, splits: Splits, seed: int):
        self.p, self.splits, self.seed = params, splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, tuple(params.features), params.classes

    def num_samples(self, cid: int) -> int:
        return self.p.samples

    def client(self, cid: int) -> ClientData:
        g = generator(self.seed, "gaussian", cid)
        x = g.standard_normal((self.p.samples, *self.p.features), dtype=np.float32)
        y = g.integers(0, self.p.classes, self.p.samples)
        return split_client(cid, x, y, self.splits, self.seed)


@dataclass(frozen=True)
class DigitsParams:
    pass


class Digits(FederatedSource):
    """scikit-learn's bundled handwritten digits (1 797 8x8 images, 10 classes; UCI optdigits):
    real data present on every machine, pooled and split by the scenario's partitioner."""

    def __init__(self, params: DigitsParams, clients: int, partition, splits: Splits, seed: int):
        from sklearn.datasets import load_digits
        if partition is None:
            raise ValueError("digits needs a partition")
        from . import PARTITIONERS
        d = load_digits()
        self.x = (d.data / 16.0).astype(np.float32)
        self.y = d.target.astype(np.int64)
        self.splits, self.seed = splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (64,), 10
        spec = PARTITIONERS[partition.kind]
        try:
            self.parts = spec.fn(self.y, clients, partition.params, generator(seed, "partition"))
        except ValueError as e:
            from .base import DataError
            raise DataError(f"digits: {e}") from None

    def num_samples(self, cid: int) -> int:
        return len(self.parts[cid])

    def client(self, cid: int) -> ClientData:
        idx = self.parts[cid]
        return split_client(cid, self.x[idx], self.y[idx], self.splits, self.seed)
