"""Every method gives the same numbers on 1 host and on 3, on a GPU (or, without one, on the CPU).

    python bench/gpu_identity.py                  # every method of scenarios/pfl_benchmark.yaml
    python bench/gpu_identity.py --variant 'fedem-shards,lr=0.01'
    python bench/gpu_identity.py --set algorithm.stacking=padded

Each classification method of the personalized-FL benchmark (scenarios/pfl_benchmark.yaml, its
pathological split at lr 0.01) runs on scikit-learn's bundled digits (no download), 10 clients
of which 2 never train and are scored after personalizing (``eval.unseen_fraction``), 2 rounds
of 1 local epoch, and D-SGD and D-FedEM run on a small synthetic graph whose clients
hold unequal numbers of samples (and the gossip forms of FedPer, FedRep, LG-FedAvg, FedBN, FedRoD,
MOON, Per-FedAvg, Ditto, APFL and SuPerFed-MM on it, with a small MLP); all on the serial
engine with ``resources.gpus_per_host: 1``
(the GPU when CUDA is there) and with PyTorch's deterministic algorithms enforced
(``torch.use_deterministic_algorithms(True)``: an operation without a deterministic kernel
fails its run and is named). Each is run on 1 host and on 3, and every metric of every round is
compared (timings, bytes and message counts left out). It prints the runs that failed and the
runs whose numbers differ, with the first metrics that do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from gpu import learned  # noqa: E402

DECENTRALIZED = {
    "d-sgd": {"algorithm": {"name": "fedavg", "lr": 0.1, "batch_size": 32, "local_epochs": 1}},
    "d-fedem": {
        "algorithm": {"name": "fedem", "components": 3, "lr": 0.1, "momentum": 0.9, "batch_size": 32, "local_epochs": 1}
    },
}
# the gossip forms of the methods that keep a part on each client (or mix a meta-model): a
# model with a head (and, for FedBN, batch norm)
for _name in ("fedper", "fedrep", "lg_fedavg", "fedbn", "fedrod", "moon", "perfedavg", "ditto", "apfl", "superfed-mm"):
    DECENTRALIZED[f"d-{_name}"] = {
        "algorithm": {"name": _name, "lr": 0.1, "momentum": 0.5, "batch_size": 32, "local_epochs": 1},
        "model": {"name": "mlp", "hidden": [16], **({"norm": "batch"} if _name == "fedbn" else {})},
    }


def child(argv: list[str]) -> int:
    """``raysim`` with PyTorch's deterministic algorithms enforced."""
    import torch

    torch.use_deterministic_algorithms(True)
    from raysim.cli import main

    return main(argv)


def start(args: list[str], cwd: str) -> subprocess.Popen:
    """``raysim ARGS`` (the installed raysim) in a child process, started."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def store_runs(uri: str) -> dict[str, tuple[str, dict]]:
    """{run name: (status, {metric: [(step, value), ...]})} of a store's runs (a sweep's parent left out)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    out = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=10_000):
            keys = list(learned(run.data.metrics))
            if not keys:  # a sweep's parent run
                continue
            out[run.info.run_name] = (
                run.info.status,
                {
                    k: [
                        (m.step, m.value)
                        for m in sorted(client.get_metric_history(run.info.run_id, k), key=lambda m: m.step)
                    ]
                    for k in keys
                },
            )
    return out


def differing(a: dict, b: dict) -> list[str]:
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="*-shards,lr=0.01", help="pfl_benchmark.yaml variants (a pattern)")
    ap.add_argument("--no-decentralized", action="store_true")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to every run (e.g. algorithm.stacking=padded)",
    )
    args = ap.parse_args()
    import torch

    print(f"device: {'CUDA, ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU (no GPU)'}")
    common = [
        "--engine",
        "serial",
        "-q",
        "--set",
        "resources.gpus_per_host=1",
        *(a for kv in args.set for a in ("--set", kv)),
    ]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        stores, procs = {}, {}
        for hosts in (1, 3):  # the two sweeps side by side
            stores[hosts] = f"sqlite:///{tmp}/methods{hosts}.db"
            procs[hosts] = start(
                [
                    "run",
                    str(ROOT / "scenarios/pfl_benchmark.yaml"),
                    "--variant",
                    args.variant,
                    "--seeds",
                    "0",
                    "--set",
                    "data.dataset=digits",
                    "--set",
                    "data.clients=10",
                    "--set",
                    "rounds=2",
                    "--set",
                    "eval.every=1",
                    "--set",
                    "algorithm.local_epochs=1",
                    "--set",
                    "eval.unseen_fraction=0.2",
                    "--set",
                    f"resources.hosts={hosts}",
                    "--set",
                    f"tracking.uri={stores[hosts]}",
                    *common,
                ],
                tmp,
            )
        for hosts, p in procs.items():
            out, _ = p.communicate()
            for line in out.splitlines():
                if "run failed" in line:
                    bad += 1
                    print(f"{hosts} host(s): {line.split('(rerun')[0].strip()}")
        one, three = store_runs(stores[1]), store_runs(stores[3])
        for name in sorted(one):
            (sa, ma), (sb, mb) = one[name], three.get(name, ("missing", {}))
            diff = differing(ma, mb)
            if sa != "FINISHED" or sb != "FINISHED" or diff:
                bad += 1
                print(f"{name}: {sa} / {sb}" + (f"; differ: {', '.join(diff[:4])}" if diff else ""))
        print(f"methods: {len(one)} runs on 1 host and on 3, {sum(1 for n in one if n in three)} compared")
        if not args.no_decentralized:
            for name, over in DECENTRALIZED.items():
                sc = {
                    "name": name,
                    "seed": 0,
                    "rounds": 3,
                    "data": {"dataset": "synthetic", "clients": 30, "splits": {"train": 0.8, "test": 0.2}},
                    "model": {"name": "linear"},
                    **over,
                    "topology": {"kind": "erdos_renyi", "p": 0.3, "mixing": "metropolis"},
                    "eval": {"every": 3},
                }
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(yaml.safe_dump(sc))
                runs, procs = {}, {}
                for hosts in (1, 3):
                    procs[hosts] = start(
                        [
                            "run",
                            str(path),
                            "--summary",
                            str(Path(tmp) / f"{name}-{hosts}.json"),
                            "--set",
                            f"resources.hosts={hosts}",
                            "--set",
                            f"tracking.uri=sqlite:///{tmp}/{name}{hosts}.db",
                            *common,
                        ],
                        tmp,
                    )
                for hosts, p in procs.items():
                    out, _ = p.communicate()
                    runs[hosts] = (
                        json.loads((Path(tmp) / f"{name}-{hosts}.json").read_text()) if p.returncode == 0 else None
                    )
                    if p.returncode:
                        print(f"{name}, {hosts} host(s): failed: {out.strip().splitlines()[-1]}")
                if runs[1] and runs[3]:
                    diff = sorted(
                        {
                            k
                            for a, b in zip(runs[1]["history"], runs[3]["history"])
                            for k in differing(learned(a), learned(b))
                        }
                    )
                    print(f"{name}: " + (f"differ: {', '.join(diff[:4])}" if diff else "the same on 1 host and 3"))
                    bad += bool(diff)
                else:
                    bad += 1
    print("all the same" if bad == 0 else f"{bad} not the same")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
