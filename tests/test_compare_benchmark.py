"""`raysim compare` for a benchmark (scenarios/pfl_benchmark.yaml, in small): two partitions of
one dataset are two columns, and with ``--select`` each cell gives the chosen variant's mean wall
seconds per run, MLflow's end minus start time, checked here against the runs."""

import csv

import numpy as np
import pytest
from conftest import write_scenario

from raysim import cli
from raysim.results import report

BENCH = """
name: bench
seed: 0
seeds: [0]
rounds: 2
data: {{dataset: digits, clients: 6, partition: {{kind: dirichlet, alpha: 0.5}},
        splits: {{train: 0.7, val: 0.1, test: 0.2}}}}
model: {{name: linear}}
algorithm: {{name: fedavg, lr: 0.1, batch_size: 32}}
eval: {{every: 1}}
tracking: {{uri: 'sqlite:///{tmp}/m.db'}}
checkpoint: {{every: 0, dir: '{tmp}/ck'}}
sweep:
  fedavg-dir: {{}}
  local-dir: {{algorithm.name: local}}
  fedavg-shards: {{data.partition: {{kind: shards, classes_per_client: 2}}}}
  local-shards: {{algorithm.name: local, data.partition: {{kind: shards, classes_per_client: 2}}}}
grid:
  algorithm.lr: [0.0001, 0.3]
"""


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    path = write_scenario(tmp, BENCH.format(tmp=tmp))
    assert cli.main(["run", path, "--engine", "serial", "-q"]) == 0
    _, client = report.client_for(f"sqlite:///{tmp}/m.db")
    (parent,) = [
        r
        for r in client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
        if r.data.tags.get("raysim.parent") == "1"
    ]
    return tmp, client, parent.info.run_id


def test_partitions_of_one_dataset_are_separate_columns_with_the_time_per_run(bench, tmp_path):
    tmp, client, parent = bench
    kids = report.expand(client, [parent])
    assert len(kids) == 8
    assert (
        cli.main(
            [
                "compare",
                parent,
                "--tracking-uri",
                f"sqlite:///{tmp}/m.db",
                "--out",
                str(tmp_path),
                "--select",
                "val_accuracy",
            ]
        )
        == 0
    )
    lines = (tmp_path / "compare.md").read_text().splitlines()
    assert lines[0] == "| method | digits (dirichlet) (avg / bottom decile) | digits (shards) (avg / bottom decile) |"
    rows = list(csv.DictReader(open(tmp_path / "compare.csv")))
    assert {(r["method"], r["dataset"]) for r in rows} == {
        (m, f"digits ({p})") for m in ("fedavg", "local") for p in ("dirichlet", "shards")
    }
    for r in rows:
        # the chosen variant is the best of its method's on that partition by validation accuracy
        part = r["dataset"].split("(")[1].rstrip(")")
        mine = [
            k for k in kids if k.data.tags["algorithm"] == r["method"] and k.data.params["data.partition.kind"] == part
        ]
        assert len(mine) == 2
        best = max(mine, key=lambda k: k.data.metrics["val_accuracy"])
        assert r["variant"] == best.data.tags["variant"]
        assert float(r["mean"]) == pytest.approx(best.data.metrics["accuracy"])
        want = (best.info.end_time - best.info.start_time) / 1000
        assert float(r["seconds_per_run"]) == pytest.approx(want) and 0 < want < 60
    cell = next(line for line in lines if line.startswith("| fedavg |"))
    assert cell.count(" s/run)") == 2


def test_one_partition_keeps_the_dataset_name_and_the_api_gives_the_seconds(bench, tmp_path):
    tmp, client, parent = bench
    from raysim.api import _table

    df, md = _table(client, parent, select="val_accuracy")
    assert set(df["dataset"]) == {"digits (dirichlet)", "digits (shards)"}
    assert np.all(df["seconds_per_run"] > 0)
    # the runs of one partition alone: the column is the dataset's name, as before
    dirichlet = [
        k.info.run_id for k in report.expand(client, [parent]) if k.data.params["data.partition.kind"] == "dirichlet"
    ]
    assert cli.main(["compare", *dirichlet, "--tracking-uri", f"sqlite:///{tmp}/m.db", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compare.md").read_text().splitlines()[0] == "| method | digits (avg / bottom decile) |"


def test_methods_keep_the_order_of_the_runs_whichever_grid_point_is_chosen(bench, tmp_path):
    """Runs given as FedAvg's losing grid point, then Local's winner, then FedAvg's winner: FedAvg
    still heads the table, where its first run stood."""
    tmp, client, parent = bench
    kids = [k for k in report.expand(client, [parent]) if k.data.params["data.partition.kind"] == "dirichlet"]
    by = {}
    for k in kids:
        by.setdefault(k.data.tags["algorithm"], []).append(k)
    fedavg = sorted(by["fedavg"], key=lambda k: k.data.metrics["val_accuracy"])
    local = max(by["local"], key=lambda k: k.data.metrics["val_accuracy"])
    order = [fedavg[0].info.run_id, local.info.run_id, fedavg[-1].info.run_id]
    assert fedavg[0].data.metrics["val_accuracy"] < fedavg[-1].data.metrics["val_accuracy"]
    assert (
        cli.main(
            [
                "compare",
                *order,
                "--tracking-uri",
                f"sqlite:///{tmp}/m.db",
                "--out",
                str(tmp_path),
                "--select",
                "val_accuracy",
            ]
        )
        == 0
    )
    methods = [line.split(" | ")[0].lstrip("| ") for line in (tmp_path / "compare.md").read_text().splitlines()[2:4]]
    assert methods == ["fedavg", "local"]


def test_a_server_optimizer_is_a_method_of_its_own_whose_lr_is_chosen_apart():
    """FedAvg's runs with and without `server: adam` are two rows; --select picks each one's best
    validation run among its own runs only (the plain FedAvg run with the higher val_accuracy
    does not take FedAdam's row)."""
    from types import SimpleNamespace as NS

    from raysim.results import compare

    def run(rid, variant, server, val, acc):
        params = {"seed": "0", "data.partition.kind": "dirichlet", "server.optimizer": server}
        return NS(
            info=NS(run_id=rid, start_time=0, end_time=1000),
            data=NS(
                tags={"algorithm": "fedavg", "variant": variant, "dataset": "digits", "seed": "0"},
                params=params,
                metrics={"accuracy": acc, "val_accuracy": val},
            ),
        )

    runs = [
        run("a", "fedavg", "none", 0.90, 0.80),
        run("b", "adam-0.01", "adam", 0.70, 0.60),
        run("c", "adam-0.1", "adam", 0.85, 0.75),
        run("d", "sgd", "sgd", 0.50, 0.40),
    ]
    assert compare.method_name("fedavg", {"server.optimizer": "adam"}) == "fedavg (server adam)"
    assert compare.method_name("fedavg", {"server.optimizer": "none"}) == "fedavg"
    assert compare.method_name("fedavg", {}) == "fedavg"
    found, choices = compare.chosen_rows(runs, None, "val_accuracy")
    chosen = {algorithm: c.method for (algorithm, _), c in choices.items()}
    assert chosen == {
        "fedavg": "fedavg",
        "fedavg (server adam)": "fedavg (server adam) [adam-0.1]",
        "fedavg (server sgd)": "fedavg (server sgd) [sgd]",
    }
    assert [(r.method, r.run_id, r.value) for r in found] == [
        ("fedavg", "a", 0.80),
        ("fedavg (server adam)", "c", 0.75),
        ("fedavg (server sgd)", "d", 0.40),
    ]
