"""``raysim run`` of a scenario, a sweep (``sweep:`` variants) or seeded runs (``--seeds``).

Several runs are nested under one parent MLflow run (tags ``variant`` and ``seed``) and compared
at the end. They run side by side on Ray Tune when the cluster holds more than one of them at
a time (``raysim.engine.ray_sweep``: one trial per run, each reserving its own hosts), else one
after another in this process; ``--concurrent N`` caps how many run at once (1: one after
another). Either way every run is the run it would be alone: same metrics, same MLflow record,
same checkpoints and ``--resume`` command. Side by side, a failed run does not stop the others;
the command then exits 1 after the last one, naming each failed run and how to continue it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from raysim.errors import RunsFailed
from raysim.results.report import INDEX_TAG
from raysim.scenario.config import Scenario, absolute_uri


@dataclass(frozen=True)
class Job:
    """One run of the command: a variant (or None) at a seed."""

    label: str  # "variant", "variant seed 1", or the scenario's name
    variant: str | None
    sc: Scenario
    tags: dict
    resume_command: str  # with {run_id} to fill in
    engine: str = "ray"
    address: str | None = None
    resume: str | None = None
    summary_path: str | None = None
    verbose: bool = False
    progress: bool = True


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a side-by-side sweep (its unfinished runs marked KILLED); exit
    130 (143)."""


def _run_line(
    file: str,
    overrides: list[str],
    engine: str,
    address: str | None,
    variant: str | None,
    seeds: str | None,
    best_of: str | None = None,
) -> str:
    """``raysim run FILE`` with the options that give the same runs again."""
    parts = ["raysim", "run", file]
    if variant is not None:
        parts += ["--variant", variant]
    if seeds:
        parts += ["--seeds", seeds]
    if best_of:
        parts += ["--best-of", best_of]
    for item in overrides:
        parts += ["--set", item]
    if engine != "ray":
        parts += ["--engine", engine]
    if address:
        parts += ["--address", address]
    return shlex.join(parts)


def resume_command(
    file: str, overrides: list[str], engine: str, address: str | None, variant: str | None, seed: int | None = None
) -> str:
    """The command that continues a run, with ``{run_id}`` to fill in."""
    line = _run_line(file, overrides, engine, address, variant, None if seed is None else str(seed))
    # braces of the overrides (``--set systems={dropout: 0.1}``) escaped for the ``{run_id}`` format
    return line.replace("{", "{{").replace("}", "}}") + " --resume {run_id}"


def sweep_resume_command(
    file: str,
    overrides: list[str],
    engine: str,
    address: str | None,
    seeds: list[int] | None,
    parent_id: str,
    pattern: str | None = None,
    best_of: str | None = None,
) -> str:
    """The command that continues a whole sweep (``--resume`` of its parent run)."""
    seeds_text = ",".join(map(str, seeds)) if seeds else None
    return _run_line(file, overrides, engine, address, pattern, seeds_text, best_of) + f" --resume {parent_id}"


def best_of(
    file: str, variants: list[tuple[str | None, Scenario]], parent_id: str, pattern: str | None, verbose: bool = False
) -> list[tuple[str | None, Scenario]]:
    """``raysim run SWEEP --best-of PARENT``: of the file's variants (those ``--variant`` chose),
    the ones the sweep PARENT's finished runs (several parents: comma-separated) choose on validation (``compare.best_variants``:
    per method and dataset, the grid point of best mean ``val_accuracy``, or ``val_mse``),
    so a grid tuned at a few seeds is repeated at others for its chosen points only.
    ScenarioError where the file is no sweep, or has none of them (or, without ``--variant``,
    not all of them)."""
    from raysim.results import tracking
    from raysim.results.compare import CompareError, best_variants
    from raysim.scenario.config import ScenarioError, name_list

    if variants[0][0] is None:
        raise ScenarioError(f"{file}: --best-of {parent_id}: the file has no sweep section to choose variants of")
    try:
        chosen = best_variants(tracking.resolve_uri(variants[0][1].tracking.uri, verbose), parent_id.split(","))
    except CompareError as e:
        raise ScenarioError(f"{file}: {e}") from None
    names = {v for v, _ in variants}
    missing = [c for c in chosen if c not in names]
    kept = [(v, sc) for v, sc in variants if v in chosen]
    if (missing and pattern is None) or not kept:
        raise ScenarioError(
            f"{file}: --best-of {parent_id}: its chosen variants {name_list(missing or list(chosen))} "
            f"are not {'among the variants --variant chose' if pattern else 'variants of this file'}"
        )
    again = sorted({str(sc.seed) for v, sc in kept if str(sc.seed) in chosen[v]}, key=int)
    if again:
        raise ScenarioError(
            f"{file}: --best-of {parent_id}: the chosen variants ran at seed {', '.join(again)} there "
            f"already; give the other seeds (--seeds), e.g. the file's without {', '.join(again)}"
        )
    return kept


