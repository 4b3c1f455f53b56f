"""The modules that moved into wings in 0.2.0: their old paths still import, with a warning, as
the same module objects; nothing of raysim's own uses an old path."""

import re
import subprocess
import sys
from pathlib import Path

import raysim

ROOT = Path(__file__).resolve().parents[1]


def test_an_old_path_imports_the_moved_module_itself_with_a_deprecation_warning():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n    import raysim.config\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('ignore')\n"
        "import raysim.config as old, raysim.scenario.config as new\n"
        "from raysim import systems\n"
        "print(old is new, old.__spec__.name, systems.__name__, old.load.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [
        "raysim.config moved to raysim.scenario.config in raysim 0.2.0; the old path goes in 0.3.0",
        "True raysim.scenario.config raysim.federation.fleet raysim.scenario.config",
    ]


def test_every_moved_module_exists_at_its_new_path_and_no_old_file_is_left():
    for old, new in raysim.MOVED.items():
        assert (ROOT / Path(*new.split("."))).with_suffix(".py").is_file(), new
        assert not (ROOT / Path(*old.split("."))).with_suffix(".py").exists(), old


def test_nothing_in_the_project_imports_or_names_an_old_path():
    olds = "|".join(re.escape(o.split(".", 1)[1]) for o in raysim.MOVED)
    pattern = re.compile(rf"\braysim[./]({olds})\b|from raysim import [\w, ]*\b({olds})\b")
    files = [
        p
        for d in ("raysim", "algorithms", "tests", "bench", "docs", "scenarios")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".py", ".md", ".yaml", ".yml")
    ]
    files += [ROOT / "README.md", ROOT / "mkdocs.yml"]
    files = [p for p in files if p not in (ROOT / "raysim" / "__init__.py", ROOT / "tests" / "test_moved.py")]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found
