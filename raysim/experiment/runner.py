"""One experiment end to end: tracking, engine, rounds, checkpoints, progress; the summary it
writes is made by ``raysim.experiment.summary`` (its names are re-exported here)."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from raysim.engine import checkpoint, faults
from raysim.engine.driver import HostLost
from raysim.errors import BadInput
from raysim.experiment.summary import (  # noqa: F401 - re-exported: the summary's names' old home
    AT_VAL_BEST,
    FINAL,
    best_over,
    make_summary,
    means,
    time_to_target,
    val_selection,
)
from raysim.scenario.config import Scenario, ScenarioError
from raysim.signals import DeferredInterrupt

SHOWN = ("accuracy", "bottom_decile_accuracy", "global_accuracy", "train_loss")


def _start_ray_server(sc: Scenario, address: str | None, verbose: bool):
    """Start (or join) Ray and start the host actors without waiting for them to boot; ``wait()`` on the result blocks until they are up."""
    from raysim.engine import ray_engine, ray_start

    what = ray_engine.host_words(sc, _local_ray(address))
    if not ray_start.running():
        what = (f"joining Ray at {address}" if address else "starting a local Ray instance") + f" and {what}"
    elif ray_engine.parked_for(sc):
        what = f"reusing the previous run's {what}"
    else:
        what = f"starting {what}"
    print(f"raysim: {what} ...", file=sys.stderr, flush=True)
    ray_start.init(address, verbose)
    return ray_engine.RayServer(sc, say=lambda line: print(line, file=sys.stderr, flush=True))


def _local_ray(address: str | None) -> bool:
    """Whether the Ray this run uses is one this process started: known once Ray is up; before,
    the one this command starts (or is starting in the background) is local when no address is
    given."""
    from raysim.engine import ray_start

    return ray_start.embedded() if ray_start.initialized() else address is None


def _import_tracking() -> None:
    """In a thread while Ray starts: import MLflow and its SQL store (about 1.6 s on 2 cores).
    Any error is left for the Tracker to raise."""
    try:
        importlib.import_module("raysim.results.tracking")
        importlib.import_module("mlflow.store.tracking.sqlalchemy_store")
    except Exception:  # noqa: BLE001 - the Tracker imports them again and reports
        pass


def _new_tracker(sc: Scenario, resume: str | None, verbose: bool, resume_command: str | None, tags: dict | None = None):
    from raysim.results.tracking import Tracker

    tracker = Tracker(sc, resume, verbose, tags)
    if resume_command:
        tracker.note_resume(resume_command.format(run_id=tracker.run_id))
    return tracker


def _in_thread(fn, *args):
    """Start ``fn(*args)`` in a thread; the returned function joins it and gives its result
    (or raises its exception)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


