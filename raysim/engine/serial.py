"""The serial engine: hosts as plain objects in this process (the reference for parity tests)."""

from __future__ import annotations

from typing import Any

import torch

from raysim.engine import checkpoint
from raysim.engine.driver import RoundDriver, place, prepared_source
from raysim.engine.drivers import make_driver
from raysim.engine.host import Host
from raysim.engine.trees import nbytes
from raysim.scenario.config import Scenario


def parts_for(message: Any, groups: dict[int, int]) -> dict[int, Any]:
    """The per-group parts a host's clients need (only those)."""
    if message is None:
        return {}
    return {g: message.groups[g] for g in sorted(set(groups.values())) if g in message.groups}


def message_nbytes(message: Any, by_host: list[dict[int, int]]) -> int:
    """Bytes sent down: the shared part to every host with a client, each group part to every
    host that needs it."""
    busy = [g for g in by_host if g]
    shared = nbytes(message.shared) * len(busy)
    return shared + sum(nbytes(part) for g in busy for part in parts_for(message, g).values())


class LocalTransport:
    def __init__(self, sc: Scenario, num_hosts: int | None = None, device: str | None = None, source=None):
        # one host's thread budget, as each Ray host gets (hosts here run one after another)
        torch.set_num_threads(max(1, int(sc.resources.cpus_per_host)))
        self.num_hosts = num_hosts or sc.resources.hosts
        # one prepared source for every host of this process (one partition, one pool)
        source = source if source is not None else prepared_source(sc)
        self.placement = place(sc, self.num_hosts, source)
        self.hosts = [Host(sc, self.placement.clients(h), device=device, source=source) for h in range(self.num_hosts)]
        for h in self.hosts:
            h.prefetch()

    def stats(self, round_: int, message: Any, by_host: list[list[int]]):
        return [h.stats(round_, message, cids) for h, cids in zip(self.hosts, by_host)]

    def train(
        self,
        round_: int,
        message: Any,
        by_host: list[dict[int, int]],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ):
        return [
            h.train(round_, message.shared, parts_for(message, g), g, each, work, clip)
            for h, g in zip(self.hosts, by_host)
        ]

    def evaluate(self, round_: int, message: Any, by_host: list[dict[int, int]], unseen: list[int]):
        shared = None if message is None else message.shared
        return [
            h.evaluate(round_, shared, parts_for(message, g), g, [c for c in g if c in set(unseen)])
            for h, g in zip(self.hosts, by_host)
        ]

    def gossip_init(self, server: Any) -> dict[int, int]:
        counts: dict[int, int] = {}
        for h in self.hosts:
            counts.update(h.gossip_init(server))
        return counts

    def gossip_train(self, round_: int, by_host: list[list[int]], outboxes: list[dict[int, list[int]]]):
        return [h.gossip_train(round_, cids, out) for h, cids, out in zip(self.hosts, by_host, outboxes)]

    def gossip_mix(self, plans: list[tuple[list[Any], Any]]):
        return [h.gossip_mix(inbox, rows) for h, (inbox, rows) in zip(self.hosts, plans)]

    def consensus(self, mean):
        return [h.consensus(mean) for h in self.hosts]

    def get_states(self) -> dict[int, Any]:
        """Every client's state, in this process (for inspection; checkpoints go per host)."""
        out: dict[int, Any] = {}
        for h in self.hosts:
            out.update(h.get_states())
        return out

    def set_states(self, trees: dict[int, Any]) -> None:
        for h in self.hosts:
            h.set_states(trees)

    def save_clients(self, folder: str, rdir: str, token: str, head: dict) -> list[dict]:
        """Each host writes its clients' states to ``rdir/host-H.pt``; the manifest's entries."""
        entries = []
        for h, host in enumerate(self.hosts):
            path = f"{rdir}/{checkpoint.host_file(h)}"
            entry, trees = host.write_states(folder, path, token, head)
            entries.append(entry if trees is None else checkpoint.write_host(path, head, trees))
        return entries

    def load_clients(self, folder: str, doc: dict, token: str) -> None:
        for host in self.hosts:
            part = checkpoint.holding(doc, host.cids)
            if not host.read_states(folder, part, token):
                host.read_states(folder, part, token, checkpoint.read_clients(folder, part, host.cids))

    def message_nbytes(self, message: Any, by_host: list[dict[int, int]]) -> int:
        return message_nbytes(message, by_host)

    def shutdown(self) -> None:
        self.hosts = []


def serial_driver(sc: Scenario, num_hosts: int | None = None, source=None) -> RoundDriver:
    source = source if source is not None else prepared_source(sc)
    return make_driver(sc, LocalTransport(sc, num_hosts, source=source), source)
