"""End to end through the CLI: learning, MLflow records, failures, interruption and --resume."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, TINY, write_scenario

DIGITS = """
name: digits
seed: 0
rounds: 20
data:
  dataset: digits
  clients: 30
  partition: {kind: dirichlet, alpha: 0.5}
model: {name: linear}
algorithm: {name: fedavg, lr: 0.1, batch_size: 16}
sampling: {fraction: 1.0}
eval: {every: 10}
resources: {hosts: 2}
"""

DIVERGING = """
name: diverge
seed: 0
rounds: 20
data:
  dataset: regression_mixture
  clients: 8
  partition: {kind: mixture, scheme: "10:90", sources: 2, min_size: 30, max_size: 40, holdout: 100}
model: {name: linear, bias: false}
algorithm: {name: fedavg, lr: 5.0, batch_size: 10}
eval: {every: 1}
resources: {hosts: 2, cpus_per_host: 0.5}
"""


def raysim(*args, env=None, check=True, here=False):
    """``raysim ARGS`` as a command in a process of its own; ``here``: through the command's
    ``main`` in this process (``in_process``), its output captured the same way, sparing the
    3 s a new process spends importing torch and MLflow (serial runs and store commands)."""
    if here:
        proc = in_process(*args, env=env, expect=None)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "raysim.cli", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            timeout=300,
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def tracked(tmp_path, text, every=1):
    return write_scenario(
        tmp_path,
        text + f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\n"
        f"checkpoint: {{every: {every}, dir: '{tmp_path}/ck'}}\n",
    )


def summary_of(tmp_path, path, *extra, name="summary.json", env=None):
    """The summary of ``raysim run PATH -q --summary OUT *extra``. A serial run with no extra
    environment runs in this process (the command's ``main``), sparing the 3 s a new process
    spends importing torch and MLflow; the rest run as the command in a process of their own."""
    out = tmp_path / name
    if env is None and "--engine" in extra and extra[extra.index("--engine") + 1] == "serial":
        in_process("run", path, "-q", "--summary", str(out), *extra)
    else:
        raysim("run", path, "-q", "--summary", str(out), *extra, env=env)
    return json.loads(out.read_text())


def in_process(*args, env=None, expect=0):
    """``raysim ARGS`` through the command's ``main`` in this process, with ``env`` added to the
    environment meanwhile; its exit code (which must be ``expect`` unless None), standard
    output and error as a CompletedProcess. What the command changes in the process (the
    SIGTERM handler, MLflow's exported tracking URI) is put back."""
    import contextlib
    import io

    from raysim.cli import main

    keys = ["MLFLOW_TRACKING_URI", *(env or {})]
    before = signal.getsignal(signal.SIGTERM), {k: os.environ.get(k) for k in keys}
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's refusals
                code = e.code
    finally:
        signal.signal(signal.SIGTERM, before[0])
        for k, v in before[1].items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert expect is None or code == expect, f"raysim {' '.join(args)}: exit {code}\n{err.getvalue()}"
    return subprocess.CompletedProcess(["raysim", *args], code, out.getvalue(), err.getvalue())


def mlflow_run(tmp_path, run_id):
    return MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id)


def test_fedavg_learns_real_digits_and_beats_local(tmp_path):
    path = tracked(tmp_path, DIGITS)
    fedavg = summary_of(tmp_path, path, "--engine", "serial", name="a.json")
    local = summary_of(tmp_path, path, "--engine", "serial", "--set", "algorithm.name=local", name="b.json")
    assert fedavg["final"]["accuracy"] > 0.8  # chance is 0.1
    assert fedavg["final"]["accuracy"] > local["final"]["accuracy"] + 0.05
    assert 0 < fedavg["final"]["bottom_decile_accuracy"] < fedavg["final"]["accuracy"]
    assert "global_accuracy" in fedavg["final"] and "global_accuracy" not in local["final"]


def test_mlflow_records_params_metrics_artifacts(tmp_path):
    path = tracked(tmp_path, TINY)
    s = summary_of(tmp_path, path, "--engine", "serial")
    assert {"scenario", "rounds", "wall_seconds", "mlflow_run_id", "final"} <= set(s)
    assert {"accuracy", "bottom_decile_accuracy", "global_accuracy"} <= set(s["final"])
    run = mlflow_run(tmp_path, s["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "fedavg" and run.data.params["data.clients"] == "12"
    assert run.data.tags["algorithm"] == "fedavg" and run.data.tags["dataset"] == "synthetic"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    acc = client.get_metric_history(s["mlflow_run_id"], "accuracy")
    assert [m.step for m in acc] == [1, 2, 3]
    assert acc[-1].value == pytest.approx(s["final"]["accuracy"])
    assert len(client.get_metric_history(s["mlflow_run_id"], "round_seconds")) == 3
    arts = {a.path for a in client.list_artifacts(s["mlflow_run_id"])}
    arts |= {a.path for a in client.list_artifacts(s["mlflow_run_id"], "scenario")}
    assert {"summary.json", "scenario/s.yaml", "scenario/resolved.json"} <= arts


def test_crash_marks_failed_keeps_checkpoint_and_resume_is_identical(tmp_path):
    path = tracked(tmp_path, TINY.replace("rounds: 3", "rounds: 5").replace("fedavg", "local"))
    full = summary_of(tmp_path, path, "--engine", "serial", name="full.json")
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1
    assert "injected failure after round 2" in proc.stderr and "Traceback" not in proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name("raysim").experiment_id], filter_string="attributes.status = 'FAILED'"
    )
    assert len(runs) == 1
    failed_id = runs[0].info.run_id
    assert (tmp_path / "ck" / failed_id / "manifest.json").exists()
    assert f"MLflow run {failed_id} marked FAILED; its last checkpoint, round 2," in proc.stderr
    assert f"continue it with: raysim run {path} --engine serial --resume {failed_id}" in proc.stderr
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", failed_id, name="resumed.json")
    assert resumed["mlflow_run_id"] == failed_id
    assert resumed["final"] == full["final"]
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in full["history"]]
    assert mlflow_run(tmp_path, failed_id).info.status == "FINISHED"


