"""raysim as a user installs it from a built wheel, not from the source tree: the wheel holds
every package of the tree, the methods install as ``raysim.algorithms`` (no global package named
``algorithms``), and the installed copy runs the quick start on Ray."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tracked files (the build writes its own build/ and
    egg-info folders, which must not land in the checkout), offline: no build isolation."""
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    src = tmp / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (whl,) = (tmp / "dist").glob("raysim-*.whl")
    return whl


def test_the_wheel_holds_every_package_and_installs_the_methods_under_raysim(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "algorithms" not in tops, "a global 'algorithms' package would collide with others"
    assert {t for t in tops if not t.endswith(".dist-info")} == {"raysim"}
    for pkg in [p.parent for p in (ROOT / "raysim").rglob("__init__.py")] + [ROOT / "algorithms"]:
        rel = pkg.relative_to(ROOT)
        inside = Path("raysim") / rel if rel.parts[0] == "algorithms" else rel
        for module in pkg.glob("*.py"):
            assert f"{(inside / module.name).as_posix()}" in names, f"{module} is missing from the wheel"
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "raysim = raysim.cli:entry" in zipfile.ZipFile(wheel).read(entry[0]).decode()


@pytest.mark.ray
def test_raysim_installed_from_the_wheel_runs_the_quick_start(wheel, tmp_path):
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (site / "algorithms").exists()
    work = tmp_path / "work"  # away from the checkout: nothing imports from it
    work.mkdir()
    shutil.copy(ROOT / "scenarios" / "quickstart.yaml", work)
    # MLFLOW_TRACKING_URI too: MLflow's set_tracking_uri in an earlier test exports it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env["PYTHONPATH"] = str(site)
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, raysim, raysim.algorithms as a; "
            "print(raysim.__file__, a.__file__, importlib.util.find_spec('algorithms'))",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where[0].startswith(str(site)) and where[1].startswith(str(site)) and where[2] == "None"
    run = subprocess.run(
        [str(site / "bin" / "raysim"), "run", "quickstart.yaml", "-q", "--set", "rounds=10", "--summary", "s.json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((work / "s.json").read_text())
    assert summary["final"]["accuracy"] > 0.6  # ten classes: chance is 0.1
    assert (work / "mlflow.db").exists()
    # an installed raysim is no git checkout: its run records the version, the commit "unknown"
    from mlflow.tracking import MlflowClient

    import raysim

    tags = MlflowClient(f"sqlite:///{work}/mlflow.db").get_run(summary["mlflow_run_id"]).data.tags
    assert (tags["raysim.version"], tags["raysim.git_commit"]) == (raysim.__version__, "unknown")
    assert "raysim.git_dirty" not in tags
