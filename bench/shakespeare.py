"""Shakespeare by speaking role on CPU: FedEM against FedAvg (its reference here) and Local, the
same data, model and optimizer, each run as a user runs it (``raysim run`` of the two scenario
files with ``--set``). The paper's scale (852 roles, 4.3 M windows, LSTM 256, 200 rounds) takes
GPU hours; this runs a sample of roles, each cut to its first ``--chars`` characters, with a
smaller LSTM and LEAF's optimizer for Shakespeare (plain SGD, batch 10), which leaves the
"always a space" plateau in a few rounds where the paper's (lr 0.05, momentum .9, batch 128)
takes far longer.

    python bench/shakespeare.py                       # 24 roles x 2000 characters, 30 rounds
    python bench/shakespeare.py --rounds 10 --clients 12 --chars 1500 --methods fedavg
    python bench/shakespeare.py --lr 0.5,1,2,3        # every method at each learning rate

Prints per method: accuracy and bottom decile on the roles' test windows (LEAF's split),
seconds per round, the whole process; then FedEM's accuracy against FedAvg's (the ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = {"fedavg": "shakespeare_fedavg.yaml", "fedem": "shakespeare_fedem.yaml", "local": "shakespeare_fedavg.yaml"}


def run(method: str, lr: float, args, tmp: str) -> dict:
    out = Path(tmp) / f"{method}-{lr}.json"
    sets = {
        "rounds": args.rounds,
        "seed": args.seed,
        "data.clients": args.clients,
        "data.max_chars": args.chars,
        "model.hidden": args.hidden,
        "algorithm.lr": lr,
        "algorithm.momentum": 0,
        "algorithm.weight_decay": 0,
        "algorithm.batch_size": args.batch,
        "algorithm.lr_schedule": "constant",
        "eval.every": args.eval_every,
        "resources.hosts": 2,
        "checkpoint.every": 0,
        "tracking.uri": f"sqlite:///{tmp}/mlflow.db",
        "checkpoint.dir": f"{tmp}/ck",
    }
    if method == "local":
        sets["algorithm.name"] = "local"
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        str(ROOT / "scenarios" / SCENARIO[method]),
        "-q",
        "--summary",
        str(out),
        "--engine",
        args.engine,
    ]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)})
    s = json.loads(out.read_text())
    s["process_s"] = time.perf_counter() - t0
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="fedavg,fedem,local")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--chars", type=int, default=2000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", default="1.0", help="learning rate, or a comma-separated list to try each")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--engine", default="ray", choices=("ray", "serial"))
    args = ap.parse_args()
    lrs = [float(v) for v in args.lr.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.methods.split(","):
            for lr in lrs:
                s = results[m, lr] = run(m, lr, args, tmp)
                f = s["final"]
                rounds_s = sum(h["round_seconds"] for h in s["history"])
                print(
                    f"{m:7s} lr {lr:<5g} accuracy {f['accuracy']:.4f}  bottom decile {f['bottom_decile_accuracy']:.4f}  "
                    f"{rounds_s / args.rounds:.2f} s/round  whole process {s['process_s']:.1f} s",
                    flush=True,
                )
    best = {
        m: max((r for r in results if r[0] == m), key=lambda r: results[r]["final"]["accuracy"])
        for m in dict.fromkeys(m for m, _ in results)
    }
    if "fedem" in best and "fedavg" in best:
        a, b = results[best["fedem"]]["final"], results[best["fedavg"]]["final"]
        print(
            f"FedEM (lr {best['fedem'][1]:g}) / FedAvg (reference, lr {best['fedavg'][1]:g}), each at its best "
            f"learning rate: accuracy {a['accuracy']:.4f} / {b['accuracy']:.4f} = {a['accuracy'] / b['accuracy']:.3f}; "
            f"bottom decile {a['bottom_decile_accuracy']:.4f} / {b['bottom_decile_accuracy']:.4f}"
        )
    print(
        f"({args.clients} roles x {args.chars} characters, LSTM {args.hidden}, SGD batch {args.batch}, "
        f"{args.rounds} rounds, seed {args.seed}, engine {args.engine})"
    )


if __name__ == "__main__":
    main()