def test_resume_refuses_unknown_run_and_changed_scenario(tmp_path):
    path = tracked(tmp_path, TINY)
    # refused before any engine starts (test_cluster: a refused command leaves no Ray behind)
    proc = raysim("run", path, "--engine", "serial", "--resume", "0123abc", check=False, here=True)
    assert proc.returncode == 2 and "--resume 0123abc: no such MLflow run" in proc.stderr
    s = summary_of(tmp_path, path, "--engine", "serial")
    MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").update_run(s["mlflow_run_id"], status="FAILED")
    proc = raysim(
        "run",
        path,
        "--engine",
        "serial",
        "--resume",
        s["mlflow_run_id"],
        "--set",
        "algorithm.lr=0.5",
        check=False,
        here=True,
    )
    assert proc.returncode == 2 and "differs" in proc.stderr
    import shutil  # a failed run whose checkpoint is gone: refused, not silently redone

    shutil.rmtree(tmp_path / "ck" / s["mlflow_run_id"])
    proc = raysim("run", path, "--engine", "serial", "--resume", s["mlflow_run_id"], check=False, here=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"raysim: {path}: checkpoint.dir: no checkpoint for run {s['mlflow_run_id']} at {tmp_path}/ck/"
        f"{s['mlflow_run_id']}, where it wrote its checkpoints to {tmp_path}/ck/{s['mlflow_run_id']}; resume "
        "with the checkpoint.dir that holds them"
    )


