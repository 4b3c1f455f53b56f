"""``raysim run SWEEP --resume PARENT``: a long sweep (a benchmark of hundreds of runs on a
laptop) continued after a failure or a stop: finished runs kept as they are, unfinished ones
continued in their own MLflow runs from their checkpoints, never-started ones started; the
results equal an undisturbed sweep's."""

from mlflow.tracking import MlflowClient

from tests.conftest import TINY
from tests.test_runs import raysim, tracked

SWEEP = (
    TINY.replace("rounds: 3", "rounds: 4").replace("fedavg", "local")
    + """
sweep:
  short: {rounds: 2}
  long: {}
  other: {algorithm.lr: 0.05}
"""
)


def children(client, parent):
    exp = client.get_run(parent).info.experiment_id
    kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")
    return {k.data.tags["variant"]: k for k in kids}


def parent_of(client):
    exp = client.get_experiment_by_name("raysim").experiment_id
    (parent,) = client.search_runs([exp], "tags.`raysim.parent` = '1'")
    return parent.info.run_id


def losses(client, run_id):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")]


def test_a_failed_sweep_continues_keeping_finished_runs_and_ends_as_an_undisturbed_one(tmp_path):
    ref_dir, dir_ = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir(), dir_.mkdir()
    ref_path, path = tracked(ref_dir, SWEEP), tracked(dir_, SWEEP)
    raysim("run", ref_path, "-q", "--engine", "serial", here=True)
    ref_client = MlflowClient(f"sqlite:///{ref_dir}/mlflow.db")
    ref = {v: losses(ref_client, k.info.run_id) for v, k in children(ref_client, parent_of(ref_client)).items()}

    # every run fails after its 3rd round: "short" (2 rounds) finishes, the two others fail
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "3"}, check=False, here=True)
    assert proc.returncode == 1, proc.stderr
    client = MlflowClient(f"sqlite:///{dir_}/mlflow.db")
    parent = parent_of(client)
    assert client.get_run(parent).info.status == "FAILED"
    command = f"raysim run {path} --engine serial --resume {parent}"
    assert f"continue the whole sweep (its finished runs kept) with: {command}" in proc.stderr
    first = children(client, parent)
    assert {v: k.info.status for v, k in first.items()} == {"short": "FINISHED", "long": "FAILED", "other": "FAILED"}
    short_end = first["short"].info.end_time
    table = raysim(
        "compare", parent, "--tracking-uri", f"sqlite:///{dir_}/mlflow.db", "--out", str(dir_ / "cmp"), here=True
    ).stdout
    assert (
        f"Sweep {parent} (s.yaml): 1 of 3 runs finished, 0 running, 2 failed or stopped, 0 not started; the "
        f"table holds the finished ones (`raysim run s.yaml --resume {parent}`"
    ) in table
    assert "[short]" in table and "[long]" not in table
    # a run never started: its record deleted (as if the sweep had stopped before it)
    client.delete_run(first["other"].info.run_id)

    proc = raysim("run", path, "-q", "--engine", "serial", "--resume", parent, here=True)
    assert "continuing sweep " + parent + ": 1 finished runs kept, 1 continued, 1 started" in proc.stderr
    assert client.get_run(parent).info.status == "FINISHED"
    after = children(client, parent)
    assert set(after) == {"short", "long", "other"}
    assert after["short"].info.run_id == first["short"].info.run_id and after["short"].info.end_time == short_end
    assert after["long"].info.run_id == first["long"].info.run_id  # continued in its own run
    assert after["other"].info.run_id != first["other"].info.run_id  # started anew
    assert all(k.info.status == "FINISHED" for k in after.values())
    for variant, kid in after.items():  # every round once, as in the undisturbed sweep
        assert losses(client, kid.info.run_id) == ref[variant], variant
    # the comparison table of the parent holds the three runs
    assert all(v in proc.stdout for v in ("short", "long", "other"))


def test_resuming_a_sweep_refuses_other_variants_a_single_run_and_a_finished_sweep(tmp_path):
    path = tracked(tmp_path, SWEEP)
    raysim("run", path, "-q", "--engine", "serial", "--set", "rounds=1", here=True)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = parent_of(client)
    done = raysim("run", path, "--engine", "serial", "--set", "rounds=1", "--resume", parent, check=False, here=True)
    assert done.returncode == 2 and f"--resume {parent}: the run is FINISHED" in done.stderr
    client.update_run(parent, status="FAILED")
    other = raysim(
        "run",
        path,
        "--engine",
        "serial",
        "--set",
        "rounds=1",
        "--seeds",
        "0,1",
        "--resume",
        parent,
        check=False,
        here=True,
    )
    assert other.returncode == 2, other.stderr
    assert other.stderr.strip().splitlines()[-1] == (
        f"raysim: {path}: --resume {parent}: the sweep ran variants long, other, short with seeds 0; this command "
        "makes variants long, other, short with seeds 0,1: resume with the same file, --set and --seeds"
    )
    kid = children(client, parent)["long"].info.run_id
    client.update_run(kid, status="FAILED")
    single = raysim("run", path, "--engine", "serial", "--set", "rounds=1", "--resume", kid, check=False, here=True)
    assert single.returncode == 2
    assert (
        f"--resume {kid}: not a sweep's parent run; to continue one run of a sweep add --variant NAME" in single.stderr
    )


