"""`raysim report`: every figure drawn from real runs read back from MLflow (and logged to
them), and from hand-made summaries for the methods whose runs are long (SuPerFed's λ curve,
SosicFL's simplex, a clustered method's center/source table). Each PNG is opened and must be
sized and not blank."""

import json

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image

from raysim import cli
from raysim.experiment.runner import run as run_scenario
from raysim.results import report
from raysim.scenario import config


def looks_drawn(path, min_size=(400, 300)):
    img = Image.open(path)
    assert img.size[0] >= min_size[0] and img.size[1] >= min_size[1], (path, img.size)
    px = np.asarray(img.convert("L"), dtype=float)
    assert px.std() > 15 and (px < 128).mean() > 0.005, path  # lines and text, not a blank page


def small(name, tmp_path, *extra):
    sc = config.load(
        ROOT / "scenarios" / name,
        [
            "rounds=4",
            "eval.every=2",
            "data.clients=20",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
            f"checkpoint.dir={tmp_path}/ck",
            *extra,
        ],
    )
    return run_scenario(sc, engine="serial", progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return tmp, {
        "fedem": small("synthetic_fedem.yaml", tmp),
        "dfedem": small("synthetic_dfedem.yaml", tmp),
        "fedavg": small("synthetic_fedavg.yaml", tmp),
    }


def test_the_compare_figure_draws_one_curve_per_method_of_one_file_averaging_its_seeds(runs, tmp_path):
    """Two methods run from one file (--set algorithm.name=fedavg+, same scenario name) are
    two curves, each labelled with its method, and two seeds of FedAvg one curve, their mean
    (compare_accuracy.csv: the numbers drawn)."""
    import csv

    tmp, s = runs
    seed1 = small("synthetic_fedavg.yaml", tmp, "seed=1")
    plus = small("synthetic_fedavg.yaml", tmp, "algorithm.name=fedavg+")
    out = tmp_path / "rep"
    ids = [s["fedavg"]["mlflow_run_id"], seed1["mlflow_run_id"], plus["mlflow_run_id"]]
    assert cli.main(["report", *ids, "--tracking-uri", f"sqlite:///{tmp}/m.db", "--out", str(out), "--no-log"]) == 0
    looks_drawn(out / "compare_accuracy.png")
    rows = list(csv.DictReader(open(out / "compare_accuracy.csv")))
    by = {(r["label"], r["metric"]): r for r in rows if r["round"] == "4"}
    assert sorted(by) == [
        ("synthetic-fedavg (fedavg+, 1 run)", "accuracy"),
        ("synthetic-fedavg (fedavg+, 1 run)", "bottom_decile_accuracy"),
        ("synthetic-fedavg (fedavg, 2 runs)", "accuracy"),
        ("synthetic-fedavg (fedavg, 2 runs)", "bottom_decile_accuracy"),
    ]
    two = [s["fedavg"]["final"]["accuracy"], seed1["final"]["accuracy"]]
    assert float(by["synthetic-fedavg (fedavg, 2 runs)", "accuracy"]["mean"]) == pytest.approx(np.mean(two))
    assert float(by["synthetic-fedavg (fedavg, 2 runs)", "accuracy"]["std"]) == pytest.approx(np.std(two, ddof=1))
    assert float(by["synthetic-fedavg (fedavg+, 1 run)", "accuracy"]["mean"]) == pytest.approx(
        plus["final"]["accuracy"]
    )
    assert [r["round"] for r in rows[:2]] == ["2", "4"]  # evaluated every 2 rounds


def test_compare_groups_seeds_of_a_configuration_and_tells_apart_what_differs():
    """By hand: two seeds of FedAvg (0.5, 0.7 then 0.6, 0.8: mean 0.6, 0.7, std 0.1414), a
    sweep's variant, and a run of the same file and method with another lr, named by the key
    that differs."""

    def run(seed, accs, algorithm="fedavg", name="quick", lr=0.1, variant=None):
        history = [
            {"round": r, "accuracy": a, "bottom_decile_accuracy": a - 0.2, "eval_seconds": 0.1}
            for r, a in zip((5, 10), accs)
        ]
        summary = {
            "name": name,
            "algorithm": algorithm,
            "seed": seed,
            "mlflow_run_id": f"{name}{algorithm}{seed}{lr}",
            "history": history,
        }
        scenario = {
            "name": name,
            "seed": seed,
            "algorithm": {"name": algorithm, "lr": lr},
            "resources": {"hosts": 2 + seed},
            "tracking": {"uri": f"sqlite:///{seed}.db"},
        }
        return report.Compared(summary, scenario, {"variant": variant} if variant else {})

    runs = [
        run(0, [0.5, 0.6]),
        run(1, [0.7, 0.8]),
        run(0, [0.4, 0.5], lr=0.05),
        run(0, [0.9, 0.9], "fedprox", "quick-prox", variant="prox"),
        run(0, [0.3, 0.3], "fedprox", variant="mu"),
    ]
    labels = [label for label, _ in report.compare_groups(runs)]
    assert labels == [
        "quick (fedavg, algorithm.lr=0.1, 2 runs)",
        "quick (fedavg, algorithm.lr=0.05, 1 run)",
        "quick-prox (fedprox, 1 run)",
        "quick (fedprox, variant mu, 1 run)",
    ]
    first = report.compare_curves(runs)[0]
    assert (first.label, first.key, first.rounds) == (labels[0], "accuracy", [5, 10])
    assert first.mean == pytest.approx([0.6, 0.7]) and first.std == pytest.approx([0.141421, 0.141421], abs=1e-6)


def test_report_draws_each_runs_figures_and_logs_them_to_mlflow(runs, tmp_path, capsys):
    tmp, s = runs
    ids = [s[k]["mlflow_run_id"] for k in ("fedem", "dfedem", "fedavg")]
    out = tmp_path / "rep"
    assert cli.main(["report", *ids, "--tracking-uri", f"sqlite:///{tmp}/m.db", "--out", str(out)]) == 0
    names = {i: sorted(p.name for p in (out / i).glob("*.png")) for i in ids}
    assert names[ids[0]] == ["accuracy.png", "clients.png", "mixture_weights.png"]
    assert names[ids[1]] == ["accuracy.png", "clients.png", "consensus.png", "graph.png", "mixture_weights.png"]
    assert names[ids[2]] == ["accuracy.png", "clients.png"]
    for i in ids:
        for n in names[i]:
            looks_drawn(out / i / n)
    looks_drawn(out / "compare_accuracy.png")
    _, client = report.client_for(f"sqlite:///{tmp}/m.db")
    logged = sorted(a.path for a in client.list_artifacts(ids[0], "report"))
    assert logged == [f"report/{n}" for n in names[ids[0]]]
    # the per-client scores behind the histogram: their test-weighted mean is the reported accuracy
    final = s["fedem"]["final"]
    scores = final["client_accuracy"]
    assert len(scores) == 20 and min(scores.values()) >= 0
    assert np.percentile(list(scores.values()), 10) == pytest.approx(final["bottom_decile_accuracy"])


def test_report_of_an_unknown_run_is_one_line_and_exit_2(runs, capsys):
    tmp, _ = runs
    assert cli.main(["report", "0" * 32, "--tracking-uri", f"sqlite:///{tmp}/m.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no run {'0' * 32} in the tracking store" in err[0]


def hand_summary(algorithm, final, history=None):
    history = history or [
        {"round": r, "accuracy": 0.5 + 0.1 * r, "bottom_decile_accuracy": 0.3 + 0.1 * r, "eval_seconds": 0.1}
        for r in range(1, 4)
    ]
    return {"name": "hand", "algorithm": algorithm, "dataset": "d", "seed": 0, "final": final, "history": history}


def test_superfed_sosicfl_and_cluster_figures(tmp_path):
    lam = report.figures(
        hand_summary(
            "superfed",
            {
                "lambda_curve": {"0.0": 0.6, "0.5": 0.7, "1.0": 0.65},
                "lambda_curve_std": {"0.0": 0.05, "0.5": 0.04, "1.0": 0.06},
            },
        ),
        None,
        tmp_path / "lam",
    )
    assert [p.name for p in lam] == ["accuracy.png", "lambda_curve.png"]
    rng = np.random.default_rng(0)
    alpha = rng.dirichlet(np.ones(3), size=30)
    simplex = {
        "alpha": {str(c): a.tolist() for c, a in enumerate(alpha)},
        "cluster": {str(c): int(a.argmax()) for c, a in enumerate(alpha)},
        "centres": np.eye(3).tolist(),
        "eta": 0.3,
    }
    sx = report.figures(hand_summary("sosicfl", {"simplex": simplex}), None, tmp_path / "sx")
    assert [p.name for p in sx] == ["accuracy.png", "simplex.png"]
    clus = report.figures(
        hand_summary(
            "fedsoft",
            {
                "importance": {str(c): [0.9, 0.1] if c < 5 else [0.2, 0.8] for c in range(12)},
                "center_source": [[0.9, 0.2], [0.3, 0.8]],
                "association": [0, 1],
            },
        ),
        None,
        tmp_path / "cl",
    )
    assert [p.name for p in clus] == ["accuracy.png", "clusters.png"]
    for p in lam + sx + clus:
        looks_drawn(p)
    # a regression run: the metric is mse, its bottom decile the 90th percentile
    mse = hand_summary(
        "fedsoft",
        {"client_mse": {str(c): float(c) for c in range(20)}},
        [{"round": 1, "mse": 2.0, "bottom_decile_mse": 3.0, "eval_seconds": 0.1}],
    )
    assert report.metric_of(mse) == "mse"
    assert [p.name for p in report.figures(mse, None, tmp_path / "mse")] == ["accuracy.png", "clients.png"]
    json.dumps(mse)


def test_runs_on_a_fleet_compare_against_virtual_hours_by_hand(tmp_path):
    """Two seeds of a synchronous run (clock 1800 s and 3600 s at rounds 5, 10; the other seed
    3600 s and 7200 s) average to 0.75 and 1.5 hours; an asynchronous run has its own clock. A
    run without a clock leaves the figure out."""

    def run(seed, accs, clock, variant):
        history = [
            {"round": r, "accuracy": a, "virtual_time_s": t, "eval_seconds": 0.1}
            for r, a, t in zip((5, 10), accs, clock)
        ]
        summary = {
            "name": "fleet",
            "algorithm": "fedavg",
            "seed": seed,
            "mlflow_run_id": f"{variant}{seed}",
            "history": history,
        }
        scenario = {"name": "fleet", "seed": seed, "systems": {"aggregation": variant}}
        return report.Compared(summary, scenario, {"variant": variant})

    runs = [
        run(0, [0.5, 0.6], [1800, 3600], "sync"),
        run(1, [0.7, 0.8], [3600, 7200], "sync"),
        run(0, [0.6, 0.9], [360, 720], "fedbuff"),
    ]
    (label, hours, acc), (_, hours2, acc2) = report.time_curves(runs)
    assert hours == pytest.approx([0.75, 1.5]) and acc == pytest.approx([0.6, 0.7])
    assert hours2 == pytest.approx([0.1, 0.2]) and acc2 == pytest.approx([0.6, 0.9])
    assert report.compare_time_figure(runs, tmp_path).name == "compare_time.png"
    plain = run(0, [0.5, 0.6], [1800, 3600], "sync")
    for h in plain.summary["history"]:
        del h["virtual_time_s"]
    assert (
        report.time_curves(runs[:2] + [plain]) is None and report.compare_time_figure([plain, plain], tmp_path) is None
    )
