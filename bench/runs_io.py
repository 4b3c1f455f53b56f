"""Move finished raysim runs between MLflow stores through a JSON-lines file.

    python bench/runs_io.py export --tracking-uri sqlite:///a.db --experiment pfl-benchmark --out runs.jsonl
    python bench/runs_io.py import runs.jsonl --tracking-uri sqlite:///b.db --experiment pfl-benchmark

A benchmark that takes longer than one machine's life (the tuned personalized-FL table is
about 10 hours of two cores) is run in parts, on several machines, into several stores; the
table is made by ``raysim compare`` from one store. ``export`` writes one line per finished run
of an experiment (parents of sweeps and seeds left out): its id, status, start and end times,
parameters, tags and its metrics, the last value of each by default (what ``raysim compare``
reads) or every logged value with ``--history`` (what ``raysim report`` draws). ``import``
creates each run anew in the target store, with the same start and end times (``compare``'s
wall seconds), parameters, tags and metrics, and the source id in the tag
``raysim.source_run``; a run whose source id the target already holds is skipped, so importing
the same file twice adds nothing. The file holds numbers and strings only (JSON), never pickles.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys

SOURCE_TAG = "raysim.source_run"


def export(
    uri: str, experiment: str, out: str, history: bool = False, run_ids: set[str] | None = None, append: bool = False
) -> int:
    """Finished runs of ``experiment`` (those of ``run_ids`` only, if given) into ``out``, one JSON
    line each, the file replaced (or appended to); returns how many."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"runs_io: no experiment {experiment!r} in {uri}")
    runs = client.search_runs(
        [exp.experiment_id], "attributes.status = 'FINISHED'", max_results=50000, order_by=["attributes.start_time ASC"]
    )
    n = 0
    with open(out, "a" if append else "w") as f:
        # parts side by side append to one file; a line (up to tens of kB) leaves in several
        # writes, which another part's could split: one writer at a time
        fcntl.flock(f, fcntl.LOCK_EX)
        for r in runs:
            if r.data.tags.get("raysim.parent") == "1" or (run_ids is not None and r.info.run_id not in run_ids):
                continue
            if history:
                metrics = {
                    k: [[m.step, m.timestamp, m.value] for m in client.get_metric_history(r.info.run_id, k)]
                    for k in r.data.metrics
                }
            else:
                metrics = {k: [[None, None, v]] for k, v in r.data.metrics.items()}
            tags = {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")}
            f.write(
                json.dumps(
                    {
                        "run_id": r.data.tags.get(SOURCE_TAG, r.info.run_id),
                        "name": r.info.run_name,
                        "status": r.info.status,
                        "start_time": r.info.start_time,
                        "end_time": r.info.end_time,
                        "params": r.data.params,
                        "tags": tags,
                        "metrics": metrics,
                    },
                    sort_keys=True,
                )
                + "\n"
            )
            n += 1
    return n


def load(path: str, uri: str, experiment: str) -> tuple[int, int]:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    have = {r.data.tags.get(SOURCE_TAG, r.info.run_id) for r in client.search_runs([exp_id], max_results=50000)}
    added = skipped = 0
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec["run_id"] in have:
                skipped += 1
                continue
            tags = dict(rec["tags"], **{SOURCE_TAG: rec["run_id"]})
            run = client.create_run(exp_id, start_time=rec["start_time"], tags=tags, run_name=rec.get("name"))
            rid = run.info.run_id
            params = [Param(k, str(v)) for k, v in rec["params"].items()]
            metrics = [
                Metric(k, v, ts if ts is not None else rec["end_time"] or rec["start_time"], step or 0)
                for k, hist in rec["metrics"].items()
                for step, ts, v in hist
            ]
            for i in range(0, max(len(params), 1), 100):
                client.log_batch(rid, params=params[i : i + 100])
            for i in range(0, len(metrics), 1000):
                client.log_batch(rid, metrics=metrics[i : i + 1000])
            client.set_terminated(rid, rec["status"], end_time=rec["end_time"])
            have.add(rec["run_id"])
            added += 1
    return added, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="finished runs of an experiment into a JSON-lines file")
    e.add_argument("--tracking-uri", required=True)
    e.add_argument("--experiment", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--history", action="store_true", help="every logged value, not only the last")
    i = sub.add_parser("import", help="the runs of a JSON-lines file into a store (skipping those it holds)")
    i.add_argument("file")
    i.add_argument("--tracking-uri", required=True)
    i.add_argument("--experiment", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "export":
        print(f"{export(a.tracking_uri, a.experiment, a.out, a.history)} runs written to {a.out}")
    else:
        added, skipped = load(a.file, a.tracking_uri, a.experiment)
        print(f"{added} runs imported into {a.tracking_uri} ({skipped} already there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
