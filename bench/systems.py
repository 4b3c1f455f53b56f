"""The simulated fleet (scenario ``systems``): what the clock costs, and what it shows.

    python bench/systems.py                 # all three parts (about 5 to 10 minutes on 2 cores)
    python bench/systems.py --parts cost    # one of: cost, async, deadline

- cost: FedAvg on Fashion-MNIST (below) with a heterogeneous fleet on (lognormal speeds and
  links, no deadline, nobody offline: the same clients train) against the same run without
  the section, rounds alternated in one process on the serial engine; the ratio of their
  median seconds a round (the target: within 5 %).
- async: synchronous FedAvg (20 clients a round) against FedBuff (20 clients in flight, a
  buffer of 10) and FedAsync on Fashion-MNIST (100 clients, Dirichlet 0.3, an MLP) with a
  long-tailed fleet (speeds lognormal, σ 1.5): the virtual hours each takes to reach the target
  accuracy (FedBuff should need fewer, as in Nguyen et al. 2022, Fig. 2).
- deadline: synchronous FedAvg on the same fleet with and without a round deadline: the
  accuracy of the slowest and the fastest tenth of the clients, and how often they took part.

Everything is virtual time from the seed: the figures of the async and deadline parts are the
same on any machine; the cost part is wall time and varies with the machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

FLEET = {
    "speed": {"dist": "lognormal", "value": 50, "sigma": 1.5},
    "down": {"dist": "lognormal", "value": 20, "sigma": 0.5},
    "up": {"dist": "lognormal", "value": 5, "sigma": 0.5},
    "latency": {"dist": "uniform", "low": 0.02, "high": 0.2},
}


def fashion(tmp: Path, name: str, rounds: int, systems: dict, every: int) -> str:
    sc = {
        "name": name,
        "seed": 0,
        "rounds": rounds,
        "data": {
            "dataset": "fashion_mnist",
            "clients": 100,
            "partition": {"kind": "dirichlet", "alpha": 0.3},
            "splits": {"train": 0.8, "test": 0.2},
        },
        "model": {"name": "mlp", "hidden": [100]},
        "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 32, "local_epochs": 1},
        "sampling": {"count": 20},
        "eval": {"every": every},
        **({"systems": systems} if systems else {}),
        "resources": {"hosts": 2, "cpus_per_host": 1},
        "checkpoint": {"every": 0},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sc))
    return str(path)


def driver(path: str, overrides=()):
    from raysim.engine.serial import serial_driver
    from raysim.scenario import config

    return serial_driver(config.load(path, list(overrides)))


def cost(tmp: Path, rounds: int = 40) -> None:
    import statistics

    plain = driver(fashion(tmp, "plain", rounds, None, 1000))
    fleet = driver(fashion(tmp, "fleet", rounds, FLEET, 1000))
    times = {"plain": [], "fleet": []}
    for r in range(rounds - 1):  # the last round evaluates
        pair = (("plain", plain), ("fleet", fleet)) if r % 2 else (("fleet", fleet), ("plain", plain))
        for name, d in pair:
            t = time.perf_counter()
            d.step()
            times[name].append(time.perf_counter() - t)
    a, b = statistics.median(times["fleet"][2:]), statistics.median(times["plain"][2:])
    same = [h["train_loss"] for h in plain.history] == [h["train_loss"] for h in fleet.history]
    print(
        f"cost: Fashion-MNIST MLP, 20 clients a round, {len(times['plain'])} rounds alternated: with the fleet "
        f"{1000 * a:.1f} ms a round (median), without {1000 * b:.1f} ms; ratio {a / b:.3f} (the same training: "
        f"{same})",
        flush=True,
    )


def to_target(d, target: float, cap: int) -> tuple[float | None, float, int]:
    """Run until the mean accuracy reaches ``target`` (or ``cap`` rounds): (virtual hours then
    or None, the last accuracy, rounds)."""
    acc = 0.0
    for _ in range(cap):
        rec = d.step()
        if "accuracy" in rec:
            acc = rec["accuracy"]
            if acc >= target:
                return rec["virtual_time_s"] / 3600, acc, d.round
    return None, acc, d.round


def asynchronous(tmp: Path, target: float) -> None:
    runs = [
        ("sync FedAvg", {"aggregation": "sync"}, 150, 2),
        ("FedBuff", {"aggregation": "fedbuff", "buffer": 10}, 400, 4),
        ("FedAsync", {"aggregation": "fedasync", "alpha": 0.6, "staleness": "hinge"}, 1500, 20),
    ]
    out = {}
    for name, extra, cap, every in runs:
        t = time.perf_counter()
        d = driver(fashion(tmp, name.split()[-1].lower(), cap, {**FLEET, **extra}, every))
        hours, acc, steps = to_target(d, target, cap)
        out[name] = hours
        shown = f"{hours:.3f} virtual hours" if hours is not None else f"not reached in {steps} steps"
        print(
            f"async: {name:<12} to {target:.0%} accuracy: {shown} ({steps} server steps, accuracy {acc:.4f}; "
            f"{time.perf_counter() - t:.0f} s of wall time)",
            flush=True,
        )
    if out["FedBuff"] and out["sync FedAvg"]:
        print(f"async: FedBuff / sync FedAvg virtual time to {target:.0%}: {out['FedBuff'] / out['sync FedAvg']:.2f}")


def deadline(tmp: Path, rounds: int) -> None:
    for name, extra in (("no deadline", {}), ("deadline 30 s", {"deadline_s": 30.0})):
        d = driver(fashion(tmp, "deadline" if extra else "wait", rounds, {**FLEET, **extra}, rounds))
        for _ in range(rounds):
            rec = d.step()
        print(
            f"deadline: {name:<14} accuracy {rec['accuracy']:.4f}; slowest tenth {rec['slowest_decile_accuracy']:.4f} "
            f"(took part {rec['slowest_decile_participation']:.1f} rounds), fastest tenth "
            f"{rec['fastest_decile_accuracy']:.4f} ({rec['fastest_decile_participation']:.1f}); gap "
            f"{rec['fastest_decile_accuracy'] - rec['slowest_decile_accuracy']:+.4f}; never took part "
            f"{rec['never_participated']:.0%}; {rec['virtual_time_s'] / 3600:.2f} virtual hours",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", nargs="*", default=["cost", "async", "deadline"])
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--rounds", type=int, default=60, help="rounds of the deadline part")
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            {
                "cost": lambda: cost(Path(tmp)),
                "async": lambda: asynchronous(Path(tmp), args.target),
                "deadline": lambda: deadline(Path(tmp), args.rounds),
            }[part]()


if __name__ == "__main__":
    main()