def test_a_run_that_failed_before_its_first_checkpoint_resumes_from_round_1_in_the_same_run(tmp_path):
    """checkpoint.every 0 (only at the end) and a failure after round 2: the run says it has no
    checkpoint yet and prints a --resume command, which starts it again from round 1 in the
    same MLflow run; rounds 1 and 2, already logged, are not logged twice, and the run ends with
    the numbers of an undisturbed run."""
    path = tracked(tmp_path, TINY.replace("rounds: 3", "rounds: 5").replace("fedavg", "local"), every=0)
    full = summary_of(tmp_path, path, "--engine", "serial", name="full.json")
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1, proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (failed,) = client.search_runs(
        [client.get_experiment_by_name("raysim").experiment_id], filter_string="attributes.status = 'FAILED'"
    )
    run_id = failed.info.run_id
    assert not (tmp_path / "ck" / run_id).exists() and "raysim.checkpoint" not in failed.data.tags
    assert (
        f"MLflow run {run_id} marked FAILED; no checkpoint yet: resumed, it starts again from round 1 in "
        "the same MLflow run"
    ) in proc.stderr
    command = f"raysim run {path} --engine serial --resume {run_id}"
    assert f"continue it with: {command}" in proc.stderr
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [1, 2]
    changed = raysim(
        "run", path, "--engine", "serial", "--set", "algorithm.lr=0.5", "--resume", run_id, check=False, here=True
    )
    assert changed.returncode == 2 and "the scenario differs from the one run" in changed.stderr
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", run_id, name="resumed.json")
    assert resumed["mlflow_run_id"] == run_id and resumed["final"] == full["final"]
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in full["history"]]
    logged = client.get_metric_history(run_id, "train_loss")
    assert [m.step for m in logged] == [1, 2, 3, 4, 5]  # each round once
    assert [m.value for m in logged] == pytest.approx([h["train_loss"] for h in full["history"]])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["raysim.checkpoint"] == str(tmp_path / "ck" / run_id)


def test_interrupt_marks_killed_and_resumes(tmp_path):
    text = DIGITS.replace("rounds: 20", "rounds: 400").replace("eval: {every: 10}", "eval: {every: 400}")
    path = tracked(tmp_path, text, every=1)
    # a shell's background job starts with SIGINT ignored (and Python keeps it so): restore it
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", path, "-q", "--engine", "serial"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,
    )
    ck_root = tmp_path / "ck"
    deadline = time.time() + 120
    while time.time() < deadline and not list(ck_root.glob("*/manifest.json")):
        time.sleep(0.2)
    time.sleep(0.5)
    # Ctrl-C: SIGINT to the whole process group, the MLflow helper process included
    # (tracker_process), which leaves the ending to the run
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run_id = next(ck_root.iterdir()).name
    assert mlflow_run(tmp_path, run_id).info.status == "KILLED"
    assert "stopping after this round" in err
    # the round in progress finished and was checkpointed: nothing is lost
    from raysim.engine import checkpoint

    saved = checkpoint.manifest(ck_root / run_id)["round"]
    logged = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(run_id, "train_loss")
    assert 0 < saved < 400 and saved == max(m.step for m in logged)


