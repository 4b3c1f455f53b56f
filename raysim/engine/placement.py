"""Where a run's clients live and how the round driver reaches them: the ``Transport`` both
engines implement (in-process hosts, Ray actors), the ``Placement`` of clients on hosts, the
prepared data source every host shares, and ``HostLost``, a host gone mid-round."""

from __future__ import annotations

import heapq
from typing import Any, Protocol

import numpy as np

from raysim.scenario.config import Scenario, make_source


class Transport(Protocol):
    num_hosts: int
    placement: Placement

    def stats(self, round_: int, message: Any, by_host: list[list[int]]) -> list: ...
    def train(
        self,
        round_: int,
        message: Any,
        by_host: list[dict[int, int]],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ) -> list[tuple]: ...
    def evaluate(self, round_: int, message: Any, by_host: list[dict[int, int]], unseen: list[int]) -> list[dict]: ...
    def save_clients(self, folder: str, rdir: str, token: str, head: dict) -> list[dict]: ...
    def load_clients(self, folder: str, doc: dict, token: str) -> None: ...
    def message_nbytes(self, message: Any, by_host: list[dict[int, int]]) -> int: ...
    def shutdown(self) -> None: ...


class Placement:
    """Which host holds each client, for the whole run (``owner[cid]``).

    ``balanced`` (``resources.placement: samples``, the default) balances the hosts' work: the
    clients, largest first (ties: lower id first), each go to the host with the fewest samples
    so far (ties: lower host index) — greedy longest-processing-time, deterministic, within
    4/3 of the best balance; with equal sizes it is round robin. ``round_robin`` puts client c
    on host c mod H whatever its size. Results never depend on placement (replies are reduced
    in client-id order)."""

    def __init__(self, owner: np.ndarray, hosts: int):
        self.owner = np.asarray(owner, dtype=np.int64)
        self.hosts = hosts
        self._clients = [np.flatnonzero(self.owner == h).tolist() for h in range(hosts)]

    @classmethod
    def round_robin(cls, clients: int, hosts: int) -> Placement:
        return cls(np.arange(clients) % hosts, hosts)

    @classmethod
    def balanced(cls, sizes, hosts: int) -> Placement:
        sizes = np.asarray(sizes, dtype=np.int64)
        order = np.lexsort((np.arange(len(sizes)), -sizes))  # largest first, then by id
        owner = np.empty(len(sizes), dtype=np.int64)
        heap = [(0, h) for h in range(hosts)]
        for c in order.tolist():
            load, h = heapq.heappop(heap)
            owner[c] = h
            heapq.heappush(heap, (load + int(sizes[c]), h))
        return cls(owner, hosts)

    def host(self, cid: int) -> int:
        return int(self.owner[cid])

    def clients(self, h: int) -> list[int]:
        """Host h's clients, ascending."""
        return self._clients[h]


def prepared_source(sc: Scenario):
    """The scenario's data source with its once-only work done (``FederatedSource.prepare``):
    the engine makes one per run in the driver and hands it to every host and the server."""
    source = make_source(sc)
    source.prepare()
    return source


def place(sc: Scenario, hosts: int | None = None, source=None) -> Placement:
    """The scenario's placement over ``hosts`` (default ``resources.hosts``) hosts."""
    hosts = hosts or sc.resources.hosts
    if sc.resources.placement == "round_robin" or hosts == 1:
        return Placement.round_robin(sc.data.clients, hosts)
    source = source or make_source(sc)
    return Placement.balanced([source.num_samples(c) for c in range(sc.data.clients)], hosts)


def groups_by_host(assignment: dict[int, int], placement: Placement) -> list[dict[int, int]]:
    out: list[dict[int, int]] = [{} for _ in range(placement.hosts)]
    owner = placement.owner
    for c in sorted(assignment):
        out[owner[c]][c] = assignment[c]
    return out


class HostLost(RuntimeError):
    """A host actor died (its process killed, out of memory, its node gone) or did not answer
    in time. The run rolls back to its last checkpoint on a fresh set of hosts and goes on:
    client work is a pure function of state, message, round and client id, so the redone
    rounds give the same results."""
