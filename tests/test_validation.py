"""Tuning on a validation split: the ``val_*`` metrics (``eval.validation``), the round picked on
them (``val_best_round``, ``test_at_val_best_*``) and ``raysim compare --select``.

Hand-checked on a 1-feature, 2-class linear model with W = (1, −1), b = 0: the logits are
(x, −x), so it predicts class 0 where x > 0, and a sample's cross-entropy is
log(e^x + e^−x) − z_y. The validation split x = (2, −1, 3), y = (0, 0, 1) is right on x = 2
only: accuracy 1/3. The test split x = (1, −2), y = (0, 1) is right on both: accuracy 1.
"""

import csv
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import raysim
import raysim.algorithms as algorithms
from raysim import cli
from raysim.algorithms.base import Received
from raysim.core.data import ClientData, Context
from raysim.core.loop import drive
from raysim.core.tasks import TASKS
from raysim.engine.driver import validation
from raysim.engine.serial import serial_driver
from raysim.experiment.runner import make_summary, val_selection
from raysim.results import report
from raysim.scenario import config
from raysim.scenario.config import FinetuneCfg, ScenarioError
from tests.conftest import TINY, write_scenario

CPU = torch.device("cpu")
TRAIN = ([2.0, 1.0], [0, 1])
VAL = ([2.0, -1.0, 3.0], [0, 0, 1])
TEST = ([1.0, -2.0], [0, 1])
SPLITS = "data.splits={train: 0.6, val: 0.2, test: 0.2}"


def shard(val=VAL):
    col = lambda v: torch.tensor(v[0]).reshape(-1, 1)  # noqa: E731
    return ClientData(
        0,
        col(TRAIN),
        torch.tensor(TRAIN[1]),
        col(val),
        torch.tensor(val[1], dtype=torch.int64),
        col(TEST),
        torch.tensor(TEST[1]),
    )


def fedavg(finetune=None):
    cls = algorithms.get("fedavg")
    algo = cls(
        cls.Hyper(lr=1.0, batch_size=2), lambda variant=0: nn.Linear(1, 2), rounds=10, task=TASKS["classification"]
    )
    algo.finetune = finetune
    return algo


def scored(algo, params, data, val=True):
    """(test metrics, validation metrics) of one client, and how many jobs the loop trained."""
    trained = []

    def fit(jobs):
        trained.extend(jobs)
        return algo.trainer(CPU).fit(jobs)

    ctx = Context(10, 10, 0, torch.Generator().manual_seed(0), CPU, 0)
    ((test, val_metrics),) = drive([algo.evaluations(None, Received(params), data, ctx, val)], fit)
    return test, val_metrics, len(trained)


def by_hand(w, xs, ys):
    """Accuracy and mean cross-entropy of logits (w·x, −w·x)."""
    right, losses = 0, []
    for x, y in zip(xs, ys):
        z = (w * x, -w * x)
        losses.append(math.log(math.exp(z[0]) + math.exp(z[1])) - z[y])
        right += int((0 if z[0] > z[1] else 1) == y)
    return right / len(ys), sum(losses) / len(losses)


def test_a_clients_val_metrics_are_its_models_scores_on_its_validation_split():
    params = [torch.tensor([[1.0], [-1.0]]), torch.zeros(2)]
    test, val, jobs = scored(fedavg(), params, shard())
    acc, loss = by_hand(1.0, *VAL)
    assert acc == pytest.approx(1 / 3)
    # evaluate's own names: the engine renames them val_accuracy, val_loss, val_global_accuracy
    assert val["accuracy"] == pytest.approx(acc) and val["global_accuracy"] == pytest.approx(acc)
    assert val["test_loss"] == pytest.approx(loss, rel=1e-6)
    assert test["accuracy"] == 1.0 and test["test_loss"] == pytest.approx(by_hand(1.0, *TEST)[1], rel=1e-6)
    assert jobs == 0
    # off, or no validation samples: no validation metrics, the same test metrics
    for data, on in ((shard(), False), (shard(([], [])), True)):
        again, none, _ = scored(fedavg(), params, data, on)
        assert none is None and again == test


