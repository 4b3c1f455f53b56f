"""A pooled dataset is partitioned once, in the driver: the serial engine's hosts share that
source, and Ray's host actors receive it (its index arrays) from the object store."""

import dataclasses

import pytest

from raysim.data import PARTITIONERS
from raysim.engine.driver import prepared_source
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import write_scenario
from tests.test_runs import DIGITS


def digits(tmp_path):
    return config.load(write_scenario(tmp_path, DIGITS), ["rounds=1"])


def test_serial_engine_partitions_once_for_the_driver_and_every_host(tmp_path, monkeypatch):
    sc = digits(tmp_path)
    calls = []
    spec = PARTITIONERS["dirichlet"]
    monkeypatch.setitem(
        PARTITIONERS, "dirichlet", dataclasses.replace(spec, fn=lambda *a: (calls.append(1), spec.fn(*a))[1])
    )
    d = serial_driver(sc, 3)
    d.step()
    assert len(calls) == 1
    assert all(h.source is d.source for h in d.transport.hosts)
    sizes = {c: n for h in d.transport.hosts for c, n in h.num_samples().items()}
    assert sum(sizes.values()) == 1797 and sorted(sizes) == list(range(30))


@pytest.mark.ray
def test_ray_hosts_use_the_drivers_partition(tmp_path):
    import ray

    from raysim.engine import ray_engine, ray_start

    sc = digits(tmp_path)
    # every host an actor: what is tested is what crosses to their processes
    sc = dataclasses.replace(sc, resources=dataclasses.replace(sc.resources, driver_host=False))
    source = prepared_source(sc)
    own = [len(p) for p in source._parts]
    # a partition the hosts could not compute themselves: the clients' index arrays reversed
    source._parts = source._parts[::-1]
    assert own != own[::-1]
    ray_start.init(None)
    try:
        pg, hosts, placement = ray_engine.start_hosts(sc, source)
        got = {}
        for part in ray.get([h.num_samples.remote() for h in hosts]):
            got.update(part)
        assert [got[c] for c in range(30)] == own[::-1]
        # the placement balanced the driver's sizes: each host within the largest client of the mean
        loads = [sum(got[c] for c in placement.clients(h)) for h in range(2)]
        assert abs(loads[0] - loads[1]) <= max(own)
        for h in hosts:
            ray.kill(h)
        ray.util.remove_placement_group(pg)
    finally:
        ray_start.shutdown()


@pytest.mark.ray
def test_parked_hosts_are_reset_for_the_next_run_and_a_dead_one_gives_new_hosts(tmp_path):
    """``reuse_hosts``: the second run of the same shape takes the first run's host actors (same
    actors, re-initialised: its own clients' data), a third, after one parked host was killed,
    starts new ones; the three runs' metrics are equal (the same scenario and seed). Host 0 runs
    in the driver's process (``resources.driver_host``), so the actors are hosts 1 on."""
    import ray

    from raysim.engine import ray_engine, ray_start
    from raysim.experiment.runner import run

    sc = config.load(
        write_scenario(tmp_path, DIGITS),
        ["rounds=1", f"tracking.uri=sqlite:///{tmp_path}/m.db", f"checkpoint.dir={tmp_path}/ck"],
    )
    ray_start.init(None)
    try:
        with ray_engine.reuse_hosts():
            first = run(sc, progress=False)
            here, *actors = ray_engine._PARKED["hosts"]
            assert isinstance(here, ray_engine.DriverHost) and actors
            parked = [h._actor_id for h in actors]
            second = run(sc, progress=False)
            assert [h._actor_id for h in ray_engine._PARKED["hosts"][1:]] == parked
            ray.kill(ray_engine._PARKED["hosts"][-1])
            third = run(sc, progress=False)
            fresh = [h._actor_id for h in ray_engine._PARKED["hosts"][1:]]
            assert fresh and not set(fresh) & set(parked)
        assert ray_engine._PARKED is None
        assert first["final"] == second["final"] == third["final"]
        assert [h["train_loss"] for h in first["history"]] == [h["train_loss"] for h in third["history"]]
    finally:
        ray_start.shutdown()
