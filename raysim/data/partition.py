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
- nfold: Huang et al. 2021 (FedAMP, "Personalized Cross-Silo Federated Learning on Non-IID
  Data", AAAI) n-fold split as SosicFL defines it: clients in ``folds`` equal groups (contiguous
  blocks of ids), group g's primary classes the g-th of ``folds`` near-equal blocks of the
  classes; every client holds ``size`` samples, a fraction ``primary`` (x = 80 %) spread evenly
  over its group's primary classes and the rest evenly over the other classes (``spread:
  others``, the paper's definition) or over all classes (``spread: all``, the authors' later
  code, whose 70/30 split reads as 76 % primary for 5 folds). The client's group is its true
  cluster (``Grouped.groups``).
- pachinko: the Pachinko allocation of Li & McCallum 2006 as Reddi et al. 2021 ("Adaptive
  Federated Optimization") and FedEM split CIFAR-100 (needs a dataset with coarse labels):
  each client draws a distribution over the coarse labels ~ Dir(alpha) and, per coarse label,
  one over its fine labels ~ Dir(beta); each of its ⌊N / clients⌋ samples draws a coarse label,
  then a fine one, then a sample of that label without replacement; an exhausted fine label
  (then coarse label) leaves its distribution, which is renormalized. Samples left over after
  every client is full are unused, as in FedEM's code.
- client_dirichlet: each client's label distribution φ_k ~ Dir_L(β), equal client sizes
  (Yurochkin et al. 2019; the split SosicFL and Floco call Dirichlet). Samples are dealt as the
  authors' code does: a client with room left draws a class from its φ_k, renormalized over
  the classes not yet exhausted, until every client is full.
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
    classes_per_client: int = field(
        default=2, metadata={"min": 1, "help": "label-sorted shards (≈ classes) per client"}
    )
    assign: str = field(
        default="random",
        metadata={
            "choices": ("random", "strided"),
            "help": "random: shards dealt at random (McMahan et al.); strided: client i gets shards i, i+K, ... "
            "(SuPerFed's code, no randomness)",
        },
    )


@dataclass(frozen=True)
class IIDParams:
    pass


@dataclass(frozen=True)
class NFoldParams:
    folds: int = field(default=5, metadata={"min": 1, "help": "groups n of clients (each with its primary classes)"})
    primary: float = field(
        default=0.8,
        metadata={"min": 0.0, "max": 1.0, "help": "x: share of a client's samples from its group's primary classes"},
    )
    spread: str = field(
        default="others",
        metadata={
            "choices": ("others", "all"),
            "help": "where the rest goes: others (the non-primary classes, the paper) or all classes (authors' code)",
        },
    )
    size: int | None = field(
        default=None,
        metadata={"min": 1, "help": "samples per client (default: the most the pool allows for every client)"},
    )


@dataclass(frozen=True)
class ClientDirichletParams:
    beta: float = field(default=0.5, metadata={"gt": 0.0, "help": "β of each client's Dir_L(β) label distribution"})
    size: int | None = field(
        default=None, metadata={"min": 1, "help": "samples per client (default: ⌊pool / clients⌋)"}
    )


class Grouped(list):
    """A partition (one index array per client) whose clients belong to known groups: the
    truth a clustered method's assignment is scored against."""

    def __init__(self, parts, groups):
        super().__init__(parts)
        self.groups = np.asarray(groups, dtype=np.int64)


def _check(n: int, num_clients: int, need: int) -> None:
    if num_clients < 1:
        raise ValueError(f"need at least one client, got {num_clients}")
    if n < need:
        raise ValueError(f"{n} samples are too few for {num_clients} clients (need {need}); use fewer clients")


def dirichlet(
    labels: np.ndarray, num_clients: int, params: DirichletParams, rng: np.random.Generator
) -> list[np.ndarray]:
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


def shards(labels: np.ndarray, num_clients: int, params: ShardsParams, rng: np.random.Generator) -> list[np.ndarray]:
    labels = np.asarray(labels)
    k = params.classes_per_client
    _check(len(labels), num_clients, num_clients * k)
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_clients * k)
    if params.assign == "strided":
        return [np.sort(np.concatenate(pieces[c::num_clients])).astype(np.int64) for c in range(num_clients)]
    ids = rng.permutation(num_clients * k)
    return [
        np.sort(np.concatenate([pieces[s] for s in ids[c * k : (c + 1) * k]])).astype(np.int64)
        for c in range(num_clients)
    ]


