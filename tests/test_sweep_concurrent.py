"""A sweep's runs side by side on Ray Tune: each the run it would be alone (the serial
engine's metrics), started together when the Ray holds them, a failed one reported with its
resume command while the others finish."""

import re
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from raysim import cli
from raysim.results import report
from tests.conftest import write_scenario

pytestmark = pytest.mark.ray

# FedSoft's synthetic regression; lr 5 diverges within a few rounds (|1 - lr·λ_max| > 1), lr
# 0.05 learns. One host of half a CPU a run: four runs fit the 2 CPUs of a local Ray at once.
SWEEP = """
name: side
seed: 0
seeds: [0, 1]
rounds: 30
data:
  dataset: regression_mixture
  clients: 8
  partition: {{kind: mixture, scheme: "10:90", sources: 2, min_size: 30, max_size: 40, holdout: 100}}
model: {{name: linear, bias: false}}
algorithm: {{name: fedavg, lr: 0.05, batch_size: 10}}
eval: {{every: 10}}
resources: {{hosts: 1, cpus_per_host: 0.5}}
tracking: {{uri: 'sqlite:///{tmp}/m.db'}}
checkpoint: {{every: 2, dir: '{tmp}/ck'}}
sweep:
  ok: {{}}
  diverge: {{algorithm.lr: 5.0}}
"""


@pytest.mark.slow
def test_sweep_runs_side_by_side_with_the_metrics_of_runs_alone_and_reports_a_failed_one(tmp_path):
    path = write_scenario(tmp_path, SWEEP.format(tmp=tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "run", path, "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "4 runs, up to 4 at a time on Ray Tune" in err and "Traceback" not in err
    assert "raysim: 2 of 4 runs failed: diverge seed 0, diverge seed 1" in err
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    (parent,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
        if r.data.tags.get("raysim.parent") == "1"
    ]
    assert parent.info.status == "FAILED"
    kids = {(k.data.tags["variant"], k.data.tags["seed"]): k for k in report.expand(client, [parent.info.run_id])}
    assert sorted(kids) == [("diverge", "0"), ("diverge", "1"), ("ok", "0"), ("ok", "1")]
    # each failed run: the cause, its FAILED record and the command that continues it
    for seed in ("0", "1"):
        bad = kids["diverge", seed]
        assert bad.info.status == "FAILED"
        assert re.search(rf"raysim: diverge seed {seed}: run failed: Diverged: training diverged in round \d+", err)
        assert (
            f"continue it with: raysim run {path} --variant diverge --seeds {seed} --resume {bad.info.run_id}"
        ) in err
    # the finished runs are the runs alone: the serial engine, one run, in this process
    for seed in ("0", "1"):
        good = kids["ok", seed]
        assert good.info.status == "FINISHED"
        alone = tmp_path / f"alone{seed}.json"
        assert (
            cli.main(
                [
                    "run",
                    path,
                    "--variant",
                    "ok",
                    "--seeds",
                    seed,
                    "--engine",
                    "serial",
                    "-q",
                    "--summary",
                    str(alone),
                    "--set",
                    f"tracking.uri=sqlite:///{tmp_path}/alone.db",
                ]
            )
            == 0
        )
        import json

        want = json.loads(alone.read_text())["final"]
        assert good.data.metrics["mse"] == want["mse"]
        assert good.data.metrics["bottom_decile_mse"] == want["bottom_decile_mse"]
    # side by side: the two learning runs overlapped in time (one after another, none would)
    a, b = kids["ok", "0"].info, kids["ok", "1"].info
    assert a.start_time < b.end_time and b.start_time < a.end_time
    # the finished runs' table is printed all the same
    assert re.search(r"\| fedavg( \[ok\])? \|", proc.stdout), proc.stdout


def test_runs_one_after_another_go_on_past_a_failed_one_and_fail_at_the_end(tmp_path, capsys):
    # the serial engine runs a sweep in turn: the diverging variant (listed first) fails with its
    # FAILED record and resume command, the others still run, and the sweep exits 1 at the end
    text = (
        SWEEP.format(tmp=tmp_path)
        .replace("seeds: [0, 1]\n", "")
        .replace("  ok: {}\n  diverge: {algorithm.lr: 5.0}\n", "  diverge: {algorithm.lr: 5.0}\n  ok: {}\n")
    )
    path = write_scenario(tmp_path, text)
    assert cli.main(["run", path, "-q", "--engine", "serial"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"raysim: diverge: run failed: Diverged: training diverged in round \d+", err), err
    assert err.strip().splitlines()[-1] == "raysim: 1 of 2 runs failed: diverge"
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    runs = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    status = {r.data.tags.get("variant", "parent"): r.info.status for r in runs}
    assert status == {"parent": "FAILED", "diverge": "FAILED", "ok": "FINISHED"}
    (bad,) = [r for r in runs if r.data.tags.get("variant") == "diverge"]
    assert f"continue it with: raysim run {path} --variant diverge --engine serial --resume {bad.info.run_id}" in err
