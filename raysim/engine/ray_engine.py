"""Every Ray call of raysim lives here (the transport, as Flower keeps its ray_transport apart).

- Host actors: ``Host`` wrapped with ``ray.remote``, one bundle each in a SPREAD placement group
  (``num_cpus``/``num_gpus`` from the scenario's ``resources``), so hosts spread across nodes.
  On a local Ray host 0 runs in the driver's process instead (``resources.driver_host``,
  ``DriverHost``: called as an actor is, its call of each step run once the actors' are sent).
- The server (``RayServer``): a RoundDriver over a RayTransport in the driver's process, so it
  writes checkpoints where the user runs ``raysim``.
- Each round the message is put into the object store once; every host gets the same ref.
- A host that dies (SIGKILL, the OOM killer, its node leaving) or does not answer within
  ``resources.host_timeout_s`` raises ``HostLost``; the server then starts a fresh set of
  hosts and rolls back to the last checkpoint (``recover``), and ``raysim.experiment.runner`` goes on.
  An exception raised on a host (its construction included: ``RayHost``) is no loss: it reaches
  the driver as the exception itself, and the run fails with it.

The host actors themselves (``RayHost``, the driver's ``DriverHost``) are in ``ray_hosts``;
their names are importable from here too, as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raysim.engine import checkpoint
from raysim.engine.drivers import make_driver
from raysim.engine.placement import HostLost, Placement, place, prepared_source
from raysim.engine.ray_hosts import (  # noqa: F401 - re-exported
    DriverHost,
    DriverRayHost,
    RayHost,
    _Call,
    _cause,
    _kill,
    _run,
)
from raysim.engine.ray_start import embedded
from raysim.engine.serial import message_nbytes, parts_for
from raysim.engine.trees import from_numpy, to_numpy
from raysim.scenario.config import Scenario, ScenarioError

PLACEMENT_TIMEOUT_S = 120  # a local Ray (checked to fit beforehand)


# In a sweep's Tune trial (``ray_sweep``): the trial's placement group, already reserved with one
# bundle per host from bundle ``first`` on; the hosts take those bundles (never a second group)
_TRIAL: tuple[Any, int] | None = None


def adopt_trial_placement(first: int) -> None:
    """Run the hosts of this process's runs in the current placement group (a Tune trial's),
    from bundle ``first`` on."""
    global _TRIAL
    _TRIAL = (ray.util.get_current_placement_group(), first)


def _release(pg) -> None:
    """Remove a placement group this process made (a trial's belongs to Tune)."""
    if pg is not None and (_TRIAL is None or pg is not _TRIAL[0]):
        remove_placement_group(pg)


# Runs one after another (a sweep's variants and seeds, ``reuse_hosts``): the host actors of a
# run that finished, kept for the next run of the same shape: {"key", "pg", "hosts"}; None
# outside such a sequence
_PARKED: dict | None = None


def _shape(sc: Scenario) -> tuple:
    res = sc.resources
    return res.hosts, res.cpus_per_host, res.gpus_per_host, driver_hosts(sc)


@contextmanager
def reuse_hosts():
    """Within it, a run that finishes leaves its host actors up, and the next run asking the
    same hosts (count, CPUs, GPUs) takes them: each is re-initialised with the new run's
    scenario and clients (``RayHost.reset``: the same state as a new actor's) instead of a new
    process starting and importing PyTorch (about 4 s a run for 3 hosts on 2 cores). A run
    that fails or loses a host never hands its hosts on. Left: every parked host killed."""
    global _PARKED
    outer, _PARKED = _PARKED, {}
    try:
        yield
    finally:
        _drop_parked()
        _PARKED = outer


def _drop_parked() -> None:
    if _PARKED:
        for h in _PARKED["hosts"]:
            _kill(h)
        _release(_PARKED["pg"])
        _PARKED.clear()


def parked_for(sc: Scenario) -> bool:
    """Whether the next run of ``sc`` takes parked hosts."""
    return bool(_PARKED) and _TRIAL is None and _PARKED["key"] == _shape(sc)


def host_words(sc: Scenario, local: bool | None = None) -> str:
    """ "2 host actors", or with the driver's host "1 host actor (host 0 in this process)"."""
    here = int(driver_hosts(sc, local))
    n = sc.resources.hosts - here
    if n == 0:
        return "its one host, in this process"
    return f"{n} host actor{'s' * (n != 1)}" + (" (host 0 in this process)" if here else "")


def driver_hosts(sc: Scenario, local: bool | None = None) -> bool:
    """Whether host 0 runs in the driver's process (``resources.driver_host``); ``local``:
    whether the Ray used is one this process started (default: as it is now)."""
    res = sc.resources
    return res.host_in_driver(
        res.driver_host, embedded() if local is None else local, res.gpus_per_host, _TRIAL is not None
    )


def _resources_text(sc: Scenario) -> str:
    res = sc.resources
    per = f"{res.cpus_per_host:g} CPU" + (f" + {res.gpus_per_host:g} GPU" if res.gpus_per_host else "")
    free = ray.available_resources()
    have = f"{free.get('CPU', 0.0):g} CPU" + (f", {free.get('GPU', 0.0):g} GPU" if res.gpus_per_host else "")
    return f"{res.hosts} hosts of {per} (free now: {have})"


def _wait_placed(sc: Scenario, pg, say=None) -> None:
    """Wait until the placement group is placed. A local Ray was checked beforehand (it
    cannot grow); on a cluster, raysim waits up to ``resources.placement_timeout_s`` while an
    autoscaler adds nodes, saying once what it waits for."""
    limit = PLACEMENT_TIMEOUT_S if embedded() else sc.resources.placement_timeout_s
    ready, _ = ray.wait([pg.ready()], timeout=min(5.0, limit))
    if not ready and say is not None:
        say(
            f"raysim: waiting for the cluster to place {_resources_text(sc)}; an autoscaling cluster "
            f"adds nodes meanwhile (giving up after resources.placement_timeout_s = {limit:g} s)"
        )
    if not ready:
        ready, _ = ray.wait([pg.ready()], timeout=max(0.0, limit - 5.0))
    if not ready:
        what = _resources_text(sc)
        remove_placement_group(pg)
        raise ScenarioError(
            f"{sc.path}: resources: the Ray cluster could not place {what} within "
            f"{limit:g} s; lower resources.hosts, resources.cpus_per_host or "
            "resources.gpus_per_host, or add nodes"
        )


def start_hosts(sc: Scenario, source, say=None, placement: Placement | None = None):
    """Place and start the host actors (SPREAD placement group, one bundle each) without
    waiting for them to boot; returns (placement group, actor handles, client placement).
    ``source``: the prepared data source, or its ObjectRef (put once, read by every host)."""
    if not isinstance(source, ray.ObjectRef):
        source = ray.put(source)
    placement = placement or place(sc, source=ray.get(source))
    res = sc.resources
    threads = max(1, int(res.cpus_per_host))
    if parked_for(sc):
        pg, hosts = _PARKED["pg"], _PARKED["hosts"]
        _PARKED.clear()
        try:
            _run(
                [
                    actor.reset.remote(h, sc, placement.clients(h), None, threads, source)
                    for h, actor in enumerate(hosts)
                ],
                timeout=res.host_timeout_s,
            )
            return pg, hosts, placement
        except (ray.exceptions.RayError, TimeoutError):  # one died while parked: new hosts
            _PARKED.update(key=_shape(sc), pg=pg, hosts=hosts)
            if say is not None:
                say(f"raysim: a parked host actor was lost; starting {host_words(sc)} ...")
    _drop_parked()  # another shape, or a parked host lost: their resources freed first
    here = int(driver_hosts(sc))  # host 0 in this process: no actor, no bundle
    if _TRIAL is not None:
        pg, first = _TRIAL
    else:
        pg, first = None, 0
        if res.hosts > here:
            pg = placement_group(host_bundles(sc, res.hosts - here), strategy="SPREAD")
            _wait_placed(sc, pg, say)
    actor = ray.remote(RayHost)
    hosts = [DriverHost(0, sc, placement.clients(0), None, threads, source)] if here else []
    hosts += [
        actor.options(
            num_cpus=res.cpus_per_host,
            num_gpus=res.gpus_per_host,
            max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, first + h - here),
        ).remote(h, sc, placement.clients(h), None, threads, source)
        for h in range(here, res.hosts)
    ]
    return pg, hosts, placement