def test_the_local_update_is_trained_once_and_scored_on_both_splits():
    # from W = 0 one full-batch SGD step of lr 1 on TRAIN gives W = (.25, −.25) (tests/test_finetune.py)
    zeros = [torch.zeros(2, 1), torch.zeros(2)]
    test, val, jobs = scored(fedavg(FinetuneCfg(epochs=1)), zeros, shard())
    assert jobs == 1
    acc, loss = by_hand(0.25, *VAL)
    assert val["lu_accuracy"] == pytest.approx(acc) and val["lu_test_loss"] == pytest.approx(loss, rel=1e-5)
    assert val["accuracy"] == val["lu_accuracy"]  # FedAvg-LU: the personalized model is the tuned one
    assert test["lu_accuracy"] == by_hand(0.25, *TEST)[0] == 1.0
    # and the test metrics are those of the local update without validation
    alone, _, _ = scored(fedavg(FinetuneCfg(epochs=1)), zeros, shard(), val=False)
    assert alone == test


def test_val_metrics_are_reduced_over_clients_as_the_test_metrics():
    # (test metrics, test size, weights, validation metrics, validation size) per client
    results = {
        0: ({"accuracy": 1.0}, 2, None, {"accuracy": 1 / 3, "test_loss": 0.9}, 3),
        1: ({"accuracy": 0.5}, 2, None, {"accuracy": 1.0, "test_loss": 0.1}, 2),
        2: ({"accuracy": 0.0}, 2, None, None, 0),
        3: ({"accuracy": 0.5}, 2, None, {"accuracy": 0.5, "test_loss": 0.7}, 4),
    }
    got = validation(results, [0, 1, 2], [3])
    assert got["val_accuracy"] == pytest.approx((1 / 3 * 3 + 1.0 * 2) / 5)  # 0.6, weighted by val size
    assert got["val_accuracy_std"] == pytest.approx(math.sqrt((3 * (1 / 3 - 0.6) ** 2 + 2 * 0.4**2) / 5))
    assert got["val_bottom_decile_accuracy"] == pytest.approx(1 / 3 + 0.1 * 2 / 3)  # 10th percentile
    assert got["val_loss"] == pytest.approx((0.9 * 3 + 0.1 * 2) / 5)  # test_loss -> val_loss
    assert got["val_bottom_decile_loss"] == pytest.approx(0.1 + 0.9 * 0.8)  # 90th: lower is better
    assert got["val_unseen_accuracy"] == 0.5 and got["val_unseen_loss"] == 0.7
    assert validation({0: results[2]}, [0], []) == {}


def run(tmp_path, *overrides):
    sc = config.load(write_scenario(tmp_path, TINY), [SPLITS, "eval.unseen_fraction=0.25", *overrides])
    d = serial_driver(sc)
    for _ in range(sc.rounds):
        d.step()
    return sc, d


def test_a_run_logs_val_metrics_that_a_hand_computation_gives_and_the_test_metrics_stay(tmp_path):
    sc, d = run(tmp_path)
    last = d.history[-1]
    # the global model (FedAvg's server state) on every evaluated client's validation split,
    # pooled: the mean of the clients' accuracies weighted by their validation sizes
    w, b = d.server_state
    right = total = 0
    for c in d.eval_ids:
        data = d.source.client(int(c))
        right += int(((data.val_x @ w.T + b).argmax(1) == data.val_y).sum())
        total += data.num_val
    assert total > 0 and last["val_accuracy"] == pytest.approx(right / total, rel=1e-12)
    assert last["val_accuracy"] != last["accuracy"]
    assert {"val_loss", "val_global_accuracy", "val_unseen_accuracy", "val_bottom_decile_accuracy"} <= set(last)
    # off: no val_* at all, and the same test numbers
    _, off = run(tmp_path, "eval.validation=false")
    assert not [k for h in off.history for k in h if k.startswith("val_")]
    for h, o in zip(d.history, off.history):
        assert {k: v for k, v in h.items() if not k.startswith("val_") and "seconds" not in k} == {
            k: v for k, v in o.items() if "seconds" not in k
        }
    # the summary: the round with the best val_accuracy and its test metrics
    final = make_summary(sc, d.history, 0.0, type("T", (), {"run_id": "r", "uri": "u"})())["final"]
    best = max(d.history, key=lambda h: (h["val_accuracy"], -h["round"]))
    assert final["val_best_round"] == best["round"]
    assert final["test_at_val_best_accuracy"] == best["accuracy"]
    assert final["bottom_decile_test_at_val_best_accuracy"] == best["bottom_decile_accuracy"]
    assert final["best_val_accuracy"] == best["val_accuracy"]


