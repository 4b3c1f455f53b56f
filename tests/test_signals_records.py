"""SIGTERM, records that never lose or repeat a round, resume rules, and the checks made before
Ray or training starts (tracking store reachable, output paths writable)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, TINY
from tests.test_runs import DIGITS, mlflow_run, raysim, summary_of, tracked

LONG = DIGITS.replace("rounds: 20", "rounds: 400").replace("eval: {every: 10}", "eval: {every: 400}")


def _start(path, *extra, group=False):
    """``raysim run path``; ``group``: in a process group of its own (as ``timeout`` or a job
    runner starts it), which ``_terminate`` then signals whole."""
    return subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", path, "-q", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )


def _wait_for_checkpoint(ck_root, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline and not list(ck_root.glob("*/manifest.json")):
        time.sleep(0.2)
    assert list(ck_root.glob("*/manifest.json")), "no checkpoint was written"


def _terminate(tmp_path, proc, times=1, pause=0.5, group=False):
    """SIGTERM ``times`` to a run once it has a checkpoint (``group``: to its whole process
    group); (its run id, its standard error) after it has exited 143 with its MLflow run KILLED."""
    _wait_for_checkpoint(tmp_path / "ck")
    for _ in range(times):
        time.sleep(pause)
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    run_id = next((tmp_path / "ck").iterdir()).name
    assert mlflow_run(tmp_path, run_id).info.status == "KILLED"
    return run_id, err


def _steps(tmp_path, run_id, key="train_loss"):
    return sorted(m.step for m in MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(run_id, key))


@pytest.mark.ray
@pytest.mark.parametrize("group", [False, True], ids=["driver", "process-group"])
def test_sigterm_finishes_the_round_checkpoints_marks_killed_and_exits_143(tmp_path, group):
    """SIGTERM to the driver of a Ray run, or to its whole process group (``timeout``, a job
    runner; the local Ray's processes are in sessions of their own, so only the driver gets
    it): the round in progress is finished and checkpointed, its metrics are in the store, the
    run is KILLED, the resume command is printed, exit 143; the resumed run then logs every
    round exactly once."""
    path = tracked(tmp_path, LONG.replace("rounds: 400", "rounds: 300").replace("every: 400", "every: 300"))
    run_id, err = _terminate(tmp_path, _start(path, group=group), group=group)
    assert "terminated (SIGTERM): stopping after this round" in err
    assert f"continue it with: raysim run {path} --resume {run_id}" in err
    assert err.strip().splitlines()[-1] == "raysim: terminated (SIGTERM)"
    from raysim.engine import checkpoint

    saved = checkpoint.manifest(tmp_path / "ck" / run_id)["round"]
    assert 0 < saved < 300 and _steps(tmp_path, run_id) == list(range(1, saved + 1))
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", run_id, name="r.json")
    assert resumed["mlflow_run_id"] == run_id and len(resumed["history"]) == 300
    assert _steps(tmp_path, run_id) == list(range(1, 301))


def test_a_second_sigterm_stops_at_once_and_the_last_checkpoint_resumes(tmp_path):
    path = tracked(tmp_path, LONG)
    run_id, _ = _terminate(tmp_path, _start(path, "--engine", "serial"), times=2, pause=0.05)
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", run_id, name="r.json")
    assert len(resumed["history"]) == 400 and _steps(tmp_path, run_id) == list(range(1, 401))


KILL_AFTER_COMMIT = """
import json, os, signal, sys
from raysim.engine import checkpoint
from raysim import cli
commit = checkpoint.commit
def commit_then_die(folder, *args, **kwargs):
    commit(folder, *args, **kwargs)
    if json.loads((checkpoint.Path(folder) / checkpoint.MANIFEST).read_text())["round"] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)     # the driver dies the instant the checkpoint is in
