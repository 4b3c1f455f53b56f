"""A sweep file's grid (``grid: {dotted.key: [values]}``): expanded into ordinary sweep variants,
one per combination, named by their values, crossed with the file's sweep variants and with
seeds; every problem one line naming the file and key (exit 2); a tiny grid run end to end."""

import json

import pytest
from mlflow.tracking import MlflowClient

from raysim import cli
from raysim.results import report
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import TINY, write_scenario


def variants(tmp_path, text, **kw):
    return config.load_variants(write_scenario(tmp_path, TINY + text), check_data=False, **kw)


def test_a_grid_is_the_cartesian_product_of_its_values_named_by_them(tmp_path):
    got = variants(tmp_path, "grid:\n  algorithm.lr: [0.01, 0.1]\n  sampling.fraction: [0.5, 1.0]\n")
    assert [(v, sc.algorithm.params.lr, sc.sampling.fraction) for v, sc in got] == [
        ("lr=0.01,fraction=0.5", 0.01, 0.5),
        ("lr=0.01,fraction=1.0", 0.01, 1.0),
        ("lr=0.1,fraction=0.5", 0.1, 0.5),
        ("lr=0.1,fraction=1.0", 0.1, 1.0),
    ]
    assert got[0][1].name == "tiny-lr=0.01,fraction=0.5"
    # everything else is the base scenario's, the command line's --set applies to every variant
    assert {(sc.rounds, sc.algorithm.params.batch_size) for _, sc in got} == {(3, 16)}
    seeded = config.load_variants(
        write_scenario(tmp_path, TINY + "grid:\n  algorithm.lr: [0.01, 0.1]\n"),
        ["rounds=5"],
        seeds=[0, 1],
        check_data=False,
    )
    assert [(v, sc.seed, sc.rounds) for v, sc in seeded] == [
        ("lr=0.01", 0, 5),
        ("lr=0.01", 1, 5),
        ("lr=0.1", 0, 5),
        ("lr=0.1", 1, 5),
    ]
    one = config.load_variants(
        write_scenario(tmp_path, TINY + "grid:\n  algorithm.lr: [0.01, 0.1]\n"), only="lr=0.1", check_data=False
    )
    assert [(v, sc.algorithm.params.lr) for v, sc in one] == [("lr=0.1", 0.1)]