def test_validation_true_needs_a_validation_split(tmp_path):
    path = write_scenario(tmp_path, TINY)
    with pytest.raises(ScenarioError, match="eval.validation: true, but data.splits.val is 0"):
        config.load(path, ["eval.validation=true"])
    with pytest.raises(
        ScenarioError, match="eval.validation: 'yes please' is not allowed; choose one of auto, true, false"
    ):
        config.load(path, ["eval.validation=yes please"])
    assert config.load(path, ["eval.validation=true", SPLITS]).eval.validation is True
    assert config.load(path).eval.validation == "auto"


def test_the_best_round_on_validation_data_is_picked_from_a_recorded_history():
    rows = [(1, 0.50, 0.60), (2, 0.70, 0.62), (3, 0.70, 0.75), (4, 0.65, 0.80)]  # round, val, test
    history = [
        {
            "round": r,
            "val_accuracy": v,
            "val_accuracy_std": 0.1,
            "accuracy": t,
            "accuracy_std": 0.2,
            "bottom_decile_accuracy": t - 0.1,
        }
        for r, v, t in rows
    ]
    history.insert(2, {"round": 2.5, "train_loss": 0.3})  # a round without an evaluation
    got = val_selection([h for h in history if "accuracy" in h], "accuracy")
    # round 2 and 3 tie on validation: the earlier; its test numbers, not round 4's best test accuracy
    assert got == {
        "val_best_round": 2,
        "test_at_val_best_accuracy": 0.62,
        "test_at_val_best_accuracy_std": 0.2,
        "bottom_decile_test_at_val_best_accuracy": pytest.approx(0.52),
    }
    mse = [
        {"round": r, "val_mse": m, "val_mse_std": 0.0, "mse": t, "mse_std": 0.0}
        for r, m, t in ((1, 3.0, 2.0), (2, 1.0, 4.0), (3, 2.0, 1.0))
    ]
    assert val_selection(mse, "mse")["val_best_round"] == 2 and val_selection(mse, "mse")["test_at_val_best_mse"] == 4.0
    assert val_selection([{"round": 1, "accuracy": 0.5, "accuracy_std": 0.0}], "accuracy") == {}


GRID = """
name: grid
seed: 0
seeds: [0, 1]
rounds: 3
data: {{dataset: synthetic, clients: 8, dim: 10, max_samples: 80, splits: {{train: 0.6, val: 0.2, test: 0.2}}}}
model: {{name: linear}}
algorithm: {{name: fedavg, lr: 0.1, batch_size: 16}}
resources: {{hosts: 2}}
tracking: {{uri: 'sqlite:///{tmp}/m.db'}}
checkpoint: {{dir: '{tmp}/ck'}}
sweep:
  lr-0.0001: {{algorithm.lr: 0.0001}}
  lr-0.3: {{algorithm.lr: 0.3}}
"""


