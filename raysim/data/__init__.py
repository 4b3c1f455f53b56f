"""Datasets and partitioners, each registered with its own options dataclass."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import partition as _p
from .base import DataError, FederatedSource, Splits, split_client
from .fashion import FashionMNIST, FashionParams
from .synthetic import Digits, DigitsParams, Gaussian, GaussianParams, SyntheticMixture, SyntheticParams


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    summary: str
    Params: type
    pooled: bool              # a labelled pool split among clients by a partitioner
    build: Callable[..., FederatedSource]


@dataclass(frozen=True)
class PartitionerSpec:
    name: str
    summary: str
    Params: type
    fn: Callable


@dataclass(frozen=True)
class PartitionCfg:
    kind: str
    params: object


DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec("synthetic", "FedEM synthetic mixture of linear models (Marfoq et al. 2021), binary",
                SyntheticParams, False, lambda p, n, part, sp, seed: SyntheticMixture(p, n, sp, seed)),
    DatasetSpec("gaussian", "random normal features, uniform labels, any shape (timing workload)",
                GaussianParams, False, lambda p, n, part, sp, seed: Gaussian(p, n, sp, seed)),
    DatasetSpec("fashion_mnist", "Fashion-MNIST from IDX files (Debian: dataset-fashion-mnist), pooled",
                FashionParams, True, FashionMNIST),
    DatasetSpec("digits", "scikit-learn's bundled 8x8 handwritten digits (1 797 samples, 10 classes), pooled",
                DigitsParams, True, Digits),
)}

PARTITIONERS: dict[str, PartitionerSpec] = {s.name: s for s in (
    PartitionerSpec("dirichlet", "label shares per class ~ Dir(alpha) over clients (Hsu et al. 2019)",
                    _p.DirichletParams, _p.dirichlet),
    PartitionerSpec("shards", "pathological non-IID: k label-sorted shards per client (McMahan et al. 2017)",
                    _p.ShardsParams, _p.shards),
    PartitionerSpec("iid", "uniform random split, equal sizes", _p.IIDParams, _p.iid),
)}


def build_source(dataset: str, params, clients: int, partition: PartitionCfg | None,
                 splits: Splits, seed: int) -> FederatedSource:
    return DATASETS[dataset].build(params, clients, partition, splits, seed)


__all__ = ["DATASETS", "PARTITIONERS", "DataError", "DatasetSpec", "FederatedSource",
           "PartitionCfg", "PartitionerSpec", "Splits", "build_source", "split_client"]
