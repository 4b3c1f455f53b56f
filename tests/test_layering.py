"""The layering rules, checked on the source: the floors of raysim's wings (no import runs back
up a floor), algorithms never import Ray, the engine reaches algorithms through the registry,
every Ray call lives in the transport."""

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|import\s+([\w.]+))", re.M)


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "algorithms":  # installed as raysim.algorithms (pyproject's package-dir)
        parts.insert(0, "raysim")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved; ``from P
    import m`` counts P.m when P.m is a module of the project)."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    out = set()
    for frm, names, plain in IMPORT.findall(path.read_text()):
        if plain:
            out.add(plain)
            continue
        if frm.startswith("."):
            up = len(frm) - len(frm.lstrip("."))
            base = package.rsplit(".", up - 1)[0] if up > 1 else package
            frm = f"{base}.{frm.lstrip('.')}".rstrip(".")
        out.add(frm)
        for name in re.findall(r"\w+", names):
            if any(
                (ROOT / Path(*parts)).with_suffix(".py").exists()
                for parts in (f"{frm}.{name}".split("."), f"{frm}.{name}".split(".")[1:])
            ):
                out.add(f"{frm}.{name}")
    return out


def sources(*dirs):
    return [f for d in dirs for f in (ROOT / d).rglob("*.py")]


# Each wing of raysim/ and its floor: a module imports modules of its own wing or of a lower
# floor, never of a higher one, nor of another wing on its floor (except the pairs in SIDEWAYS).
FLOORS = {
    "raysim.rng": 0,
    "raysim.cachedir": 0,
    "raysim.signals": 0,
    "raysim.errors": 0,
    "raysim.plugins": 0,
    "raysim.core": 1,
    "raysim.algorithms": 2,
    "raysim.data": 3,
    "raysim.models": 3,
    "raysim.federation": 3,
    "raysim.scenario": 4,
    "raysim.engine": 5,
    "raysim.results": 5,
    "raysim.experiment": 6,
    "raysim.api": 7,
    "raysim.cli": 7,
    "raysim": 7,
}
SIDEWAYS = {
    ("raysim.errors", "raysim.signals"),  # an interrupt's exit code: 143 after SIGTERM
    ("raysim.plugins", "raysim.errors"),  # a name that does not resolve is a ScenarioError
    ("raysim.algorithms", "raysim.plugins"),  # every registry binds its plugin kind (data and models too)
    ("raysim.api", "raysim.cli"),  # the API's run id as the command reads it
    ("raysim", "raysim.api"),  # raysim.run is raysim.api.run
}


def wing(module: str) -> str:
    """The wing of a project module: the longest key of FLOORS it is, or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is in no wing of FLOORS: give it one")


def test_every_module_is_in_a_wing_and_every_wing_exists():
    files = sources("raysim", "algorithms")
    wings = {wing(module_of(f)) for f in files}
    assert wings == set(FLOORS), set(FLOORS) ^ wings


def test_no_import_runs_back_up_a_floor_or_sideways_into_another_wing():
    known = {module_of(f) for f in sources("raysim", "algorithms")}
    wrong = []
    for f in sources("raysim", "algorithms"):
        here = wing(module_of(f))
        for mod in imports(f):
            if mod not in known and not mod.startswith("raysim.") or mod == "raysim":
                continue  # (``from raysim import x`` imports x, not the package)
            there = wing(mod)
            if there == here or FLOORS[there] < FLOORS[here] or (here, there) in SIDEWAYS:
                continue
            wrong.append(
                f"{f.relative_to(ROOT)} ({here}, floor {FLOORS[here]}) imports {mod} ({there}, floor {FLOORS[there]})"
            )
    assert not wrong, "\n".join(wrong)


def test_every_package_says_what_lives_there_and_what_it_may_import():
    for init in (ROOT / "raysim").rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name != "raysim":
            assert "import" in doc, f"{init.relative_to(ROOT)}: say what the package may import"
    for init in (ROOT / "algorithms", ROOT / "raysim" / "core", ROOT / "raysim" / "data", ROOT / "raysim" / "engine"):
        assert ast.get_docstring(ast.parse((init / "__init__.py").read_text())), init


def test_raysim_has_at_most_eight_top_level_modules():
    top = sorted(p.name for p in (ROOT / "raysim").glob("*.py"))
    assert len(top) <= 8, top


def test_algorithms_import_only_the_core_of_raysim_never_ray_mlflow_or_the_engine():
    for f in sources("algorithms"):
        for mod in imports(f):
            assert not mod.startswith(("ray.", "mlflow")) and mod != "ray", f"{f.name} imports {mod}"
            if mod.startswith("raysim.") and not mod.startswith("raysim.algorithms"):
                assert mod.startswith("raysim.core") or mod == "raysim.plugins", f"{f.name} imports {mod}"


def test_the_core_imports_nothing_above_it():
    for f in sources("raysim/core"):
        for mod in imports(f):
            assert not (mod == "ray" or mod.startswith(("ray.", "mlflow", "raysim.algorithms"))), (
                f"{f.name} imports {mod}"
            )
            if mod.startswith("raysim"):
                assert mod.startswith("raysim.core"), f"{f.name} imports {mod}"


def test_engine_reaches_algorithms_only_through_the_registry_and_the_contract():
    for f in sources("raysim"):
        for mod in imports(f):
            if mod.startswith("raysim.algorithms"):
                assert mod in ("raysim.algorithms", "raysim.algorithms.base"), f"{f.relative_to(ROOT)} imports {mod}"


def test_every_ray_call_lives_in_the_transport_modules():
    """raysim/engine/ray_engine.py (hosts, rounds) and ray_sweep.py (a sweep's runs on Tune)."""
    for f in sources("raysim"):
        if f.parent.name == "engine" and f.name.startswith("ray_"):
            continue
        for mod in imports(f):
            assert not (mod == "ray" or mod.startswith("ray.")), f"{f.relative_to(ROOT)} imports {mod}"


def test_no_import_cycles_between_project_modules():
    files = sources("raysim", "algorithms")
    known = {module_of(f) for f in files}
    g = nx.DiGraph()
    for f in files:
        for mod in imports(f):
            if mod in known and mod != module_of(f) and not module_of(f).startswith(mod + "."):
                g.add_edge(module_of(f), mod)
    cycles = [c for c in nx.simple_cycles(g) if not all(m.endswith("__init__") for m in c)]
    # a package's __init__ importing its own submodules is not a cycle of ideas; only count
    # cycles between modules that are not each other's package
    cycles = [
        c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a in c for b in c if a != b)
    ]
    assert not cycles, cycles


def test_yaml_and_torch_load_are_safe():
    for f in sources("raysim", "algorithms"):
        text = f.read_text()
        assert "yaml.load(" not in text and "pickle.load" not in text, f
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{f}: {call}"


def test_the_checks_before_ray_starts_import_neither_torch_nor_mlflow(tmp_path):
    """`raysim run` reads and checks the scenario file (raysim.experiment.preflight) before Ray starts, so
    that Ray's start overlaps the validation; importing torch there (seconds) delays it."""
    import subprocess
    import sys

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: x\nrounds: 1\ndata: {dataset: digits, clients: 4}\nalgorithm: {name: fedavg}\n")
    code = (
        "import sys; from raysim.experiment.preflight import check_run; "
        f"check_run({str(scenario)!r}, ['rounds=2'], None, None); "
        "print(sorted(m for m in ('torch', 'mlflow', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "[]", out.stdout
