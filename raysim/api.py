"""The Python API: run experiments and read finished runs back, from a notebook or a script.

```python
import raysim

result = raysim.run("scenarios/synthetic_fedem.yaml", {"rounds": 20, "data.clients": 50})
result.final["accuracy"]          # the last evaluation's mean accuracy over clients
result.history["accuracy"]        # one row per round
result.clients                    # each client's final score (and FedEM's mixture weights)

again = raysim.load(result.run_id)     # the same run, read back from MLflow
```

``raysim.run`` is what ``raysim run`` does (the same validation, MLflow record, checkpoints and
numbers) without the command's process exit: errors are raised (a bad scenario, override or
argument as ``ScenarioError``, a ``ValueError``), and the local Ray instance started by the first run on the ``ray`` engine
is kept and reused by the next runs of the same Python process (``shutdown`` stops it).

Nothing heavy is imported with this module (torch, Ray, MLflow and pandas are imported by the
first run or load), so ``import raysim`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raysim.cli import parse_run_id, parse_run_ids
from raysim.scenario.schema import ScenarioError

# isort: split
# the result types live in raysim.results.result and are re-exported here (raysim.api.Result);
# imported after ScenarioError so that the API reference, in source order, lists it first
from raysim.results.result import DICT_LABEL, Result, SweepResult
from raysim.results.result import check_text as _text
from raysim.results.result import compare_table as _table  # also raysim.api._table (tests)
from raysim.results.result import loaded as _loaded
from raysim.results.result import open_client as _client
from raysim.results.result import result_of as _result
from raysim.results.result import sweep_result_of as _sweep_result

__all__ = ["run", "load", "shutdown", "Result", "SweepResult", "ScenarioError"]

ENGINES = ("ray", "serial")
# the command's option names in messages shared with the command, as this API's arguments
_ARGUMENTS = {"--set": "overrides", "--variant": "variant", "--seeds": "seeds", "--resume": "resume"}


# Over 80 lines with its signature and the docstring the API reference renders; the body is three steps.
def run(
    scenario: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    *,
    engine: str = "ray",
    seeds: Sequence[int] | str | int | None = None,
    address: str | None = None,
    variant: str | None = None,
    concurrent: int | None = None,
    resume: str | None = None,
    best_of: str | None = None,
    progress: bool = False,
    verbose: bool = False,
) -> Result | SweepResult:
    """Run a scenario, as ``raysim run`` does, and return its results.

    Every run is recorded in MLflow as the command records it (the store is the scenario's
    ``tracking.uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the
    working directory). A sweep file (``sweep:`` variants, a ``grid:`` of values, or both) or
    several seeds give several runs nested under one parent MLflow run and compared at the
    end. On the ``ray`` engine the first run starts a local Ray instance (or joins
    ``address``), which later runs in this process reuse; ``shutdown()`` stops it.

    Args:
        scenario: A scenario YAML file, or the same mapping as a dict (validated exactly as
            the file would be; errors name it ``<dict>``). A dict's text is recorded with the
            run like a file (MLflow artifact ``scenario/<name>.yaml``).
        overrides: Scenario keys to change, as a dict of dotted keys and values
            (``{"algorithm.lr": 0.01, "rounds": 5}``) or as ``raysim run --set`` items
            (``["algorithm.lr=0.01"]``, values read as YAML). A sweep's variants apply theirs
            first.
        engine: ``"ray"`` (default) or ``"serial"`` (every client in this process: the
            reference engine, same numbers).
        seeds: Run each variant once per seed (``[0, 1, 2]`` or ``"0,1,2"``); default: the
            file's ``seeds:`` if any, else its ``seed``.
        address: Join this Ray cluster (``"auto"`` or ``HOST:PORT``) instead of starting a
            local Ray.
        variant: Run only this variant of a sweep, or the variants a shell-style pattern
            matches (``"*-shards,lr=0.01"``).
        concurrent: How many runs of a sweep or of seeds go side by side on Ray Tune
            (default: as many as Ray holds; 1: one after another in this process).
        resume: Continue this MLflow run from its last checkpoint (with a sweep, give
            ``variant`` and a single seed too); or, for a sweep or several seeds, the id of
            their parent run: its finished runs are kept, the unfinished ones continue and
            those never started start (the result holds them all).
        best_of: The id of a sweep's parent run (or several, comma-separated, that choose
            together): of this sweep file's variants, run only those it chose on validation
            (per method and dataset, the grid point of best mean ``val_accuracy``, or
            ``val_mse``, over its seeds), e.g. a grid tuned at seed 0 repeated at seeds 1
            and 2.
        progress: Show a progress bar per run.
        verbose: Show Ray's and MLflow's logs.

    Returns:
        A ``Result`` for a single run; a ``SweepResult`` (the runs and their mean ± std
        table) when the scenario gives several runs (a sweep, or more than one seed).

    Raises:
        ScenarioError: A bad scenario, override or argument (one line naming the key and
            what is allowed), before anything runs.
        raysim.errors.RunsFailed: Some runs of a sweep failed (each marked FAILED in
            MLflow, with the way to resume it printed), once every other run has finished.
        KeyboardInterrupt: The run was interrupted (its MLflow run is marked KILLED).
    """
    resume, best_of = _checked_arguments(
        scenario, engine, concurrent, address, variant, resume, best_of, progress, verbose
    )
    label = DICT_LABEL if isinstance(scenario, Mapping) else str(scenario)
    items = _override_items(overrides, label)
    with tempfile.TemporaryDirectory(prefix="raysim-api-") as tmp:
        file = _scenario_file(scenario, tmp) if isinstance(scenario, Mapping) else str(scenario)
        try:
            variants, summaries = _run_file(
                file,
                items,
                seeds,
                variant,
                engine=engine,
                address=address,
                concurrent=concurrent,
                resume=resume,
                best_of=best_of,
                progress=progress,
                verbose=verbose,
            )
        except ScenarioError as e:
            raise ScenarioError(_api_words(str(e), file, label)) from None
    return _results(summaries, variants, label, resume)


def _checked_arguments(
    scenario: Any,
    engine: Any,
    concurrent: Any,
    address: Any,
    variant: Any,
    resume: Any,
    best_of: Any,
    progress: Any,
    verbose: Any,
) -> tuple[str | None, str | None]:
    """``run``'s arguments checked in turn, as ScenarioErrors naming the argument: (resume,
    best_of) as the command reads them."""
    if not isinstance(scenario, (str, os.PathLike, Mapping)):
        raise ScenarioError(f"scenario: {scenario!r}: give a scenario YAML file's path or a dict of its keys")
    if engine not in ENGINES:
        raise ScenarioError(f"engine: {engine!r}: choose one of {', '.join(ENGINES)}")
    if concurrent is not None and (isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1):
        raise ScenarioError(f"concurrent: {concurrent!r}: give a whole number >= 1 (1: one run after another)")
    _text("address", address, "'auto' or HOST:PORT of a Ray cluster")
    _text("variant", variant, "a variant's name or a shell-style pattern of names")
    resume = _option("resume", resume, parse_run_id)
    best_of = _option("best_of", best_of, parse_run_ids)
    _flag("progress", progress)
    _flag("verbose", verbose)
    return resume, best_of


def _run_file(
    file: str,
    items: list[str],
    seeds: Sequence[int] | str | int | None,
    variant: str | None,
    *,
    engine: str,
    address: str | None,
    concurrent: int | None,
    resume: str | None,
    best_of: str | None,
    progress: bool,
    verbose: bool,
) -> tuple[list, dict]:
    """``raysim run``'s steps on a scenario file: the quick checks, its variants (only those
    ``best_of`` chose), every run. (variants, {label: summary})."""
    from raysim.experiment.preflight import check_run
    from raysim.scenario import config

    check_run(file, items, None, resume)
    seed_list = config.seeds_of(file, _seeds_text(seeds))
    variants = config.load_variants(file, items, variant, seeds=seed_list)
    from raysim.experiment.sweep import best_of as best
    from raysim.experiment.sweep import run_command

    if best_of:
        variants = best(file, variants, best_of, variant, verbose)
    summaries = run_command(
        file,
        variants,
        seed_list,
        overrides=items,
        engine=engine,
        address=address,
        resume=resume,
        verbose=verbose,
        progress=progress,
        concurrent=concurrent,
        pattern=variant,
        tuned_by=best_of,
    )
    return variants, summaries


def _results(summaries: dict, variants: list, label: str, resume: str | None) -> Result | SweepResult:
    """What ``run`` returns: one run's ``Result``, or the ``SweepResult`` of several (a sweep
    continued: read back, its runs of before with those of now)."""
    if label == DICT_LABEL:  # the temporary file is gone: the scenario is the dict's
        variants = [(v, dataclasses.replace(sc, path=DICT_LABEL)) for v, sc in variants]
    if len(variants) == 1:
        (only,) = summaries.values()
        return _result(only, variants[0][1], variants[0][0])
    if resume:  # a sweep continued: its runs of before and of now, read back
        return load(resume, variants[0][1].tracking.uri)
    return _sweep_result(list(summaries.values()), variants)


def load(run_id: str, tracking_uri: str | None = None) -> Result | SweepResult:
    """Read a finished run, or a sweep's parent run, back from MLflow.

    Args:
        run_id: The MLflow run's id (``Result.run_id``, ``SweepResult.parent_run_id``, or
            one printed by ``raysim run``).
        tracking_uri: The MLflow store (default ``MLFLOW_TRACKING_URI``, else
            ``sqlite:///mlflow.db`` in the working directory).

    Returns:
        The ``Result`` the run returned (same history, final metrics and per-client scores,
        read from its ``summary.json``; its scenario validated again from the one it
        recorded), or for a parent run a ``SweepResult`` of its finished runs.

    Raises:
        ScenarioError: ``run_id`` is not a non-empty string, or ``tracking_uri`` is neither
            None nor a tracking URI MLflow can open.
        raysim.results.report.ReportError: No such run in the store, or a run that did not finish
            (no summary; a failed or killed run can be continued with ``resume``).
    """
    _text("run_id", run_id, "the MLflow run's id, a string")
    _text("tracking_uri", tracking_uri, "an MLflow tracking URI, e.g. sqlite:///mlflow.db")
    from raysim.scenario.stores import unknown_store

    if tracking_uri is not None and (unknown := unknown_store(tracking_uri)):
        raise ScenarioError(f"tracking_uri: {unknown}")
    from raysim.results import report

    uri, client = _client(tracking_uri)
    runs = report.expand(client, [run_id])  # ReportError for an unknown id
    if runs[0].info.run_id == run_id and runs[0].data.tags.get("raysim.parent") != "1":
        return _loaded(client, runs[0], uri)
    children = {}
    for child in runs:
        if child.info.status != "FINISHED":
            warnings.warn(f"run {child.info.run_id} of sweep {run_id} is {child.info.status}: left out", stacklevel=2)
            continue
        r = _loaded(client, child, uri)
        children[(r.variant, r.seed)] = r
    table, markdown = _table(client, run_id)
    return SweepResult(run_id, children, table, markdown, uri)


def shutdown() -> None:
    """Stop the local Ray instance this process started (or leave the cluster it joined).

    The next run on the ``ray`` engine starts a fresh one. Not needed between runs, nor at
    the end: Ray stops with the Python process.
    """
    import sys

    if "ray" in sys.modules:
        from raysim.engine import ray_start

        ray_start.shutdown()


# ------------------------------------------------------------------------------------------------
# arguments


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ScenarioError(f"{name}: {value!r}: give True or False")


def _option(name: str, value: Any, parse) -> str | None:
    """An optional text argument read by ``parse``, the type of the command's option of the
    same name (``--resume``, ``--best-of``): the same rule, as a ScenarioError naming the
    argument."""
    import argparse

    if value is None:
        return None
    if not isinstance(value, str):
        raise ScenarioError(f"{name}: {value!r}: give a run id, a string")
    try:
        return parse(value)
    except argparse.ArgumentTypeError as e:
        raise ScenarioError(f"{name}: {e}") from None


_OVERRIDES = "give a dict of dotted keys and values, e.g. {'algorithm.lr': 0.01}, or a list of KEY=VALUE strings"


def _override_items(overrides: Mapping[str, Any] | Sequence[str] | None, label: str) -> list[str]:
    """``overrides`` as ``--set`` items: a dict's values written as YAML that reads back as
    the same value (a float stays a float, a string a string)."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        import yaml

        items = []
        for key, value in overrides.items():
            if not isinstance(key, str):
                raise ScenarioError(f"{label}: overrides: key {key!r} is not a string; {_OVERRIDES}")
            value = _plain(value, f"{label}: overrides: {key}")
            text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
            text = text.removesuffix("\n...").strip()
            items.append(f"{key}={text}")
        return items
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(item, str) for item in overrides):
        raise ScenarioError(f"{label}: overrides: {overrides!r}: {_OVERRIDES}")
    return list(overrides)


