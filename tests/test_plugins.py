"""Plugins (raysim.plugins): algorithms, datasets, models and partitioners from a user's package
(entry points) or a module on the path (``module:Name``), and the how-to pages that teach them.

The example packages are the code blocks of docs/how-to/add-algorithm.md (FedAvgM),
docs/how-to/plugins.md (a partitioner, a model, a dataset) and docs/how-to/own-model.md (a model
by ``module:Name``): the tests take them from the pages, install the first two with pip into a
folder of their own and run them, so the guides cannot drift from what works.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from raysim import plugins
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import ROOT, TINY, write_scenario

DOCS = ROOT / "docs" / "how-to"
# a page's file: a line "`path`:" (or "`path`, continued:"), a blank line, a fenced block
FILE = re.compile(r"^`([\w./-]+)`[^`\n]*:\n\n```\w+\n(.*?)^```$", re.M | re.S)


def page_files(page: str) -> dict[str, str]:
    """{path: text} of the files a page shows; blocks of one path are joined in page order."""
    out: dict[str, str] = {}
    for path, text in FILE.findall((DOCS / page).read_text()):
        out[path] = out[path] + "\n\n" + text if path in out else text
    return out


def write(files: dict[str, str], root: Path) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def raysim(*args, path, cwd, check=True):
    """The `raysim` command in a fresh process with PYTHONPATH = ``path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    proc = subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def tracked(tmp: Path, text: str, name: str = "s.yaml") -> str:
    """A scenario whose MLflow store and checkpoints are inside ``tmp``."""
    return write_scenario(
        tmp, text + f"tracking: {{uri: 'sqlite:///{tmp}/mlflow.db'}}\ncheckpoint: {{dir: '{tmp}/ck'}}\n", name
    )


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    """The pages' two packages, installed (no network, no dependencies) into their own folder."""
    root = tmp_path_factory.mktemp("plugins")
    write({**page_files("add-algorithm.md"), **page_files("plugins.md")}, root / "src")
    site = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(root / "src" / "raysim-fedavgm"),
            str(root / "src" / "flkit"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return SimpleNamespace(root=root, src=root / "src", site=site)


@pytest.fixture
def on_path(monkeypatch):
    """Put folders on this process's path as if installed there, with fresh plugin caches."""

    def add(*folders):
        monkeypatch.setattr(plugins, "_SCANS", {})
        monkeypatch.setattr(plugins, "_FOUND", {})
        for name in ("fedavgm", "flkit", "mymodels"):  # a module imported from another folder
            monkeypatch.delitem(sys.modules, name, raising=False)
        for f in folders:
            monkeypatch.syspath_prepend(str(f))
        importlib.invalidate_caches()

    yield add
    for name in ("fedavgm", "flkit", "mymodels"):
        sys.modules.pop(name, None)


# ----------------------------------------------------------------------------- the packages
def test_the_pages_packages_are_complete():
    assert set(page_files("add-algorithm.md")) == {
        "raysim-fedavgm/pyproject.toml",
        "raysim-fedavgm/fedavgm.py",
        "raysim-fedavgm/test_fedavgm.py",
        "raysim-fedavgm/digits_fedavgm.yaml",
    }
    assert set(page_files("plugins.md")) == {"flkit/pyproject.toml", "flkit/flkit.py", "flkit/blobs.yaml"}
    assert set(page_files("own-model.md")) == {"mymodels.py", "digits_body_head.yaml"}


def test_the_guides_own_tests_pass_on_the_installed_fedavgm(pkgs, on_path):
    """add-algorithm.md's test_fedavgm.py: one FedAvgM server step computed by hand
    (w = (2.55, 2), v = (−1.55, 0)) and β = 0 being FedAvg, run on the installed module."""
    on_path(pkgs.site)
    spec = importlib.util.spec_from_file_location("test_fedavgm", pkgs.src / "raysim-fedavgm" / "test_fedavgm.py")
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    assert Path(sys.modules["fedavgm"].__file__).parent == pkgs.site  # the installed copy
    names = [n for n in dir(tests) if n.startswith("test_")]
    assert names == ["test_a_server_step_by_hand", "test_without_momentum_it_is_fedavg"]
    for n in names:
        getattr(tests, n)()


def test_list_shows_every_name_with_its_source(pkgs):
    out = raysim("list", path=[pkgs.site], cwd=pkgs.root).stdout
    rows = {m[1]: m[2] for m in re.finditer(r"^  (\S+)\s+(built-in|\S+ \d\S*)\s+", out, re.M)}
    assert rows["fedavgm"] == "raysim-fedavgm 0.1.0"
    assert rows["blobs"] == rows["resmlp"] == rows["classes"] == "flkit 0.2.0"
    assert rows["fedavg"] == rows["digits"] == rows["mlp"] == rows["dirichlet"] == "built-in"
    assert re.search(r"^  fedavgm\s+raysim-fedavgm 0\.1\.0\s+FedAvgM \(Hsu et al\. 2019\)", out, re.M)
    sections = re.findall(r"^(\w+):$", out, re.M)
    assert sections == ["algorithms", "datasets", "models", "partitioners"]
    # each plugin in its own section
    parts = dict(zip(sections, re.split(r"^\w+:$", out, flags=re.M)[1:]))
    assert "  fedavgm " in parts["algorithms"] and "  blobs " in parts["datasets"]
    assert "  resmlp " in parts["models"] and "  classes " in parts["partitioners"]


def test_the_plugin_partitioner_and_dataset_by_hand(pkgs, on_path):
    """classes, k = 2, 4 clients, labels 0 0 1 1 2 2 3 3: client c holds classes 2c mod 4 and
    2c + 1 mod 4 and one of each class's two samples; blobs.yaml (8 clients, 800 samples, 4
    classes, k = 2): clients 0, 2, 4, 6 hold classes {0, 1}, the others {2, 3}, all 800 dealt."""
    on_path(pkgs.site)
    from raysim.data import partitioner

    spec = partitioner("classes")
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    parts = spec.fn(labels, 4, spec.Params(k=2), np.random.default_rng(0))
    assert [sorted(labels[p].tolist()) for p in parts] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert sorted(np.concatenate([parts[0], parts[2]]).tolist()) == [0, 1, 2, 3]
    assert sorted(np.concatenate([parts[1], parts[3]]).tolist()) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="client 4 gets no sample"):  # it shares class 0's one sample
        spec.fn(np.array([0, 1, 1, 2, 2, 3, 3]), 5, spec.Params(k=1), np.random.default_rng(0))

    path = pkgs.root / "blobs.yaml"
    path.write_text((pkgs.src / "flkit" / "blobs.yaml").read_text())
    sc = config.load(path)  # validates: builds the source and the model
    assert (sc.data.dataset.name, sc.model.name, sc.data.partition.name) == ("blobs", "resmlp", "classes")
    source = config.make_source(sc)
    held = []
    for c in range(8):
        d = source.client(c)
        held.append(set(d.train_y.tolist()) | set(d.test_y.tolist()))
    assert held == [{0, 1}, {2, 3}] * 4
    assert sum(source.num_samples(c) for c in range(8)) == 800


