"""Put the personalized-FL benchmark's three-seed table into the docs, from the committed runs.

    python bench/pfl_table.py        # bench/results/pfl_benchmark_runs.jsonl -> docs/results/tables.md

Imports the runs (``bench/runs_io.py import``) into a new SQLite store in a temporary folder,
makes the table with ``raysim compare --select val_accuracy --over clients`` (each method's lr
chosen by its mean validation accuracy over the seeds) and puts the Markdown between the
``<!-- pfl-benchmark-3seeds -->`` markers of the page, replacing what was there. Prints the
table. About 30 s for 180 runs on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "pfl-benchmark-3seeds"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(HERE / "results" / "pfl_benchmark_runs.jsonl"))
    ap.add_argument("--page", default=str(HERE.parent / "docs" / "results" / "tables.md"))
    ap.add_argument("--raysim", default=str(Path(sys.executable).with_name("raysim")))
    a = ap.parse_args(argv)
    page = Path(a.page)
    text = page.read_text()
    if f"<!-- {MARK} -->" not in text:
        raise SystemExit(f"pfl_table: {page} has no <!-- {MARK} --> marker")
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/pfl.db"
        subprocess.run(
            [
                sys.executable,
                str(HERE / "runs_io.py"),
                "import",
                a.runs,
                "--tracking-uri",
                uri,
                "--experiment",
                "pfl-benchmark",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                a.raysim,
                "compare",
                "--experiment",
                "pfl-benchmark",
                "--tracking-uri",
                uri,
                "--select",
                "val_accuracy",
                "--over",
                "clients",
                "--out",
                f"{tmp}/out",
            ],
            check=True,
            capture_output=True,
        )
        table = Path(tmp, "out", "compare.md").read_text().strip()
    pattern = rf"<!-- {MARK} -->.*?<!-- /{MARK} -->"
    page.write_text(re.sub(pattern, lambda _: f"<!-- {MARK} -->\n{table}\n<!-- /{MARK} -->", text, flags=re.S))
    print(table.split("\n\n")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
