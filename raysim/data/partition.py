"""Partitioners: split a pool of labelled samples among clients.

Each is ``fn(labels, num_clients, params, rng) -> list of index arrays``, one sorted int64 array
per client, drawing only from ``rng`` (so a fixed generator gives a fixed split).

- dirichlet: for each class c, shares p_c ~ Dir(alpha·1) over clients, and class c's shuffled
  samples are cut by p_c (Hsu, Qi & Brown 2019, "Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification"; the split FedEM and FL-bench use). Redrawn
  up to ``TRIES`` times until every client has ``min_size`` samples, then fixed up by moving
  samples from the largest clients. Every sample goes to exactly one client.
- shards: McMahan et al. 2017 ("Communication-Efficient Learning of Deep Networks from
  Decentralized Data") pathological non-IID split: sort by label, cut clients·k shards, k random
  shards per client. Shard sizes differ by at most one, so no sample is dropped; a client holds at
  most k labels whenever each shard falls inside one class (e.g. class sizes divisible by the
  shard size), otherwise a shard straddling a class boundary adds a label. ``assign: strided``
  gives client i shards i, i+K, i+2K, ... instead (SuPerFed's code: deterministic; with K
  clients, 2 shards each and 10 equal classes, client i holds classes ⌊10i/2K⌋ and that + 5).
- iid: uniform shuffle, equal sizes (differing by at most one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TRIES = 100


@dataclass(frozen=True)
class DirichletParams:
    alpha: float = field(default=0.3, metadata={"gt": 0.0, "help": "concentration; small = skewed labels"})
    min_size: int = field(default=2, metadata={"min": 0, "help": "fewest samples any client gets"})


@dataclass(frozen=True)
class ShardsParams:
    classes_per_client: int = field(default=2, metadata={"min": 1, "help": "label-sorted shards (≈ classes) per client"})
    assign: str = field(default="random", metadata={
        "choices": ("random", "strided"),
        "help": "random: shards dealt at random (McMahan et al.); strided: client i gets shards i, i+K, ... "
                "(SuPerFed's code, no randomness)"})


@dataclass(frozen=True)
class IIDParams:
    pass


def _check(n: int, num_clients: int, need: int) -> None:
    if num_clients < 1:
        raise ValueError(f"need at least one client, got {num_clients}")
    if n < need:
        raise ValueError(f"{n} samples are too few for {num_clients} clients (need {need}); "
                         f"use fewer clients")


def dirichlet(labels: np.ndarray, num_clients: int, params: DirichletParams,
              rng: np.random.Generator) -> list[np.ndarray]:
    labels = np.asarray(labels)
    _check(len(labels), num_clients, params.min_size * num_clients)
    classes = np.unique(labels)
    for _ in range(TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, params.alpha))
            cuts = np.minimum((np.cumsum(p)[:-1] * len(idx)).astype(np.int64), len(idx))
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.concatenate(p) for p in parts]
        if min(len(o) for o in out) >= params.min_size:
            break
    else:
        # still short after TRIES draws: move random samples from the largest client to the smallest
        while True:
            sizes = np.array([len(o) for o in out])
            small, big = int(np.argmin(sizes)), int(np.argmax(sizes))
            need = params.min_size - sizes[small]
            if need <= 0:
                break
            k = min(need, sizes[big] - params.min_size)
            take = rng.permutation(sizes[big])[:k]
            out[small] = np.concatenate([out[small], out[big][take]])
            out[big] = np.delete(out[big], take)
    return [np.sort(o).astype(np.int64) for o in out]


def shards(labels: np.ndarray, num_clients: int, params: ShardsParams,
           rng: np.random.Generator) -> list[np.ndarray]:
    labels = np.asarray(labels)
    k = params.classes_per_client
    _check(len(labels), num_clients, num_clients * k)
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_clients * k)
    if params.assign == "strided":
        return [np.sort(np.concatenate(pieces[c::num_clients])).astype(np.int64) for c in range(num_clients)]
    ids = rng.permutation(num_clients * k)
    return [np.sort(np.concatenate([pieces[s] for s in ids[c * k:(c + 1) * k]])).astype(np.int64)
            for c in range(num_clients)]


def iid(labels: np.ndarray, num_clients: int, params: IIDParams,
        rng: np.random.Generator) -> list[np.ndarray]:
    _check(len(labels), num_clients, num_clients)
    return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(len(labels)), num_clients)]