def test_the_add_algorithm_pages_scenario_validates(pkgs, on_path):
    on_path(pkgs.site)
    sc = config.load(pkgs.src / "raysim-fedavgm" / "digits_fedavgm.yaml")
    assert sc.algorithm.name == "fedavgm"
    assert (sc.algorithm.params.server_lr, sc.algorithm.params.server_momentum) == (1.0, 0.5)


# ----------------------------------------------------------------------------- runs
PLUGGED = """
name: plugged
seed: 0
rounds: 8
data:
  dataset: digits
  clients: 10
  partition: {kind: classes, k: 3}
model: {name: resmlp, width: 32}
algorithm: {name: fedavgm, lr: 0.1, batch_size: 16, server_momentum: 0.5}
eval: {every: 4}
resources: {hosts: 2}
"""


def summary(pkgs, name, *extra):
    scenario = tracked(pkgs.root, PLUGGED)
    out = pkgs.root / name
    raysim("run", scenario, "-q", "--summary", str(out), *extra, path=[pkgs.site], cwd=pkgs.root)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def serial(pkgs):
    return summary(pkgs, "serial.json", "--engine", "serial")


def test_the_plugin_algorithm_model_and_partitioner_learn(serial):
    """FedAvgM on a residual MLP, digits dealt 3 classes per client: after 8 rounds far above
    the 10 % of chance (FedAvg itself reaches about 0.79 here, FedAvgM about 0.87)."""
    assert serial["algorithm"] == "fedavgm"
    assert serial["final"]["accuracy"] > 0.8
    losses = [h["train_loss"] for h in serial["history"]]
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.ray
def test_ray_hosts_resolve_the_plugins_and_match_the_serial_engine(pkgs, serial):
    """Each Ray host process finds fedavgm, resmlp and classes itself: the same numbers."""
    on_ray = summary(pkgs, "ray.json")
    assert on_ray["final"] == serial["final"]