def run_command(
    file: str,
    variants: list[tuple[str | None, Scenario]],
    seeds: list[int] | None,
    *,
    overrides: list[str],
    engine: str = "ray",
    address: str | None = None,
    resume: str | None = None,
    summary: str | None = None,
    verbose: bool = False,
    progress: bool = True,
    concurrent: int | None = None,
    pattern: str | None = None,
    tuned_by: str | None = None,
) -> dict:
    """Run every (variant, scenario); returns {label: summary}. Raises RunsFailed once every
    run has ended if some failed, SweepInterrupted (side by side) if stopped, or the error of
    a single run, a bad input or an interrupt at once. ``pattern``: the ``--variant`` that chose
    the variants, ``tuned_by``: the ``--best-of`` parent that did (both for the command that
    continues the sweep)."""
    several = len(variants) > 1
    parent, given_uri, earlier = None, variants[0][1].tracking.uri, {}
    if several:
        variants, parent, earlier = _open_parent(file, variants, seeds, resume, tuned_by, verbose)
    jobs, kept = _jobs(
        file,
        variants,
        seeds,
        parent,
        earlier,
        overrides=overrides,
        engine=engine,
        address=address,
        resume=resume,
        summary=summary,
        verbose=verbose,
        progress=progress,
    )
    if resume and several:
        _tell_continuing(resume, jobs, kept)
    ok, unfinished, summaries = False, None, {}
    try:
        summaries, unfinished = _run_jobs(jobs, several, engine, concurrent, parent)
        ok = unfinished is None
    finally:
        if parent is not None:
            _end_parent(parent, ok, file, overrides, engine, address, seeds, pattern, tuned_by)
    if several and (summaries or kept):
        _show_sweep(file, summaries, summary, parent, given_uri)
    if unfinished is not None:
        raise unfinished
    return summaries


def _open_parent(
    file: str, variants: list[tuple[str | None, Scenario]], seeds, resume: str | None, tuned_by, verbose: bool
):
    """Several runs' parent MLflow run: (the variants, all on one tracking store; (client,
    parent id); the runs the parent holds already, {(variant, seed): run}), new or, with
    ``resume``, reopened."""
    from raysim.results import tracker_process, tracking

    tracker_process.discard()  # the runs track in threads: MLflow is imported here now
    # one tracking store for every run, fixed here (trials start in folders of their own)
    uri = absolute_uri(tracking.resolve_uri(variants[0][1].tracking.uri, verbose))
    variants = [(v, dataclasses.replace(sc, tracking=dataclasses.replace(sc.tracking, uri=uri))) for v, sc in variants]
    runs = [(v, sc.seed) for v, sc in variants]
    if resume:  # the sweep continued: its parent, and the runs it has already
        client, parent_id, earlier = tracking.reopen_parent(variants[0][1], resume, file, runs)
        return variants, (client, parent_id), earlier
    name = (
        f"{Path(file).stem}"
        + (f" seeds {','.join(map(str, seeds))}" if seeds else "")
        + (f" best of {tuned_by}" if tuned_by else "")
    )
    return variants, tracking.start_parent(variants[0][1], name, runs), {}


def _jobs(
    file: str,
    variants: list[tuple[str | None, Scenario]],
    seeds: list[int] | None,
    parent,
    earlier: dict,
    *,
    overrides: list[str],
    engine: str,
    address: str | None,
    resume: str | None,
    summary: str | None,
    verbose: bool,
    progress: bool,
) -> tuple[list[Job], list[str]]:
    """(the runs to make, the labels of the finished runs kept): a sweep's run that did not
    finish continues in its own MLflow run (from its last checkpoint, or from round 1 if it had
    none); one never started starts now; a finished one's record is whole: not run again."""
    several = len(variants) > 1
    jobs, kept = [], []
    for i, (variant, sc) in enumerate(variants):
        tags = {"variant": variant} if variant else {}
        if parent is not None:
            tags.update({"mlflow.parentRunId": parent[1], INDEX_TAG: str(i)})
        label = variant if not seeds else f"{variant or sc.name} seed {sc.seed}"
        before = earlier.get((variant, sc.seed))
        if before is not None and before.info.status == "FINISHED":
            kept.append(label or sc.name)
            continue
        again = before.info.run_id if before is not None else (None if several else resume)
        jobs.append(
            Job(
                label or sc.name,
                variant,
                sc,
                tags,
                resume_command(file, overrides, engine, address, variant, sc.seed if seeds else None),
                engine,
                address,
                again,
                None if several else summary,
                verbose,
                progress,
            )
        )
    return jobs, kept


