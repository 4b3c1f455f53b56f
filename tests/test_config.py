"""Every class of scenario error is one line naming the file and key, exit code 2, no traceback."""

import subprocess
import sys

import pytest

from raysim import cli
from raysim.algorithms import REGISTRY
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import TINY, write_scenario

NAMES = ", ".join(REGISTRY)  # the refusal lists every registered algorithm, in registry order


def load_text(tmp_path, text, overrides=()):
    return config.load(write_scenario(tmp_path, text), list(overrides))


def error_of(tmp_path, text, overrides=()):
    with pytest.raises(ScenarioError) as e:
        load_text(tmp_path, text, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(tmp_path / "s.yaml"))
    return msg


def test_valid_scenario_loads_with_defaults(tmp_path):
    sc = load_text(tmp_path, TINY)
    assert sc.algorithm.name == "fedavg" and sc.algorithm.params.lr == 0.1
    assert sc.algorithm.params.local_epochs == 1  # default from the dataclass
    assert sc.sampling.fraction == 0.5 and sc.data.dataset.params.dim == 10


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("algorithm.name=fedavgg", "algorithm.name", "choose one of " + NAMES),
        ("algorithm.lrr=0.1", "algorithm.lrr", "unknown key"),
        ("algorithm.lr=fast", "algorithm.lr", "not a number"),
        ("algorithm.lr=-1", "algorithm.lr", "must be > 0"),
        ("algorithm.lr_schedule=cosine", "algorithm.lr_schedule", "choose one of constant, step"),
        ("sampling.fraction=1.5", "sampling.fraction", "must be > 0.0 and <= 1.0"),
        ("sampling.fraction=0", "sampling.fraction", "must be > 0.0"),
        ("data.clients=0", "data.clients", "must be an integer from 1 to 9223372036854775807"),
        ("data.clients=2.5", "data.clients", "not an integer"),
        ("rounds=true", "rounds", "not an integer"),
        ("resources.hosts=-2", "resources.hosts", "must be an integer from 1 to"),
        ("data.dataset=cifar", "data.dataset", "choose one of"),
        ("model.name=resnet", "model.name", "choose one of linear, mlp, twonn, twocnn, simplecnn, femnist_cnn"),
        ("colour=blue", "colour", "unknown section"),
        ("data.splits.test=0.5", "data.splits", "must sum to 1"),
        ("sampling={count: 100}", "sampling.count", "more than the 12 training clients"),
        ("data.partition.kind=dirichlet", "data.partition", "partition applies only to"),
        ("algorithm.stacking=sometimes", "algorithm.stacking", "choose one of auto, always, padded, never"),
        ("algorithm.optimizer=lbfgs", "algorithm.optimizer", "choose one of sgd, adam"),
        ("topology={kind: ring, weighting: size}", "topology.weighting", "choose one of uniform, samples"),
        ("topology={kind: ring, mixing: fmmc, fmmc_iters: 0}", "topology.fmmc_iters", "must be an integer from 1 to"),
    ],
)
def test_bad_values_name_the_key(tmp_path, override, key, words):
    msg = error_of(tmp_path, TINY, [override])
    assert f": {key}" in msg and words in msg, msg


def test_override_syntax_errors(tmp_path):
    assert "expected KEY=VALUE" in error_of(tmp_path, TINY, ["rounds"])
    assert "is not a mapping" in error_of(tmp_path, TINY, ["rounds.x=1"])


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "empty file"),
        (b"   \n# only a comment\n", "empty file"),
        (b"- a\n- b\n", "the document is list"),
        (b"just a string", "the document is str"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00", "binary content"),
        (b"\xff\xfe\xfa garbage", "not UTF-8"),
        (b"rounds: [1, 2\n", "invalid YAML at line"),
    ],
)
def test_file_level_errors(tmp_path, content, words):
    p = tmp_path / "s.yaml"
    p.write_bytes(content)
    with pytest.raises(ScenarioError) as e:
        config.load(str(p))
    assert words in str(e.value) and str(p) in str(e.value)


