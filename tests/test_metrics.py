"""The metrics every method gets (issue 25, item 4): top-5 accuracy, ECE, test loss from
``Task.scores``; the std over clients from ``driver.summarize``; ACC(T) and time-to-accuracy
in the summary; ``raysim compare --metrics --over clients``. Numbers worked out by hand."""

import csv
import json
import math

import numpy as np
import pytest
import scipy.stats
import torch
from conftest import write_scenario

from raysim import cli
from raysim.core.tasks import TASKS, ece, lower_is_better
from raysim.engine.driver import summarize
from raysim.experiment.runner import best_over, time_to_target
from raysim.results import report

CE = TASKS["classification"]


def test_top5_accuracy_only_beyond_five_classes():
    # 7 classes ranked 0 > 1 > ... > 6 for every sample: class 0 is top-1, classes 0..4 the
    # top 5; labels 0 (top-1), 4 (5th: top-5 only) and 5 (6th: neither)
    out = torch.tensor([[6.0, 5, 4, 3, 2, 1, 0]]).repeat(3, 1)
    got = CE.scores(out, torch.tensor([0, 4, 5]), "global_")
    assert got["global_accuracy"] == pytest.approx(1 / 3)
    assert got["global_top5_accuracy"] == pytest.approx(2 / 3)
    assert "top5_accuracy" not in CE.scores(out[:, :5], torch.tensor([0, 4, 3]))  # 5 classes: none
    assert "top5_accuracy" in CE.scores(out[:, :6], torch.tensor([0, 4, 3]))


def test_ece_and_loss_by_hand():
    # outputs are log-probabilities, so the softmax gives p back; 15 bins (k/15, (k+1)/15]:
    #   sample  p                  label  pred  correct  conf  bin
    #   0       (.9, .05, .05)     0      0     1        .9    13 (.8667, .9333]
    #   1       (.9, .05, .05)     1      0     0        .9    13
    #   2       (.5, .3, .2)       0      0     1        .5     7 (.4667, .5333]
    #   3       (.35, .45, .2)     0      1     0        .45    6 (.4, .4667]
    # ECE = 2/4·|1/2 − .9| + 1/4·|1 − .5| + 1/4·|0 − .45| = .2 + .125 + .1125 = .4375
    p = torch.tensor([[0.9, 0.05, 0.05], [0.9, 0.05, 0.05], [0.5, 0.3, 0.2], [0.35, 0.45, 0.2]], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 0])
    got = CE.scores(p.log(), y)
    assert got["ece"] == pytest.approx(0.4375, abs=1e-12)
    assert got["accuracy"] == 0.5
    assert got["test_loss"] == pytest.approx(
        -(math.log(0.9) + math.log(0.05) + math.log(0.5) + math.log(0.35)) / 4, rel=1e-6
    )
    assert "top5_accuracy" not in got
    # a perfectly calibrated bin gives 0: two samples at confidence .5, one right, one wrong
    half = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64).clamp_min(1e-300).log()
    assert ece(half, torch.tensor([True, False])) == pytest.approx(0.0, abs=1e-12)
    assert lower_is_better("ece") and lower_is_better("global_ece") and not lower_is_better("top5_accuracy")


