"""Run a benchmark's (variant, seed) pairs in parts, N at a time, on any machine, and keep the
runs where the next machine can find them.

    python bench/pfl_parts.py --workers 2 --dir /tmp/pfl               # runs, until stopped
    python bench/runs_io.py export --tracking-uri sqlite:////tmp/pfl/mlflow-0.db \
        --experiment pfl-benchmark --out part.jsonl                      # then commit or copy

``scenarios/pfl_benchmark.yaml`` run whole is 522 runs; tuned at seed 0 and repeated at the
others (``--best-of``) it is still about 180, some 10 to 25 hours of two cores. Where no
machine lives that long, the tuned half runs in parts: ``--jobs`` lists one pair a line,
``VARIANT<TAB>SEED<TAB>SECONDS`` (the seconds an estimate, used to order and to keep a part
inside ``--deadline``), cheapest first by default (``--reverse``: dearest first, for a second
machine working from the other end). Each pair is ``raysim run SCENARIO --variant VARIANT
--seeds SEED --engine serial`` into the worker's own SQLite store under ``--dir`` (stores are
not shared: SQLite serializes writers), with checkpoints every 25 rounds. A pair is skipped when
a ``done*.txt`` file under ``--dir`` lists it (a pair that finished or diverged; one stopped
from outside runs again), or when ``--skip`` (``runs_io.py export`` files)
already holds a finished run of it: a part on a new machine starts where the parts before it
stopped. The jobs file is read again whenever a worker takes a pair, so pairs appended to it
while a part runs are run by that part. ``log.txt`` records each pair's exit status and time;
``--results FILE`` appends each finished run to FILE as it ends. ``raysim compare`` then makes
the table from one store into which every part's runs were imported (``runs_io.py import``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import runs_io  # noqa: E402  (bench/runs_io.py, beside this file)


def finished_pairs(files: list[str]) -> set[tuple[str, str]]:
    """(variant, seed) of every finished run in ``runs_io.py export`` files."""
    out = set()
    for path in files:
        for line in open(path):
            rec = json.loads(line)
            if rec["status"] == "FINISHED" and rec["tags"].get("variant") is not None:
                out.add((rec["tags"]["variant"], str(rec["tags"].get("seed", rec["params"].get("seed")))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default=str(HERE / "results" / "pfl_benchmark_jobs.tsv"))
    ap.add_argument("--scenario", default=str(HERE.parent / "scenarios" / "pfl_benchmark.yaml"))
    ap.add_argument("--dir", required=True, help="stores, checkpoints, log and done lists of this part")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpu-workers", type=int, default=0, help="of the workers, how many run on the GPU")
    ap.add_argument(
        "--deadline", type=float, default=float("inf"), help="seconds: start no pair whose estimate would end after it"
    )
    ap.add_argument("--speed", type=float, default=1.0, help="multiplies the estimates (a slower machine: > 1)")
    ap.add_argument("--reverse", action="store_true", help="dearest pairs first")
    ap.add_argument("--skip", nargs="*", default=[], help="runs_io.py export files whose finished pairs to skip")
    ap.add_argument("--raysim", default="raysim", help="the command (default: raysim on PATH)")
    ap.add_argument("--experiment", default="pfl-benchmark")
    ap.add_argument(
        "--results",
        default=None,
        help="append each finished run to this runs_io.py export file as soon as it ends (e.g. "
        "bench/results/pfl_benchmark_runs.jsonl: a part stopped at any point loses no run)",
    )
    a = ap.parse_args(argv)
    t0 = time.time()

    def jobs() -> list[list[str]]:  # read again at each pick: pairs added while it runs are taken too
        listed = [line.rstrip("\n").split("\t") for line in open(a.jobs) if line.strip()]
        return listed[::-1] if a.reverse else listed

    out = Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    exported = finished_pairs(a.skip)
    lock, claimed = threading.Lock(), set()

    def done() -> set[tuple[str, str]]:
        pairs = set(exported)
        for f in out.glob("done*.txt"):
            pairs |= {tuple(line.rstrip("\n").split("\t")) for line in open(f) if line.strip()}
        return pairs

    def worker(w: int) -> None:
        store = f"sqlite:///{(out / f'mlflow-{w}.db').resolve()}"
        gpu = w < a.gpu_workers
        while True:
            with lock:
                skip, job = done() | claimed, None
                for variant, seed, cost in jobs():
                    if (variant, seed) not in skip and time.time() - t0 + float(cost) * a.speed <= a.deadline:
                        job = (variant, seed, cost)
                        claimed.add((variant, seed))
                        break
            if job is None:
                return
            variant, seed, cost = job
            cmd = [
                a.raysim,
                "run",
                a.scenario,
                "--variant",
                variant,
                "--seeds",
                seed,
                "--engine",
                "serial",
                "-q",
                "--set",
                f"tracking.uri={store}",
                "--set",
                f"tracking.experiment={a.experiment}",
                "--set",
                f"checkpoint.dir={(out / 'ck').resolve()}",
                "--set",
                "checkpoint.every=25",
            ]
            if gpu:
                cmd += ["--set", "resources.gpus_per_host=0.5"]
            start = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True)
            with lock:
                with open(out / "log.txt", "a") as f:
                    f.write(
                        f"worker {w}{' (gpu)' if gpu else ''} rc={r.returncode} {time.time() - start:.0f}s "
                        f"(estimate {cost}) {variant} seed {seed}\n{r.stdout[-600:]}{r.stderr[-600:]}\n"
                    )
                if r.returncode == 0 or "Diverged" in r.stdout + r.stderr:  # else (stopped): again next part
                    with open(out / "done.txt", "a") as f:
                        f.write(f"{variant}\t{seed}\n")
                ids = set(re.findall(r"MLflow run ([0-9a-f]{32})", r.stdout))
                if a.results and r.returncode == 0 and ids:
                    runs_io.export(store, a.experiment, a.results, run_ids=ids, append=True)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"part ended after {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