def test_missing_file_and_missing_sections(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        config.load(str(tmp_path / "nope.yaml"))
    msg = error_of(tmp_path, "rounds: 3\ndata: {dataset: synthetic, clients: 3}\nmodel: linear\n")
    assert "algorithm: missing required section" in msg


def test_missing_data_files_are_input_errors(tmp_path):
    text = TINY.replace(
        "dataset: synthetic\n  clients: 12\n  dim: 10\n  max_samples: 80",
        f"dataset: fashion_mnist\n  clients: 12\n  root: {tmp_path}/none",
    )
    msg = error_of(tmp_path, text)
    assert ": data:" in msg and "dataset-fashion-mnist" in msg


def test_model_that_does_not_fit_the_data(tmp_path):
    msg = error_of(tmp_path, TINY, ["model.name=femnist_cnn"])
    assert "model.name" in msg and "1x28x28" in msg


def test_cli_exit_code_2_one_line_no_traceback(tmp_path):
    path = write_scenario(tmp_path, TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "validate", path, "--set", "algorithm.name=fedavgg"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0] == (f"raysim: {path}: algorithm.name: 'fedavgg' is not one of the choices; choose one of " + NAMES)


def test_cli_validate_and_list(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY)
    assert cli.main(["validate", path]) == 0
    assert "ok (fedavg on synthetic, 12 clients, 3 rounds)" in capsys.readouterr().out
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in (
        *REGISTRY,
        "synthetic",
        "gaussian",
        "fashion_mnist",
        "linear",
        "mlp",
        "femnist_cnn",
        "dirichlet",
        "shards",
        "iid",
    ):
        assert f"  {name} " in out


def test_every_shipped_scenario_validates():
    import glob

    for path in sorted(glob.glob("scenarios/*.yaml")) + sorted(glob.glob("bench/*.yaml")):
        for _, sc in config.load_variants(path, check_data=False):
            assert sc.rounds >= 1, path


def test_the_resolved_scenario_gives_every_key_and_validates_back_to_the_same_scenario():
    """config.resolved (a run's scenario/resolved.json): every shipped scenario and variant,
    through JSON, validates to the scenario it came from; the keys a file leaves out are
    there at their defaults."""
    import dataclasses
    import glob
    import json

    count = 0
    for path in sorted(glob.glob("scenarios/*.yaml")) + sorted(glob.glob("bench/*.yaml")):
        for variant, sc in config.load_variants(path, check_data=False):
            full = json.loads(json.dumps(config.resolved(sc)))
            back = config.validate(full, path, check_data=False)
            assert dataclasses.replace(back, raw=sc.raw) == sc, (path, variant)
            count += 1
    assert count > 50
    quick = config.resolved(config.load("scenarios/quickstart.yaml", check_data=False))
    assert list(quick) == list(config.TOP_KEYS)
    assert quick["algorithm"]["momentum"] == 0.0 and quick["resources"]["max_host_losses"] == 3  # not in the file
    assert quick["data"]["partition"] == {"kind": "dirichlet", "alpha": 0.5, "min_size": 2}
    assert quick["sampling"] == {"fraction": 0.5, "count": None} and quick["topology"] is None


SWEEP = (
    TINY
    + """
sweep:
  slow: {algorithm.lr: 0.01}
  prox: {algorithm: {name: fedprox, mu: 0.1}}
"""
)


def test_sweep_variants_apply_their_overrides_then_the_command_line(tmp_path):
    path = write_scenario(tmp_path, SWEEP)
    variants = config.load_variants(path, ["rounds=7"])
    assert [v for v, _ in variants] == ["slow", "prox"]
    slow, prox = variants[0][1], variants[1][1]
    assert slow.name == "tiny-slow" and slow.algorithm.params.lr == 0.01 and slow.rounds == 7
    assert prox.algorithm.name == "fedprox" and prox.algorithm.params.mu == 0.1
    assert [v for v, _ in config.load_variants(path, only="prox")] == ["prox"]
    with pytest.raises(ScenarioError, match="no such variant; choose one of slow, prox"):
        config.load_variants(path, only="fast")
    with pytest.raises(ScenarioError, match="this file is a sweep"):
        config.load(path)


def test_sweep_errors_name_the_variant(tmp_path):
    path = write_scenario(tmp_path, TINY + "sweep:\n  bad: {algorithm.lr: -1}\n")
    with pytest.raises(ScenarioError, match=r"algorithm.lr: -1.0 is out of range.*\(in sweep variant 'bad'\)"):
        config.load_variants(path)
    path = write_scenario(tmp_path, TINY + "sweep: [1, 2]\n")
    with pytest.raises(ScenarioError, match="sweep: expected a mapping of variant names"):
        config.load_variants(path)


def test_relative_paths_are_made_absolute_at_the_driver(tmp_path, monkeypatch):
    # host actors may run on other nodes, in other working directories
    from raysim.scenario.config import load
    from tests.conftest import TINY, write_scenario

    path = write_scenario(tmp_path, TINY + "tracking: {uri: 'sqlite:///runs/m.db'}\ncheckpoint: {dir: ck}\n")
    monkeypatch.chdir(tmp_path)
    sc = load(path)
    assert sc.checkpoint.dir == str(tmp_path / "ck")
    assert sc.tracking.uri == f"sqlite:///{tmp_path}/runs/m.db"
    assert sc.raw["checkpoint"]["dir"] == "ck"  # the user's text is kept
    fm_path = write_scenario(
        tmp_path,
        TINY.replace("dataset: synthetic", "dataset: fashion_mnist\n  root: data/fm")
        .replace("  dim: 10\n", "")
        .replace("  max_samples: 80\n", ""),
        "fm.yaml",
    )
    fm = load(fm_path, check_data=False)
    assert str(fm.data.dataset.params.root) == str(tmp_path / "data" / "fm")