def test_ece_matches_the_textbook_loop_on_random_logits():
    # Guo et al.'s loop (SuPerFed's code follows it): bins (lo, hi] from linspace(0, 1, 16)
    g = torch.Generator().manual_seed(0)
    out, y = 3 * torch.randn(500, 10, generator=g, dtype=torch.float64), torch.randint(10, (500,), generator=g)
    conf, pred = torch.softmax(out, -1).max(-1)
    right = (pred == y).double()
    edges = torch.linspace(0, 1, 16, dtype=torch.float64)
    want = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            want += float(inside.double().mean() * (right[inside].mean() - conf[inside].mean()).abs())
    assert CE.scores(out, y)["ece"] == pytest.approx(want, abs=1e-12)
    assert CE.scores(out, y)["test_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), abs=1e-12)
    in_top5 = (out.topk(5, 1).indices == y[:, None]).any(1)  # no ties in random logits
    assert CE.scores(out, y)["top5_accuracy"] == pytest.approx(float(in_top5.double().mean()))


def test_std_over_clients_weighted_by_test_size():
    results = {
        2: ({"accuracy": 0.5}, 0),  # no test split: left out
        1: ({"accuracy": 0.0, "ece": 0.3}, 3),
        0: ({"accuracy": 1.0, "ece": 0.1}, 1),
    }
    got = summarize(results)
    # mean (1·1 + 3·0)/4 = .25; std sqrt((1·.75² + 3·.25²)/4) = sqrt(.1875)
    assert got["accuracy"] == pytest.approx(0.25)
    assert got["accuracy_std"] == pytest.approx(math.sqrt(0.1875))
    assert got["bottom_decile_accuracy"] == pytest.approx(0.1)  # 10th percentile of (1, 0)
    # ece: mean (.1 + .9)/4 = .25; std sqrt((.15² + 3·.05²)/4) = sqrt(.0075); lower is better:
    # its bottom decile is the 90th percentile of (.1, .3) = .28
    assert got["ece"] == pytest.approx(0.25) and got["ece_std"] == pytest.approx(math.sqrt(0.0075))
    assert got["bottom_decile_ece"] == pytest.approx(0.28)
    # equal test sizes: the population std of the values (SuPerFed's std(unbiased=False))
    even = summarize({c: ({"accuracy": a}, 7) for c, a in enumerate([0.2, 0.5, 0.9])})
    assert even["accuracy_std"] == pytest.approx(np.std([0.2, 0.5, 0.9]))


def test_ece_of_the_union_of_test_splits_pools_the_bins():
    # client 0: one sample, conf .9 (bin 13), right: gap +.1, ECE .1
    # client 1: conf .9 wrong (bin 13: −.9) and conf .5 right (bin 7: +.5): ECE (.9 + .5)/2 = .7
    # the mean over clients weighted by test size: (1·.1 + 2·.7)/3 = .5; the union's bins:
    # 13: .1 − .9 = −.8, 7: +.5, so its ECE is (.8 + .5)/3 = .4333 (at most the mean)
    p0 = torch.tensor([[0.9, 0.05, 0.05]], dtype=torch.float64).log()
    p1 = torch.tensor([[0.9, 0.05, 0.05], [0.5, 0.3, 0.2]], dtype=torch.float64).log()
    y0, y1 = torch.tensor([0]), torch.tensor([1, 0])
    s0, s1 = CE.scores(p0, y0, "global_"), CE.scores(p1, y1, "global_")
    assert (s0["global_ece"], s1["global_ece"]) == (pytest.approx(0.1), pytest.approx(0.7))
    got = summarize({1: (s1, 2), 0: (s0, 1)})
    assert got["global_ece"] == pytest.approx(0.5)
    assert got["global_ece_union"] == pytest.approx(1.3 / 3, abs=1e-12)
    assert got["global_ece_union"] == pytest.approx(
        ece(torch.cat([p0, p1]), torch.tensor([True, False, True])), abs=1e-12
    )
    assert "global_ece_bins" not in got and "global_ece_union_std" not in got
    # accuracy and loss: the mean weighted by test size is the union's value
    assert got["global_accuracy"] == pytest.approx(2 / 3)


HISTORY = [
    {
        "round": 1,
        "accuracy": 0.5,
        "accuracy_std": 0.1,
        "bottom_decile_accuracy": 0.3,
        "test_loss": 2.0,
        "test_loss_std": 0.2,
        "ece": 0.3,
        "ece_std": 0.1,
        "round_seconds": 1.0,
        "eval_seconds": 0.1,
    },
    {"round": 2, "train_loss": 1.0, "round_seconds": 2.0},  # not evaluated
    {
        "round": 3,
        "accuracy": 0.7,
        "accuracy_std": 0.2,
        "bottom_decile_accuracy": 0.6,
        "test_loss": 2.5,
        "test_loss_std": 0.2,
        "ece": 0.2,
        "ece_std": 0.1,
        "round_seconds": 0.5,
        "eval_seconds": 0.1,
    },
    {
        "round": 4,
        "accuracy": 0.6,
        "accuracy_std": 0.3,
        "bottom_decile_accuracy": 0.2,
        "test_loss": 1.5,
        "test_loss_std": 0.2,
        "ece": 0.4,
        "ece_std": 0.1,
        "round_seconds": 4.0,
        "eval_seconds": 0.1,
    },
]


def test_acc_t_is_the_best_of_every_mean_over_the_evaluations():
    evaluated = [h for h in HISTORY if "eval_seconds" in h]
    # the largest accuracy, the smallest loss and ECE; nothing for stds and bottom deciles
    assert best_over(evaluated) == {"best_accuracy": 0.7, "best_test_loss": 1.5, "best_ece": 0.2}


def test_time_to_target_round_and_seconds():
    # accuracy .65 is first reached in round 3; the rounds took 1 + 2 + .5 s
    assert time_to_target(HISTORY, "accuracy", 0.65) == {"target_round": 3, "target_seconds": 3.5}
    assert time_to_target(HISTORY, "accuracy", 0.5) == {"target_round": 1, "target_seconds": 1.0}
    assert time_to_target(HISTORY, "accuracy", 0.9) == {}  # never
    mse = [{"round": r, "mse": v, "round_seconds": 1.0} for r, v in ((1, 0.5), (2, 0.3), (3, 0.2))]
    assert time_to_target(mse, "mse", 0.3) == {"target_round": 2, "target_seconds": 2.0}  # lower is better


DIGITS = """
name: digits_metrics
seed: 0
rounds: 4
data: {{dataset: digits, clients: 6, partition: {{kind: dirichlet, alpha: 0.5}}}}
model: {{name: linear}}
algorithm: {{name: fedavg, lr: 0.1, batch_size: 16}}
eval: {{every: 1, target: 0.6}}
resources: {{hosts: 1}}
tracking: {{uri: 'sqlite:///{tmp}/m.db'}}
checkpoint: {{every: 0, dir: '{tmp}/ck'}}
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digits")
    path = write_scenario(tmp, DIGITS.format(tmp=tmp))
    out = tmp / "s.json"
    assert cli.main(["run", path, "--engine", "serial", "-q", "--summary", str(out)]) == 0
    return tmp, json.loads(out.read_text())


def test_end_to_end_summary_has_every_metric(digits):
    tmp, s = digits
    final, evaluated = s["final"], s["history"]
    for k in ("accuracy", "top5_accuracy", "ece", "test_loss", "global_top5_accuracy", "global_ece"):
        assert k in final and f"{k}_std" in final and f"best_{k}" in final and f"bottom_decile_{k}" in final
    assert 0 < final["accuracy_std"] < 0.5 and 0 <= final["ece"] <= 1
    # the union's ECE is at most the clients' mean (triangle inequality), up to the float64 rounding of the sums
    assert 0 <= final["global_ece_union"] <= final["global_ece"] + 1e-12 and "best_global_ece_union" in final
    assert final["accuracy"] <= final["top5_accuracy"] <= 1
    assert final["best_accuracy"] == max(h["accuracy"] for h in evaluated)
    assert final["best_test_loss"] == min(h["test_loss"] for h in evaluated)
    # FedAvg's global model on the union of the test splits: accuracy and loss are test-size
    # weighted means, so they equal the personalized (the same model) ones
    assert final["global_accuracy"] == final["accuracy"] and final["global_test_loss"] == final["test_loss"]
    first = next(h for h in evaluated if h["accuracy"] >= 0.6)
    assert final["target_round"] == first["round"]
    assert final["target_seconds"] == pytest.approx(
        sum(h["round_seconds"] for h in evaluated if h["round"] <= first["round"])
    )
    # the summary-only numbers are logged to MLflow too
    _, client = report.client_for(f"sqlite:///{tmp}/m.db")
    m = client.get_run(s["mlflow_run_id"]).data.metrics
    assert m["best_accuracy"] == final["best_accuracy"] and m["target_round"] == final["target_round"]
    assert m["ece_std"] == final["ece_std"]


def test_compare_over_clients_and_chosen_metrics(digits, tmp_path):
    tmp, s = digits
    f = s["final"]
    uri = f"sqlite:///{tmp}/m.db"
    rid = s["mlflow_run_id"]
    assert (
        cli.main(
            [
                "compare",
                rid,
                "--tracking-uri",
                uri,
                "--out",
                str(tmp_path),
                "--metrics",
                "accuracy,ece,best_accuracy",
                "--over",
                "clients",
            ]
        )
        == 0
    )
    lines = (tmp_path / "compare.md").read_text().splitlines()
    assert lines[0] == (
        "| method | digits accuracy (avg / bottom decile) | digits ece (avg / bottom decile) "
        "| digits best_accuracy (avg / bottom decile) |"
    )
    want = (
        f"| fedavg | {100 * f['accuracy']:.1f} ± {100 * f['accuracy_std']:.1f} / "
        f"{100 * f['bottom_decile_accuracy']:.1f} (n=1) | "
        f"{f['ece']:.4g} ± {f['ece_std']:.2g} / {f['bottom_decile_ece']:.4g} (n=1) | "
        f"{100 * f['best_accuracy']:.1f} / - (n=1) |"
    )
    assert want in lines
    assert any(line.startswith("Mean ± std over clients") for line in lines)
    rows = list(csv.DictReader(open(tmp_path / "compare.csv")))
    assert [r["metric"] for r in rows] == ["accuracy", "ece", "best_accuracy"]
    assert float(rows[0]["std"]) == pytest.approx(f["accuracy_std"]) and rows[0]["std_over"] == "clients"
    assert rows[2]["std"] == ""  # a best has no std over clients
    # over seeds (one seed): std 0
    assert cli.main(["compare", rid, "--tracking-uri", uri, "--out", str(tmp_path), "--metrics", "ece"]) == 0
    assert (
        f"| fedavg | {f['ece']:.4g} ± 0 / {f['bottom_decile_ece']:.4g} ± 0 (n=1) |"
        in (tmp_path / "compare.md").read_text().splitlines()
    )
    assert cli.main(["compare", rid, "--tracking-uri", uri, "--out", str(tmp_path), "--metrics", "nope"]) == 2


def test_fairness_numbers_of_the_clients_accuracies_by_hand():
    # accuracies .2, .5, .9, .4 (N = 4: the worst and best 10 % are one client each)
    got = summarize({c: ({"accuracy": a}, 5 + c) for c, a in enumerate([0.2, 0.5, 0.9, 0.4])})
    assert got["worst_accuracy"] == 0.2 and got["worst10_accuracy"] == 0.2 and got["best10_accuracy"] == 0.9
    # normalized: (.1, .25, .45, .2); H = .230259 + .346574 + .359328 + .321888 = 1.258048, scipy's entropy agrees
    assert got["entropy_accuracy"] == pytest.approx(1.258048, abs=1e-6)
    assert got["entropy_accuracy"] == pytest.approx(scipy.stats.entropy([0.2, 0.5, 0.9, 0.4]))
    # N = 20: ⌊0.1·N⌋ = 2 clients; a client with a 0 adds nothing to the entropy (0·log 0 = 0)
    accs = [0.0, 0.1] + [0.5] * 16 + [0.8, 1.0]
    got = summarize({c: ({"accuracy": a, "test_loss": 1.0}, 3) for c, a in enumerate(accs)}, "val_")
    assert got["val_worst10_accuracy"] == pytest.approx(0.05) and got["val_best10_accuracy"] == pytest.approx(0.9)
    assert got["val_entropy_accuracy"] == pytest.approx(scipy.stats.entropy(accs))
    assert "val_worst_test_loss" not in got  # accuracies only
    # every client equal: the entropy is log N, its largest value
    assert summarize({c: ({"accuracy": 0.7}, 1) for c in range(8)})["entropy_accuracy"] == pytest.approx(math.log(8))


def test_the_compare_table_shows_accuracies_in_percent_but_not_their_entropy():
    from raysim.results.tables import percent

    assert percent("worst_accuracy") and percent("val_worst10_accuracy") and percent("accuracy")
    assert not percent("entropy_accuracy") and not percent("test_loss")