def test_a_serial_run_without_mlflow_imported_tracks_through_a_helper_process_and_records_the_same_run(tmp_path):
    """A serial run in a process that has not imported MLflow (the ``raysim run`` command) leaves
    MLflow to a helper process (raysim/results/tracker_process.py): MLflow is never imported in the run's
    process, and the MLflow record is the one a run tracking in a thread (this process, which has
    MLflow) makes: status, parameters, every round's metrics, artifacts, the driver's pid."""
    path = tracked(tmp_path, TINY.replace("fedavg", "local"))
    code = (
        "import json, os, sys; from raysim.scenario import config; from raysim.experiment import runner; "
        "s = runner.run(config.load(sys.argv[1]), engine='serial', progress=False); "
        "print(json.dumps({'mlflow': 'mlflow' in sys.modules, 'id': s['mlflow_run_id'], 'pid': os.getpid()}))"
    )
    out = subprocess.run([sys.executable, "-c", code, path], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    helper = json.loads(out.stdout.strip().splitlines()[-1])
    assert helper["mlflow"] is False
    from raysim.experiment.runner import run as run_here
    from raysim.scenario import config

    assert "mlflow" in sys.modules
    threaded = run_here(config.load(path), engine="serial", progress=False)["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    a, b = client.get_run(helper["id"]), client.get_run(threaded)
    assert a.info.status == b.info.status == "FINISHED"
    assert a.data.params == b.data.params and set(a.data.metrics) == set(b.data.metrics)
    for key in a.data.metrics:
        if "seconds" not in key:
            assert [(m.step, m.value) for m in client.get_metric_history(a.info.run_id, key)] == [
                (m.step, m.value) for m in client.get_metric_history(b.info.run_id, key)
            ], key
    arts = lambda rid: sorted(f.path for d in ("", "scenario") for f in client.list_artifacts(rid, d))  # noqa: E731
    assert arts(a.info.run_id) == arts(b.info.run_id) and "summary.json" in arts(a.info.run_id)
    assert a.data.tags["raysim.driver"].endswith(f":{helper['pid']}")
    assert b.data.tags["raysim.driver"].endswith(f":{os.getpid()}")


def test_the_tracking_helper_imports_mlflow_without_pandas_and_loads_it_when_a_call_needs_it():
    """The helper imports MLflow with pandas read as absent (``tracker_process.DEFERRED``: MLflow
    binds it at its top level only for its dataset and evaluation modules), then lets it be
    imported again: a call of MLflow's that imports it inside (the JSON encoder, which does so
    for any value) loads it then, and works. The record a helper makes is checked against a
    thread's in the test above."""
    code = (
        "import json, sys, numpy; from raysim.results import tracker_process as t; t.import_tracking(); "
        "from mlflow.utils.proto_json_utils import NumpyEncoder; "
        "before = {m: m in sys.modules for m in ('mlflow', 'raysim.results.tracking', 'pandas')}; "
        "print(json.dumps([before, NumpyEncoder().default(numpy.float32(1.5)), "
        "'pandas' in sys.modules, sum(isinstance(f, t._Deferred) for f in sys.meta_path)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, value, after, finders = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == {"mlflow": True, "raysim.results.tracking": True, "pandas": False}
    assert value == 1.5 and after is True and finders == 0


def test_the_tracking_helper_runs_ten_steps_nicer_than_the_run_and_leaves_when_its_pipe_closes():
    """The helper yields the cores to the run's own processes while both start (its niceness is
    the run's plus 10: ``tracker_process.NICE``), and ends when the run's end of the pipe closes."""
    import psutil

    from raysim.results import tracker_process

    assert tracker_process.NICE == 10
    want = min(19, os.nice(0) + 10)  # Linux's niceness stops at 19
    conn, proc = tracker_process._start_helper()
    try:
        end, nice = time.time() + 30, None
        while time.time() < end and nice != want:
            nice = psutil.Process(proc.pid).nice()
            time.sleep(0.01)
        assert nice == want
    finally:
        conn.close()
    assert proc.wait(timeout=60) == 0


def test_an_error_that_does_not_unpickle_reaches_the_run_as_its_text():
    """MLflow's UnsupportedModelRegistryStoreURIException pickles but does not unpickle (its
    ``__init__`` takes two arguments): sent as it is, the run got a TypeError instead of it."""
    from multiprocessing import Pipe

    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    from raysim.results import tracker_process

    here, there = Pipe()
    tracker_process._send(there, "error", UnsupportedModelRegistryStoreURIException("nosuch://x", ["file"]), "said")
    kind, value, said = here.recv()
    assert (kind, type(value), said) == ("error", RuntimeError, "said")
    assert str(value).startswith(
        "UnsupportedModelRegistryStoreURIException:  Model registry functionality is "
        "unavailable; got unsupported URI 'nosuch://x'"
    )


def test_a_run_the_tracking_helper_cannot_create_fails_with_the_stores_error_and_no_resume_command(tmp_path):
    """The helper creates a new run while the rounds start; a store that refuses it (here: the
    experiment deleted) stops the run at the next round with the store's error in one line, exit
    1, and no resume command (there is no run to resume)."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    client.delete_experiment(client.create_experiment("raysim"))
    path = tracked(
        tmp_path, DIGITS.replace("rounds: 20", "rounds: 400").replace("eval: {every: 10}", "eval: {every: 400}")
    )
    proc = raysim("run", path, "--engine", "serial", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "raysim: run failed: MlflowException: The experiment 1 must be in the 'active' state. Current state "
        "is deleted. (rerun with -v for the traceback)"
    )
    assert "--resume" not in proc.stderr and "400 rounds" not in proc.stdout
    assert not list((tmp_path / "ck").glob("*/manifest.json"))  # no checkpoint of any run


def test_runs_starting_together_on_a_new_sqlite_store_all_get_a_run(tmp_path):
    """MLflow creates a new SQLite store's tables on first use; three runs starting at the same
    instant on one new file (parallel variants) must each get their run, none "table ... exists"."""
    path = tracked(tmp_path, TINY)
    # a barrier: each process, once it has imported MLflow and loaded the scenario, says so in a
    # file and waits for the other two; then all three open the new store at the same instant
    code = (
        "import pathlib, sys, time; from raysim.scenario import config; from raysim.results.tracking import Tracker; "
        "sc = config.load(sys.argv[1]); d = pathlib.Path(sys.argv[2]); (d / sys.argv[3]).touch(); "
        "end = time.time() + 60\n"
        "while len(list(d.iterdir())) < 3 and time.time() < end: time.sleep(0.005)\n"
        "print(Tracker(sc).run_id)"
    )
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(ready), str(i)],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-300:] for _, err in outs]
    ids = {out.strip() for out, _ in outs}
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    assert len(ids) == 3 and {r.info.run_id for r in runs} == ids


@pytest.mark.parametrize("store", ["slow", "broken"])
def test_rounds_are_logged_without_waiting_on_the_store_and_written_by_the_end(tmp_path, monkeypatch, store):
    """A round's metrics go to the run's writer thread: with a store that takes 0.3 s a
    write, three rounds are handed over in well under one write, and when the run finishes
    every round is in the store. A store that cannot write them fails a finished run (FAILED,
    the store's error raised); a run failing for its own cause keeps that cause."""
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from raysim.results.tracking import Tracker
    from raysim.scenario import config

    write = SqlAlchemyStore.log_batch

    def slow(self, run_id, metrics, params, tags):
        if metrics:
            time.sleep(0.3)
            if store == "broken":
                raise MlflowException("disk full")
        return write(self, run_id, metrics, params, tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", slow)
    sc = config.load(tracked(tmp_path, TINY))
    tracker = Tracker(sc)
    t0 = time.perf_counter()
    for r in (1, 2, 3):
        tracker.log_round({"round": r, "accuracy": r / 10, "train_loss": 1.0 / r})
    assert time.perf_counter() - t0 < 0.25
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    if store == "slow":
        tracker.finish("ok")
        history = client.get_metric_history(tracker.run_id, "accuracy")
        assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3)]
        assert client.get_run(tracker.run_id).info.status == "FINISHED"
        return
    with pytest.raises(MlflowException, match="disk full"):
        tracker.finish("ok")
    assert client.get_run(tracker.run_id).info.status == "FAILED"
    again = Tracker(sc)
    again.log_round({"round": 1, "accuracy": 0.1})
    again.finish("failed")  # no store error over the run's own cause
    assert client.get_run(again.run_id).info.status == "FAILED"


def test_divergence_stops_the_run_naming_the_round_and_clients_and_keeps_the_last_good_checkpoint(tmp_path):
    # FedAvg with lr 5 on least squares (FedSoft's synthetic regression): |1 - lr·λ_max| > 1,
    # so the weights grow geometrically and the loss overflows within a few rounds
    path = tracked(tmp_path, DIVERGING)
    proc = raysim("run", path, "-q", "--engine", "serial", check=False, here=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "Diverged" in ln)
    import re

    m = re.search(r"Diverged: training diverged in round (\d+): non-finite loss on clients? ([\d, ]+);", line)
    assert m, line
    bad_round = int(m.group(1))
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    assert run.info.status == "FAILED"
    from raysim.engine import checkpoint

    ck = checkpoint.server_part(tmp_path / "ck" / run.info.run_id)
    assert ck["round"] == bad_round - 1  # the last good round, checkpointed every round
    assert all(math.isfinite(h["train_loss"]) for h in ck["history"])


def test_a_run_records_its_resolved_scenario_raysim_version_and_source_commit(tmp_path):
    """What reproduces a run is in MLflow: every key of the scenario with its defaults filled in
    (parameters and scenario/resolved.json, which runs again to the same numbers), the keys the
    file and --set gave (scenario/given.json), raysim's version and its source's git commit."""
    import tomllib

    from raysim.scenario import config

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    path = tracked(tmp_path, TINY)
    s = summary_of(tmp_path, path, "--engine", "serial", "--set", "algorithm.lr=0.05")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(s["mlflow_run_id"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run.data.tags["raysim.version"] == version
    assert run.data.tags["raysim.git_commit"] == head and len(head) == 40
    assert run.data.tags["raysim.git_dirty"] in ("true", "false")
    p = run.data.params  # keys TINY leaves out, at their defaults; the override as given
    assert (p["algorithm.lr"], p["algorithm.momentum"], p["algorithm.optimizer"]) == ("0.05", "0.0", "sgd")
    assert (p["resources.max_host_losses"], p["eval.finetune.lr_source"], p["data.splits.train"]) == (
        "3",
        "base",
        "0.8",
    )
    art = tmp_path / "art"
    given = json.loads(open(client.download_artifacts(run.info.run_id, "scenario/given.json", str(art))).read())
    assert given["algorithm"] == {"name": "fedavg", "lr": 0.05, "batch_size": 16}
    assert "momentum" not in given["algorithm"] and "splits" not in given["data"]
    resolved = json.loads(open(client.download_artifacts(run.info.run_id, "scenario/resolved.json", str(art))).read())
    assert resolved == json.loads(json.dumps(config.resolved(config.load(path, ["algorithm.lr=0.05"]))))
    assert resolved["algorithm"]["momentum"] == 0.0 and resolved["resources"]["max_host_losses"] == 3
    again = tmp_path / "resolved.yaml"  # the resolved scenario alone reruns the same run
    again.write_text(json.dumps(resolved))
    rerun = summary_of(tmp_path, str(again), "--engine", "serial", name="again.json")
    assert rerun["final"] == s["final"]


def test_the_source_commit_is_the_checkouts_or_unknown_without_failing(tmp_path, monkeypatch):
    from raysim.results.tracking import COMMIT_TAG, DIRTY_TAG, source_commit

    assert source_commit(tmp_path) == {COMMIT_TAG: "unknown"}  # not a checkout (an installed wheel)
    repo = tmp_path / "repo"
    (repo / "raysim").mkdir(parents=True)
    (repo / "raysim" / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "raysim/a.py"], ["commit", "-qm", "one"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert source_commit(repo) == {COMMIT_TAG: head, DIRTY_TAG: "false"}
    (repo / "raysim" / "a.py").write_text("x = 2\n")  # raysim's own files edited since the commit
    source_commit.cache_clear()
    assert source_commit(repo) == {COMMIT_TAG: head, DIRTY_TAG: "true"}
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-folder"))  # no git at all
    source_commit.cache_clear()
    assert source_commit(repo) == {COMMIT_TAG: "unknown"}
    source_commit.cache_clear()
