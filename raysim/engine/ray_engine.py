"""Every Ray call of raysim lives here (the transport, as Flower keeps its ray_transport apart).

- Host actors: ``Host`` wrapped with ``ray.remote``, one bundle each in a SPREAD placement group
  (``num_cpus``/``num_gpus`` from the scenario's ``resources``), so hosts spread across nodes.
- The server actor: a RoundDriver over a RayTransport, pinned (num_cpus=0) to the driver's node
  so it writes checkpoints where the user runs ``raysim``.
- Each round the message is put into the object store once; every host gets the same ref.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from raysim.config import Scenario, ScenarioError
from raysim.engine.driver import host_of
from raysim.engine.drivers import make_driver
from raysim.engine.host import Host
from raysim.engine.serial import message_nbytes, parts_for
from raysim.engine.trees import from_numpy, to_numpy

PLACEMENT_TIMEOUT_S = 120


def init(address: str | None, verbose: bool = False) -> None:
    """Start an embedded Ray (address None) or join a cluster ("auto" or HOST:PORT)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    kwargs: dict[str, Any] = dict(
        logging_level=logging.INFO if verbose else logging.ERROR,
        log_to_driver=verbose,
        configure_logging=True,
    )
    if address is None:
        kwargs.update(include_dashboard=False, dashboard_host="127.0.0.1")
    ray.init(address=address, **kwargs)


def running() -> bool:
    """True once this process has started or joined Ray (later sweep variants reuse it)."""
    return ray.is_initialized()


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def _fetch(parts: dict[int, Any]) -> dict[int, Any]:
    """Per-group parts sent as {group: ref}: fetched here, on the host (Ray does not resolve
    refs inside a dict)."""
    keys = list(parts)
    return dict(zip(keys, (from_numpy(v) for v in ray.get([parts[k] for k in keys]))))


class RayHost(Host):
    """A Host as a Ray actor: tensors cross the process boundary as numpy arrays."""

    def stats(self, round_: int, message: Any, cids: list[int]):
        return super().stats(round_, from_numpy(message), cids)

    def train(self, round_: int, shared: Any, parts: dict[int, Any], groups: dict[int, int]):
        return super().train(round_, from_numpy(shared), _fetch(parts), groups)

    def evaluate(self, round_: int, shared: Any, parts: dict[int, Any], groups: dict[int, int],
                 unseen: list[int] = ()):
        return super().evaluate(round_, from_numpy(shared), _fetch(parts), groups, unseen)

    def gossip_init(self, server: Any) -> dict[int, int]:
        return super().gossip_init(from_numpy(server))

    def consensus(self, mean: Any):
        return super().consensus(from_numpy(mean))

    def gossip_train(self, round_: int, cids: list[int], outbox: dict[int, list[int]]):
        """One object per host that needs some of these clients' messages, holding exactly
        those; it goes into this node's object store and only its ref leaves."""
        bundles, losses, secs = super().gossip_train(round_, cids, outbox)
        return {h: ray.put(to_numpy(b)) for h, b in bundles.items()}, losses, secs

    def gossip_mix(self, inbox: list[Any], rows: dict[int, list[tuple[int, float]]] | None):
        """Fetch the bundles other hosts made for this one (peer to peer), then mix."""
        return super().gossip_mix([from_numpy(b) for b in ray.get(list(inbox))], rows)

    def get_states(self) -> dict[int, Any]:
        return to_numpy(super().get_states())

    def set_states(self, trees: dict[int, Any]) -> None:
        super().set_states(from_numpy(trees))


def start_hosts(sc: Scenario):
    """Place and start the host actors (SPREAD placement group, one bundle each) without
    waiting for them to boot; returns (placement group, actor handles)."""
    res = sc.resources
    bundle = {"CPU": res.cpus_per_host, **({"GPU": res.gpus_per_host} if res.gpus_per_host else {})}
    pg = placement_group([dict(bundle) for _ in range(res.hosts)], strategy="SPREAD")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(f"the cluster could not place {res.hosts} hosts of {bundle} "
                           f"within {PLACEMENT_TIMEOUT_S}s")
    actor = ray.remote(RayHost)
    n = sc.data.clients
    threads = max(1, int(res.cpus_per_host))
    hosts = [
        actor.options(num_cpus=res.cpus_per_host, num_gpus=res.gpus_per_host, max_concurrency=1,
                      scheduling_strategy=PlacementGroupSchedulingStrategy(pg, h))
        .remote(sc, [c for c in range(n) if host_of(c, res.hosts) == h], None, threads)
        for h in range(res.hosts)
    ]
    return pg, hosts


