"""What each robust rule costs the server a round, against FedAvg's mean on the same per-client
path and against the pre-summed path FedAvg takes without a defence.

For K = 100 and 1 000 clients and d the parameters of the Byzantine grid's MLP (784-100-10,
79 510 floats), each rule runs in a process of its own on K random replies (float64 Weighted
models, as hosts send them) through ``RobustRound.reduce``, the server's whole step: the updates
stacked (K × d), the rule, the reply rebuilt. Printed per rule: its seconds, the mean rule's on the
same path, their ratio, and the process's peak memory beside the K × d × 8 bytes the updates take.
The pre-summed line is what FedAvg's server does with no defence: merge two host sums.

    python bench/byzantine_cost.py                 # both K, every rule (about 3 min on 2 cores)
    python bench/byzantine_cost.py --k 100         # one K
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D = 784 * 100 + 100 + 100 * 10 + 10
RULES = [
    "mean",
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "geometric_median",
    "bulyan",
    "centered_clipping",
    "norm_clipping",
    "dnc",
    "signguard",
    "flame",
    "median+bucketing",
    "median+nnm",
]
SCENARIO = """
name: cost
rounds: 1
data: {dataset: synthetic, clients: CLIENTS, dim: 10, max_samples: 20}
model: {name: linear}
algorithm: {name: fedavg}
"""


def one(rule: str, k: int, repeats: int) -> dict:
    import torch

    from raysim.core.replies import Accumulator, Weighted
    from raysim.federation.robust_round import RobustRound
    from raysim.scenario import config

    name, _, pre = rule.partition("+")
    f = k // 5
    defence = f"{{rule: {name}, f: {f}" + (f", preaggregate: {pre}}}" if pre else "}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cost.yaml"
        path.write_text(SCENARIO.replace("CLIENTS", str(k)) + ("" if rule == "presummed" else f"defence: {defence}\n"))
        sc = config.load(path, check_data=False)
    g = torch.Generator().manual_seed(0)
    theta = [torch.zeros(D)]
    replies = {}
    for c in range(k):
        replies[c] = Accumulator()
        replies[c].add(Weighted([0.01 * torch.randn(D, generator=g)], float(10 + c % 7)))
    torch.set_num_threads(1)  # the server's math runs on one thread (engine.driver.server_math)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if rule == "presummed":  # two hosts' sums merged: the server's whole step without a defence
            halves = [Accumulator(), Accumulator()]
            for c, acc in replies.items():
                halves[c % 2].merge(acc)
            t0 = time.perf_counter()
            total = Accumulator()
            for h in halves:
                total.merge(h)
            total.result()
        else:
            RobustRound(sc, list(range(k))).reduce(0, replies, theta)
        seconds.append(time.perf_counter() - t0)
    return {"seconds": min(seconds), "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child(rule: str, k: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", rule, "--k", str(k), "--repeats", str(repeats)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, action="append", help="clients a round (default 100 and 1000)")
    ap.add_argument("--rules", default=",".join(RULES), help="comma-separated (rule or rule+preaggregator)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.k[0], a.repeats)))
        return
    for k in a.k or [100, 1000]:
        bound = k * D * 8 / 2**20
        base = child("mean", k, a.repeats)
        summed = child("presummed", k, a.repeats)
        print(f"\nK = {k} clients, d = {D}: the updates take K × d × 8 B = {bound:.0f} MB")
        print(f"{'rule':<22}{'seconds':>10}{'mean s':>10}{'ratio':>8}{'peak MB':>10}")
        print(
            f"{'(pre-summed FedAvg)':<22}{summed['seconds']:>10.4f}{base['seconds']:>10.4f}"
            f"{summed['seconds'] / base['seconds']:>8.2f}{summed['peak_mb']:>10.0f}"
        )
        for rule in a.rules.split(","):
            r = base if rule == "mean" else child(rule, k, a.repeats)
            print(
                f"{rule:<22}{r['seconds']:>10.4f}{base['seconds']:>10.4f}"
                f"{r['seconds'] / base['seconds']:>8.2f}{r['peak_mb']:>10.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
