"""MLflow tracking: one run per `raysim run`, params from the scenario, metrics per round.

Tracking URI: scenario ``tracking.uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's default
(``sqlite:///mlflow.db`` in the working directory). The store itself (its URI, a new SQLite store
seeded, the experiment opened) is ``raysim.results.store``'s; its names are re-exported here.

A run's driver stamps it (tags ``raysim.driver`` = host:pid, ``raysim.heartbeat`` = unix time,
refreshed every ``HEARTBEAT_S`` by a thread). A driver killed outright (SIGKILL, a lost login
node) cannot mark its run, so every later ``raysim run`` on the same experiment marks the
RUNNING runs whose driver is gone FAILED: its process is no longer alive (same host) or its
heartbeat is older than ``STALE_S`` (any host), and says how to resume them.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from raysim.results.figures import write_curve
from raysim.results.store import (  # noqa: F401 - re-exported: the store's names' old home
    artifact_root,
    open_store,
    resolve_uri,
    seed_store,
    sqlite_file,
    store_lock,
)
from raysim.scenario.config import RunSpec, Scenario, ScenarioError, name_list

STATUS = {"ok": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
HEARTBEAT_S = 60.0
STALE_S = 600.0
DRIVER_TAG, BEAT_TAG, RESUME_TAG = "raysim.driver", "raysim.heartbeat", "raysim.resume"
HOSTS_TAG = "raysim.host_nodes"  # where the hosts run: "HOST=IP ..."
CHECKPOINT_TAG = "raysim.checkpoint"  # the folder of a run's checkpoints, once it has written one


def _alive(pid: int) -> bool:
    """A raysim process with this id runs on this machine (the id not reused by another): a
    ``raysim`` command, or a Ray worker (a sweep's run in a Tune trial, titled ``ray::...``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return b"raysim" in cmdline or cmdline.startswith(b"ray::")
    except OSError:
        return True  # no /proc: trust the signal check


def driver_gone(tags: dict, now: float) -> str | None:
    """Why a RUNNING run's driver is gone (its process no longer alive on this host, or no
    heartbeat for ``STALE_S``), or None while it may still be running."""
    if DRIVER_TAG not in tags:
        return None
    host, _, pid = tags[DRIVER_TAG].rpartition(":")
    beat = float(tags.get(BEAT_TAG, 0) or 0)
    if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
        return f"its driver (pid {pid} on {host}) is gone"
    if now - beat > STALE_S:
        return f"its driver on {host} last signalled {now - beat:.0f}s ago"
    return None


def resumable_run(client: MlflowClient, run_id: str, uri: str):
    """The MLflow run ``--resume RUN_ID`` continues; ScenarioError (exit 2, the run left as it
    is) when there is no such run, when it is FINISHED (its record is complete: resuming would
    only rewrite it), or when its driver still runs it."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ScenarioError(f"--resume {run_id}: no such MLflow run in {uri}") from None
    status = run.info.status
    if status == "FINISHED":
        raise ScenarioError(
            f"--resume {run_id}: the run is FINISHED, nothing to continue (its record is left "
            "as it is); start a new run without --resume"
        )
    if status == "RUNNING" and DRIVER_TAG in run.data.tags and driver_gone(run.data.tags, time.time()) is None:
        raise ScenarioError(
            f"--resume {run_id}: the run is still RUNNING (driver {run.data.tags[DRIVER_TAG]}); "
            "stop it first (Ctrl-C or SIGTERM)"
        )
    return run


GIVEN, RESOLVED = "given.json", "resolved.json"  # a run's scenario artifacts (under scenario/)
VERSION_TAG, COMMIT_TAG, DIRTY_TAG = "raysim.version", "raysim.git_commit", "raysim.git_dirty"


def provenance() -> dict[str, str]:
    """The tags that say which raysim ran: its version and, when its source is a git checkout
    (the folder above the ``raysim`` package holds ``.git``), the commit checked out and
    whether raysim's own files (``raysim/``, ``algorithms/``) differ from it (``git_dirty``);
    the commit is "unknown" elsewhere (an installed wheel) or when git cannot tell (no git,
    another user's checkout), without failing."""
    import raysim

    return {VERSION_TAG: raysim.__version__, **source_commit(Path(raysim.__file__).resolve().parent.parent)}


@functools.cache
def source_commit(root: Path) -> dict[str, str]:
    """``provenance``'s git tags for the source tree at ``root`` (looked up once a process)."""
    tags = {COMMIT_TAG: "unknown"}
    if not (root / ".git").exists():
        return tags
    # this checkout's git only; --no-optional-locks: status never takes the index's lock, which
    # a git command of the user's may hold meanwhile
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "--no-optional-locks", "-C", str(root), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = (git("rev-parse", "--verify", "HEAD") or "").strip()
    if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        tags[COMMIT_TAG] = commit
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "raysim", "algorithms")
        if changed is not None:
            tags[DIRTY_TAG] = "true" if changed.strip() else "false"
    return tags


def run_record(sc: Scenario, run_id: str) -> tuple[dict | None, str | None]:
    """For ``--resume RUN_ID`` of a run without a checkpoint: (the scenario keys it was started
    with: its ``scenario/given.json``, or the ``resolved.json`` of a run recorded before
    given.json existed, which held those keys; None if neither is there, the folder its
    checkpoints were written to or None if it never wrote one). The same refusals as any
    ``--resume`` (``resumable_run``)."""
    from mlflow.exceptions import MlflowException

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bar for one small file
    uri = resolve_uri(sc.tracking.uri)
    client = MlflowClient(uri)
    run = resumable_run(client, run_id, uri)
    given = None
    with tempfile.TemporaryDirectory() as tmp:
        for name in (GIVEN, RESOLVED):
            try:
                given = json.loads(Path(client.download_artifacts(run_id, f"scenario/{name}", tmp)).read_text())
                break
            except (MlflowException, OSError, ValueError):
                continue
    return given if isinstance(given, dict) else None, run.data.tags.get(CHECKPOINT_TAG)


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = str(d)
    return out


class Tracker:
    def __init__(
        self,
        sc,
        resume_run_id: str | None = None,
        verbose: bool = False,
        tags: dict[str, str] | None = None,
        driver_pid: int | None = None,
    ):
        """A new run (or ``resume_run_id`` reopened) for ``sc``: a Scenario, or its
        ``config.RunSpec`` (what tracking needs of it, for a process without the
        methods' modules). ``driver_pid``: the process that runs the rounds (default: this)."""
        sc = sc if isinstance(sc, RunSpec) else RunSpec.of(sc)
        self.sc = sc
        self._driver_pid = driver_pid or os.getpid()
        self._queue: queue.Queue = queue.Queue()  # rounds' metrics for the writer thread
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self.uri, self.client, exp = open_store(sc, verbose, create=not resume_run_id)
        self._logged: set[tuple[str, int]] = set()  # (metric, round) already in the store
        if resume_run_id:
            run = resumable_run(self.client, resume_run_id, self.uri)
            self.run_id = run.info.run_id
            self._logged = {
                (key, m.step) for key in run.data.metrics for m in self.client.get_metric_history(self.run_id, key)
            }
            self.client.update_run(self.run_id, status="RUNNING")
            self._start_heartbeat()
            if exp is not None:
                self.reap(exp.experiment_id)
            return
        self.reap(exp.experiment_id)
        run = self.client.create_run(
            exp.experiment_id,
            run_name=sc.name,
            tags={
                "algorithm": sc.algorithm,
                "dataset": sc.dataset,
                "model": sc.model,
                "scenario": os.path.basename(sc.path),
                "seed": str(sc.seed),
                **provenance(),
                **(tags or {}),
            },
        )
        self.run_id = run.info.run_id
        self._start_heartbeat()
        self._record_scenario(sc)

    def _record_scenario(self, sc) -> None:
        """What reproduces the run: every key of the resolved scenario (``config.resolved``:
        defaults filled in) as a parameter, and as artifacts under ``scenario/`` the file as
        written, ``given.json`` (the keys the file, its sweep variant and ``--set`` gave) and
        ``resolved.json`` (every key, as the run used it; ``raysim run`` of it runs the same
        scenario)."""
        full = sc.resolved
        items = [mlflow.entities.Param(k, v[:6000]) for k, v in sorted(flatten(full).items())]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        if os.path.isfile(sc.path):
            self.client.log_artifact(self.run_id, sc.path, "scenario")
        with tempfile.TemporaryDirectory() as tmp:
            for name, mapping in ((GIVEN, sc.raw), (RESOLVED, full)):
                with open(os.path.join(tmp, name), "w") as f:
                    json.dump(mapping, f, indent=2, default=str)
                self.client.log_artifact(self.run_id, os.path.join(tmp, name), "scenario")

    def log_round(self, record: dict[str, float]) -> None:
        """Hand the round's metrics to this run's writer thread, so a round does not wait on
        the store (about 12 ms a round on a local SQLite store on 2 cores, 12 s of a
        1000-round run; a network round trip each with a tracking server). ``flush`` waits
        until they are written. MLflow's own ``log_batch(synchronous=False)`` was measured
        first: its ``set_terminated`` joins its writer thread, which waits up to a second on
        its queue, about 0.9 s added to the end of every run.

        Each round is logged once: a round redone after a lost host or a resume (the same
        values: client work is a pure function of the state) is not written again where the
        store already has it."""
        step = int(record["round"])
        now = int(time.time() * 1000)
        metrics = [
            mlflow.entities.Metric(k, float(v), now, step)
            for k, v in record.items()
            if k != "round" and isinstance(v, (int, float)) and math.isfinite(v) and (k, step) not in self._logged
        ]
        self._logged.update((m.key, step) for m in metrics)
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="raysim-mlflow-writer", daemon=True)
            self._writer.start()
        self._queue.put(metrics)

    def _write(self) -> None:
        """The writer thread: what has queued up since its last write goes in one ``log_batch``
        (at most 1000 metrics each, MLflow's limit); the first error is kept for ``flush``.
        Ends at a None."""
        done = False
        while not done:
            batch = [self._queue.get()]
            while batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = batch[-1] is None
            metrics = [m for ms in batch if ms is not None for m in ms]
            try:
                for i in range(0, len(metrics), 1000):
                    self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
            except Exception as e:  # noqa: BLE001 - raised by flush, in the run's thread
                self._error = self._error or e

    def flush(self) -> None:
        """Wait until every round handed over is written, ending the writer thread (the next
        ``log_round`` starts another); raise the store's error (once)."""
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join()
        self._writer = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def log_summary(self, summary: dict) -> None:
        """summary.json, and for a clustered method ``clusters/center_source.csv`` (row c:
        center c's score per source, the association below) and ``clusters/importance.csv``
        (each client's estimated weights beside its true shares); every ``*_curve`` of the
        report (SuPerFed's ``lambda_curve``) as ``curves/<name>.csv`` and ``.png``. The
        summary's scalars not logged with the rounds (``best_*``, ``target_round``,
        ``target_seconds``) are logged as metrics at the last round's step."""
        final = summary.get("final", {})
        if summary.get("history"):
            self.log_round(
                {
                    "round": summary["history"][-1]["round"],
                    **{k: v for k, v in final.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                }
            )
        self.flush()
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "summary.json")
            with open(p, "w") as f:
                json.dump(summary, f, indent=2)
            self.client.log_artifact(self.run_id, p)
            if "center_source" in final:
                p = os.path.join(tmp, "center_source.csv")
                table = final["center_source"]
                with open(p, "w", newline="") as f:
                    w = csv.writer(f)
                    w.writerow(["center", *[f"source{s}" for s in range(len(table[0]))]])
                    w.writerows([[c, *row] for c, row in enumerate(table)])
                    w.writerow(["best_center", *final["association"]])
                self.client.log_artifact(self.run_id, p, "clusters")
            if "importance" in final:
                p = os.path.join(tmp, "importance.csv")
                imp, true = final["importance"], final.get("true_shares", {})
                width = len(next(iter(imp.values())))
                tw = len(next(iter(true.values()))) if true else 0
                with open(p, "w", newline="") as f:
                    w = csv.writer(f)
                    w.writerow(["client", *[f"estimated{c}" for c in range(width)], *[f"true{s}" for s in range(tw)]])
                    w.writerows([[c, *v, *true.get(c, [])] for c, v in imp.items()])
                self.client.log_artifact(self.run_id, p, "clusters")

            for key, curve in final.items():
                if key.endswith("_curve") and isinstance(curve, dict) and curve:
                    for path in write_curve(tmp, key, curve, final.get(f"{key}_std"), summary.get("name", "")):
                        self.client.log_artifact(self.run_id, path, "curves")

    # -- liveness --------------------------------------------------------------------------------
    def _beat(self) -> None:
        self.client.set_tag(self.run_id, BEAT_TAG, f"{time.time():.0f}")

    def _start_heartbeat(self) -> None:
        self.client.set_tag(self.run_id, DRIVER_TAG, f"{socket.gethostname()}:{self._driver_pid}")
        self._beat()
        self._stop = threading.Event()

        def loop():
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    self._beat()
                except Exception:  # noqa: BLE001 - a missed beat is not a failure
                    pass

        self._thread = threading.Thread(target=loop, name="raysim-heartbeat", daemon=True)
        self._thread.start()

    def reap(self, experiment_id: str) -> list[str]:
        """Mark FAILED the experiment's RUNNING runs (not this one) whose driver is gone; print
        one line each with the way to resume it. Returns their ids."""
        gone = []
        now = time.time()
        for run in self.client.search_runs(
            [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
        ):
            rid, tags = run.info.run_id, run.data.tags
            why = driver_gone(tags, now)
            if rid == getattr(self, "run_id", None) or why is None:
                continue
            self.client.set_tag(rid, "raysim.failure", why)
            self.client.set_terminated(rid, status="FAILED")
            command = tags.get(RESUME_TAG) or (
                f"raysim run {tags.get('scenario', 'SCENARIO.yaml')} --resume {rid} (the same file and --set options)"
            )
            print(
                f"raysim: MLflow run {rid} ({run.info.run_name}) was left RUNNING: {why}; marked FAILED. "
                f"Continue it with: {command}",
                file=sys.stderr,
            )
            gone.append(rid)
        return gone

    def note_checkpoint(self, folder: str | os.PathLike) -> None:
        """Tag the run with the folder of its checkpoints, once a process: a run tagged so that
        has no checkpoint at ``--resume`` lost it (refused), one without the tag never wrote
        one (it starts again from round 1)."""
        if getattr(self, "_checkpoint_noted", None) != str(folder):
            self.client.set_tag(self.run_id, CHECKPOINT_TAG, str(folder))
            self._checkpoint_noted = str(folder)

    def note_hosts(self, nodes: dict[int, str]) -> None:
        """Tag the run with each host's node address (``raysim.host_nodes``, "HOST=IP ..."),
        where its hosts run now (a lost host's replacement may run elsewhere)."""
        if nodes:
            self.client.set_tag(self.run_id, HOSTS_TAG, " ".join(f"{h}={ip}" for h, ip in sorted(nodes.items())))

    def note_resume(self, command: str) -> None:
        """The exact command that continues this run (shown if its driver dies unannounced)."""
        self.client.set_tag(self.run_id, RESUME_TAG, command)

    def finish(self, outcome: str) -> None:
        """Write the queued rounds, then end the run with the outcome's status (a finished run
        whose rounds could not be written is FAILED, with the store's error)."""
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
        try:
            self.flush()
        except Exception:
            if outcome == "ok":
                self.client.set_terminated(self.run_id, status=STATUS["failed"])
                raise
            # a failed or killed run keeps its own cause; the rounds it could not write are lost
        self.client.set_terminated(self.run_id, status=STATUS[outcome])


def start_parent(sc: Scenario, name: str, runs: list[tuple[str | None, int]]) -> tuple[MlflowClient, str]:
    """The parent run of a sweep or of seeded runs (each child carries its id as
    ``mlflow.parentRunId``, so the MLflow UI nests them and ``raysim compare``/``report`` of
    the parent read its children)."""
    _, client, exp = open_store(sc)
    run = client.create_run(
        exp.experiment_id,
        run_name=name,
        tags={"raysim.parent": "1", "scenario": os.path.basename(sc.path), "algorithm": "sweep", **provenance()},
    )
    variants, seeds = sweep_params(runs)
    client.log_batch(
        run.info.run_id,
        params=[
            mlflow.entities.Param("variants", variants),
            mlflow.entities.Param("seeds", seeds),
            mlflow.entities.Param("runs", str(len(runs))),
        ],
    )
    return client, run.info.run_id


def sweep_params(runs: list[tuple[str | None, int]]) -> tuple[str, str]:
    """A sweep's parent's ``variants`` and ``seeds`` params, as logged."""
    variants = sorted({v for v, _ in runs if v is not None})
    return name_list(variants)[:6000] or "-", ",".join(map(str, sorted({s for _, s in runs})))


def reopen_parent(sc: Scenario, parent_id: str, file: str, runs: list[tuple[str | None, int]]):
    """``raysim run SWEEP --resume PARENT``: the sweep's parent run, marked RUNNING again, and its
    children by (variant, seed). ScenarioError (exit 2, nothing changed) when the run is not a
    sweep's parent, when the file now makes other variants or seeds than the parent ran, or when
    one of its runs is still running (its driver alive)."""
    _, client, _ = open_store(sc)
    uri = resolve_uri(sc.tracking.uri)
    parent = resumable_run(client, parent_id, uri)
    if parent.data.tags.get("raysim.parent") != "1":
        raise ScenarioError(
            f"{file}: --resume {parent_id}: not a sweep's parent run; to continue one run of a "
            "sweep add --variant NAME (and --seeds SEED)"
        )
    was = (parent.data.params.get("variants"), parent.data.params.get("seeds"))
    now = sweep_params(runs)
    if was != now:
        raise ScenarioError(
            f"{file}: --resume {parent_id}: the sweep ran variants {was[0]} with seeds {was[1]}; "
            f"this command makes variants {now[0]} with seeds {now[1]}: resume with the same file, "
            "--set and --seeds"
        )
    kids = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=50000
    )
    for kid in kids:
        if (
            kid.info.status == "RUNNING"
            and DRIVER_TAG in kid.data.tags
            and driver_gone(kid.data.tags, time.time()) is None
        ):
            raise ScenarioError(
                f"{file}: --resume {parent_id}: its run {kid.info.run_id} is still RUNNING "
                f"(driver {kid.data.tags[DRIVER_TAG]}); stop the sweep first (Ctrl-C or SIGTERM)"
            )
    by = {}
    for kid in sorted(kids, key=lambda k: k.info.start_time or 0):  # a variant run twice: the latest
        by[(kid.data.tags.get("variant"), int(kid.data.tags.get("seed", sc.seed)))] = kid
    client.update_run(parent_id, status="RUNNING")
    return client, parent_id, by
