"""raysim vs a bare PyTorch loop on the same FedAvg workloads (issue #2's benchmark).

    python bench/compare.py                 # both workloads
    python bench/compare.py tiny            # one of them
    python bench/compare.py --hosts 2       # override resources.hosts
    python bench/compare.py tiny --repeat 3 # three times, one after another, and the ratios' medians

First, what the user waits for: the whole process, from exec to exit, of the bare loop
(`python bench/bare_fedavg.py`: Python, torch, data, rounds) and of `raysim run` (Python, Ray's
start, host actors loading their shards, MLflow, rounds, final evaluation, shutdown), and their
ratio (goal on tiny: <= 1.0), for a first run that creates the MLflow store and a later
run that finds it. A new store is a copy of the empty store kept in the user's cache
(``store.seed_store``); the machine's first store ever is made by MLflow, 1.5 to 2 s more.
Then the training alone: the bare loop's timed rounds against raysim's rounds without the final
evaluation (which the bare loop does not do), and with it.
Targets on 2 cores: tiny <= 1.2, cnn <= 0.6 (training ratio).

    python bench/compare.py tiny --address auto   # raysim joins a running Ray (`ray start --head`)
    python bench/compare.py tiny --set resources.driver_host=false   # every host an actor
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {"tiny": (1000, 10, 1.2), "cnn": (50, 5, 0.6)}  # clients, rounds, target ratio


def bare(kind: str, clients: int, rounds: int) -> tuple[float, float]:
    """(timed rounds, whole process) of the bare loop."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE / "bare_fedavg.py"), kind, str(clients), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(re.search(r"wall=([\d.]+)s", out).group(1)), time.perf_counter() - t0


def raysim(
    kind: str, hosts: int | None, engine: str, address: str | None, tmp: str, sets: list[str] = ()
) -> tuple[float, float, float, float]:
    """(training seconds, rounds seconds, run seconds as the summary reports, whole process),
    tracking into ``tmp``'s store (a new one the first time)."""
    summary = Path(tmp) / "summary.json"
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        str(HERE / f"{kind}.yaml"),
        "-q",
        "--engine",
        engine,
        "--summary",
        str(summary),
        "--set",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "--set",
        f"checkpoint.dir={tmp}/ck",
    ]
    if hosts:
        cmd += ["--set", f"resources.hosts={hosts}"]
    if address:
        cmd += ["--address", address]
    for item in sets:
        cmd += ["--set", item]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    whole = time.perf_counter() - t0
    s = json.loads(summary.read_text())
    rounds = sum(h["round_seconds"] for h in s["history"])
    training = rounds - sum(h.get("eval_seconds", 0.0) for h in s["history"])
    return training, rounds, s["wall_seconds"], whole


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--engine", default="ray", choices=("ray", "serial"))
    ap.add_argument("--address", default=None, help="raysim joins this Ray (e.g. auto) instead of starting one")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a scenario override for raysim")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the three (bare, raysim on a new store, on an existing one) this many times, "
        "one after another, then print each ratio's median (machines vary from run to run)",
    )
    args = ap.parse_args()
    # raysim runs twice on one MLflow store: the first run creates it (MLflow migrates a new
    # SQLite database: about 1 s of CPU), the second finds it, as a user's later runs do
    print(
        f"{'workload':<8} {'store':<8} {'bare process s':>14} {'raysim process s':>16} {'ratio':>6} | "
        f"{'bare rounds s':>13} {'raysim train s':>14} {'ratio':>6} {'target':>6} {'+final eval s':>13} {'ratio':>6}"
    )
    for kind in args.workloads:
        clients, rounds, target = WORKLOADS[kind]
        ratios: dict[str, list[tuple[float, float, float]]] = {"new": [], "existing": []}
        for _ in range(args.repeat):
            b, b_whole = bare(kind, clients, rounds)
            with tempfile.TemporaryDirectory() as tmp:
                for store in ("new", "existing"):
                    train, r_rounds, _, r_whole = raysim(kind, args.hosts, args.engine, args.address, tmp, args.set)
                    ratios[store].append((r_whole / b_whole, train / b, r_rounds / b))
                    print(
                        f"{kind:<8} {store:<8} {b_whole:14.2f} {r_whole:16.2f} {r_whole / b_whole:6.2f} | "
                        f"{b:13.2f} {train:14.2f} {train / b:6.2f} {target:6.2f} {r_rounds:13.2f} "
                        f"{r_rounds / b:6.2f}",
                        flush=True,
                    )
        if args.repeat > 1:
            for store, rs in ratios.items():
                whole, train, rounds_ = (statistics.median(col) for col in zip(*rs))
                print(
                    f"{kind:<8} {store:<8} {'median of ' + str(len(rs)):>31} {whole:6.2f} | {'':>28} {train:6.2f} "
                    f"{target:6.2f} {'':>13} {rounds_:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
