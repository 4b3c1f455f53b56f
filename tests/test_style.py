"""The project's habits, enforced by the test command: ruff's lint and format pass on the whole
tree, and mypy finds no type error beyond the baseline (``tests/mypy-baseline.txt``: counts per
file and error code, which may only shrink)."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<file>[^:\n]+\.py):\d+: error: .*\[(?P<code>[\w-]+)\]$", re.M)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_passes():
    proc = _run("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    proc = _run("ruff", "format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def mypy_errors() -> collections.Counter:
    """mypy's errors on raysim/ and algorithms/ (pyproject's [tool.mypy]), counted by (file, code)."""
    proc = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")
    assert proc.returncode == 0 or (proc.returncode == 1 and ERROR.search(proc.stdout)), proc.stdout + proc.stderr
    return collections.Counter((m["file"], m["code"]) for m in ERROR.finditer(proc.stdout))


def read_baseline() -> collections.Counter:
    counts = collections.Counter()
    for line in BASELINE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            file, code, n = line.split()
            counts[(file, code)] = int(n)
    return counts


def test_mypy_finds_no_error_beyond_the_baseline():
    found, allowed = mypy_errors(), read_baseline()
    new = {k: (n, allowed.get(k, 0)) for k, n in found.items() if n > allowed.get(k, 0)}
    assert not new, "mypy errors beyond tests/mypy-baseline.txt (file, code: found, allowed):\n" + "\n".join(
        f"  {f} [{c}]: {n} > {a}" for (f, c), (n, a) in sorted(new.items())
    )


def write_baseline() -> None:
    found = mypy_errors()
    lines = [f"{f} {c} {n}" for (f, c), n in sorted(found.items())]
    header = (
        "# mypy's errors on raysim/ and algorithms/ when this baseline was written, per file and code;\n"
        "# tests/test_style.py fails on any count above these. Written by `python tests/test_style.py --baseline`.\n"
    )
    BASELINE.write_text(header + "\n".join(lines) + "\n")
    print(f"{BASELINE}: {sum(found.values())} errors in {len({f for f, _ in found})} files")


if __name__ == "__main__":
    if sys.argv[1:] == ["--baseline"]:
        write_baseline()


def test_the_version_is_the_same_in_pyproject_the_package_and_the_changelog():
    import tomllib

    import raysim

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert raysim.__version__ == version
    released = re.findall(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released[0] == version, f"CHANGELOG.md's latest release is {released[0]}, pyproject's version {version}"
