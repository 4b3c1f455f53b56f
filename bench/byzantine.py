"""The Byzantine benchmark: every attack against every defence (FedAvg), personalized and
clustered methods under attack, and decentralized ones against robust gossip, as three grids of
MLflow runs, their figures and tables in the docs.

    python bench/byzantine.py                      # the three grids, about 40 + 30 + 35 min on 2 cores
    python bench/byzantine.py --only fashion       # one of them (fashion, methods, gossip)
    python bench/byzantine.py --parent fashion=ID[,ID2] --tracking-uri URI   # runs already made
    python bench/byzantine.py --points             # redraw from the committed points

Runs ``scenarios/byzantine_fashion.yaml`` (7 attacks x 9 defences x {0, 10, 20, 30 %} malicious,
252 runs) and ``scenarios/byzantine_methods.yaml`` (FedAvg, Ditto, FedRep, FedEM, IFCA x {mean,
median} x 4 attacks x {0, 20 %}, 80 runs) and ``scenarios/byzantine_gossip.yaml`` (D-SGD and
D-FedEM x {plain gossip, ClippedGossip, BRIDGE} x 4 attacks x {0, 20 %}, 48 runs) on the serial
engine, one after another, into a store of its own (``--tracking-uri``; default a temporary SQLite file), or reads the runs of the parents
given. Each run's point (attack, method / defence, malicious share, the honest clients' final
accuracy, the backdoor's success rate) goes to ``bench/results/byzantine_<grid>.csv``; the figure
``docs/results/byzantine_<grid>.png`` and the tables between the ``<!-- byzantine-<grid> -->``
markers of ``docs/results/byzantine.md`` are drawn from those points by ``raysim.results.byzantine``,
the code ``raysim report`` draws them with. Prints each grid's tables and its wall time.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GRIDS = {
    "fashion": ROOT / "scenarios" / "byzantine_fashion.yaml",
    "methods": ROOT / "scenarios" / "byzantine_methods.yaml",
    "gossip": ROOT / "scenarios" / "byzantine_gossip.yaml",
}
PAGE = ROOT / "docs" / "results" / "byzantine.md"
FIELDS = ("attack", "line", "share", "honest", "asr")


def run_points(grid: str, uri: str, parent: str | None) -> tuple[list, float | None]:
    """The grid's points, from the runs of ``parent`` or from a fresh run of its scenario."""
    import raysim
    from raysim.results.byzantine import points
    from raysim.results.curves import Compared
    from raysim.scenario.config import resolved

    t0 = time.perf_counter()
    if parent is None:
        import os

        os.environ["MLFLOW_TRACKING_URI"] = uri
        sweep = raysim.run(str(GRIDS[grid]), engine="serial", concurrent=1)
    else:
        sweep = None
    results = list(sweep.runs.values()) if sweep is not None else []
    for pid in (parent or "").split(","):  # a grid run in parts: several parents
        if pid:
            results += list(raysim.load(pid, tracking_uri=uri).runs.values())
    wall = time.perf_counter() - t0 if parent is None else None
    runs = [Compared(r.summary, resolved(r.scenario) if r.scenario is not None else None) for r in results]
    return points(runs), wall


def save(pts: list, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for p in pts:
            w.writerow([p.attack, p.line, p.share, p.honest, "" if p.asr is None else p.asr])


def read(path: Path) -> list:
    from raysim.results.byzantine import Point

    with open(path, newline="") as f:
        return [
            Point(r["attack"], r["line"], float(r["share"]), float(r["honest"]), float(r["asr"]) if r["asr"] else None)
            for r in csv.DictReader(f)
        ]


def put(page: Path, mark: str, body: str) -> None:
    text = page.read_text()
    if f"<!-- {mark} -->" not in text:
        raise SystemExit(f"byzantine: {page} has no <!-- {mark} --> marker")
    pattern = rf"<!-- {mark} -->.*?<!-- /{mark} -->"
    page.write_text(re.sub(pattern, lambda _: f"<!-- {mark} -->\n{body.strip()}\n<!-- /{mark} -->", text, flags=re.S))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(GRIDS), action="append")
    ap.add_argument("--parent", action="append", default=[], metavar="GRID=RUN_ID")
    ap.add_argument("--tracking-uri")
    ap.add_argument("--points", action="store_true", help="redraw from bench/results/byzantine_<grid>.csv")
    a = ap.parse_args(argv)
    from raysim.results.byzantine import draw

    parents = dict(p.split("=", 1) for p in a.parent)
    grids = a.only or (list(parents) if parents else list(GRIDS))
    with tempfile.TemporaryDirectory() as tmp:
        uri = a.tracking_uri or f"sqlite:///{tmp}/byzantine.db"
        for grid in grids:
            csv_path = HERE / "results" / f"byzantine_{grid}.csv"
            if a.points:
                pts, wall = read(csv_path), None
            else:
                pts, wall = run_points(grid, uri, parents.get(grid))
                save(pts, csv_path)
            with tempfile.TemporaryDirectory() as out:
                draw(pts, Path(out), f"byzantine_{grid}")
                md = Path(out, f"byzantine_{grid}.md").read_text()
                (PAGE.parent / f"byzantine_{grid}.png").write_bytes(Path(out, f"byzantine_{grid}.png").read_bytes())
            put(PAGE, f"byzantine-{grid}", md)
            print(f"## {grid}: {len(pts)} runs" + (f" in {wall / 60:.1f} min" if wall else "") + "\n\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
