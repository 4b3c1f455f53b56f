"""raysim on the workloads a personalized-FL researcher runs every day, against a bare loop
written the way PFLlib and FL-bench train (bench/bare_pfl.py).

    python bench/pfl_workload.py                      # the four workloads, 10 rounds
    python bench/pfl_workload.py fedavg-100 --rounds 3
    python bench/pfl_workload.py --hosts 1            # raysim on one host
    python bench/pfl_workload.py --engine both        # Ray's engine and the serial one (one process)
    python bench/pfl_workload.py --engine all         # and Ray with every host an actor (driver_host=false)

Fashion-MNIST, 50 clients, pathological 2-class split, every client every round, 1 local
epoch of batch 10, plain SGD at lr 0.01, evaluation after the last round; FedAvg and Ditto
(λ = 1) on the MLPs 784-100-10 and 784-200-200-10. Both sides run as the user runs them, a
process each from exec to exit (raysim: `raysim run`, Ray's start, its host actors, MLflow);
for each, this prints the wall seconds, the CPU seconds of every process of the run (Ray's
included; the machine's busy time), the peak non-shared memory (USS summed over the
processes, and their PSS, which counts a page they share once: bench/proctree.py; both from a
second run of each side, since sampling them slows a run), the final accuracy and raysim's
median round, then raysim's figures over the bare loop's. Last, raysim's
Ditto round against its FedAvg round (same model, rounds alternated, in three fresh processes
one after another: ``--ratio-processes``). Run it on an
otherwise idle machine; the measuring is bench/proctree.py. The first raysim run creates its
MLflow store, and a user's first run in a folder creates it too (tables and migrations: a few
CPU-seconds); every later run finds it. The benchmark measures the usual case: it creates the
store before the first timed run (``--new-store``: each raysim run makes its own, as a first
run does). ``--repeat N`` alternates the sides N times and keeps each
side's fastest run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from proctree import measure_both  # noqa: E402

WORKLOADS = {
    "fedavg-100": ("fedavg", [100]),
    "ditto-100": ("ditto", [100]),
    "fedavg-200-200": ("fedavg", [200, 200]),
    "ditto-200-200": ("ditto", [200, 200]),
}


def scenario(method: str, hidden: list[int], rounds: int, hosts: int, root: str) -> dict:
    algo = {"name": method, "lr": 0.01, "local_epochs": 1, "batch_size": 10}
    if method == "ditto":
        algo["lam"] = 1.0
    return {
        "name": f"pfl-{method}-{'-'.join(map(str, hidden))}",
        "seed": 0,
        "rounds": rounds,
        "data": {
            "dataset": "fashion_mnist",
            "root": root,
            "clients": 50,
            "partition": {"kind": "shards", "classes_per_client": 2, "assign": "strided"},
        },
        "model": {"name": "mlp", "hidden": hidden},
        "algorithm": algo,
        "eval": {"every": rounds},
        "resources": {"hosts": hosts},
        "checkpoint": {"every": 0},
    }


def make_store(uri: str) -> None:
    """Create the MLflow store at ``uri`` (its tables), in a process of its own, unmeasured."""
    code = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
    subprocess.run([sys.executable, "-c", code, uri], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_raysim(sc: dict, tmp: Path, engine: str = "ray", new_store: bool = False) -> dict:
    """raysim's run of ``sc``, twice: timed (no sampling), then sampled for its memory
    (proctree.py says why)."""
    path = tmp / f"{sc['name']}.yaml"
    path.write_text(yaml.safe_dump(sc))
    summary = tmp / f"{sc['name']}.json"
    store = tmp / "mlflow.db"
    cmd = [
        sys.executable,
        "-m",
        "raysim.cli",
        "run",
        str(path),
        "-q",
        "--engine",
        engine.split("-")[0],
        "--summary",
        str(summary),
        "--set",
        f"tracking.uri=sqlite:///{store}",
        "--set",
        f"checkpoint.dir={tmp}/ck",
    ]
    if engine == "ray-actors":  # every host an actor of its own (host 0 not in this process)
        cmd += ["--set", "resources.driver_host=false"]
    timed = []  # the timed run's summary: its rounds' seconds are unsampled

    def before(memory: bool) -> None:
        if memory:
            timed.append(json.loads(summary.read_text()))
        if new_store and store.exists():
            store.unlink()
        elif not new_store and not store.exists():
            make_store(f"sqlite:///{store}")

    r = measure_both(cmd, before=before, cwd=str(tmp), env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    if r["rc"]:
        raise SystemExit(f"raysim failed ({r['rc']}):\n{r['stderr'][-3000:]}")
    s = timed[0]
    r["accuracy"] = s["final"]["accuracy"]
    # a round's time: the median over the rounds after the first (whose passes measure their widths)
    rounds = s["history"][1:] or s["history"]
    r["round"] = statistics.median(h["round_seconds"] - h.get("eval_seconds", 0.0) for h in rounds)
    return r


def run_bare(method: str, hidden: list[int], rounds: int, root: str) -> dict:
    """The bare loop's run, twice as raysim's: timed, then sampled for its memory."""
    cmd = [
        sys.executable,
        str(HERE / "bare_pfl.py"),
        method,
        ",".join(map(str, hidden)),
        "--rounds",
        str(rounds),
        "--root",
        root,
    ]
    r = measure_both(cmd)
    if r["rc"]:
        raise SystemExit(f"bare loop failed ({r['rc']}):\n{r['stderr'][-3000:]}")
    r["accuracy"] = float(re.search(r"accuracy=([\d.]+)", r["stdout"]).group(1))
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument(
        "--engine",
        default="ray",
        choices=("ray", "ray-actors", "serial", "both", "all"),
        help="raysim's engine: Ray (host actors, host 0 in the command's process on a local Ray: "
        "the default), ray-actors (Ray, every host an actor: resources.driver_host=false) "
        "or serial (every host in the one process, one after another); both: a row for ray "
        "and serial; all: a row for each of the three",
    )
    ap.add_argument(
        "--new-store",
        action="store_true",
        help="each raysim run creates its own MLflow store, as a user's first run in a folder "
        "does (default: one store made before the timed runs, as every later run finds it)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each side this many times, alternating, and keep each side's fastest run "
        "(machines that share their cores vary from minute to minute)",
    )
    ap.add_argument(
        "--ratio-processes",
        type=int,
        default=3,
        help="fresh processes, one after another, that each measure Ditto's round against FedAvg's "
        "(a round's speed differs more from one process to the next than within one)",
    )
    ap.add_argument("--ratio-child", help=argparse.SUPPRESS)  # one of those processes: its hidden sizes
    args = ap.parse_args()
    if args.ratio_child:
        print(json.dumps(_ratio_here([int(h) for h in args.ratio_child.split(",")], args.root)))
        return
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    args.workloads = args.workloads or list(WORKLOADS)
    print(
        f"{'workload':<16} {'side':<6} {'wall s':>7} {'CPU s':>7} {'USS MB':>7} {'PSS MB':>7} {'acc':>6} "
        f"{'round s':>7} | {'wall ratio':>10} {'CPU ratio':>9} {'USS ratio':>9} {'PSS ratio':>9}",
        flush=True,
    )
    engines = {"both": ("ray", "serial"), "all": ("ray", "ray-actors", "serial")}.get(args.engine, (args.engine,))
    rounds = {}  # workload -> raysim's median round in its kept run (first engine)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            method, hidden = WORKLOADS[name]
            bares, ourss = [], {e: [] for e in engines}
            for _ in range(args.repeat):
                bares.append(run_bare(method, hidden, args.rounds, args.root))
                for e in engines:
                    ourss[e].append(
                        run_raysim(
                            scenario(method, hidden, args.rounds, args.hosts, args.root), Path(tmp), e, args.new_store
                        )
                    )
            bare = min(bares, key=lambda r: r["wall"])
            ours = {e: min(rs, key=lambda r: r["wall"]) for e, rs in ourss.items()}
            rows = [("bare", bare)] + [("raysim" if len(engines) == 1 else e, r) for e, r in ours.items()]
            for side, r in rows:
                ratios = (
                    (
                        f" {r['wall'] / bare['wall']:10.2f} {r['cpu'] / bare['cpu']:9.2f} "
                        f"{r['uss_peak_mb'] / bare['uss_peak_mb']:9.2f} "
                        f"{r['pss_peak_mb'] / bare['pss_peak_mb']:9.2f}"
                    )
                    if r is not bare
                    else ""
                )
                print(
                    f"{name:<16} {side:<6} {r['wall']:7.1f} {r['cpu']:7.1f} {r['uss_peak_mb']:7.0f} "
                    f"{r['pss_peak_mb']:7.0f} {r['accuracy']:6.3f} {r.get('round', float('nan')):7.3f} |{ratios}",
                    flush=True,
                )
            rounds[name] = ours[engines[0]]["round"]
    for size in ("100", "200-200"):
        if f"fedavg-{size}" in args.workloads and f"ditto-{size}" in args.workloads:
            ratios, fa, di = round_ratio(WORKLOADS[f"fedavg-{size}"][1], args.root, args.ratio_processes)
            print(
                f"Ditto round / FedAvg round, MLP {size}: {statistics.median(ratios):.2f}x, median of "
                f"{len(ratios)} processes ({', '.join(f'{r:.2f}' for r in ratios)}), each 5 alternated pairs "
                f"on the serial engine; CPU seconds a round: Ditto {di:.3f}, FedAvg {fa:.3f}"
            )
            di, fa = rounds[f"ditto-{size}"], rounds[f"fedavg-{size}"]
            print(
                f"  in the whole runs above ({engines[0]}, wall, median round after the first, less "
                f"evaluation): Ditto {di:.3f} s / FedAvg {fa:.3f} s = {di / fa:.2f}x"
            )


def round_ratio(hidden: list[int], root: str, processes: int = 3) -> tuple[list[float], float, float]:
    """Ditto's round over FedAvg's, measured in ``processes`` fresh processes one after another
    (``_ratio_here`` in each): the same round's speed differs from one process to the next
    (0.54 to 0.78 CPU-s for FedAvg 784-100-10 on a 2-core machine) by more than from one round
    to the next within one. Returns (each process's ratio, the median of their FedAvg rounds'
    seconds, of their Ditto rounds')."""
    got = []
    for _ in range(processes):
        out = subprocess.run(
            [sys.executable, __file__, "--ratio-child", ",".join(map(str, hidden)), "--root", root],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        ).stdout
        got.append(json.loads(out.strip().splitlines()[-1]))
    return (
        [g["ratio"] for g in got],
        statistics.median(g["fedavg"] for g in got),
        statistics.median(g["ditto"] for g in got),
    )


def _ratio_here(hidden: list[int], root: str, pairs: int = 5) -> dict:
    """Ditto's round over FedAvg's in this process, both on the serial engine (the hosts' work,
    one host after the other, one thread), rounds alternated so that a machine whose speed
    drifts weighs on both alike, timed in CPU seconds (a preempted round is not charged for
    the wait); the medians of ``pairs`` pairs: {ratio, fedavg, ditto}."""
    import time

    from raysim.engine.serial import serial_driver
    from raysim.scenario import config

    with tempfile.TemporaryDirectory() as tmp:
        drivers = {}
        for method in ("fedavg", "ditto"):
            path = Path(tmp) / f"{method}.yaml"
            sc = scenario(method, hidden, 2 * pairs + 1, 2, root)
            sc["eval"] = {"every": 10 * sc["rounds"]}
            path.write_text(yaml.safe_dump(sc))
            drivers[method] = serial_driver(config.load(path))
            drivers[method].step()  # warm-up: the pass widths are measured
        secs: dict[str, list[float]] = {"fedavg": [], "ditto": []}
        for _ in range(pairs):
            for method, d in drivers.items():
                t0 = time.process_time()
                d.step()
                secs[method].append(time.process_time() - t0)
    ratios = [b / a for a, b in zip(secs["fedavg"], secs["ditto"])]
    return {
        "ratio": statistics.median(ratios),
        "fedavg": statistics.median(secs["fedavg"]),
        "ditto": statistics.median(secs["ditto"]),
    }


if __name__ == "__main__":
    main()