def test_compare_select_reports_the_variant_with_the_best_mean_validation_score(tmp_path, capsys):
    swept = raysim.run(write_scenario(tmp_path, GRID.format(tmp=tmp_path)), engine="serial", concurrent=1)
    parent, uri = swept.parent_run_id, f"sqlite:///{tmp_path}/m.db"
    _, client = report.client_for(uri)
    kids = report.expand(client, [parent])
    metric = lambda v, k: np.array([r.data.metrics[k] for r in kids if r.data.tags["variant"] == v])  # noqa: E731
    val = {v: metric(v, "val_accuracy").mean() for v in ("lr-0.0001", "lr-0.3")}
    assert val["lr-0.3"] > val["lr-0.0001"] + 0.05  # clearly better on validation
    acc, bot = metric("lr-0.3", "accuracy"), metric("lr-0.3", "bottom_decile_accuracy")
    assert cli.main(["compare", parent, "--tracking-uri", uri, "--out", str(tmp_path), "--select", "val_accuracy"]) == 0
    lines = (tmp_path / "compare.md").read_text().splitlines()
    assert any(
        line.startswith(
            f"| fedavg | {100 * acc.mean():.1f} ± {100 * acc.std(ddof=1):.1f} / "
            f"{100 * bot.mean():.1f} ± {100 * bot.std(ddof=1):.1f} (n=2; lr-0.3; "
        )
        and line.endswith(" s/run) |")
        for line in lines
    )
    assert f"| fedavg | synthetic | **lr-0.3** (chosen) | {100 * val['lr-0.3']:.1f} | 2 |" in lines
    assert f"| fedavg | synthetic | lr-0.0001 | {100 * val['lr-0.0001']:.1f} | 2 |" in lines
    (row,) = csv.DictReader(open(tmp_path / "compare.csv"))
    assert row["variant"] == "lr-0.3" and row["selected_by"] == "val_accuracy"
    assert float(row["mean"]) == pytest.approx(acc.mean()) and float(row["selection_mean"]) == pytest.approx(
        val["lr-0.3"]
    )
    # the Python API's table is the same one
    (api_row,) = swept.compare(select="val_accuracy").to_dict("records")
    assert api_row["variant"] == "lr-0.3" and api_row["mean"] == pytest.approx(acc.mean())
    assert api_row["method"] == "fedavg" and api_row["n"] == 2
    # choosing on test data is refused
    capsys.readouterr()
    assert cli.main(["compare", parent, "--tracking-uri", uri, "--out", str(tmp_path), "--select", "accuracy"]) == 2
    assert "--select accuracy: not a validation metric" in capsys.readouterr().err
    # every run's summary holds the round picked on validation data
    summary, _ = report.load(client, kids[0].info.run_id)
    assert 1 <= summary["final"]["val_best_round"] <= 3
    assert json.dumps(summary["final"])  # plain numbers, logged as the run's metrics too
    assert kids[0].data.metrics["val_best_round"] == summary["final"]["val_best_round"]


def test_selection_compares_variants_on_the_seeds_they_share():
    """Variant A was tuned at seed 0 (val 0.7) and then repeated at seeds 1 and 2 (0.1 each); B
    ran at seed 0 only (0.6). On the seed they share A is better (0.7 > 0.6), though A's mean
    over all its seeds (0.3) is below B's."""
    from raysim.results.compare import Row, pick_variants

    rows = [
        Row(f"a{s}", "fedavg [a]", "d", str(s), "val_accuracy", v, None, algorithm="fedavg", variant="a")
        for s, v in ((0, 0.7), (1, 0.1), (2, 0.1))
    ]
    rows.append(Row("b0", "fedavg [b]", "d", "0", "val_accuracy", 0.6, None, algorithm="fedavg", variant="b"))
    (choice,) = pick_variants(rows, "val_accuracy").values()
    assert choice.variant == "a" and choice.mean == pytest.approx(0.7)
    assert choice.candidates == [("a", pytest.approx(0.7), 1), ("b", pytest.approx(0.6), 1)]
    # without a shared seed, each candidate's own mean
    rows[-1] = Row("b5", "fedavg [b]", "d", "5", "val_accuracy", 0.6, None, algorithm="fedavg", variant="b")
    (choice,) = pick_variants(rows, "val_accuracy").values()
    assert choice.variant == "b" and choice.candidates[0] == ("a", pytest.approx(0.3), 3)


