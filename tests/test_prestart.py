"""Ray boots the workers of a run's host actors as it starts (``preflight.host_actors``,
``ray_start.init(prestart=...)``), and the rule of which host runs in the driver's process is
one (``ResourcesCfg.host_in_driver``)."""

from __future__ import annotations

import pytest

from raysim.experiment.preflight import check_run, host_actors
from raysim.scenario.sections import ResourcesCfg


@pytest.mark.parametrize(
    "want, local, gpus, trial, expected",
    [
        ("auto", True, 0.0, False, True),  # a local Ray on CPUs: host 0 in the driver
        ("auto", False, 0.0, False, False),  # a cluster: every host an actor
        ("auto", True, 0.5, False, False),  # GPU hosts: every host an actor
        (True, False, 0.0, False, True),  # asked for, on a cluster too
        (False, True, 0.0, False, False),
        (True, True, 0.0, True, False),  # a Tune trial's hosts are all actors
    ],
)
def test_the_driver_host_rule(want, local, gpus, trial, expected):
    assert ResourcesCfg.host_in_driver(want, local, gpus, trial) is expected


@pytest.mark.parametrize(
    "resources, expected",
    [
        (None, 1),  # the default: 2 hosts, host 0 in the driver
        ({"hosts": 2}, 1),
        ({"hosts": 1}, 0),  # the driver's host only
        ({"hosts": 2, "driver_host": False}, 2),
        ({"hosts": 2, "gpus_per_host": 0.5}, 2),
        ({"hosts": 9, "cpus_per_host": 0.2}, 4),  # at most one a CPU (4 here)
        ({"hosts": "two"}, 0),  # refused later by the validation: none booted
        ({"hosts": 2, "driver_host": "maybe"}, 0),
    ],
)
def test_host_actors_counts_the_actors_a_local_run_starts(monkeypatch, resources, expected):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    raw = {"rounds": 1} if resources is None else {"rounds": 1, "resources": resources}
    assert host_actors(raw) == expected


def test_a_sweep_boots_no_worker_ahead():
    assert host_actors({"resources": {"hosts": 3}, "sweep": {"algorithm.lr": [0.1, 0.01]}}) == 0
    assert host_actors({"resources": {"hosts": 3}, "grid": {"algorithm.lr": [0.1, 0.01]}}) == 0


def test_check_run_gives_the_count_after_the_set_options(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nresources: {hosts: 2}\n")
    assert check_run(str(path), [], None) == 1
    assert check_run(str(path), ["resources.hosts=5"], None) == 4
    assert check_run(str(path), ["resources.hosts=5", "resources.driver_host=false"], None) == 5