def _plain(value: Any, where: str) -> Any:
    """``value`` as YAML's plain types: tuples as lists, numpy scalars and arrays as numbers
    and lists, paths as strings; ScenarioError for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _plain(value.tolist(), where)
    raise ScenarioError(
        f"{where}: a {type(value).__name__} cannot be part of a scenario; give numbers, strings, lists and dicts"
    )


def _scenario_file(scenario: Mapping[str, Any], folder: str) -> str:
    """A dict scenario written as a YAML file in ``folder`` (named after its ``name``): what
    the run validates, and records in MLflow as its scenario file."""
    import yaml

    raw = {str(k) if not isinstance(k, str) else k: v for k, v in scenario.items()}
    raw = _plain(raw, DICT_LABEL)
    name = raw.get("name") if isinstance(raw.get("name"), str) and raw.get("name") else "scenario"
    path = Path(folder) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name).strip('.') or 'scenario'}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _seeds_text(seeds: Sequence[int] | str | int | None) -> str | None:
    """``seeds`` as the command's ``--seeds`` text (whose ranges ``config.seeds_of`` checks);
    ScenarioError for anything but a string, an integer or a non-empty list of integers."""
    if seeds is None or isinstance(seeds, str):
        return seeds
    if _integer(seeds):
        return str(seeds)
    if isinstance(seeds, (list, tuple, range)) and seeds and all(_integer(s) for s in seeds):
        return ",".join(str(s) for s in seeds)
    raise ScenarioError(f"seeds: {seeds!r}: give a list of distinct integers >= 0, e.g. [0, 1, 2]")


def _integer(value: Any) -> bool:
    """An integer, numpy's included, but not True or False."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _api_words(message: str, file: str, label: str) -> str:
    """A message shared with the command in this API's words: the dict's label for the
    temporary file, argument names for option names."""
    if file != label:
        message = message.replace(file, label)
    return re.sub(r"--(set|variant|seeds|resume)\b", lambda m: _ARGUMENTS[m.group(0)], message)
