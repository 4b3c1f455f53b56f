"""raysim on one GPU: fractional placement, the same numbers whichever hosts share the GPU, and
the speed of CUDA against the machine's CPU cores.

    python bench/gpu.py                              # bench/cnn.yaml's workload, 100 clients
    python bench/gpu.py --clients 50 --rounds 5 --hosts 1,2,4
    python bench/gpu.py --gpu-only --set algorithm.stacking=always   # any override, to every raysim run
    python bench/gpu.py --workload mlp --gpu-only                     # bench/mlp.yaml's MLP 784-200-200-10

The workload is bench/cnn.yaml's (the FEMNIST CNN on 1x28x28 inputs, 62 classes, batch 32, 64
training samples a client, FedAvg, all clients every round, evaluation after the last round),
or with ``--workload mlp`` bench/mlp.yaml's (the MLP 784-200-200-10 at batch 10, whose clients
``stacking: always`` trains together), with ``--clients`` clients (100 unless said). Each line
is one whole process, from exec to exit:

- the bare loop (``bench/bare_fedavg.py``, the same workload) on the GPU and on one CPU thread:
  the floor;
- ``raysim run`` on the Ray engine with 1, 2, 4, ... hosts sharing the GPU
  (``resources.gpus_per_host`` = 1/hosts). While each run goes on, ``nvidia-smi`` counts the
  processes that hold memory on the GPU: with 4 hosts at 0.25 GPU, 4 processes at once;
- ``raysim run`` on the CPU with the same hosts, the machine's cores split between them.

It prints each run's whole-process and training seconds, the training ratio to the bare GPU
loop, and whether the run's metrics (every round's and the final ones; timings, transport bytes
and message counts left out) are identical to those of the first GPU run (of the first CPU run,
for the CPU lines). Without a GPU it runs the CPU lines only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# what a run reports that is not about learning: timings, and the bytes and messages the hosts
# sent (one message a host: they grow with the hosts)
NOT_LEARNED = ("second", "time", "wall", "bytes_", "messages_")


def gpu_processes(stop: threading.Event, seen: list[int]) -> None:
    """The most processes holding GPU memory at one time, polled every 0.2 s."""
    while not stop.is_set():
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout
        seen.append(len({line.strip() for line in out.splitlines() if line.strip()}))
        stop.wait(0.2)


def bare(kind: str, clients: int, rounds: int, device: str) -> tuple[float, float]:
    """(timed rounds, whole process) of the bare loop on ``device``."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE / "bare_fedavg.py"), kind, str(clients), str(rounds), device],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(re.search(r"wall=([\d.]+)s", out).group(1)), time.perf_counter() - t0


def learned(d: dict) -> dict:
    """``d``'s metrics about learning (``NOT_LEARNED`` left out)."""
    return {k: v for k, v in d.items() if not any(t in k for t in NOT_LEARNED)}


def metrics(summary: dict) -> dict:
    """Every number the run reported about learning."""
    return {"final": learned(summary["final"]), "history": [learned(h) for h in summary["history"]]}


def raysim(
    kind: str, clients: int, rounds: int, hosts: int, gpus: float, cpus: int, tmp: str, gpu: bool, extra: list[str]
) -> dict:
    summary = Path(tmp) / f"summary-{hosts}-{gpus}.json"
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        str(HERE / f"{kind}.yaml"),
        "-q",
        "--summary",
        str(summary),
        "--set",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "--set",
        f"checkpoint.dir={tmp}/ck",
        "--set",
        f"data.clients={clients}",
        "--set",
        f"rounds={rounds}",
        "--set",
        f"eval.every={rounds}",
        "--set",
        f"resources.hosts={hosts}",
        "--set",
        f"resources.cpus_per_host={cpus}",
        "--set",
        f"resources.gpus_per_host={gpus:g}",
    ] + [a for kv in extra for a in ("--set", kv)]
    stop, seen = threading.Event(), [0]
    watcher = threading.Thread(target=gpu_processes, args=(stop, seen), daemon=True) if gpu else None
    if watcher:
        watcher.start()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=tmp)
    whole = time.perf_counter() - t0
    stop.set()
    if watcher:
        watcher.join()
    s = json.loads(summary.read_text())
    rounds_s = sum(h["round_seconds"] for h in s["history"])
    train = rounds_s - sum(h.get("eval_seconds", 0.0) for h in s["history"])
    return {
        "whole": whole,
        "train": train,
        "gpu_processes": max(seen),
        "metrics": metrics(s),
        "accuracy": s["final"]["accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=("cnn", "mlp"), default="cnn")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--gpu-only", action="store_true", help="leave out the CPU lines")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every raysim run")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    cores = os.cpu_count() or 1
    hosts = [int(h) for h in args.hosts.split(",")]
    print(f"{'run':<34} {'process s':>9} {'train s':>8} {'/bare GPU':>9} {'GPU procs':>9} {'accuracy':>8} same")
    ref_train = None
    if gpu:
        ref_train, whole = bare(args.workload, args.clients, args.rounds, "cuda")
        print(f"{'bare loop, GPU':<34} {whole:9.2f} {ref_train:8.2f} {1.0:9.2f}", flush=True)
    if not (gpu and args.gpu_only):
        b_train, whole = bare(args.workload, args.clients, args.rounds, "cpu")
        print(
            f"{'bare loop, 1 CPU thread':<34} {whole:9.2f} {b_train:8.2f} "
            f"{(b_train / ref_train if ref_train else float('nan')):9.2f}",
            flush=True,
        )
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(h, 1.0 / h, 1, True) for h in hosts] if gpu else []
        if not (gpu and args.gpu_only):
            runs += [(h, 0.0, max(1, cores // h), False) for h in hosts]
        for h, g, c, on_gpu in runs:
            r = raysim(args.workload, args.clients, args.rounds, h, g, c, tmp, on_gpu, args.set)
            label = f"raysim {h} host(s), " + (f"{g:g} GPU each" if on_gpu else f"{c} CPU each")
            # CPU lines: a host's torch threads (cpus_per_host) split some sums (convolutions),
            # so the numbers are held to the reference's only at the same thread count
            if first is None or first[0] != on_gpu:
                first = (on_gpu, c, r["metrics"])
                same = "(reference)"
            elif first[1] != c:
                same = f"- ({c} threads, not {first[1]})"
            else:
                same = "yes" if r["metrics"] == first[2] else "NO"
            ratio = r["train"] / ref_train if ref_train else float("nan")
            print(
                f"{label:<34} {r['whole']:9.2f} {r['train']:8.2f} {ratio:9.2f} "
                f"{(r['gpu_processes'] if on_gpu else '-'):>9} {r['accuracy']:8.4f} {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