checkpoint.commit = commit_then_die
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_driver_killed_right_after_a_checkpoint_loses_no_round_and_repeats_none(tmp_path):
    """Killed the moment round 3's checkpoint is committed: round 3's metrics are already in
    the store; the resumed run adds rounds 4..6, each exactly once."""
    path = tracked(tmp_path, TINY.replace("rounds: 3", "rounds: 6"), every=3)
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_COMMIT, "3", "run", path, "-q", "--engine", "serial"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run_id = next((tmp_path / "ck").iterdir()).name
    assert _steps(tmp_path, run_id) == [1, 2, 3]
    # its tracking helper outlived it: the run KILLED, its checkpoint folder named
    assert MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id).info.status == "KILLED"
    assert (
        f"raysim: MLflow run {run_id} marked KILLED; its checkpoints are in {tmp_path / 'ck' / run_id}" in proc.stderr
    )
    assert f"raysim: continue it with: raysim run {path} --engine serial --resume {run_id}" in proc.stderr
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", run_id)
    assert resumed["mlflow_run_id"] == run_id
    for key in ("train_loss", "accuracy"):
        assert _steps(tmp_path, run_id, key) == [1, 2, 3, 4, 5, 6]


def test_resuming_a_finished_run_is_refused_and_changes_nothing(tmp_path):
    path = tracked(tmp_path, TINY)
    done = summary_of(tmp_path, path, "--engine", "serial")
    run_id = done["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    before = client.download_artifacts(run_id, "summary.json", str(tmp_path / "before"))
    proc = raysim("run", path, "-q", "--engine", "serial", "--resume", run_id, check=False, here=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"raysim: --resume {run_id}: the run is FINISHED, nothing to continue (its record is left as it is); "
        "start a new run without --resume"
    ]
    run = mlflow_run(tmp_path, run_id)
    assert run.info.status == "FINISHED"
    after = client.download_artifacts(run_id, "summary.json", str(tmp_path / "after"))
    assert json.loads(open(after).read()) == json.loads(open(before).read())
    assert _steps(tmp_path, run_id) == [1, 2, 3]


def test_an_empty_resume_id_is_an_input_error(tmp_path):
    path = tracked(tmp_path, TINY)
    proc = raysim("run", path, "--engine", "serial", "--resume", "", check=False, here=True)
    assert proc.returncode == 2
    assert "--resume: an empty run id" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_unreachable_tracking_server_fails_in_seconds_before_ray_starts(tmp_path, kind):
    """A tracking server that refuses connections, or accepts and never answers: one line,
    exit 2, within the store timeout, and Ray is never started."""
    silent = None
    if kind == "refused":
        port = _closed_port()
    else:
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # never accepted, never answered
        port = silent.getsockname()[1]
    path = tracked(tmp_path, TINY)
    t0 = time.time()
    try:
        proc = raysim("run", path, "-q", "--set", f"tracking.uri=http://127.0.0.1:{port}", check=False)
    finally:
        if silent is not None:
            silent.close()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"tracking.uri: http://127.0.0.1:{port}: the tracking server did not answer" in lines[0]
    assert "Ray" not in proc.stderr
    assert time.time() - t0 < 20


def test_unwritable_summary_and_checkpoint_paths_are_refused_before_the_run(tmp_path):
    path = tracked(tmp_path, TINY)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = raysim("run", path, "-q", "--engine", "serial", "--summary", str(blocker / "s.json"), check=False, here=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        f"raysim: --summary: cannot write to {blocker}"
    )
    proc = raysim(
        "run", path, "-q", "--engine", "serial", "--set", f"checkpoint.dir={blocker}/ck", check=False, here=True
    )
    assert proc.returncode == 2 and f"checkpoint.dir: cannot write to {blocker}/ck" in proc.stderr
    proc = raysim("run", path, "-q", "--engine", "serial", "--summary", str(tmp_path), check=False, here=True)
    assert proc.returncode == 2 and "--summary: " in proc.stderr and "is a folder" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no run was created