class RayTransport:
    def __init__(self, sc: Scenario, started=None):
        """Over host actors ``started`` by ``start_hosts`` (the driver starts them, so they boot
        while the server actor does), or started here."""
        self.num_hosts = sc.resources.hosts
        self.pg, self.hosts = started if started is not None else start_hosts(sc)
        ray.get([h.prefetch.remote() for h in self.hosts])     # started, shards loaded

    def _put(self, message: Any, by_host: list[dict[int, int]]):
        """The shared part and each needed group part into the object store once; per host,
        the shared ref and the refs of its clients' groups."""
        if message is None:
            return None, [{} for _ in by_host]
        shared = ray.put(to_numpy(message.shared))
        needed = sorted({g for groups in by_host for g in parts_for(message, groups)})
        refs = {g: ray.put(to_numpy(message.groups[g])) for g in needed}
        return shared, [{g: refs[g] for g in parts_for(message, groups)} for groups in by_host]

    def stats(self, round_: int, message: Any, by_host: list[list[int]]):
        ref = ray.put(to_numpy(message))
        return ray.get([h.stats.remote(round_, ref, cids) for h, cids in zip(self.hosts, by_host)])

    def train(self, round_: int, message: Any, by_host: list[dict[int, int]]):
        shared, parts = self._put(message, by_host)
        return ray.get([h.train.remote(round_, shared, p, g) for h, p, g in zip(self.hosts, parts, by_host)])

    def evaluate(self, round_: int, message: Any, by_host: list[dict[int, int]], unseen: list[int]):
        shared, parts = self._put(message, by_host)
        unseen = set(unseen)
        return ray.get([h.evaluate.remote(round_, shared, p, g, [c for c in g if c in unseen])
                        for h, p, g in zip(self.hosts, parts, by_host)])

    def gossip_init(self, server: Any) -> dict[int, int]:
        ref = ray.put(to_numpy(server))
        counts: dict[int, int] = {}
        for part in ray.get([h.gossip_init.remote(ref) for h in self.hosts]):
            counts.update(part)
        return counts

    def gossip_train(self, round_: int, by_host: list[list[int]], outboxes: list[dict[int, list[int]]]):
        return ray.get([h.gossip_train.remote(round_, cids, out)
                        for h, cids, out in zip(self.hosts, by_host, outboxes)])

    def gossip_mix(self, plans: list[tuple[list[Any], dict[int, list[tuple[int, float]]] | None]]):
        # the refs travel inside a list, so Ray does not resolve them here: each host fetches its own
        return ray.get([h.gossip_mix.remote(inbox, rows) for h, (inbox, rows) in zip(self.hosts, plans)])

    def consensus(self, mean):
        ref = ray.put(to_numpy(mean))
        return ray.get([h.consensus.remote(ref) for h in self.hosts])

    def get_states(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for part in ray.get([h.get_states.remote() for h in self.hosts]):
            out.update(from_numpy(part))
        return out

    def set_states(self, trees: dict[int, Any]) -> None:
        ref = ray.put(to_numpy(trees))
        ray.get([h.set_states.remote(ref) for h in self.hosts])

    def message_nbytes(self, message: Any, by_host: list[dict[int, int]]) -> int:
        return message_nbytes(message, by_host)

    def shutdown(self) -> None:
        for h in self.hosts:
            ray.kill(h)
        self.hosts = []
        remove_placement_group(self.pg)


def _check_fits(sc: Scenario) -> None:
    res = sc.resources
    total = ray.cluster_resources()
    for key, per in (("CPU", res.cpus_per_host), ("GPU", res.gpus_per_host)):
        need = per * res.hosts
        have = total.get(key, 0.0)
        if need > have + 1e-9:
            name = "cpus_per_host" if key == "CPU" else "gpus_per_host"
            raise ScenarioError(f"{sc.path}: resources.{name}: {res.hosts} hosts x {per:g} {key} = "
                                f"{need:g} {key}, but the Ray cluster has {have:g}; lower resources.hosts "
                                f"or resources.{name}")


class _Server:
    """Runs inside the server actor: the RoundDriver over Ray host actors."""

    def __init__(self, sc: Scenario, started=None):
        self.driver = make_driver(sc, RayTransport(sc, started))

    def step(self) -> dict:
        return self.driver.step()

    def save(self, path: str, extra: dict | None = None) -> None:
        self.driver.save(path, extra)

    def restore(self, path: str) -> int:
        return self.driver.restore(path)

    def history(self) -> list[dict]:
        return self.driver.history

    def report(self) -> dict:
        return self.driver.report()

    def shutdown(self) -> None:
        self.driver.transport.shutdown()


class RayServer:
    """Driver-side handle with the same methods as a RoundDriver (blocking calls)."""

    def __init__(self, sc: Scenario):
        _check_fits(sc)
        here = ray.get_runtime_context().get_node_id()
        pg, hosts = start_hosts(sc)               # they boot while the server actor does
        try:
            self.actor = ray.remote(_Server).options(
                num_cpus=0, max_concurrency=1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(sc, (pg, hosts))
            ray.get(self.actor.history.remote())  # surface construction errors now
        except BaseException:
            for h in hosts:
                ray.kill(h)
            remove_placement_group(pg)
            raise

    def step(self) -> dict:
        return ray.get(self.actor.step.remote())

    def save(self, path: str, extra: dict | None = None) -> None:
        ray.get(self.actor.save.remote(path, extra))

    def restore(self, path: str) -> int:
        return ray.get(self.actor.restore.remote(path))

    @property
    def history(self) -> list[dict]:
        return ray.get(self.actor.history.remote())

    def report(self) -> dict:
        return ray.get(self.actor.report.remote())

    def close(self) -> None:
        try:
            ray.get(self.actor.shutdown.remote())
        finally:
            ray.kill(self.actor)
