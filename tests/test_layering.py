"""The layering rules of DESIGN.md §2, checked on the source."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)


def imports(path: Path) -> set[str]:
    return {a or b for a, b in IMPORT.findall(path.read_text())}


def test_algorithms_never_import_ray_mlflow_or_the_engine():
    for f in (ROOT / "algorithms").rglob("*.py"):
        for mod in imports(f):
            assert not mod.startswith(("ray", "mlflow", "raysim")), f"{f.name} imports {mod}"


def test_engine_reaches_algorithms_only_through_the_registry_and_the_contract():
    for f in (ROOT / "raysim").rglob("*.py"):
        for mod in imports(f):
            if mod.startswith("algorithms"):
                assert mod in ("algorithms", "algorithms.base"), f"{f.relative_to(ROOT)} imports {mod}"


def test_every_ray_call_lives_in_the_transport_module():
    for f in (ROOT / "raysim").rglob("*.py"):
        if f.name == "ray_engine.py":
            continue
        for mod in imports(f):
            assert not (mod == "ray" or mod.startswith("ray.")), f"{f.relative_to(ROOT)} imports {mod}"


def test_yaml_and_torch_load_are_safe():
    for f in list((ROOT / "raysim").rglob("*.py")) + list((ROOT / "algorithms").rglob("*.py")):
        text = f.read_text()
        assert "yaml.load(" not in text and "pickle.load" not in text, f
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, f"{f}: {call}"