def iid(labels: np.ndarray, num_clients: int, params: IIDParams, rng: np.random.Generator) -> list[np.ndarray]:
    _check(len(labels), num_clients, num_clients)
    return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def _deal(pools: list[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Client k takes counts[k, c] samples of class c, clients in id order, each class's
    shuffled pool consumed front to back."""
    taken = np.zeros(len(pools), dtype=np.int64)
    out = []
    for row in counts:
        got = []
        for c, m in enumerate(row):
            got.append(pools[c][taken[c] : taken[c] + m])
            taken[c] += m
        out.append(np.sort(np.concatenate(got)).astype(np.int64))
    return out


def _even(total: int, k: int) -> np.ndarray:
    """``total`` split into k near-equal integers (the first ones get the remainder)."""
    base = np.full(k, total // k, dtype=np.int64)
    base[: total % k] += 1
    return base


def nfold(labels: np.ndarray, num_clients: int, params: NFoldParams, rng: np.random.Generator) -> Grouped:
    labels = np.asarray(labels)
    classes = np.unique(labels)
    n_cls, folds = len(classes), params.folds
    if folds > num_clients or folds > n_cls:
        raise ValueError(
            f"{folds} folds need at least {folds} clients and {folds} classes "
            f"(have {num_clients} clients, {n_cls} classes)"
        )
    group = np.concatenate([np.full(len(b), g) for g, b in enumerate(np.array_split(np.arange(num_clients), folds))])
    prim = [set(b.tolist()) for b in np.array_split(np.arange(n_cls), folds)]

    def shares(g: int) -> np.ndarray:
        """Fraction of a group-g client's samples per class."""
        p = np.zeros(n_cls)
        own = sorted(prim[g])
        rest = [c for c in range(n_cls) if c not in prim[g]] if params.spread == "others" else list(range(n_cls))
        if not rest:
            p[own] = 1.0 / len(own)
            return p
        p[own] += params.primary / len(own)
        p[rest] += (1.0 - params.primary) / len(rest)
        return p

    avail = np.array([(labels == c).sum() for c in classes])
    demand = sum(shares(g) for g in group)  # per class, per unit of client size

    def counts_for(size: int) -> np.ndarray:
        """Each client's count per class: size·shares rounded by largest remainder, ties
        going to the classes after the client's id (rotating), so class totals stay even."""
        counts = np.zeros((num_clients, n_cls), dtype=np.int64)
        for k, g in enumerate(group):
            want = size * shares(g)
            base = np.floor(want + 1e-9).astype(np.int64)
            rank = np.lexsort(((np.arange(n_cls) - k) % n_cls, -np.round(want - base, 9)))
            base[rank[: size - base.sum()]] += 1
            counts[k] = base
        return counts

    if params.size:
        counts = counts_for(params.size)
        short = counts.sum(0) - avail
        if (short > 0).any():
            c = int(np.argmax(short))
            raise ValueError(
                f"size {params.size} per client needs {counts.sum(0)[c]} samples of class "
                f"{classes[c]}, the pool has {avail[c]}; lower data.partition.size"
            )
    else:  # the largest size every class can serve
        size = int(np.floor((avail / np.maximum(demand, 1e-12)).min() + 1e-9))
        while size > 1 and ((counts := counts_for(size)).sum(0) > avail).any():
            size -= 1
        counts = counts_for(size)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    return Grouped(_deal(pools, counts), group)


def client_dirichlet(
    labels: np.ndarray, num_clients: int, params: ClientDirichletParams, rng: np.random.Generator
) -> list[np.ndarray]:
    labels = np.asarray(labels)
    classes = np.unique(labels)
    n_cls = len(classes)
    size = params.size or len(labels) // num_clients
    _check(len(labels), num_clients, size * num_clients)
    phi = rng.dirichlet(np.full(n_cls, params.beta), size=num_clients)
    left = np.array([(labels == c).sum() for c in classes], dtype=np.int64)
    counts = np.zeros((num_clients, n_cls), dtype=np.int64)
    room = np.full(num_clients, size, dtype=np.int64)
    # the authors' dealing (one sample at a time: a random client with room draws a class from
    # its prior over the classes left), in passes: every client with room draws one sample, in
    # a random order; where a class runs out, the clients later in the order draw again
    while room.sum() > 0:
        ks = rng.permutation(np.flatnonzero(room > 0))
        p = phi[ks] * (left > 0)
        empty = p.sum(1) <= 0  # its classes are gone: any class left, uniformly
        p[empty] = left > 0
        cum = np.cumsum(p / p.sum(1, keepdims=True), axis=1)
        pick = np.minimum((rng.random(len(ks))[:, None] >= cum).sum(1), n_cls - 1)
        for c in np.unique(pick):
            who = ks[pick == c][: left[c]]
            counts[who, c] += 1
            room[who] -= 1
            left[c] -= len(who)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    return _deal(pools, counts)


@dataclass(frozen=True)
class PachinkoParams:
    alpha: float = field(
        default=0.4, metadata={"gt": 0.0, "help": "Dirichlet concentration over coarse labels (FedEM: 0.4)"}
    )
    beta: float = field(
        default=10.0,
        metadata={"gt": 0.0, "help": "Dirichlet concentration over a coarse label's fine labels (FedEM: 10)"},
    )


def _renormalized(w: np.ndarray, i: int) -> np.ndarray:
    w = np.delete(w, i)
    total = w.sum()
    return w / total if total > 0 else np.full(len(w), 1.0 / max(len(w), 1))


def pachinko(
    labels: np.ndarray, num_clients: int, params: PachinkoParams, rng: np.random.Generator, coarse: np.ndarray
) -> list[np.ndarray]:
    """Pachinko allocation; ``coarse[f]`` is fine label f's coarse label."""
    _check(len(labels), num_clients, num_clients)
    n_per = len(labels) // num_clients
    present = np.unique(labels)
    pools = {int(f): list(rng.permutation(np.flatnonzero(labels == f))) for f in present}
    fine_of = {int(c): [int(f) for f in present if coarse[f] == c] for c in np.unique(coarse[present])}
    available = sorted(fine_of)
    out = []
    for _ in range(num_clients):
        wc = rng.dirichlet(params.alpha * np.ones(len(available)))
        wf = {c: rng.dirichlet(params.beta * np.ones(len(fine_of[c]))) for c in available}
        taken = np.empty(n_per, dtype=np.int64)
        for k in range(n_per):
            ci = int(rng.choice(len(available), p=wc))
            c = available[ci]
            fi = int(rng.choice(len(fine_of[c]), p=wf[c]))
            f = fine_of[c][fi]
            taken[k] = pools[f].pop()
            if not pools[f]:  # fine label exhausted
                fine_of[c].pop(fi)
                wf[c] = _renormalized(wf[c], fi)
                if not fine_of[c]:  # and with it the coarse label
                    available.pop(ci)
                    del wf[c]
                    wc = _renormalized(wc, ci)
        out.append(np.sort(taken))
    return out
