"""raysim vs a bare PyTorch loop on the same FedAvg workloads (issue #2's benchmark).

    python bench/compare.py                 # both workloads
    python bench/compare.py tiny            # one of them
    python bench/compare.py --hosts 2       # override resources.hosts

For each workload it prints the bare loop's wall time (one process, one thread), raysim's
time for the rounds (first round start to last round end, data loading included, as in the bare
loop), raysim's whole `raysim run` (Python start, Ray start, actors, MLflow) and the ratios.
Targets on 2 cores: tiny <= 1.2, cnn <= 0.6 (rounds ratio).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {"tiny": (1000, 10, 1.2), "cnn": (50, 5, 0.6)}     # clients, rounds, target ratio


def bare(kind: str, clients: int, rounds: int) -> float:
    out = subprocess.run([sys.executable, str(HERE / "bare_fedavg.py"), kind, str(clients), str(rounds)],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"wall=([\d.]+)s", out).group(1))


def raysim(kind: str, hosts: int | None, engine: str) -> tuple[float, float, float]:
    """(rounds seconds, run seconds as the summary reports, whole process seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "raysim.cli", "run", str(HERE / f"{kind}.yaml"), "-q",
               "--engine", engine, "--summary", str(summary),
               "--set", f"tracking.uri=sqlite:///{tmp}/mlflow.db", "--set", f"checkpoint.dir={tmp}/ck"]
        if hosts:
            cmd += ["--set", f"resources.hosts={hosts}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
        whole = time.perf_counter() - t0
        s = json.loads(summary.read_text())
    rounds = sum(h["round_seconds"] for h in s["history"])
    return rounds, s["wall_seconds"], whole


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--engine", default="ray", choices=("ray", "serial"))
    args = ap.parse_args()
    print(f"{'workload':<8} {'bare s':>8} {'raysim rounds s':>16} {'ratio':>7} {'target':>7} "
          f"{'raysim run s':>13} {'ratio':>7} {'whole process s':>16}")
    for kind in args.workloads:
        clients, rounds, target = WORKLOADS[kind]
        b = bare(kind, clients, rounds)
        r_rounds, r_run, r_whole = raysim(kind, args.hosts, args.engine)
        print(f"{kind:<8} {b:8.2f} {r_rounds:16.2f} {r_rounds / b:7.2f} {target:7.2f} "
              f"{r_run:13.2f} {r_run / b:7.2f} {r_whole:16.2f}", flush=True)


if __name__ == "__main__":
    main()