def host_bundles(sc: Scenario, count: int | None = None) -> list[dict[str, float]]:
    """One placement-group bundle per host actor (``count`` of them; all the scenario's hosts by
    default): its CPU (and GPU) share."""
    res = sc.resources
    bundle = {"CPU": res.cpus_per_host, **({"GPU": res.gpus_per_host} if res.gpus_per_host else {})}
    return [dict(bundle) for _ in range(res.hosts if count is None else count)]


def host_nodes(pg, hosts: list) -> dict[int, str]:
    """Each host's node address: this process's node for host 0 in the driver, else the node
    of its placement-group bundle (host h's bundle: as ``start_hosts`` numbers them)."""
    try:
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        table = ray.util.placement_group_table(pg)["bundles_to_node_id"] if pg is not None else {}
        here = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - a record, never a failure of the run
        return {}
    bundle = _TRIAL[1] if _TRIAL is not None and pg is _TRIAL[0] else 0
    out = {}
    for h, host in enumerate(hosts):
        if isinstance(host, DriverHost):
            out[h] = here
            continue
        out[h] = ips.get(table.get(bundle), "?")
        bundle += 1
    return out


class RayTransport:
    def __init__(self, sc: Scenario, source, started=None, placement: Placement | None = None):
        """Over host actors ``started`` by ``start_hosts`` (started early, so they boot while
        the driver sets up tracking), or started here (with ``placement``, if known)."""
        self.num_hosts = sc.resources.hosts
        self.timeout = sc.resources.host_timeout_s
        self.pg, self.hosts, self.placement = (
            started if started is not None else start_hosts(sc, source, None, placement)
        )
        self.nodes: dict[int, str] = {}
        # started, shards loaded (booting is not hanging: no timeout)
        self._gather([h.prefetch.remote() for h in self.hosts], timeout=None)
        self.nodes = host_nodes(self.pg, self.hosts)

    def _gather(self, refs: list, timeout: float | None | str = "host") -> list:
        """ray.get of one call per host (refs[h] from host h); a host that died or did not
        answer within ``host_timeout_s`` raises HostLost naming it and the cause."""
        timeout = self.timeout if timeout == "host" else timeout
        # the driver's host's call runs now, while the actors work on theirs
        here = {h: ref.run() for h, ref in enumerate(refs) if isinstance(ref, _Call)}
        remote = [ref for ref in refs if not isinstance(ref, _Call)]
        _, late = ray.wait(remote, num_returns=len(remote), timeout=timeout) if remote else ([], [])
        lost = []
        if late:
            for ref in late:
                h = refs.index(ref)
                ray.kill(self.hosts[h])
                lost.append(f"host {h} did not answer within {timeout:g}s (resources.host_timeout_s)")
        out = []
        for h, ref in enumerate(refs):
            if h in here:
                out.append(here[h])
                continue
            if ref in late:
                continue
            try:
                out.append(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as err:
                cause = _cause(err)
                lost.append(f"host {h}{self._on_node(h, 'node left' not in cause)} lost: {cause}")
        if lost:
            raise HostLost("; ".join(lost))
        return out

    def _on_node(self, h: int, ask: bool = True) -> str:
        """' (on node IP)' for host ``h``, with ', now gone from the cluster' when ``ask`` and
        Ray counts no live node at that address any more (Ray's own error may not say so: a
        killed raylet's actors read as processes that died)."""
        ip = self.nodes.get(h)
        if ip is None:
            return ""
        try:
            gone = ask and not any(n["Alive"] for n in ray.nodes() if n["NodeManagerAddress"] == ip)
        except Exception:  # noqa: BLE001 - a report, never a second failure
            gone = False
        return f" (on node {ip}, now gone from the cluster)" if gone else f" (on node {ip})"

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
        return self._gather([h.stats.remote(round_, ref, cids) for h, cids in zip(self.hosts, by_host)])

    def train(
        self,
        round_: int,
        message: Any,
        by_host: list[dict[int, int]],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ):
        shared, parts = self._put(message, by_host)
        return self._gather(
            [
                h.train.remote(round_, shared, p, g, each, {c: work[c] for c in g if c in work} if work else None, clip)
                for h, p, g in zip(self.hosts, parts, by_host)
            ]
        )

    def evaluate(self, round_: int, message: Any, by_host: list[dict[int, int]], unseen: list[int]):
        shared, parts = self._put(message, by_host)
        unseen = set(unseen)
        return self._gather(
            [
                h.evaluate.remote(round_, shared, p, g, [c for c in g if c in unseen])
                for h, p, g in zip(self.hosts, parts, by_host)
            ]
        )

    def gossip_init(self, server: Any) -> dict[int, int]:
        ref = ray.put(to_numpy(server))
        counts: dict[int, int] = {}
        for part in self._gather([h.gossip_init.remote(ref) for h in self.hosts]):
            counts.update(part)
        return counts

    def gossip_train(self, round_: int, by_host: list[list[int]], outboxes: list[dict[int, list[int]]]):
        return self._gather(
            [h.gossip_train.remote(round_, cids, out) for h, cids, out in zip(self.hosts, by_host, outboxes)]
        )

    def gossip_mix(self, plans: list[tuple[list[Any], Any]]):
        # the refs travel inside a list, so Ray does not resolve them here: each host fetches its own
        return self._gather([h.gossip_mix.remote(inbox, rows) for h, (inbox, rows) in zip(self.hosts, plans)])

    def consensus(self, mean):
        ref = ray.put(to_numpy(mean))
        return self._gather([h.consensus.remote(ref) for h in self.hosts])

    def save_clients(self, folder: str, rdir: str, token: str, head: dict) -> list[dict]:
        """Each host writes its own file and returns its entry (file, size, SHA-256, clients);
        a host that does not see the folder (no shared file system) leaves its states in its
        object store and they are written here, one host's at a time."""
        paths = [f"{rdir}/{checkpoint.host_file(h)}" for h in range(self.num_hosts)]
        out = self._gather([h.write_states.remote(folder, p, token, head) for h, p in zip(self.hosts, paths)])
        entries = []
        for path, (entry, ref) in zip(paths, out):
            if ref is not None:
                entry = checkpoint.write_host(path, head, from_numpy(ray.get(ref)))
                del ref
            entries.append(entry)
        return entries

    def load_clients(self, folder: str, doc: dict, token: str) -> None:
        cids = [self.placement.clients(h) for h in range(self.num_hosts)]
        parts = [checkpoint.holding(doc, c) for c in cids]
        done = self._gather([h.read_states.remote(folder, p, token) for h, p in zip(self.hosts, parts)])
        for h, ok, p, c in zip(self.hosts, done, parts, cids):
            if not ok:  # read here for it, one host at a time
                given = ray.put(to_numpy(checkpoint.read_clients(folder, p, c)))
                self._gather([h.read_states.remote(folder, p, token, given)])

    def message_nbytes(self, message: Any, by_host: list[dict[int, int]]) -> int:
        return message_nbytes(message, by_host)

    def shutdown(self) -> None:
        for h in self.hosts:
            _kill(h)
        self.hosts = []
        _release(self.pg)


def check_fits(sc: Scenario) -> None:
    """A local Ray started here cannot grow: asking more than it has is an input error; so is
    asking a cluster for more than its autoscaler may grow it to. Otherwise (the autoscaler's
    limits not known, or within them) raysim waits for placement (``_wait_placed``). A Tune
    trial's hosts are placed already."""
    if _TRIAL is not None:
        return
    res = sc.resources
    total = ray.cluster_resources()
    limits = None
    if not embedded():  # the most an autoscaler may grow the cluster to (None: not known)
        try:
            limits = ray._private.state.state.get_max_resources_from_cluster_config()
        except Exception:  # noqa: BLE001 - a private API; without it, wait for placement
            limits = None
        if limits is None:
            return
    for key, per in (("CPU", res.cpus_per_host), ("GPU", res.gpus_per_host)):
        need = per * res.hosts
        have = max(total.get(key, 0.0), float((limits or {}).get(key, 0)))
        if need > have + 1e-9:
            name = "cpus_per_host" if key == "CPU" else "gpus_per_host"
            where = "the local Ray has" if embedded() else "the cluster can grow to"
            raise ScenarioError(
                f"{sc.path}: resources.{name}: {res.hosts} hosts x {per:g} {key} = "
                f"{need:g} {key}, but {where} {have:g}; lower resources.hosts "
                f"or resources.{name}"
            )


class RayServer:
    """The server: a RoundDriver (or the gossip scheduler) over Ray host actors, run in the
    driver's process, with the methods a RoundDriver has. Built without waiting: the host actors
    boot while the driver goes on (MLflow set-up); ``wait`` blocks until they are up.

    The server runs where the user typed ``raysim`` (it writes the checkpoints there). It used
    to be an actor of its own pinned to that node; it died with the driver all the same, so it
    bought neither locality nor resilience, and cost one more process importing torch (1.5 to
    3 s of a 13 s run on 2 cores)."""

    def __init__(self, sc: Scenario, source=None, say=None):
        """``source``: the scenario's prepared data source (made here when not given); put in
        the object store once, for every host."""
        check_fits(sc)
        self.sc = sc
        self.source = source if source is not None else prepared_source(sc)
        placement = place(sc, source=self.source)
        self._started = start_hosts(sc, ray.put(self.source), say, placement)
        self.driver: Any = None  # the RoundDriver, once the hosts are up (wait)

    def _abandon(self) -> None:
        pg, hosts, _ = self._started
        for h in hosts:
            _kill(h)
        _release(pg)

    def wait(self) -> None:
        """Block until every host is up (its shards loaded); surface their errors."""
        if self.driver is not None:
            return
        try:
            self.driver = make_driver(self.sc, RayTransport(self.sc, self.source, self._started), self.source)
        except BaseException:
            self._abandon()
            raise

    def step(self) -> dict:
        return self.driver.step()

    def host_nodes(self) -> dict[int, str]:
        """Each host's node address (the record of where the run's hosts run)."""
        return dict(self.driver.transport.nodes)

    def recover(self, path: str | None) -> int:
        """After a HostLost: a fresh set of hosts (placed anew: another node if one left), the
        driver rebuilt, and the last checkpoint restored (none yet: round 0)."""
        placement = self.driver.transport.placement
        self.driver.transport.shutdown()
        self.driver = make_driver(self.sc, RayTransport(self.sc, self.source, placement=placement), self.source)
        return self.driver.restore(path) if path else 0

    def save(self, path: str, extra: dict | None = None) -> None:
        self.driver.save(path, extra)

    def restore(self, path: str) -> int:
        return self.driver.restore(path)

    @property
    def history(self) -> list[dict]:
        return self.driver.history

    def report(self) -> dict:
        return self.driver.report()

    def close(self, keep: bool = False) -> None:
        """Stop the hosts; ``keep`` (a run that finished, within ``reuse_hosts``): leave them up
        for the next run."""
        if self.driver is None:  # never came up: nothing to shut down cleanly
            self._abandon()
            return
        transport = self.driver.transport
        if keep and _PARKED is not None and _TRIAL is None and transport.hosts:
            _drop_parked()
            _PARKED.update(key=_shape(self.sc), pg=transport.pg, hosts=transport.hosts)
            transport.hosts = []
            return
        transport.shutdown()