def _tell_continuing(resume: str, jobs: list[Job], kept: list[str]) -> None:
    going_on = sum(1 for j in jobs if j.resume)
    print(
        f"raysim: continuing sweep {resume}: {len(kept)} finished runs kept, {going_on} continued, "
        f"{len(jobs) - going_on} started",
        file=sys.stderr,
        flush=True,
    )


def _run_jobs(jobs: list[Job], several: bool, engine: str, concurrent: int | None, parent):
    """The runs, one after another or side by side on Ray Tune: (the finished ones' summaries,
    the error to raise once they are shown, or None)."""
    if not jobs:
        return {}, None
    at_once = _at_once(jobs, concurrent) if several and engine == "ray" else 1
    if at_once == 1:
        return _one_after_another(jobs, reuse=engine == "ray" and len(jobs) > 1)
    return _side_by_side(jobs, at_once, parent)


def _end_parent(parent, ok: bool, file, overrides, engine, address, seeds, pattern, tuned_by) -> None:
    """The parent MLflow run marked FINISHED, or FAILED with the command that continues the
    whole sweep."""
    parent[0].set_terminated(parent[1], "FINISHED" if ok else "FAILED")
    if not ok:
        print(
            f"raysim: continue the whole sweep (its finished runs kept) with: "
            f"{sweep_resume_command(file, overrides, engine, address, seeds, parent[1], pattern, tuned_by)}",
            file=sys.stderr,
            flush=True,
        )


def _show_sweep(file: str, summaries: dict, summary: str | None, parent, given_uri: str | None) -> None:
    """The runs' table (and ``--summary``'s file), the parent's comparison, and where to
    look further."""
    if summaries:
        _print_sweep(summaries)
    if summary:
        Path(summary).write_text(json.dumps({"sweep": file, "variants": summaries}, indent=2))
    from raysim.results.compare import table

    print(table(parent[0], [parent[1]])[0])
    print(
        f"parent MLflow run {parent[1]}: raysim compare {parent[1]}  /  raysim report {parent[1]}"
        + (f"  (with --tracking-uri {given_uri})" if given_uri else "")
    )


def run_job(job: Job) -> dict:
    from raysim.experiment.runner import run

    return run(
        job.sc,
        engine=job.engine,
        address=job.address,
        resume=job.resume,
        summary_path=job.summary_path,
        verbose=job.verbose,
        progress=job.progress,
        resume_command=job.resume_command,
        tags=job.tags,
    )


def _finished(summary: dict, sc: Scenario) -> None:
    from raysim.experiment.summary import FINAL

    # the headline metrics, ACC(T) and the time to eval.target (every mean, std and best is in
    # the summary file)
    shown = ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in summary["final"].items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (k in FINAL or k in ("best_accuracy", "best_mse", "target_round", "target_seconds"))
    )
    print(f"{sc.name}: {summary['rounds']} rounds in {summary['wall_seconds']:.1f}s; {shown}")
    print(
        f"MLflow run {summary['mlflow_run_id']} recorded in {summary['tracking_uri']} "
        f"(experiment '{sc.tracking.experiment}'); view it with: mlflow ui --backend-store-uri "
        f"{summary['tracking_uri']}",
        flush=True,
    )


def _one_after_another(jobs: list[Job], reuse: bool = False) -> tuple[dict, BaseException | None]:
    """The runs in turn: the finished ones' summaries, and RunsFailed (to raise once they are
    shown) if some failed. A run that fails (diverged, a host lost too often: already marked
    FAILED with its resume command printed) does not stop the others, as side by side; bad
    input, an interrupt or a single run's failure stops at once. ``reuse`` (Ray): a finished
    run's host actors serve the next run of the same shape (``ray_engine.reuse_hosts``)."""
    if reuse:
        from raysim.engine import ray_engine

        with ray_engine.reuse_hosts():
            return _one_after_another(jobs)
    from raysim.errors import EXIT_FAILED, explain

    summaries, failed = {}, []
    for job in jobs:
        try:
            summaries[job.label] = run_job(job)
        except Exception as e:  # noqa: BLE001 - reported here, raised as RunsFailed
            code, line = explain(e, job.verbose)
            if len(jobs) == 1 or code != EXIT_FAILED:
                raise
            print(f"raysim: {job.label}: {line}", file=sys.stderr, flush=True)
            failed.append(job)
            continue
        _finished(summaries[job.label], job.sc)
    if failed:
        return summaries, _runs_failed(failed, jobs)
    return summaries, None


def _runs_failed(failed: list[Job], jobs: list[Job]) -> RunsFailed:
    return RunsFailed(f"{len(failed)} of {len(jobs)} runs failed: {', '.join(j.label for j in failed)}")


