"""Bad inputs that used to slip through (issue #24): each is refused with exit code 2 and ONE
line naming the file and key (or the data file and its line) and what is allowed, before any
MLflow run exists. Numbers follow the scenario's types: YAML 1.1 reads 1e-3 as a string."""

import json
import re
import sqlite3

import pytest

from raysim import cli
from raysim.scenario import config
from tests.conftest import TINY, write_scenario

INT64 = "9223372036854775807"
F32 = "3.4028234663852886e+38"


def refused(capsys, *argv) -> str:
    """The one line a refused command prints (exit code 2)."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "run failed" not in err, err
    return lines[0]


def runs_in(tmp_path) -> int:
    db = tmp_path / "m.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as c:
        return c.execute("select count(*) from runs").fetchone()[0]


def run_refused(capsys, tmp_path, path, *args) -> str:
    """``raysim run --engine serial`` refused before any MLflow run is created."""
    line = refused(
        capsys,
        "run",
        path,
        "--engine",
        "serial",
        "-q",
        "--set",
        "rounds=1",
        "--set",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
        "--set",
        f"checkpoint.dir={tmp_path}/ck",
        *args,
    )
    assert runs_in(tmp_path) == 0
    return line


def test_numbers_written_as_yaml_strings_follow_the_fields_type(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY.replace("lr: 0.1", "lr: 1e-3"))  # a string to YAML 1.1
    assert cli.main(["validate", path]) == 0
    assert config.load(path).algorithm.params.lr == 0.001
    assert config.load(path, ["algorithm.lr=1E5"]).algorithm.params.lr == 1e5
    assert config.load(path, ["algorithm.batch_size=1e3", "rounds=2.0"]).algorithm.params.batch_size == 1000
    line = refused(capsys, "validate", path, "--set", "algorithm.lr=-2.5e-4")
    assert line == f"raysim: {path}: algorithm.lr: -0.00025 is out of range; it must be > 0 and <= {F32}"
    for text in ("abc", "٣", "nan", "1e999"):
        line = refused(capsys, "validate", path, "--set", f"algorithm.lr={text}")
        assert f"{path}: algorithm.lr: '{text}' is not " in line
    assert "rounds: 2.5 is not an integer" in refused(capsys, "validate", path, "--set", "rounds=2.5")


@pytest.mark.parametrize("value, shown", [("1e30", "1.000e+30"), (str(10**30), "1.000e+30"), (str(2**63), "9.223e+18")])
def test_integers_beyond_int64_are_refused_with_the_range(tmp_path, capsys, value, shown):
    path = write_scenario(tmp_path, TINY)
    line = run_refused(capsys, tmp_path, path, "--set", f"algorithm.batch_size={value}")
    assert line == (
        f"raysim: {path}: algorithm.batch_size: {shown} is out of range; it must be an integer from 1 to {INT64}"
    )


def test_a_learning_rate_beyond_float32_is_refused_below_it_the_run_diverges(tmp_path, capsys):
    # torch cannot even apply a step size beyond float32's largest value to float32 weights
    path = write_scenario(tmp_path, TINY)
    line = run_refused(capsys, tmp_path, path, "--set", "algorithm.lr=1e308")
    assert line.endswith(f"algorithm.lr: 1e+308 is out of range; it must be > 0 and <= {F32}")
    assert (
        refused(capsys, "validate", path, "--set", "algorithm.name=fedprox", "--set", f"algorithm.mu={10**400}")
        == f"raysim: {path}: algorithm.mu: 1.000e+400 is out of range; it must be within ±{F32}"
    )
    code = cli.main(
        [
            "run",
            path,
            "--engine",
            "serial",
            "-q",
            "--set",
            "rounds=1",
            "--set",
            "algorithm.lr=3e38",
            "--set",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
            "--set",
            f"checkpoint.dir={tmp_path}/ck",
        ]
    )
    assert code == 1
    assert "Diverged: training diverged in round 1: non-finite loss on clients" in capsys.readouterr().err


def test_a_local_update_that_overflows_at_evaluation_stops_the_run_as_diverged(tmp_path, capsys):
    """FedAvg+ trains at a sane lr and fine-tunes a copy of the global model at evaluation at
    one that overflows: the scores are NaN, and the run stops with the clients named, the way a
    diverging training does (not with an error from deep inside a metric)."""
    path = write_scenario(tmp_path, TINY)
    code = cli.main(
        [
            "run",
            path,
            "--engine",
            "serial",
            "-q",
            "--set",
            "rounds=1",
            "--set",
            "eval.every=1",
            "--set",
            "algorithm.name=fedavg+",
            "--set",
            "eval.finetune.lr=3e38",
            "--set",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
            "--set",
            f"checkpoint.dir={tmp_path}/ck",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert re.search(r"Diverged: evaluation diverged after round 1: non-finite scores on clients? \d", err), err
    assert "lower the learning rate (algorithm.lr, eval.finetune.lr)" in err


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("model.hidden=[64, -4]", "model.hidden[1]", f"-4 is out of range; it must be an integer from 1 to {INT64}"),
        ("model.hidden=[0]", "model.hidden[0]", "0 is out of range; it must be an integer from 1 to"),
        ("model.hidden=[8, x]", "model.hidden[1]", "'x' is not an integer"),
        (f"model.hidden=[{10**13}]", "model", "cannot be built ("),
    ],
)
def test_model_options_are_checked_before_the_run(tmp_path, capsys, override, key, allowed):
    path = write_scenario(tmp_path, TINY.replace("{name: linear}", "{name: mlp}"))
    line = run_refused(capsys, tmp_path, path, "--set", override)
    assert line.startswith(f"raysim: {path}: {key}: {allowed}"), line


@pytest.mark.parametrize(
    "content, line_no, what",
    [
        (b"0 1\n1 2\n\x89PNG\r\n\x00\xff\xfe\n", 3, "not UTF-8 text"),
        ("0 1\n1 \u0663\n".encode(), 2, "'1 \u0663' is not two client ids"),  # Arabic-Indic 3: int() takes it
        (b"0 1\n1 2\n# c\n2 12\n", 4, "client id 12 is not one of the 12 clients (data.clients)"),
    ],
)
def test_edges_file_errors_name_the_file_and_line(tmp_path, capsys, content, line_no, what):
    edges = tmp_path / "e.txt"
    edges.write_bytes(content)
    path = write_scenario(
        tmp_path, TINY.replace("sampling: {fraction: 0.5}\n", "") + f"topology: {{kind: edges, edges: '{edges}'}}\n"
    )
    line = run_refused(capsys, tmp_path, path)
    assert line == (
        f"raysim: {path}: topology: edges: {edges} line {line_no}: {what}; each line holds two "
        "client ids from 0 to 11 (ASCII digits) or a '#' comment"
    )


@pytest.mark.parametrize(
    "topology, words",
    [
        ("{kind: edges, edges: 'E'}", "topology: edges E: the graph is not connected (9 components)"),
        ("{kind: torus}", "topology: torus: 10 clients do not factor into an r x c grid with r, c >= 3"),
        ("{kind: erdos_renyi, p: 0.0001}", "topology: erdos_renyi: no connected G(10, 0.0001) in 1000 draws"),
    ],
)
def test_topology_errors_are_input_errors_before_the_run(tmp_path, capsys, topology, words):
    edges = tmp_path / "loops.txt"
    edges.write_text("0 0\n1 2\n")  # a self loop adds nothing
    text = TINY.replace("sampling: {fraction: 0.5}\n", "").replace("clients: 12", "clients: 10")
    path = write_scenario(tmp_path, text + f"topology: {topology.replace('E', str(edges))}\n")
    line = run_refused(capsys, tmp_path, path)
    assert line.startswith(f"raysim: {path}: {words.replace('E', str(edges))}"), line


def test_leaf_label_out_of_range_shows_the_real_value(tmp_path, capsys):
    for sub, y in (("train", -1), ("test", 0)):
        (tmp_path / "leaf" / sub).mkdir(parents=True)
        doc = {"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[0.0] * 784], "y": [y]}}}
        (tmp_path / "leaf" / sub / "d.json").write_text(json.dumps(doc))
    path = write_scenario(
        tmp_path,
        TINY.replace(
            "dataset: synthetic\n  clients: 12\n  dim: 10\n  max_samples: 80",
            f"dataset: leaf_femnist\n  clients: 1\n  root: {tmp_path}/leaf",
        ).replace("hosts: 2", "hosts: 1"),
    )
    line = refused(capsys, "validate", path)
    assert line == f"raysim: {path}: data: leaf_femnist: {tmp_path}/leaf holds label -1, expected 0..61"


def test_seeds_beyond_32_bits_are_refused(tmp_path, capsys):
    # the random generators take a seed's low 32 bits: 2**32 would run seed 0 again
    allowed = "is out of range; it must be an integer from 0 to 4294967295"
    path = write_scenario(tmp_path, TINY.replace("seed: 0", "seed: 4294967296"))
    assert refused(capsys, "validate", path) == f"raysim: {path}: seed: 4294967296 {allowed}"
    path = write_scenario(tmp_path, TINY)
    assert cli.main(["validate", path, "--set", "seed=4294967295"]) == 0
    line = run_refused(capsys, tmp_path, path, "--set", f"seed={2**70}")
    assert line == f"raysim: {path}: seed: 1.181e+21 {allowed}"
    assert (
        run_refused(capsys, tmp_path, path, "--seeds", "0,99999999999999999999999999")
        == f"raysim: --seeds: 1.000e+26 {allowed}"
    )
    listed = write_scenario(tmp_path, TINY + "seeds: [0, 4294967296]\n", "seeds.yaml")
    assert run_refused(capsys, tmp_path, listed) == f"raysim: {listed}: seeds: 4294967296 {allowed}"


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "resources.hosts=13",
            "resources.hosts: 13 hosts for 12 clients; give at most 12 (a host holds one client or more)",
        ),
        (
            "resources.driver_host=maybe",
            "resources.driver_host: 'maybe' is not allowed; choose one of auto, true, false",
        ),
        ("tracking.experiment=''", "tracking.experiment: empty; give the MLflow experiment's name, e.g. raysim"),
        (
            "resources.host_timeout_s=1.0e+30",
            "resources.host_timeout_s: 1e+30 is out of range; it must be > 0.0 and <= 1000000.0",
        ),
        (f"data.dim={10**15}", "data: more than this machine's memory (Unable to allocate"),
    ],
)
def test_other_hostile_values(tmp_path, capsys, override, line):
    path = write_scenario(tmp_path, TINY)
    assert run_refused(capsys, tmp_path, path, "--set", override).startswith(f"raysim: {path}: {line}")


def raysim_command(*argv, cwd, env=None):
    """The ``raysim`` command in a fresh process (MLflow not imported yet, as for a user)."""
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_a_tracking_uri_of_no_mlflow_store_is_refused_before_ray_starts_a_plugins_is_taken(tmp_path):
    """``nosuch://x`` was a TypeError traceback after training (exit 1). Refused now at the
    preflight, before Ray starts (no "starting a local Ray" line), and by ``validate``; a scheme an
    installed MLflow store plugin declares (entry point group mlflow.tracking_store) validates."""
    path = write_scenario(tmp_path, TINY + "tracking: {uri: 'nosuch://x'}\n")
    for argv in (("run", path), ("validate", path)):
        proc = raysim_command(*argv, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(
            f"raysim: {path}: tracking.uri: nosuch://x: MLflow has no tracking store for the "
            "scheme 'nosuch'; give a file path or a URI of scheme databricks, "
        ), lines[0]
        assert "postgresql, sqlite" in lines[0]
    plugin = tmp_path / "site" / "fakestore-1.0.dist-info"
    plugin.mkdir(parents=True)
    (plugin / "METADATA").write_text("Metadata-Version: 2.1\nName: fakestore\nVersion: 1.0\n")
    (plugin / "entry_points.txt").write_text("[mlflow.tracking_store]\nfakestore = fakestore_mod:Store\n")
    fake = write_scenario(tmp_path, TINY + "tracking: {uri: 'fakestore://bucket'}\n", "f.yaml")
    proc = raysim_command("validate", fake, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stderr


def test_report_and_compare_refuse_a_tracking_uri_of_no_mlflow_store_in_one_line(tmp_path):
    """They ended in MLflow's UnsupportedModelRegistryStoreURIException, exit 1."""
    for command in ("report", "compare"):
        proc = raysim_command(command, "--tracking-uri", "nosuch://x", "0123abcd", cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(
            f"raysim: {command} --tracking-uri: nosuch://x: MLflow has no tracking store for "
            "the scheme 'nosuch'; give a file path or a URI of scheme databricks, "
        ), lines[0]


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///a/b.db",
        "postgresql+psycopg2://u@h/db",
        "mysql://h/db",
        "/abs/path",
        "rel/path",
        "file:///x",
        "databricks",
        "databricks://profile",
        "https://h:5000",
        "nosuch://x",
        "C:\\runs",
    ],
)
def test_the_scheme_of_a_tracking_uri_is_the_one_mlflow_picks_its_store_by(uri):
    from mlflow.utils.uri import get_uri_scheme

    from raysim.scenario.stores import store_scheme

    expected = uri if uri == "databricks" else get_uri_scheme(uri)
    assert store_scheme(uri) == expected


def test_the_schemes_known_without_mlflow_are_mlflows_registry():
    """Without MLflow imported, the schemes are read as MLflow's registry reads them when it loads."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    from raysim.scenario.stores import _schemes_mlflow_loads

    assert _schemes_mlflow_loads() == set(_tracking_store_registry._registry)
    assert {
        "",
        "file",
        "sqlite",
        "postgresql",
        "mysql",
        "mssql",
        "http",
        "https",
        "databricks",
    } <= _schemes_mlflow_loads()
