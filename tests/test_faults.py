"""Faults injected into Ray runs (a host SIGKILLed mid-training, mid-evaluation, mid-gossip; a
hung host): the run goes on and ends with the metrics of an undisturbed run."""

import json
import re

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import TINY
from tests.test_gossip import DFEDEM, DSGD, strip
from tests.test_runs import raysim, summary_of, tracked

pytestmark = pytest.mark.ray

LOCAL = TINY.replace("rounds: 3", "rounds: 5").replace("fedavg", "local")  # stateful clients


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The undisturbed serial run of LOCAL (checkpoint frequency does not change results)."""
    tmp = tmp_path_factory.mktemp("reference")
    return summary_of(tmp, tracked(tmp, LOCAL, every=0), "--engine", "serial")


def kill(tmp_path, spec):
    return {"RAYSIM_KILL_HOST": f"{spec}:{tmp_path}/killed"}


def same_run(a, b):
    assert a["final"] == b["final"]
    keys = ("train_loss", "accuracy", "consensus_distance")
    assert [{k: h.get(k) for k in keys} for h in a["history"]] == [{k: h.get(k) for k in keys} for h in b["history"]]


def test_host_killed_mid_training_is_replaced_and_the_run_ends_identical(tmp_path, reference):
    path = tracked(tmp_path, LOCAL, every=2)
    serial = reference
    out = tmp_path / "ray.json"
    proc = raysim(
        "run", path, "-q", "--set", "resources.hosts=3", "--summary", str(out), env=kill(tmp_path, "kill:train:3:1")
    )
    assert (tmp_path / "killed").exists()  # the fault happened
    assert re.search(r"raysim: host 1 \(on node [\d.]+\) lost: its process died \(pid ", proc.stderr), proc.stderr
    assert (
        "or crashed; new hosts started; going on from the checkpoint of round 2 (rounds 3..4 are redone)" in proc.stderr
    )
    ray_run = json.loads(out.read_text())
    same_run(ray_run, serial)
    assert MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(ray_run["mlflow_run_id"]).info.status == "FINISHED"


def test_host_killed_mid_evaluation_before_any_checkpoint_restarts_from_round_one(tmp_path, reference):
    path = tracked(tmp_path, LOCAL, every=0)
    serial = reference
    ray_run = summary_of(tmp_path, path, env=kill(tmp_path, "kill:evaluate:2:1"), name="ray.json")
    assert (tmp_path / "killed").exists()
    same_run(ray_run, serial)


@pytest.mark.parametrize("text", [pytest.param(DFEDEM, marks=pytest.mark.slow), DSGD], ids=["dfedem", "dsgd-rows"])
def test_host_killed_during_the_gossip_exchange_gives_the_same_decentralized_run(tmp_path, text):
    """Gossip over 3 Ray hosts, one killed mid-exchange: every per-round metric (timings and
    message counts aside) equals the serial engine's, so this is also the test that gossip across
    Ray hosts matches the serial engine: per client (D-FedEM) and with hosts holding their
    clients as rows (D-SGD: rows travel between hosts as one array a host)."""
    path = tracked(tmp_path, text, every=1)
    serial = summary_of(tmp_path, path, "--engine", "serial", name="serial.json")
    ray_run = summary_of(
        tmp_path, path, "--set", "resources.hosts=3", env=kill(tmp_path, "kill:gossip_mix:2:1"), name="ray.json"
    )
    assert (tmp_path / "killed").exists()
    same_run(ray_run, serial)
    assert strip(ray_run["history"]) == strip(serial["history"])


def test_a_hung_host_times_out_and_is_replaced(tmp_path, reference):
    path = tracked(tmp_path, LOCAL, every=1)
    serial = reference
    ray_run = summary_of(
        tmp_path, path, "--set", "resources.host_timeout_s=10", env=kill(tmp_path, "hang:train:1:1"), name="ray.json"
    )
    assert (tmp_path / "killed").exists()
    same_run(ray_run, serial)


def test_beyond_max_host_losses_the_run_fails_with_the_cause_and_the_resume_command(tmp_path):
    path = tracked(tmp_path, LOCAL, every=1)
    proc = raysim(
        "run", path, "-q", "--set", "resources.max_host_losses=0", env=kill(tmp_path, "kill:train:2:1"), check=False
    )
    assert proc.returncode == 1
    assert re.search(
        r"raysim: run failed: HostLost: host 1 \(on node [\d.]+\) lost: its process died \(pid ", proc.stderr
    )
    assert "or crashed (host loss 1, beyond resources.max_host_losses = 0)" in proc.stderr
    assert "Traceback" not in proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    rid = run.info.run_id
    assert run.info.status == "FAILED"
    assert "its last checkpoint, round 2," in proc.stderr
    assert f"continue it with: raysim run {path} --set resources.max_host_losses=0 --resume {rid}" in proc.stderr


def test_driver_killed_is_marked_killed_by_its_helper_and_resumes_identical_on_other_hosts(tmp_path, reference):
    """The driver SIGKILLed (as the OOM killer does, or Ray when its node's raylet stops under
    it): its tracking helper process outlives it, writes the logged rounds, marks the run
    KILLED and prints the way to resume it; the resumed run is the serial engine's."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    path = tracked(tmp_path, LOCAL, every=1)
    serial = reference
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", str(path), "-q"],
        cwd=ROOT,
        text=True,
        env={**os.environ, "RAYSIM_PAUSE_AFTER_ROUND": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 300
    rid = None
    while time.time() < deadline and proc.poll() is None and rid is None:  # round 2 checkpointed
        time.sleep(0.5)
        for f in (tmp_path / "ck").glob("*/manifest.json") if (tmp_path / "ck").exists() else []:
            if __import__("json").loads(f.read_text())["round"] == 2:
                rid = f.parent.name  # checkpoints/<MLflow run id>/
    assert rid is not None, "the Ray run never checkpointed round 2"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    os.kill(proc.pid, signal.SIGKILL)  # the driver: no chance to mark its run
    err = proc.communicate(timeout=60)[1]  # ends when the helper, which shares stderr, has
    assert client.get_run(rid).info.status == "KILLED"
    assert client.get_run(rid).data.tags["raysim.failure"].startswith("its process ended without finishing it")
    assert f"raysim: MLflow run {rid} marked KILLED; its checkpoints are in {tmp_path / 'ck' / rid}" in err
    assert f"raysim: continue it with: raysim run {path} --resume {rid}" in err
    assert [m.step for m in client.get_metric_history(rid, "train_loss")][:2] == [1, 2]
    # resumed on 3 hosts instead of 2: only what changes results must match
    out = summary_of(tmp_path, path, "--set", "resources.hosts=3", "--resume", rid, name="resumed.json")
    same_run(out, serial)
    assert client.get_run(rid).info.status == "FINISHED"


def test_every_host_an_actor_gives_the_same_run_as_host_zero_in_the_driver(tmp_path, reference):
    """``resources.driver_host``: on a local Ray host 0 runs in the driver's process by default
    (every other Ray test runs so); ``false`` makes every host an actor, and the run is the
    serial engine's all the same."""
    path = tracked(tmp_path, LOCAL, every=2)
    out = tmp_path / "actors.json"
    said = raysim(
        "run", path, "-q", "--set", "resources.hosts=3", "--set", "resources.driver_host=false", "--summary", str(out)
    ).stderr
    same_run(json.loads(out.read_text()), reference)
    assert "raysim: starting 3 host actors ...\n" in said