def test_module_name_without_installing(tmp_path, on_path):
    """own-model.md's mymodels.py and its scenario (FedPer, mymodels:BODY_HEAD) from a folder on
    PYTHONPATH: the head is the model's `head` (raysim_head), FedPer keeps it on each client,
    and the personalized models learn digits dealt 2 classes per client."""
    mods = tmp_path / "mods"
    write(page_files("own-model.md"), mods)
    (mods / "fedavgm.py").write_text(page_files("add-algorithm.md")["raysim-fedavgm/fedavgm.py"])

    on_path(mods)  # in this process: groups by hand
    from raysim.core.groups import groups_of
    from raysim.models import spec

    body_head = spec("mymodels:BODY_HEAD")
    model = body_head.build(body_head.Params(), (64,), 10)
    g = groups_of(model)
    assert [g.names[i] for i in g.head] == ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]
    assert [g.names[i] for i in g.body] == ["body.1.weight", "body.1.bias", "body.3.weight", "body.3.bias"]
    assert groups_of(model, 1).head == (6, 7)  # model.head: 1, the last layer
    sc = config.load(
        write_scenario(
            tmp_path,
            TINY.replace("{name: linear}", '{name: "mymodels:BODY_HEAD", head: 1}').replace(
                "{name: fedavg,", '{name: "fedavgm:FedAvgM", server_momentum: 0.3,'
            ),
        )
    )
    assert (sc.algorithm.params.server_momentum, sc.model.params.head) == (0.3, 1)

    scenario = tracked(mods, (mods / "digits_body_head.yaml").read_text(), "run.yaml")
    out = tmp_path / "s.json"
    raysim("run", scenario, "-q", "--engine", "serial", "--summary", str(out), path=[mods], cwd=tmp_path)
    final = json.loads(out.read_text())["final"]
    assert final["accuracy"] > 0.9 and final["best_accuracy"] == final["accuracy"]  # the page says 94 %


# ----------------------------------------------------------------------------- errors
def test_a_module_that_does_not_import_is_one_line_exit_2(tmp_path):
    path = write_scenario(tmp_path, TINY.replace("{name: fedavg,", '{name: "nosuch_mod_xyz:FedX",'))
    line = one_line_error(raysim("validate", path, path=[], cwd=tmp_path, check=False))
    assert line == (
        f"raysim: {path}: algorithm.name: 'nosuch_mod_xyz:FedX': module nosuch_mod_xyz does not "
        "import (ModuleNotFoundError: No module named 'nosuch_mod_xyz'); it must be importable by "
        "raysim and, on a cluster, on every node: installed, or on PYTHONPATH"
    )


