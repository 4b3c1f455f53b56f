"""Partitioners: split a pool of labelled samples among clients.

- dirichlet: per class c, shares p_c ~ Dir(alpha) over clients (Hsu, Qi & Brown 2019,
  "Measuring the Effects of Non-Identical Data Distribution"; the split FedEM and FL-bench use).
- shards: sort by label, cut clients*k equal shards, k shards per client (McMahan et al. 2017's
  pathological non-IID split).
- iid: uniform shuffle, equal sizes (differ by at most one).
Each returns one sorted int64 index array per client.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DirichletParams:
    alpha: float = field(default=0.3, metadata={"gt": 0.0, "help": "concentration; small = skewed labels"})
    min_size: int = field(default=2, metadata={"min": 0, "help": "fewest samples any client gets"})


@dataclass(frozen=True)
class ShardsParams:
    classes_per_client: int = field(default=2, metadata={"min": 1, "help": "shards (≈ classes) per client"})


@dataclass(frozen=True)
class IIDParams:
    pass


def dirichlet(labels: np.ndarray, num_clients: int, params: DirichletParams,
              rng: np.random.Generator) -> list[np.ndarray]:
    n = len(labels)
    if params.min_size * num_clients > n:
        raise ValueError(f"{n} samples cannot give {num_clients} clients {params.min_size} each")
    classes = np.unique(labels)
    for _ in range(100):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, params.alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(o) for o in out) >= params.min_size:
            return out
    # rare with sane settings: move samples from the largest clients to the smallest
    while min(len(o) for o in out) < params.min_size:
        small = int(np.argmin([len(o) for o in out]))
        big = int(np.argmax([len(o) for o in out]))
        out[small] = np.sort(np.append(out[small], out[big][-1]))
        out[big] = out[big][:-1]
    return out


def shards(labels: np.ndarray, num_clients: int, params: ShardsParams,
           rng: np.random.Generator) -> list[np.ndarray]:
    """Equal shards of the label-sorted pool; the remainder (< clients*k samples) is dropped."""
    k = params.classes_per_client
    order = np.argsort(labels, kind="stable")
    num_shards = num_clients * k
    size = len(labels) // num_shards
    if size == 0:
        raise ValueError(f"{len(labels)} samples cannot make {num_shards} shards")
    shard_ids = rng.permutation(num_shards)
    return [np.sort(np.concatenate([order[s * size:(s + 1) * size] for s in shard_ids[c * k:(c + 1) * k]]))
            .astype(np.int64) for c in range(num_clients)]


def iid(labels: np.ndarray, num_clients: int, params: IIDParams,
        rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(len(labels)), num_clients)]