def run(
    sc: Scenario,
    *,
    engine: str = "ray",
    address: str | None = None,
    resume: str | None = None,
    summary_path: str | None = None,
    verbose: bool = False,
    progress: bool = True,
    resume_command: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict:
    """Run the scenario; return the summary dict. Marks the MLflow run FAILED/KILLED on error
    and prints its id, its last checkpoint and ``resume_command`` (``{run_id}`` filled in).
    ``tags`` are set on a new MLflow run (a sweep's ``mlflow.parentRunId``, ``variant``)."""
    ckpt_path = _checkpoint_to_resume(sc, resume)
    t0 = time.perf_counter()
    helper = _tracks_in_helper()
    pending = _start_ray_hosts(sc, address, verbose, import_tracking=not helper) if engine == "ray" else None
    tracker_ready = _start_tracker(sc, helper, resume, verbose, resume_command, tags)
    local, boot_error = _boot(sc, pending)
    tracker = _tracker_or_close(tracker_ready, pending)
    outcome = "failed"
    bar = None
    stop = DeferredInterrupt()
    try:
        stop.install()
        if boot_error is not None:
            raise boot_error
        server = pending if pending is not None else local
        start = server.restore(str(ckpt_path)) if ckpt_path else 0
        _note_hosts(server, tracker)
        bar = _progress_bar(sc, start, progress)
        history = _play_rounds(sc, server, tracker, stop, bar, start, progress)
        bar.close()
        summary = _write_summary(sc, history, time.perf_counter() - t0, tracker, server, summary_path)
        outcome = "ok"
        return summary
    except KeyboardInterrupt:
        outcome = "killed"
        raise
    except BadInput:  # found during the run (nobody ever online, say): a resume meets it again
        outcome = "refused"
        raise
    finally:
        stop.restore()
        if bar is not None:
            bar.close()
        _end(sc, pending, tracker, outcome, resume_command)


def _checkpoint_to_resume(sc: Scenario, resume: str | None) -> Path | None:
    """``--resume``: the run's checkpoint folder, verified and stamped with this scenario;
    None for a new run, or for one that failed before its first checkpoint (it starts again
    from round 1, once ``_check_restart`` allows it)."""
    if not resume:
        return None
    ckpt_path = checkpoint.run_dir(sc.checkpoint.dir, resume)
    if checkpoint.exists(ckpt_path):
        checkpoint.verify(ckpt_path)  # every file, before a run or host is touched
        _check_same(sc, resume, checkpoint.server_part(ckpt_path).get("scenario"))
        return ckpt_path
    _check_restart(sc, resume, ckpt_path)
    return None


def _tracks_in_helper() -> bool:
    """Whether the run tracks through a helper process (``tracker_process``): every run while
    MLflow is not imported yet (the command's). MLflow's imports and store then run on another
    core rather than against the hosts built in this process (the serial engine's, or Ray's host
    0) for the GIL, and a run whose process dies without a word (on a cluster, its node's Ray
    stopped under it) is still marked KILLED, with the way to resume it."""
    from raysim.results import tracker_process

    return tracker_process.wanted()


def _start_ray_hosts(sc: Scenario, address: str | None, verbose: bool, import_tracking: bool):
    """Ray's hosts started, not waited for. MLflow is imported while Ray starts (here, in a
    thread, or in the helper); its store is opened (a new database migrated) and the run
    created while the hosts boot, once the scenario fits (a refused run leaves no store
    behind)."""
    if import_tracking:
        threading.Thread(target=_import_tracking, daemon=True).start()
    return _start_ray_server(sc, address, verbose)


def _start_tracker(sc: Scenario, helper: bool, resume, verbose, resume_command, tags):
    """The MLflow run created beside the hosts' boot (in a thread, or in the helper process);
    the returned function waits for it and gives the tracker. A resumed run is checked (still
    resumable, the same scenario) before any round; a new one starts its rounds while the
    helper creates it (``check`` after each round)."""
    from raysim.results import tracker_process

    if helper:
        process = tracker_process.TrackerProcess(sc, resume, verbose, tags, resume_command)
        return process.ready if resume else process.started
    tracker_process.discard()  # a helper the command started that this run does not need
    return _in_thread(_new_tracker, sc, resume, verbose, resume_command, tags)


def _boot(sc: Scenario, pending):
    """(serial driver or None, boot error or None): the Ray hosts waited for, or the serial
    engine's built here (data, partition, host state). A boot failure is returned, to be raised
    once the MLflow run exists to be marked FAILED."""
    try:
        if pending is not None:
            pending.wait()
            return None, None
        from raysim.engine.serial import serial_driver

        return serial_driver(sc), None
    except BaseException as e:  # noqa: BLE001 - raised again by run
        return None, e


def _tracker_or_close(tracker_ready, pending):
    """The tracker once its MLflow run exists; if it cannot be created, the Ray hosts are
    closed and its error raised."""
    try:
        return tracker_ready()
    except BaseException:
        if pending is not None:
            pending.close()
        raise


def _progress_bar(sc: Scenario, start: int, progress: bool) -> tqdm:
    return tqdm(
        total=sc.rounds,
        initial=start,
        unit="round",
        desc=sc.name,
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )


def _run_path(sc: Scenario, tracker) -> Path:
    """The run's checkpoint folder, named by its MLflow id."""
    return checkpoint.run_dir(sc.checkpoint.dir, tracker.run_id)


def _play_rounds(sc: Scenario, server, tracker, stop: DeferredInterrupt, bar: tqdm, start: int, progress: bool):
    """The rounds from ``start`` to the last: the history of every round. A lost host starts
    the run over on fresh hosts from its last checkpoint (``_recover``); Ctrl-C or SIGTERM
    ends it after the round under way (checkpointed) as a KeyboardInterrupt."""
    check_tracking = getattr(tracker, "check", lambda: None)
    history = list(server.history) if start else []
    shown: dict[str, str] = {}
    losses = 0
    while len(history) < sc.rounds:
        done = len(history)
        try:
            record = _play_round(sc, server, tracker, stop, history, check_tracking)
        except HostLost as err:
            if stop.requested:  # a SIGTERM to the whole job took the hosts too
                raise KeyboardInterrupt from err
            history, losses = _recover(sc, server, tracker, err, losses, done, bar, progress)
            continue
        except Exception as err:
            if stop.requested:  # the round is abandoned; the last checkpoint stands
                raise KeyboardInterrupt from err
            raise
        shown.update({k: f"{record[k]:.4f}" for k in SHOWN if k in record})
        bar.set_postfix(shown, refresh=False)
        bar.update(1)
        if stop.requested:
            raise KeyboardInterrupt
        faults.after_round(int(record["round"]))
    return history


def _play_round(sc: Scenario, server, tracker, stop: DeferredInterrupt, history: list, check_tracking) -> dict:
    """One round: played, added to ``history``, logged, and checkpointed when due (every
    ``checkpoint.every`` rounds, the last round, or a stop asked for)."""
    record = server.step()
    r = int(record["round"])
    history.append(record)
    tracker.log_round(record)  # a round redone after a loss is not logged again
    check_tracking()  # the helper's error, if it has one, now
    every = sc.checkpoint.every
    if (every and r % every == 0) or r == sc.rounds or stop.requested:
        # the rounds a checkpoint covers are in the store before it is committed:
        # a driver killed just after it loses no round's metrics
        tracker.flush()
        _save(server, _run_path(sc, tracker), sc)
        tracker.note_checkpoint(_run_path(sc, tracker))
    return record


def _note_hosts(server, tracker) -> None:
    """The run's record of where its Ray hosts run (each host's node address), when it has any."""
    nodes = getattr(server, "host_nodes", None)
    if nodes is not None:
        tracker.note_hosts(nodes())


def _recover(sc: Scenario, server, tracker, err: HostLost, losses: int, done: int, bar: tqdm, progress: bool):
    """After a host loss in round ``done + 1``: fresh hosts from the last checkpoint (they may
    be lost too), until ``resources.max_host_losses`` is passed. (history, losses): the
    rounds kept, and the losses so far."""
    while True:
        losses += 1
        why = str(getattr(err, "cause", err))
        if losses > sc.resources.max_host_losses:
            raise HostLost(
                f"{why} (host loss {losses}, beyond resources.max_host_losses = {sc.resources.max_host_losses})"
            ) from None
        try:
            path = _run_path(sc, tracker)
            back = server.recover(str(path) if checkpoint.exists(path) else None)
            _note_hosts(server, tracker)
            break
        except HostLost as again:
            err = again
    history = list(server.history) if back else []
    redo = f"round {done + 1} is" if back == done else f"rounds {back + 1}..{done + 1} are"
    tqdm.write(
        f"raysim: {why}; new hosts started; going on from the "
        f"{'checkpoint of round ' + str(back) if back else 'start'} ({redo} redone)",
        file=sys.stderr,
    )
    if progress:
        bar.n = back
        bar.refresh()
    return history, losses


def _write_summary(sc: Scenario, history: list[dict], wall: float, tracker, server, summary_path: str | None) -> dict:
    """The finished run's summary: written to ``summary_path`` if given, and logged."""
    summary = make_summary(sc, history, wall, tracker, server.report())
    if summary_path:
        Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(summary_path).write_text(json.dumps(summary, indent=2))
    tracker.log_summary(summary)
    return summary


def _end(sc: Scenario, pending, tracker, outcome: str, resume_command: str | None) -> None:
    """The run's end, whatever its outcome: the Ray hosts closed (a finished run's may serve
    the next run of a sequence, ``ray_engine.reuse_hosts``), the MLflow run marked, and a run
    to resume told how."""
    try:
        if pending is not None:
            pending.close(keep=outcome == "ok")
    finally:
        tracker.finish("failed" if outcome == "refused" else outcome)
        if outcome == "refused":  # the scenario itself cannot run: nothing to resume
            print(f"raysim: MLflow run {tracker.run_id} marked FAILED", file=sys.stderr)
        elif outcome != "ok" and getattr(tracker, "failed", None) is None:  # a run to resume
            tell_resume(tracker.run_id, outcome, sc, resume_command)


# keys that do not change results: a run may resume on other hosts, another cluster, elsewhere
FREE_ON_RESUME = ("resources", "tracking", "checkpoint")


def _results_part(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k not in FREE_ON_RESUME}


def _check_same(sc: Scenario, run_id: str, stored: dict | None) -> None:
    """``--resume``: the scenario's keys that change results are those the run was started
    with (``stored``: its given keys, None when not recorded)."""
    if stored is not None and _results_part(stored) != _results_part(json.loads(json.dumps(sc.raw, default=str))):
        raise ScenarioError(
            f"{sc.path}: the scenario differs from the one run {run_id} was started with "
            f"(beyond {', '.join(FREE_ON_RESUME)}); resume with the same file and --set options"
        )


def _check_restart(sc: Scenario, run_id: str, path: Path) -> None:
    """``--resume`` of a run with no checkpoint at ``path``: it starts again from round 1 in
    the same MLflow run (the rounds it logged before are not logged again: redone rounds give
    the same numbers) when it never wrote a checkpoint and its scenario is this one. A run that
    did write one (tagged with its folder), since removed or under another ``checkpoint.dir``,
    is refused rather than silently redone."""
    from raysim.results import tracking

    given, wrote = tracking.run_record(sc, run_id)
    if wrote:
        raise ScenarioError(
            f"{sc.path}: checkpoint.dir: no checkpoint for run {run_id} at {path}, where it wrote "
            f"its checkpoints to {wrote}; resume with the checkpoint.dir that holds them"
        )
    _check_same(sc, run_id, given)


def tell_resume(run_id: str, outcome: str, sc: Scenario, command: str | None) -> None:
    from raysim.results.tracker_process import NO_CHECKPOINT, resume_words

    path, where = checkpoint.run_dir(sc.checkpoint.dir, run_id), NO_CHECKPOINT
    if checkpoint.exists(path):
        try:
            where = f"its last checkpoint, round {int(checkpoint.manifest(path)['round'])}, is {path}"
        except Exception:  # noqa: BLE001 - a report, never a second failure
            where = f"its last checkpoint is {path}"
    for line in resume_words(run_id, STATUS_WORD[outcome], where, command.format(run_id=run_id) if command else None):
        print(line, file=sys.stderr)


STATUS_WORD = {"failed": "FAILED", "killed": "KILLED"}


def _save(server, path: Path, sc: Scenario) -> None:
    # the scenario is stamped next to the state, so --resume can refuse a different one
    server.save(str(path), {"scenario": json.loads(json.dumps(sc.raw, default=str))})