@pytest.mark.parametrize(
    "key, name, words",
    [
        (
            "model.name",
            "mymodels:BODY",
            "module mymodels ({mods}/mymodels.py) has no attribute BODY; models in it: BODY_HEAD",
        ),
        (
            "model.name",
            "fedavgm:FedAvgM",
            "'fedavgm:FedAvgM' is the class fedavgm.FedAvgM, not a ModelSpec (raysim.models.ModelSpec)",
        ),
        (
            "algorithm.name",
            "mymodels:BODY_HEAD",
            "'mymodels:BODY_HEAD' is a ModelSpec, not an Algorithm subclass (raysim.algorithms.base.Algorithm)",
        ),
        ("algorithm.name", "fedavgm:", "'fedavgm:' is not module:Name"),
        ("algorithm.name", "fedavgm:Nothing", "has no attribute Nothing; algorithms in it: FedAvgM"),
    ],
)
def test_module_name_errors_name_the_key(tmp_path, on_path, key, name, words):
    mods = tmp_path / "mods"
    write(page_files("own-model.md"), mods)
    (mods / "fedavgm.py").write_text(page_files("add-algorithm.md")["raysim-fedavgm/fedavgm.py"])
    on_path(mods)
    text = (
        TINY.replace("{name: linear}", f'{{name: "{name}"}}')
        if key == "model.name"
        else TINY.replace("{name: fedavg,", f'{{name: "{name}",')
    )
    with pytest.raises(ScenarioError) as e:
        config.load(write_scenario(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path}/s.yaml: {key}: "), msg
    assert words.format(mods=mods) in msg, msg


def dist_info(folder: Path, name: str, version: str, entry_points: str) -> Path:
    """A distribution as pip installs it: its metadata and entry points in a .dist-info."""
    d = folder / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "entry_points.txt").write_text(entry_points)
    return folder


def test_an_entry_point_that_fails_to_load_names_its_distribution(tmp_path, on_path, pkgs):
    broken = dist_info(
        tmp_path / "site", "brokenplug", "0.0.1", "[raysim.algorithms]\nbroken = brokenplug_missing:Thing\n"
    )
    on_path(broken, pkgs.site)
    with pytest.raises(ScenarioError) as e:
        config.load(write_scenario(tmp_path, TINY.replace("{name: fedavg,", "{name: broken,")))
    assert str(e.value) == (
        f"{tmp_path}/s.yaml: algorithm.name: 'broken': entry point broken = "
        "brokenplug_missing:Thing (group raysim.algorithms) of distribution brokenplug 0.0.1 "
        "fails to load: ModuleNotFoundError: No module named 'brokenplug_missing'"
    )
    # a typo lists the entry points beside the built-ins
    with pytest.raises(
        ScenarioError,
        match=r"model\.name: 'resmpl' is not one of the choices; choose one of "
        r"linear, mlp, .*, lstm_classifier, resmlp$",
    ):
        config.load(write_scenario(tmp_path, TINY.replace("{name: linear}", "{name: resmpl}")))


@pytest.mark.parametrize("name", ["quitter", "quitmod:Thing"])
def test_a_plugin_that_calls_sys_exit_as_it_imports_is_its_failure_not_raysims_exit_0(tmp_path, name):
    """`raysim run` exited 0 having run nothing: SystemExit passed the plugin loader's `except
    Exception`. Now the plugin's failure: one line, exit 2, naming the entry point, its
    distribution and the exit."""
    site = dist_info(tmp_path / "site", "quitplug", "0.2", "[raysim.algorithms]\nquitter = quitmod:Thing\n")
    (site / "quitmod.py").write_text("import sys\nsys.exit(0)\n")
    path = tracked(tmp_path, TINY.replace("{name: fedavg,", f'{{name: "{name}",'))
    line = one_line_error(raysim("run", path, "-q", "--engine", "serial", path=[site], cwd=tmp_path, check=False))
    if name == "quitter":
        assert line == (
            f"raysim: {path}: algorithm.name: 'quitter': entry point quitter = quitmod:Thing (group "
            "raysim.algorithms) of distribution quitplug 0.2 fails to load: SystemExit: it called "
            "sys.exit(0)"
        )
    else:
        assert line.startswith(
            f"raysim: {path}: algorithm.name: 'quitmod:Thing': module quitmod does not import "
            "(SystemExit: it called sys.exit(0)); "
        ), line
    assert not (tmp_path / "mlflow.db").exists()


def test_a_plugin_that_calls_sys_exit_0_in_training_fails_the_run_and_its_mlflow_run(tmp_path):
    """`raysim run` exited 0 (the MLflow run marked FAILED all the same) when a plugin's reply
    called sys.exit(0): a run that did not finish, reported as a success. Now exit 1, one line
    saying so after the resume hint, and the MLflow run FAILED."""
    import mlflow

    (tmp_path / "quitter.py").write_text(
        "import sys\nfrom raysim.algorithms.fedavg import FedAvg\n\n\n"
        "class Q(FedAvg):\n    def reply(self, params, received, n):\n"
        "        sys.exit(0)\n"
    )
    path = tracked(tmp_path, TINY.replace("{name: fedavg,", '{name: "quitter:Q",'))
    proc = raysim("run", path, "-q", "--engine", "serial", path=[tmp_path], cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "raysim: run failed: SystemExit: sys.exit(0) was called while it ran (by a plugin, or a library one "
        "calls); what it did is not finished"
    )
    assert "--resume" in proc.stderr
    runs = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_experiments()]
    )
    assert [r.info.status for r in runs] == ["FAILED"]


