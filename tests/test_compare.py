"""Seeded runs nested under one parent MLflow run, and `raysim compare`: the table's numbers are
the mean and sample std of the children's final metrics, computed here by hand."""

import csv

import numpy as np
import pytest
from conftest import write_scenario

from raysim import cli
from raysim.results import report
from raysim.results.compare import CompareError, compare

SWEEP = """
name: tbl
seed: 0
seeds: [0, 1]
rounds: 2
data: {{dataset: synthetic, clients: 8, dim: 10, max_samples: 80}}
model: {{name: linear}}
algorithm: {{name: fedavg, lr: 0.1, batch_size: 16}}
eval: {{every: 1}}
resources: {{hosts: 2}}
tracking: {{uri: 'sqlite:///{tmp}/m.db'}}
checkpoint: {{every: 0, dir: '{tmp}/ck'}}
sweep:
  fedavg: {{}}
  local: {{algorithm.name: local}}
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    path = write_scenario(tmp, SWEEP.format(tmp=tmp))
    assert cli.main(["run", path, "--engine", "serial", "-q"]) == 0
    _, client = report.client_for(f"sqlite:///{tmp}/m.db")
    parent = [
        r
        for r in client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
        if r.data.tags.get("raysim.parent") == "1"
    ]
    assert len(parent) == 1
    return tmp, client, parent[0]


def test_seeds_run_every_variant_once_per_seed_nested_under_a_parent(sweep):
    tmp, client, parent = sweep
    kids = report.expand(client, [parent.info.run_id])
    got = sorted((k.data.tags["variant"], k.data.tags["seed"]) for k in kids)
    assert got == [("fedavg", "0"), ("fedavg", "1"), ("local", "0"), ("local", "1")]
    assert all(k.data.tags["mlflow.parentRunId"] == parent.info.run_id for k in kids)
    assert {k.data.params["seed"] for k in kids} == {"0", "1"}  # the seed each run really used
    assert parent.info.status == "FINISHED" and parent.data.params["seeds"] == "0,1"
    # two seeds give two different runs
    acc = {(k.data.tags["variant"], k.data.tags["seed"]): k.data.metrics["accuracy"] for k in kids}
    assert acc["fedavg", "0"] != acc["fedavg", "1"]


def test_compare_table_is_the_mean_and_std_over_seeds(sweep, tmp_path, capsys):
    tmp, client, parent = sweep
    assert (
        cli.main(["compare", parent.info.run_id, "--tracking-uri", f"sqlite:///{tmp}/m.db", "--out", str(tmp_path)])
        == 0
    )
    kids = report.expand(client, [parent.info.run_id])
    for method in ("fedavg", "local"):
        runs = [k for k in kids if k.data.tags["variant"] == method]
        acc = np.array([k.data.metrics["accuracy"] for k in runs])
        bot = np.array([k.data.metrics["bottom_decile_accuracy"] for k in runs])
        want = (
            f"| {method} | {100 * acc.mean():.1f} ± {100 * acc.std(ddof=1):.1f} / "
            f"{100 * bot.mean():.1f} ± {100 * bot.std(ddof=1):.1f} (n=2) |"
        )
        assert want in (tmp_path / "compare.md").read_text().splitlines()
        row = next(r for r in csv.DictReader(open(tmp_path / "compare.csv")) if r["method"] == method)
        assert float(row["mean"]) == pytest.approx(acc.mean()) and float(row["std"]) == pytest.approx(acc.std(ddof=1))
        assert row["seeds"] == "0 1" and row["dataset"] == "synthetic" and row["n"] == "2"
    assert "| method | synthetic (avg / bottom decile) |" in capsys.readouterr().out
    # the experiment as a whole gives the same table (the parent itself is left out)
    text, _, _ = compare([], "raysim", f"sqlite:///{tmp}/m.db", tmp_path / "exp")
    assert text == (tmp_path / "compare.md").read_text().strip()


def test_seeds_and_compare_bad_input(sweep, tmp_path, capsys):
    tmp, _, _ = sweep
    path = write_scenario(tmp_path, SWEEP.format(tmp=tmp_path))
    assert cli.main(["run", path, "--seeds", "0,x"]) == 2
    assert "--seeds: '0,x' is not a list of integers, e.g. 0,1,2" in capsys.readouterr().err
    assert cli.main(["run", path, "--seeds", "1,1"]) == 2
    assert "give distinct integers >= 0" in capsys.readouterr().err
    with pytest.raises(CompareError, match="no experiment 'nope'.*it has: raysim"):
        compare([], "nope", f"sqlite:///{tmp}/m.db", tmp_path)
    assert cli.main(["compare", "--tracking-uri", f"sqlite:///{tmp}/m.db"]) == 2
    assert "give run ids" in capsys.readouterr().err


def test_rank_orders_the_methods_best_first(sweep, tmp_path):
    """--rank: methods by their mean of the metric over seeds, highest accuracy first, lowest
    loss first; a metric not in the table is refused, naming the table's."""
    tmp, client, parent = sweep
    uri = f"sqlite:///{tmp}/m.db"
    kids = report.expand(client, [parent.info.run_id])

    def mean(variant, metric):
        return np.mean([k.data.metrics[metric] for k in kids if k.data.tags["variant"] == variant])

    def order(text):
        return [line.split("|")[1].strip() for line in text.splitlines()[2:] if line.startswith("| ")]

    text, _, _ = compare([parent.info.run_id], None, uri, tmp_path, ["accuracy", "test_loss"], rank="accuracy")
    assert order(text)[:2] == sorted(["fedavg", "local"], key=lambda v: -mean(v, "accuracy"))
    text, _, _ = compare([parent.info.run_id], None, uri, tmp_path, ["accuracy", "test_loss"], rank="test_loss")
    assert order(text)[:2] == sorted(["fedavg", "local"], key=lambda v: mean(v, "test_loss"))
    with pytest.raises(
        CompareError,
        match=r"--rank target_virtual_hours: not among the table's metrics "
        r"\(accuracy\); add it to --metrics",
    ):
        compare([parent.info.run_id], None, uri, tmp_path, ["accuracy"], rank="target_virtual_hours")