def _at_once(jobs: list[Job], concurrent: int | None) -> int | None:
    """How many runs go side by side: 1 (one after another) when asked, or when the local Ray
    raysim starts holds only one at a time; else ``concurrent`` (None: as many as fit, Tune
    queueing the rest). Starts Ray and refuses at once a run that can never be placed."""
    if concurrent == 1:
        return 1
    from raysim.engine import ray_engine, ray_start, ray_sweep

    if not ray_start.running():
        print(
            f"raysim: {'starting a local Ray instance' if jobs[0].address is None else 'joining Ray at ' + jobs[0].address}"
            f" for {len(jobs)} runs ...",
            file=sys.stderr,
            flush=True,
        )
    ray_start.init(jobs[0].address, jobs[0].verbose)
    for job in jobs:
        ray_engine.check_fits(job.sc)
    fit = ray_sweep.runs_at_once([j.sc for j in jobs])
    if fit is not None and fit < 2:
        return 1
    return min(x for x in (concurrent, fit, len(jobs)) if x is not None)


def run_trial_job(job: Job) -> dict:
    """``run_job`` in a Tune trial: its summary, or its error as the exit code and the line
    the command would print, with the run's MLflow id (found again by the driver)."""
    from raysim.errors import explain

    try:
        return {"summary": run_job(job)}
    except BaseException as e:  # noqa: BLE001 - reported by the driver
        code, line = explain(e, job.verbose)
        return {"error": line, "code": code}


def _side_by_side(jobs: list[Job], at_once: int | None, parent) -> tuple[dict, BaseException | None]:
    """The runs as Tune trials: the finished ones' summaries, and RunsFailed or
    SweepInterrupted (to raise once they are shown) if some did not finish."""
    from raysim.engine import ray_sweep

    client, parent_id = parent
    print(
        f"raysim: {len(jobs)} runs, up to {at_once} at a time on Ray Tune; each line below is one that ended",
        file=sys.stderr,
        flush=True,
    )
    jobs = [dataclasses.replace(j, progress=False) for j in jobs]

    def done(i: int, outcome) -> None:
        if isinstance(outcome, dict) and "summary" in outcome:
            _finished(outcome["summary"], jobs[i].sc)
        else:
            why = outcome["error"] if isinstance(outcome, dict) else outcome or "stopped"
            print(f"raysim: {jobs[i].label}: {why}", file=sys.stderr, flush=True)

    outcomes = ray_sweep.run_trials(jobs, [j.sc for j in jobs], run_trial_job, at_once, done)
    summaries, failed, stopped = {}, [], []
    for job, outcome in zip(jobs, outcomes):
        if isinstance(outcome, dict) and "summary" in outcome:
            summaries[job.label] = outcome["summary"]
        else:
            (
                stopped if outcome is None or (isinstance(outcome, dict) and outcome["code"] in (130, 143)) else failed
            ).append(job)
    for job in failed + stopped:
        _close_child(client, parent_id, job, "failed" if job in failed else "killed")
    if stopped:
        return summaries, SweepInterrupted()
    if failed:
        return summaries, _runs_failed(failed, jobs)
    return summaries, None


def _close_child(client, parent_id: str, job: Job, outcome: str) -> None:
    """A run that did not finish: marked FAILED or KILLED in MLflow if its trial could not
    (its process lost, or stopped), and its id, checkpoint and resume command printed."""
    from raysim.experiment.runner import STATUS_WORD, tell_resume

    query = f"tags.mlflow.parentRunId = '{parent_id}' and tags.seed = '{job.sc.seed}'"
    if job.variant is not None:
        query += f" and tags.variant = '{job.variant}'"
    exp = client.get_run(parent_id).info.experiment_id
    for run in client.search_runs([exp], query, max_results=10):
        status = run.info.status
        if status == "RUNNING":
            client.set_terminated(run.info.run_id, STATUS_WORD[outcome])
        elif status == "FINISHED":  # ended just as the sweep stopped: its record is whole
            continue
        else:
            outcome = {v: k for k, v in STATUS_WORD.items()}.get(status, outcome)
        tell_resume(run.info.run_id, outcome, job.sc, job.resume_command)


def _print_sweep(summaries: dict) -> None:
    keys = ["accuracy", "bottom_decile_accuracy", "global_accuracy", "mse", "bottom_decile_mse", "consensus_distance"]
    keys = [k for k in keys if any(k in s["final"] or k in s["history"][-1] for s in summaries.values())]
    width = max(len(str(v)) for v in summaries)
    print(f"{'variant':<{width}}  " + "  ".join(f"{k:>22}" for k in keys) + f"  {'seconds':>8}")
    for variant, s in summaries.items():
        vals = [s["final"].get(k, s["history"][-1].get(k)) for k in keys]
        print(
            f"{variant:<{width}}  "
            + "  ".join(f"{v:22.4g}" if v is not None else f"{'-':>22}" for v in vals)
            + f"  {s['wall_seconds']:8.1f}"
        )
