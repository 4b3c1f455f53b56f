"""What a round of each method costs, against FedAvg's, on the personalized-FL benchmark's
workload (scenarios/pfl_benchmark.yaml: Fashion-MNIST, SuPerFed's pathological split, 50
clients, 5 a round, the 784-200-200-10 MLP, 5 local epochs of batch 10, SGD with momentum).

    python bench/method_rounds.py                              # the methods below
    python bench/method_rounds.py --methods apfl,ditto --pairs 3
    python bench/method_rounds.py --methods all                # every method of the benchmark

For each method, in this process on the serial engine (every host's work, one host after the
other): its round by default (gradients by hand where the model is a chain of linear layers:
loop.py's ``Objective.gradients`` and chain.py), the same round with ``gradients: autograd``
(the reference: each step through PyTorch's autograd, as the peers train) and FedAvg's round,
alternated ``--pairs`` times after one warm-up round each (the pass widths are measured then),
so that a machine whose speed drifts weighs on all three alike. Prints the median seconds of
each, the method's round over FedAvg's and the reference's over raysim's. SuPerFed runs its
mixing phase (``start: 0``), the dearer one. Evaluation is left out (it runs every 25 rounds in
the benchmark). Needs Fashion-MNIST (sudo apt-get install dataset-fashion-mnist).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from raysim.engine.serial import serial_driver  # noqa: E402
from raysim.scenario import config  # noqa: E402

SCENARIO = HERE.parent / "scenarios" / "pfl_benchmark.yaml"
DEFAULT = ("ditto", "apfl", "pfedme", "superfed-mm", "superfed-lm", "sosicfl", "sosicfl+")


def driver(method: str, gradients: str):
    extra = ["algorithm.start=0.0"] if method.startswith("superfed") else []
    ((_, sc),) = config.load_variants(
        SCENARIO,
        [f"algorithm.gradients={gradients}", "eval.every=1000", "checkpoint.every=0", *extra],
        only=f"{method}-shards,lr=0.01",
    )
    d = serial_driver(sc)
    d.step()  # warm-up: data on the hosts, pass widths measured
    return d


def timed(d) -> float:
    t0 = time.perf_counter()
    d.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default=",".join(DEFAULT), help="comma-separated, or 'all'")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of each side, alternated")
    args = ap.parse_args()
    if args.methods == "all":
        names = [
            n.removesuffix("-shards,lr=0.01")
            for n, _ in config.load_variants(SCENARIO, only="*-shards,lr=0.01", check_data=False)
        ]
        methods = [n for n in names if n != "fedavg"]
    else:
        methods = args.methods.split(",")
    fedavg = driver("fedavg", "auto")
    rows = []
    print(f"{'method':<14} {'round s':>8} {'/ FedAvg':>9} {'autograd s':>11} {'autograd / raysim':>18}")
    for method in methods:
        ours, ref = driver(method, "auto"), driver(method, "autograd")
        secs: dict[str, list[float]] = {"fedavg": [], "ours": [], "ref": []}
        for _ in range(args.pairs):
            secs["fedavg"].append(timed(fedavg))
            secs["ours"].append(timed(ours))
            secs["ref"].append(timed(ref))
        f, o, r = (statistics.median(secs[k]) for k in ("fedavg", "ours", "ref"))
        rows.append((method, o, o / f, r, r / o))
        print(f"{method:<14} {o:>8.2f} {o / f:>8.2f}x {r:>11.2f} {r / o:>17.2f}x  (FedAvg {f:.2f} s)", flush=True)
        del ours, ref


if __name__ == "__main__":
    main()
