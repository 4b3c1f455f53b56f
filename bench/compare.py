"""raysim vs a bare PyTorch loop on the same FedAvg workloads (issue #2's benchmark).

    python bench/compare.py                 # both workloads
    python bench/compare.py tiny            # one of them
    python bench/compare.py --hosts 2       # override resources.hosts

For each workload it prints the bare loop's wall time (one process, one thread, training only),
raysim's training time (the rounds without the final evaluation, which the bare loop does not
do), the rounds with it, raysim's whole `raysim run` (Python start, Ray start, host actors
loading their shards, MLflow) and the ratios to the bare loop.
Targets on 2 cores: tiny <= 1.2, cnn <= 0.6 (training ratio).
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


def raysim(kind: str, hosts: int | None, engine: str) -> tuple[float, float, float, float]:
    """(training seconds, rounds seconds, run seconds as the summary reports, whole process)."""
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
    training = rounds - sum(h.get("eval_seconds", 0.0) for h in s["history"])
    return training, rounds, s["wall_seconds"], whole


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--hosts", type=int, default=None)
    ap.add_argument("--engine", default="ray", choices=("ray", "serial"))
    args = ap.parse_args()
    print(f"{'workload':<8} {'bare s':>7} {'raysim train s':>15} {'ratio':>6} {'target':>6} "
          f"{'+final eval s':>14} {'ratio':>6} {'raysim run s':>13} {'ratio':>6} {'process s':>10}")
    for kind in args.workloads:
        clients, rounds, target = WORKLOADS[kind]
        b = bare(kind, clients, rounds)
        train, r_rounds, r_run, r_whole = raysim(kind, args.hosts, args.engine)
        print(f"{kind:<8} {b:7.2f} {train:15.2f} {train / b:6.2f} {target:6.2f} {r_rounds:14.2f} "
              f"{r_rounds / b:6.2f} {r_run:13.2f} {r_run / b:6.2f} {r_whole:10.2f}", flush=True)


if __name__ == "__main__":
    main()