# the grid's base scenario, at seed 0 only: two methods x two learning rates
TUNED = (
    GRID.replace("name: grid", "name: tuned").replace("seeds: [0, 1]", "seeds: [0]").split("sweep:")[0]
    + """\
sweep:
  avg: {{}}
  prox: {{algorithm.name: fedprox, algorithm.mu: 0.01}}
grid:
  algorithm.lr: [0.0001, 0.3]
"""
)


def test_best_of_repeats_a_grid_tuned_at_one_seed_at_other_seeds_for_its_chosen_points(tmp_path, capsys):
    """Stage 1: two methods x two learning rates at seed 0. Stage 2 (``--best-of`` its parent, at
    seeds 1 and 2): only each method's grid point of best validation accuracy runs. Comparing
    both parents, each method's cell is its chosen point over the three seeds, chosen on the
    seed every candidate has."""
    path = write_scenario(tmp_path, TUNED.format(tmp=tmp_path), "tuned.yaml")
    uri = f"sqlite:///{tmp_path}/m.db"
    first = raysim.run(path, engine="serial", concurrent=1)
    assert len(first.runs) == 4
    chosen = {"avg": None, "prox": None}
    for (variant, _), r in first.runs.items():
        method = variant.split(",")[0]
        best = chosen[method]
        if best is None or r.final["val_accuracy"] > best[1]:
            chosen[method] = (variant, r.final["val_accuracy"])
    assert {v for v, _ in chosen.values()} == {"avg,lr=0.3", "prox,lr=0.3"}  # clearly better on validation
    out = tmp_path / "second.json"
    assert (
        cli.main(
            [
                "run",
                path,
                "-q",
                "--engine",
                "serial",
                "--seeds",
                "1,2",
                "--best-of",
                first.parent_run_id,
                "--summary",
                str(out),
            ]
        )
        == 0
    )
    second = json.loads(out.read_text())["variants"]
    assert sorted(second) == ["avg,lr=0.3 seed 1", "avg,lr=0.3 seed 2", "prox,lr=0.3 seed 1", "prox,lr=0.3 seed 2"]
    _, client = report.client_for(uri)
    parent2 = client.get_run(second["avg,lr=0.3 seed 1"]["mlflow_run_id"]).data.tags["mlflow.parentRunId"]
    assert client.get_run(parent2).info.run_name == f"tuned seeds 1,2 best of {first.parent_run_id}"
    capsys.readouterr()
    assert (
        cli.main(
            [
                "compare",
                first.parent_run_id,
                parent2,
                "--tracking-uri",
                uri,
                "--out",
                str(tmp_path),
                "--select",
                "val_accuracy",
            ]
        )
        == 0
    )
    lines = (tmp_path / "compare.md").read_text().splitlines()
    assert sum("(n=3; avg,lr=0.3;" in line for line in lines) == 1
    assert sum("(n=3; prox,lr=0.3;" in line for line in lines) == 1
    assert f"| fedavg | synthetic | **avg,lr=0.3** (chosen) | {100 * chosen['avg'][1]:.1f} | 1 |" in lines
    # the command that continues the second sweep keeps --best-of
    from raysim.experiment.sweep import sweep_resume_command

    assert sweep_resume_command(path, [], "serial", None, [1, 2], parent2, None, first.parent_run_id).endswith(
        f"--seeds 1,2 --best-of {first.parent_run_id} --engine serial --resume {parent2}"
    )
    # bad input: seeds the chosen variants ran at already (the file's seeds: [0]); a file with no sweep
    assert cli.main(["run", path, "--engine", "serial", "--best-of", first.parent_run_id]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran at seed 0 there already; give the other seeds (--seeds)" in err[0]
    plain = write_scenario(tmp_path, TINY + f"tracking: {{uri: '{uri}'}}\n", "plain.yaml")
    assert cli.main(["run", plain, "--engine", "serial", "--best-of", first.parent_run_id]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--best-of" in err[0] and "no sweep section" in err[0]
