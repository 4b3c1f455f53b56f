"""The Python API (raysim.run, raysim.load): its results are the run's numbers as MLflow holds
them, a dict scenario and dict overrides give what the file and --set give, seeds give the mean
± std computed here by hand, bad input raises ScenarioError, and the tutorial notebook runs
twice on one Ray in one kernel."""

import json
import subprocess
import sys

import nbclient
import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, TINY, write_scenario
from mlflow.tracking import MlflowClient

import raysim
from raysim.api import ScenarioError

FEDEM = TINY.replace("name: fedavg", "name: fedem")
NOTEBOOK = ROOT / "docs" / "tutorials" / "python-api.ipynb"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny FedEM scenario file (tracking and checkpoints in its folder) and its run."""
    tmp = tmp_path_factory.mktemp("api")
    path = write_scenario(
        tmp, FEDEM + f"tracking: {{uri: 'sqlite:///{tmp}/m.db'}}\ncheckpoint: {{every: 0, dir: '{tmp}/ck'}}\n"
    )
    uri = f"sqlite:///{tmp}/m.db"
    return path, uri, raysim.run(path, engine="serial")


def numbers(history: pd.DataFrame) -> pd.DataFrame:
    """The history without its timings (wall-clock seconds differ from run to run)."""
    return history.drop(columns=[c for c in history if c.endswith("_seconds")])


def test_import_raysim_imports_nothing_heavy():
    code = (
        "import sys, raysim; raysim.run, raysim.load, raysim.Result, raysim.SweepResult, raysim.ScenarioError; "
        "print([m for m in ('torch', 'ray', 'mlflow', 'pandas') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


def test_result_is_the_run_as_mlflow_records_it(setup):
    path, uri, a = setup
    assert isinstance(a, raysim.Result) and a.name == "tiny" and a.seed == 0 and a.variant is None
    assert list(a.history.index) == [1, 2, 3]
    # the last row of the history is the final evaluation
    last = a.history.iloc[-1]
    shared = [k for k in a.final if k in last.index]
    assert {"accuracy", "bottom_decile_accuracy", "test_loss"} <= set(shared)
    assert {k: float(last[k]) for k in shared} == {k: a.final[k] for k in shared}
    assert a.final == {k: v for k, v in a.summary["final"].items() if isinstance(v, float)}
    # each round's accuracy is the one logged to MLflow at that step
    client = MlflowClient(uri)
    logged = {m.step: m.value for m in client.get_metric_history(a.run_id, "accuracy")}
    assert logged == a.history["accuracy"].to_dict()
    assert (
        client.get_run(a.run_id).data.metrics["best_accuracy"]
        == a.history["accuracy"].max()
        == a.final["best_accuracy"]
    )
    # per client: 12 clients, FedEM's mixture weights sum to 1, the 10th percentile is the bottom decile
    assert list(a.clients.index) == list(range(12)) and not a.clients["unseen"].any()
    assert a.clients[["weight_0", "weight_1", "weight_2"]].sum(axis=1).to_numpy() == pytest.approx(np.ones(12))
    assert np.percentile(a.clients["accuracy"], 10) == pytest.approx(a.final["bottom_decile_accuracy"])
    assert a.scenario.rounds == 3 and a.scenario.algorithm.name == "fedem" and a.scenario.path == path


def test_load_reads_the_same_run_back(setup):
    _, uri, a = setup
    b = raysim.load(a.run_id, uri)
    pd.testing.assert_frame_equal(b.history, a.history)
    pd.testing.assert_frame_equal(b.clients, a.clients)
    assert b.final == a.final and b.run_id == a.run_id and b.seed == 0
    assert b.scenario.algorithm == a.scenario.algorithm and b.scenario.data == a.scenario.data


def test_a_dict_and_dict_overrides_give_what_the_file_and_set_give(setup):
    path, uri, a = setup
    raw = yaml.safe_load(open(path).read())
    by_dict = raysim.run(raw, {"rounds": 2, "algorithm.lr": 0.05}, engine="serial")
    by_file = raysim.run(path, ["rounds=2", "algorithm.lr=0.05"], engine="serial")
    assert by_dict.scenario.rounds == 2 and by_dict.scenario.algorithm.params.lr == 0.05
    assert by_dict.scenario.path == "<dict>" and list(by_dict.history.index) == [1, 2]
    assert MlflowClient(uri).get_run(by_dict.run_id).data.params["algorithm.lr"] == "0.05"
    pd.testing.assert_frame_equal(numbers(by_dict.history), numbers(by_file.history))
    pd.testing.assert_frame_equal(by_dict.clients, by_file.clients)
    assert by_dict.final == by_file.final
    # the override changed the training: round 2 differs from the run at lr 0.1 (round 1 is
    # evaluated after one round of training, so it differs too)
    assert by_dict.history.loc[2, "train_loss"] != a.history.loc[2, "train_loss"]


def test_seeds_give_a_sweep_result_with_the_mean_and_std_over_seeds(setup):
    path, uri, _ = setup
    s = raysim.run(path, engine="serial", seeds=[0, 1])
    assert isinstance(s, raysim.SweepResult) and list(s.runs) == [(None, 0), (None, 1)]
    acc = np.array([r.final["accuracy"] for r in s.runs.values()])
    bottom = np.array([r.final["bottom_decile_accuracy"] for r in s.runs.values()])
    assert acc[0] != acc[1]
    (row,) = s.table.to_dict("records")
    assert (row["method"], row["dataset"], row["metric"], row["n"]) == ("fedem", "synthetic", "accuracy", 2)
    assert row["mean"] == pytest.approx((acc[0] + acc[1]) / 2)
    assert row["std"] == pytest.approx(abs(acc[0] - acc[1]) / np.sqrt(2))  # sample std of two
    assert row["bottom_decile_mean"] == pytest.approx(bottom.mean())
    assert row["seeds"] == [0, 1] and row["run_ids"] == [r.run_id for r in s.runs.values()]
    assert f"| fedem | {100 * acc.mean():.1f} ± {100 * acc.std(ddof=1):.1f} /" in s.markdown
    # over clients: the mean over seeds of each run's std over clients
    by_clients = s.compare(over="clients").iloc[0]
    assert by_clients["std"] == pytest.approx(np.mean([r.final["accuracy_std"] for r in s.runs.values()]))
    client = MlflowClient(uri)
    assert all(client.get_run(r.run_id).data.tags["mlflow.parentRunId"] == s.parent_run_id for r in s.runs.values())
    assert len(s.history) == 6 and s.history.loc[(None, 1, 3), "accuracy"] == acc[1]
    pd.testing.assert_frame_equal(s.compare("accuracy"), s.table)  # one metric, by name
    # the parent read back: the same runs and table
    back = raysim.load(s.parent_run_id, uri)
    assert isinstance(back, raysim.SweepResult) and list(back.runs) == list(s.runs)
    pd.testing.assert_frame_equal(back.table, s.table)
    pd.testing.assert_frame_equal(back.runs[None, 1].history, s.runs[None, 1].history)


def test_bad_input_raises_scenario_error_naming_the_key_and_runs_nothing(setup):
    path, uri, _ = setup
    before = len(MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("raysim").experiment_id]))
    raw = yaml.safe_load(open(path).read())
    raw["algorithm"]["lrr"] = 0.1
    cases = [
        ((path, {"algorithm.lrr": 0.1}), {}, f"{path}: algorithm.lrr: unknown key; allowed keys here: lr, "),
        ((raw,), {}, "<dict>: algorithm.lrr: unknown key; allowed keys here: lr, "),
        (
            (path, {"algorithm.name": "nope"}),
            {},
            f"{path}: algorithm.name: 'nope' is not one of the choices; choose one of fedavg, ",
        ),
        ((path, ["rounds=0"]), {}, f"{path}: rounds: 0 is out of range; it must be an integer from 1"),
        ((path,), {"engine": "gpu"}, "engine: 'gpu': choose one of ray, serial"),
        ((path,), {"seeds": "0,x"}, "seeds: '0,x' is not a list of integers"),
        ((path,), {"variant": "big"}, f"{path}: variant big: the file has no sweep section"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ScenarioError) as caught:
            raysim.run(*args, engine=kwargs.pop("engine", "serial"), **kwargs)
        assert str(caught.value).startswith(message), str(caught.value)
    assert (
        len(MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("raysim").experiment_id])) == before
    )


@pytest.mark.ray
def test_the_tutorial_notebook_runs_twice_on_one_ray_in_one_kernel(tmp_path, monkeypatch):
    saved = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.outputs and c.execution_count is None for c in saved.cells if c.cell_type == "code")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the notebook's store: mlflow.db beside it
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    def printed(needle):
        cell = next(c for c in nb.cells if c.cell_type == "code" and needle in c.source)
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    # Ray was started by the first run and reused by the second
    assert "starting a local Ray instance and 1 host actor (host 0 in this process)" in printed(
        "fedem = raysim.run(scenario)"
    )
    second = printed('fedavg = raysim.run(scenario, {"algorithm.name": "fedavg"')
    assert "starting 1 host actor (host 0 in this process)" in second and "local Ray" not in second
    # the run loaded back is the FedEM run in the notebook's mlflow.db, with its logged accuracy
    run_id, name, accuracy = printed("again = raysim.load(fedem.run_id)").split()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    assert sorted((r.data.tags["algorithm"], r.info.status) for r in runs) == [
        ("fedavg", "FINISHED"),
        ("fedem", "FINISHED"),
    ]
    fedem = client.get_run(run_id)
    assert fedem.data.tags["algorithm"] == "fedem" and fedem.info.run_name == name
    assert float(accuracy) == pytest.approx(fedem.data.metrics["accuracy"], abs=5e-7)
    assert len(client.get_metric_history(run_id, "accuracy")) == 10
    summary = json.loads(open(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read())
    assert summary["final"]["accuracy"] == fedem.data.metrics["accuracy"]


def test_every_bad_argument_raises_scenario_error_a_value_error_naming_it(tmp_path):
    path = write_scenario(tmp_path, TINY + f"tracking: {{uri: 'sqlite:///{tmp_path}/m.db'}}\n")
    sweep = write_scenario(tmp_path, TINY + "sweep:\n  a: {algorithm.lr: 0.1}\n  b: {algorithm.lr: 0.2}\n", "w.yaml")
    dicts = "give a dict of dotted keys and values, e.g. {'algorithm.lr': 0.01}, or a list of KEY=VALUE strings"
    cases = [
        (lambda: raysim.run(42), "scenario: 42: give a scenario YAML file's path or a dict of its keys"),
        (lambda: raysim.run(path, 42), f"{path}: overrides: 42: {dicts}"),
        (lambda: raysim.run(path, {1: 2}), f"{path}: overrides: key 1 is not a string; {dicts}"),
        (lambda: raysim.run(path, resume=123), "resume: 123: give a run id, a string"),
        (lambda: raysim.run(path, resume=" "), "resume: an empty run id; give the id of the MLflow run to continue"),
        (lambda: raysim.run(sweep, variant=5), "variant: 5: give a variant's name or a shell-style pattern of names"),
        (lambda: raysim.run(sweep, best_of=7), "best_of: 7: give a run id, a string"),
        (lambda: raysim.run(sweep, best_of="a,,b"), "best_of: 'a,,b': give sweep parent run ids, separated by commas"),
        (lambda: raysim.run(path, address=5), "address: 5: give 'auto' or HOST:PORT of a Ray cluster"),
        (lambda: raysim.run(path, seeds=[0, True]), "seeds: [0, True]: give a list of distinct integers >= 0"),
        (lambda: raysim.run(path, progress="no"), "progress: 'no': give True or False"),
        (lambda: raysim.run(path, verbose=1), "verbose: 1: give True or False"),
        (lambda: raysim.load(5), "run_id: 5: give the MLflow run's id, a string"),
        (lambda: raysim.load("abc", 5), "tracking_uri: 5: give an MLflow tracking URI"),
        (
            lambda: raysim.load("abc", "nosuch://x"),
            "tracking_uri: nosuch://x: MLflow has no tracking store for the "
            "scheme 'nosuch'; give a file path or a URI of scheme ",
        ),
        (
            lambda: raysim.SweepResult("p", {}, pd.DataFrame(), "").compare(metrics=5),
            "metrics: 5: give metrics the runs logged",
        ),
    ]
    assert issubclass(raysim.ScenarioError, ValueError)
    for call, message in cases:
        with pytest.raises(ValueError) as caught:  # what a Python user catches
            call()
        assert type(caught.value) is ScenarioError and str(caught.value).startswith(message), str(caught.value)
    assert not (tmp_path / "m.db").exists()  # nothing ran
