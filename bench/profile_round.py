"""Where a round's time goes: a scenario's rounds on the serial engine (every host in this
process, one after another, each at its own thread budget), profiled with cProfile after one
warm-up round, each function's own time put in one bucket.

    python bench/profile_round.py scenarios/quickstart.yaml
    python bench/profile_round.py my.yaml --rounds 2 --set algorithm.name=ditto
    python bench/profile_round.py scenarios/pfl_benchmark.yaml --variant 'apfl-shards,lr=0.003'

Buckets: matrix products (bmm, baddbmm, matmul: forward, weight gradients, error), element-wise
tensor ops (activations, softmax, the fused update's adds), autograd (the backward engine),
the loop's Python (batching, passes, optimizer bookkeeping), client steps (the methods' code,
jobs, contexts and their generators), replies (reduction into float64 sums), gossip (mixing,
consensus), evaluation, data (shards), and the rest. The serial engine runs the hosts one
after another, so seconds here are a host's work summed over hosts, not a Ray round's wall.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

BUCKETS = [
    ("matrix products", ("bmm", "baddbmm", "matmul", "addmm", "linear", "conv")),
    ("autograd", ("run_backward", "autograd/__init__", "autograd/graph")),
    ("evaluation", ("evaluat", "scores", "outputs", "tasks.py")),
    ("gossip mixing and consensus", ("mixing.py", "gossip_mix", "consensus")),
    ("replies and reduction", ("replies.py", "aggregate", "reply")),
    ("data (shards)", ("raysim/data/", "split_client", "core/data.py:pack", "prefetch")),
    (
        "client steps (methods, jobs, contexts)",
        ("algorithms/", "make_job", "draw_orders", "rng.py", "context", "Generator", "randperm", "_advance", "drive"),
    ),
    ("the loop's Python and optimizer", ("core/loop.py", "core/optim.py", "core/chain.py", "foreach")),
    ("torch's Python (modules, no_grad)", ("site-packages/torch/",)),
    (
        "element-wise tensor ops",
        ("torch._C", "TensorBase", "torch.relu", "built-in method torch", "threshold", "softmax", "scatter", "gather"),
    ),
]


def bucket(func: tuple) -> str:
    text = f"{func[0]}:{func[2]}"
    for name, keys in BUCKETS:
        if any(k in text for k in keys):
            return name
    return "other (engine, Python)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--variant", help="a sweep's variant (the file is a sweep)")
    args = ap.parse_args()
    from raysim.engine.serial import serial_driver
    from raysim.scenario import config

    if args.variant:
        ((_, sc),) = config.load_variants(args.scenario, args.overrides, only=args.variant)
    else:
        sc = config.load(args.scenario, args.overrides)
    driver = serial_driver(sc)
    driver.step()  # warm-up: first loads, width measuring
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.rounds):
        driver.step()
    prof.disable()
    wall = (time.perf_counter() - t0) / args.rounds
    stats = pstats.Stats(prof).stats
    sums: dict[str, float] = {}
    for func, (_, _, own, _, _) in stats.items():
        sums[bucket(func)] = sums.get(bucket(func), 0.0) + own / args.rounds
    total = sum(sums.values())
    print(f"{sc.name}: {wall:.3f} s a round (profiled; {total:.3f} s of own time)")
    for name, secs in sorted(sums.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<42} {secs:8.3f} s  {100 * secs / total:5.1f} %")


if __name__ == "__main__":
    main()