def test_a_plugin_with_a_built_in_name_is_refused_naming_both(tmp_path):
    shadow = dist_info(tmp_path / "site", "shadow", "1.0", "[raysim.models]\nmlp = shadow:MLP\n")
    line = one_line_error(raysim("list", path=[shadow], cwd=tmp_path, check=False))
    assert line == (
        "raysim: plugin model 'mlp' (shadow:MLP, entry point of distribution shadow 1.0) collides "
        "with the built-in model 'mlp' (raysim.models.MODELS['mlp']); a built-in name always means "
        'the built-in: rename the entry point in shadow\'s [project.entry-points."raysim.models"]'
    )


def test_built_in_names_never_read_the_entry_points(tmp_path, monkeypatch):
    """Start-up stays lean: a scenario of built-ins validates without scanning distributions."""

    def refuse(**kw):
        raise AssertionError(f"entry points read: {kw}")

    monkeypatch.setattr(plugins.metadata, "entry_points", refuse)
    monkeypatch.setattr(plugins, "_SCANS", {})
    sc = config.load(write_scenario(tmp_path, TINY))
    assert (sc.algorithm.name, sc.model.name, sc.data.dataset.name) == ("fedavg", "linear", "synthetic")


# ----------------------------------------------------------------------------- on Ray hosts
FAILING = '''"""A model and an algorithm that raise on a Ray host actor, never in the driver's process."""
import dataclasses

import ray

from raysim.algorithms.fedavg import FedAvg
from raysim.models import MODELS


def on_actor():
    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


def build(params, input_shape, num_classes):
    if on_actor():
        raise ValueError("no model here")
    return MODELS["linear"].build(params, input_shape, num_classes)


MODEL = dataclasses.replace(MODELS["linear"], name="failing", build=build)


class Failing(FedAvg):
    def reply(self, params, received, n):
        if on_actor():
            raise KeyError("no reply here")
        return super().reply(params, received, n)
'''


@pytest.mark.ray
@pytest.mark.parametrize(
    "model, algorithm, raised",
    [
        ("failing:MODEL", "fedavg", ("ValueError: no model here", "build")),  # at the host's start
        ("linear", "failing:Failing", ("KeyError: 'no reply here'", "reply")),  # in training
    ],
)
def test_a_plugin_raising_on_a_ray_host_is_reported_as_its_error_where_it_was_raised(
    tmp_path, model, algorithm, raised
):
    """A host's construction error was reported as its death ("killed (SIGKILL: the kernel's OOM
    killer ...)"), the host replaced: now, as in training, the plugin's exception, its message and
    the file and line that raised it; nothing is replaced."""
    (tmp_path / "failing.py").write_text(FAILING)
    text = (
        TINY.replace("rounds: 3", "rounds: 2")
        .replace("clients: 12", "clients: 4")
        .replace("{name: linear}", f'{{name: "{model}"}}')
        .replace("{name: fedavg,", f'{{name: "{algorithm}",')
        .replace("cpus_per_host: 0.5}", "cpus_per_host: 0.5, driver_host: false}")
    )
    proc = raysim("run", tracked(tmp_path, text), "-q", path=[tmp_path], cwd=tmp_path, check=False)
    error, function = raised
    kind = error.split(":")[0]
    line = next(i for i, text in enumerate(FAILING.splitlines(), 1) if text.strip().startswith(f"raise {kind}("))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"raysim: run failed: {error} (raised on a Ray host at {tmp_path}/failing.py:{line}, in {function}) "
        "(rerun with -v for the traceback)"
    )
    assert "SIGKILL" not in proc.stderr and "new hosts started" not in proc.stderr