def test_variant_patterns_choose_the_matching_variants_and_the_sweep_command_keeps_the_pattern(tmp_path):
    import pytest

    from raysim.experiment.sweep import sweep_resume_command
    from raysim.scenario.config import ScenarioError, load_variants

    grid = TINY + "sweep:\n  a-x: {}\n  a-y: {}\n  b-x: {}\ngrid:\n  algorithm.lr: [0.1, 0.2]\n"
    path = tracked(tmp_path, grid)
    names = lambda pattern: [v for v, _ in load_variants(path, only=pattern)]  # noqa: E731
    assert names("*-x,lr=0.1") == ["a-x,lr=0.1", "b-x,lr=0.1"]
    assert names("a-?,lr=0.2") == ["a-x,lr=0.2", "a-y,lr=0.2"]
    assert names("b-x,lr=0.2") == ["b-x,lr=0.2"]  # a name is itself
    assert [sc.algorithm.params.lr for _, sc in load_variants(path, only="a-*")] == [0.1, 0.2, 0.1, 0.2]
    with pytest.raises(ScenarioError, match=r"--variant c-\*: matches no variant; choose one of a-x,lr=0.1; "):
        load_variants(path, only="c-*")
    with pytest.raises(ScenarioError, match=r"--variant c-x: no such variant; choose one of"):
        load_variants(path, only="c-x")
    assert sweep_resume_command("b.yaml", ["rounds=5"], "serial", None, [0, 1], "abc", "*-x,lr=0.1") == (
        "raysim run b.yaml --variant '*-x,lr=0.1' --seeds 0,1 --set rounds=5 --engine serial --resume abc"
    )


def test_the_python_api_continues_a_sweep_and_returns_every_run(tmp_path, monkeypatch):
    import pytest

    import raysim
    from raysim.errors import RunsFailed

    path = tracked(tmp_path, SWEEP)
    monkeypatch.setenv("RAYSIM_FAIL_AFTER_ROUND", "3")
    with pytest.raises(RunsFailed, match="2 of 3 runs failed: long, other"):
        raysim.run(path, engine="serial", progress=False)
    monkeypatch.delenv("RAYSIM_FAIL_AFTER_ROUND")
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = parent_of(client)
    result = raysim.run(path, engine="serial", progress=False, resume=parent)
    assert result.parent_run_id == parent
    assert list(result.runs) == [("short", 0), ("long", 0), ("other", 0)]
    assert [len(result.runs[(v, 0)].history) for v in ("short", "long", "other")] == [2, 4, 4]


def test_a_sweep_whose_process_was_killed_continues_from_where_it_stood(tmp_path):
    """The laptop case: the sweep's process dies without a word (SIGKILL, power loss) in its
    second run, leaving the parent and that run RUNNING; --resume of the parent keeps the first
    run, continues the second from its checkpoint and starts the third."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    path = tracked(tmp_path, SWEEP)
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", path, "-q", "--engine", "serial"],
        cwd=ROOT,
        env={**os.environ, "RAYSIM_PAUSE_AFTER_ROUND": "3"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline, paused = time.time() + 120, None
    while time.time() < deadline and proc.poll() is None and paused is None:
        time.sleep(0.3)
        for f in (tmp_path / "ck").glob("*/manifest.json") if (tmp_path / "ck").exists() else []:
            if json.loads(f.read_text())["round"] == 3:
                paused = f.parent.name
    assert paused is not None, "the sweep never checkpointed round 3 of its second run"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = parent_of(client)
    assert client.get_run(parent).info.status == "RUNNING"
    before = children(client, parent)
    assert {v: k.info.status for v, k in before.items()} == {"short": "FINISHED", "long": "RUNNING"}
    assert before["long"].info.run_id == paused

    done = raysim("run", path, "-q", "--engine", "serial", "--resume", parent)
    assert f"continuing sweep {parent}: 1 finished runs kept, 1 continued, 1 started" in done.stderr
    after = children(client, parent)
    assert {v: k.info.status for v, k in after.items()} == {
        "short": "FINISHED",
        "long": "FINISHED",
        "other": "FINISHED",
    }
    assert after["long"].info.run_id == paused
    assert [s for s, _ in losses(client, paused)] == [1, 2, 3, 4]  # each round logged once
    assert client.get_run(parent).info.status == "FINISHED"
