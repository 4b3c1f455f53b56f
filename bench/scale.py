"""raysim at scale: 10 000 and 100 000 registered clients (issue #11's benchmark).

    python bench/scale.py                # every case (about 10 minutes on 2 cores)
    python bench/scale.py --sizes 10000  # one size
    python bench/scale.py --sizes 1000000 --cases star-1000   # a million registered, 1 000 a round

Cases, on a linear model over 20 standard-normal features (16 samples a client, 8 for training),
2 host actors of 1 CPU:
- star: FedAvg, 1 % of the clients sampled a round, evaluation of 1 000 sampled clients every
  10 rounds; run for 10 rounds and for 100, to see memory stay flat;
- star-1000: the same with 1 000 clients sampled a round whatever the size (the million-client
  case: ``--sizes 1000000 --cases star-1000``; data and state exist only for clients that were
  sampled or evaluated);
- gossip: D-SGD (every client trains and mixes each round) on a sparse Erdős–Rényi graph of
  average degree 8 (its components bridged: ``topology.connect: bridge``) and on a ring.

Each case runs `raysim run` as the user does (a process of its own, a fresh local Ray) and
prints the whole process, the time outside the rounds (start-up and shutdown), the median seconds per
round, and the peak resident memory of the driver (which runs the server) and the host actors
(sampled every 0.2 s from /proc: Linux). The reference is the same scenario on raysim's serial
engine (one process, no Ray): the ratio says what Ray's processes cost at that scale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def scenario(kind: str, clients: int, rounds: int) -> dict:
    sc = {
        "name": f"scale-{kind}-{clients}",
        "seed": 0,
        "rounds": rounds,
        "data": {
            "dataset": "gaussian",
            "clients": clients,
            "samples": 16,
            "features": [20],
            "classes": 2,
            "splits": {"train": 0.5, "test": 0.5},
        },
        "model": {"name": "linear"},
        "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 8, "local_epochs": 1},
        "eval": {"every": 10, "clients": 1000},
        "resources": {"hosts": 2, "cpus_per_host": 1},
        "checkpoint": {"every": 0},
        "tracking": {"experiment": "raysim-scale"},
    }
    if kind == "star":
        sc["sampling"] = {"fraction": 0.01}
    elif kind == "star1000":
        sc["sampling"] = {"count": 1000}
    else:
        graph = {"kind": "ring"} if kind == "ring" else {"kind": "erdos_renyi", "p": 8 / clients, "connect": "bridge"}
        sc["topology"] = {**graph, "mixing": "metropolis"}
        sc["sampling"] = {"fraction": 1.0}
    return sc


def _rss(pid: int) -> int:
    """Resident bytes of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _roles() -> dict[str, list[int]]:
    """Pids of the Ray host actors (by their process titles)."""
    out: dict[str, list[int]] = {"hosts": []}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "RayHost" in cmd:
            out["hosts"].append(int(d.name))
    return out


def run(sc: dict, engine: str) -> dict:
    """Run one scenario; returns whole-process seconds, start-up, s/round and peak RSS (MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump(sc))
        summary = Path(tmp) / "summary.json"
        cmd = [
            sys.executable,
            "-m",
            "raysim.cli",
            "run",
            str(path),
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
        peak = {"driver": 0, "hosts": 0}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak["driver"] = max(peak["driver"], _rss(proc.pid))
                for role, pids in _roles().items():
                    peak[role] = max(peak[role], sum(_rss(p) for p in pids))
                time.sleep(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out, err = proc.communicate()
        whole = time.perf_counter() - t0
        done.set()
        watcher.join()
        if proc.returncode:
            raise SystemExit(f"raysim failed ({proc.returncode}):\n{err[-3000:]}")
        s = json.loads(summary.read_text())
    rounds = [h["round_seconds"] - h.get("eval_seconds", 0.0) for h in s["history"]]
    return {
        "whole": whole,
        "startup": whole - sum(h["round_seconds"] for h in s["history"]),
        "per_round": statistics.median(rounds),
        "mb": {k: v / 2**20 for k, v in peak.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    kinds = {"star": "star", "star-1000": "star1000", "gossip-er": "er", "gossip-ring": "ring"}
    ap.add_argument("--cases", nargs="*", default=["star", "gossip-er", "gossip-ring"], choices=list(kinds))
    args = ap.parse_args()
    print(
        f"{'case':<22} {'engine':<6} {'rounds':>6} {'process s':>9} {'outside s':>10} {'s/round':>8} "
        f"{'driver MB':>9} {'hosts MB':>9}  vs serial (process, s/round)",
        flush=True,
    )
    for n in args.sizes:
        for case in args.cases:
            kind = kinds[case]
            lengths = (10, 100) if kind.startswith("star") else (10,)
            ref = run(scenario(kind, n, lengths[0]), "serial")
            for rounds in lengths:
                r = run(scenario(kind, n, rounds), "ray")
                vs = (
                    f"{r['whole'] / ref['whole']:.2f}x, {r['per_round'] / ref['per_round']:.2f}x"
                    if rounds == lengths[0]
                    else ""
                )
                m = r["mb"]
                print(
                    f"{case + ' ' + str(n):<22} {'ray':<6} {rounds:>6} {r['whole']:9.1f} {r['startup']:10.1f} "
                    f"{r['per_round']:8.3f} {m['driver']:9.0f} {m['hosts']:9.0f}  {vs}",
                    flush=True,
                )
            print(
                f"{case + ' ' + str(n):<22} {'serial':<6} {lengths[0]:>6} {ref['whole']:9.1f} {ref['startup']:10.1f} "
                f"{ref['per_round']:8.3f} {ref['mb']['driver']:9.0f} {'-':>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()