def test_a_grid_crosses_the_sweeps_variants_and_names_keys_that_share_a_last_part_in_full(tmp_path):
    got = variants(
        tmp_path,
        "sweep:\n  avg: {}\n  prox: {algorithm.name: fedprox, algorithm.mu: 0.1}\n"
        "grid:\n  algorithm.lr: [0.01, 0.1]\n  eval.finetune.lr: [0.5]\n"
        "  algorithm.weight_decay: [0, 0.001]\n",
    )
    names = [v for v, _ in got]
    assert names == [
        f"{m},algorithm.lr={lr},eval.finetune.lr=0.5,weight_decay={wd}"
        for m in ("avg", "prox")
        for lr in ("0.01", "0.1")
        for wd in ("0", "0.001")
    ]
    prox = dict(got)["prox,algorithm.lr=0.1,eval.finetune.lr=0.5,weight_decay=0.001"]
    assert (
        prox.algorithm.name,
        prox.algorithm.params.mu,
        prox.algorithm.params.lr,
        prox.algorithm.params.weight_decay,
        prox.eval.finetune.lr,
    ) == ("fedprox", 0.1, 0.1, 0.001, 0.5)
    assert config.grid_value(True) == "true" and config.grid_value(None) == "null"
    assert config.grid_value({"name": "mlp", "hidden": [64]}) == '{"name":"mlp","hidden":[64]}'


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "grid: [0.1, 0.2]\n",
            "grid: expected a mapping of dotted keys to lists of values, e.g. {algorithm.lr: "
            "[0.01, 0.1], algorithm.mu: [0.1, 1.0]}",
        ),
        ("grid: {}\n", "grid: expected a mapping of dotted keys to lists of values"),
        (
            "grid:\n  algorithm.lr: 0.1\n",
            "grid.algorithm.lr: expected a non-empty list of values, e.g. [0.01, 0.1]; got 0.1",
        ),
        ("grid:\n  algorithm.lr: []\n", "grid.algorithm.lr: expected a non-empty list of values"),
        ("grid:\n  algorithm.lr: [0.1, 0.2, 0.1]\n", "grid.algorithm.lr: 0.1 is listed twice; list each value once"),
        ("grid:\n  seed: [0, 1]\n", "grid.seed: not a grid key; list the seeds in seeds: [0, 1, 2] (or --seeds 0,1,2)"),
        ("grid:\n  algorithm..lr: [0.1]\n", "grid: 'algorithm..lr': empty key segment"),
        (
            "sweep:\n  slow: {algorithm.lr: 0.01}\ngrid:\n  algorithm.lr: [0.1]\n",
            "sweep.slow: sets algorithm.lr, which grid also sets; set it in one place",
        ),
        (
            "grid:\n  algorithm.lr: [0.1, -1]\n",
            "algorithm.lr: -1.0 is out of range; it must be > 0 and <= "
            "3.4028234663852886e+38 (in sweep variant 'lr=-1')",
        ),
        ("grid:\n  algorithm.lrr: [0.1]\n", "algorithm.lrr: unknown key; allowed keys here: lr, "),
        (
            "grid:\n  algorithm.lr: [0.1]\n  sampling.fraction: [0.5, 2]\n",
            "sampling.fraction: 2.0 is out of range; it must be > 0.0 and <= 1.0 (in sweep variant 'lr=0.1,fraction=2')",
        ),
    ],
)
def test_grid_errors_are_one_line_naming_the_file_and_key_exit_2(tmp_path, capsys, text, message):
    path = write_scenario(tmp_path, TINY + text)
    with pytest.raises(ScenarioError) as e:
        config.load_variants(path, check_data=False)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{path}: ")
    assert message in str(e.value), str(e.value)
    assert cli.main(["validate", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_grid_file_is_not_one_scenario_and_an_unknown_variant_lists_the_grids(tmp_path):
    path = write_scenario(tmp_path, TINY + "grid:\n  algorithm.lr: [0.01, 0.1]\n  sampling.fraction: [0.5]\n")
    with pytest.raises(ScenarioError, match="grid: this file is a sweep; run it with `raysim run`"):
        config.load(path)
    with pytest.raises(
        ScenarioError,
        match=r"--variant lr=0.2: no such variant; choose one of "
        r"lr=0.01,fraction=0.5; lr=0.1,fraction=0.5$",
    ):
        config.load_variants(path, only="lr=0.2", check_data=False)


def test_a_tiny_grid_runs_end_to_end_each_variant_the_run_its_settings_give(tmp_path, capsys):
    """Two learning rates x two seeds, serially: four runs under one parent, each tagged with
    its variant, recording its lr, with the accuracy of a plain run with that --set and seed;
    the table has one row per grid point."""
    uri = f"sqlite:///{tmp_path}/m.db"
    text = TINY + (
        f"tracking: {{uri: '{uri}'}}\ncheckpoint: {{dir: '{tmp_path}/ck'}}\nseeds: [0, 1]\n"
        "grid:\n  algorithm.lr: [0.05, 0.3]\n"
    )
    path = write_scenario(tmp_path, text, "grid.yaml")
    out = tmp_path / "sweep.json"
    assert cli.main(["run", path, "-q", "--engine", "serial", "--summary", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| fedavg [lr=0.05] |" in printed and "| fedavg [lr=0.3] |" in printed
    runs = json.loads(out.read_text())["variants"]
    assert sorted(runs) == ["lr=0.05 seed 0", "lr=0.05 seed 1", "lr=0.3 seed 0", "lr=0.3 seed 1"]
    client = MlflowClient(uri)
    for label, summary in runs.items():
        run = client.get_run(summary["mlflow_run_id"])
        variant, seed = label.split(" seed ")
        assert (run.data.tags["variant"], run.data.tags["seed"]) == (variant, seed)
        assert run.data.params["algorithm.lr"] == variant.removeprefix("lr=")
        assert run.info.run_name == f"tiny-{variant}" and run.info.status == "FINISHED"
    (parent,) = {client.get_run(s["mlflow_run_id"]).data.tags["mlflow.parentRunId"] for s in runs.values()}
    assert len(report.expand(client, [parent])) == 4
    plain = write_scenario(
        tmp_path, TINY + f"tracking: {{uri: '{uri}'}}\ncheckpoint: {{dir: '{tmp_path}/ck'}}\n", "plain.yaml"
    )
    alone = tmp_path / "alone.json"
    assert (
        cli.main(
            [
                "run",
                plain,
                "-q",
                "--engine",
                "serial",
                "--set",
                "algorithm.lr=0.3",
                "--set",
                "seed=1",
                "--summary",
                str(alone),
            ]
        )
        == 0
    )
    assert json.loads(alone.read_text())["final"] == runs["lr=0.3 seed 1"]["final"]
