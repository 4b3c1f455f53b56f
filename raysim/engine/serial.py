"""The serial engine: hosts as plain objects in this process (the reference for parity tests)."""
from __future__ import annotations

from typing import Any

import torch

from raysim.config import Scenario
from raysim.engine.driver import RoundDriver, host_of, make_driver
from raysim.engine.host import Host
from raysim.engine.trees import nbytes


class LocalTransport:
    def __init__(self, sc: Scenario, num_hosts: int | None = None, device: str | None = None):
        # one host's thread budget, as each Ray host gets (hosts here run one after another)
        torch.set_num_threads(max(1, int(sc.resources.cpus_per_host)))
        self.num_hosts = num_hosts or sc.resources.hosts
        n = sc.data.clients
        self.hosts = [Host(sc, [c for c in range(n) if host_of(c, self.num_hosts) == h], device=device)
                      for h in range(self.num_hosts)]
        for h in self.hosts:
            h.prefetch()

    def train(self, round_: int, message: Any, by_host: list[list[int]]):
        return [h.train(round_, message, cids) for h, cids in zip(self.hosts, by_host)]

    def evaluate(self, round_: int, message: Any, by_host: list[list[int]], unseen: list[int]):
        return [h.evaluate(round_, message, cids, unseen) for h, cids in zip(self.hosts, by_host)]

    def gossip_init(self, message: Any) -> dict[int, int]:
        counts: dict[int, int] = {}
        for h in self.hosts:
            counts.update(h.gossip_init(message))
        return counts

    def gossip_train(self, round_: int, by_host: list[list[int]], outboxes: list[dict[int, list[int]]]):
        return [h.gossip_train(round_, cids, out) for h, cids, out in zip(self.hosts, by_host, outboxes)]

    def gossip_mix(self, plans: list[tuple[list[Any], dict[int, list[tuple[int, float]]] | None]]):
        return [h.gossip_mix(inbox, rows) for h, (inbox, rows) in zip(self.hosts, plans)]

    def consensus(self):
        return [h.consensus() for h in self.hosts]

    def get_states(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for h in self.hosts:
            out.update(h.get_states())
        return out

    def set_states(self, trees: dict[int, Any]) -> None:
        for h in self.hosts:
            h.set_states(trees)

    def message_nbytes(self, message: Any) -> int:
        return nbytes(message)

    def shutdown(self) -> None:
        self.hosts = []


def serial_driver(sc: Scenario, num_hosts: int | None = None) -> RoundDriver:
    return make_driver(sc, LocalTransport(sc, num_hosts))
