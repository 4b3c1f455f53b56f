"""``raysim report RUN_ID...``: a run's results as the figures of a paper, written to a folder
and logged to the run in MLflow (``report/``).

Everything is read back from MLflow: the run's ``summary.json`` artifact (per-round history,
the final evaluation with each client's score, a clustered method's report) and its resolved
scenario (to redraw a gossip run's graph, which is a function of the scenario and seed).

The figures of one run are ``raysim.results.figures``' (which lists them); with several runs,
``compare_accuracy.png`` draws their curves together (``raysim.results.curves``): one per
configuration (name, method, sweep variant and every other key that changes results), the mean
over its seeds with a ±std band; ``compare_accuracy.csv`` holds the numbers drawn. The names of
both modules are re-exported here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from raysim.errors import BadInput
from raysim.results.byzantine import byzantine_figure
from raysim.results.curves import (  # noqa: F401 - re-exported: the curves' old home
    Compared,
    Curve,
    compare_curves,
    compare_figure,
    compare_groups,
    compare_time_figure,
    time_curves,
)
from raysim.results.figures import (  # noqa: F401 - re-exported: the figures' old home
    accuracy_figure,
    clients_figure,
    clusters_figure,
    figures,
    fleet_figure,
    graph_figures,
    lambda_figure,
    metric_of,
    mixture_figure,
    simplex_figure,
    write_curve,
)


def client_for(uri: str | None):
    """(URI, MlflowClient) on ``uri``, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    (``raysim.results.store.resolve_uri``: the rule runs use)."""
    from mlflow.tracking import MlflowClient

    from raysim.results.store import resolve_uri

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = resolve_uri(uri)
    return uri, MlflowClient(uri)


class ReportError(BadInput):
    """A run that cannot be reported (unknown, or without its summary); one line."""


INDEX_TAG = "raysim.index"  # a sweep's run: its place in the sweep (variant-major, then seed)


def expand(client, run_ids: list[str]) -> list:
    """The runs named (MLflow Run objects), a parent (a sweep's, or seeded runs') replaced by
    its children in the sweep's order (their ``raysim.index``; runs side by side start in any
    order), else in start order."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    out = []
    for rid in run_ids:
        try:
            run = client.get_run(rid)
        except MlflowException:
            raise ReportError(f"no run {rid} in the tracking store {client.tracking_uri}") from None
        kids = client.search_runs(
            [run.info.experiment_id],
            f"tags.mlflow.parentRunId = '{rid}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=50000,
            order_by=["attributes.start_time ASC"],
        )
        if kids and all(INDEX_TAG in k.data.tags for k in kids):
            kids = sorted(kids, key=lambda k: int(k.data.tags[INDEX_TAG]))
        out += kids if kids else [run]
    return out


def load(client, run_id: str) -> tuple[dict, dict | None]:
    """(the run's summary, its resolved scenario or None), read from its artifacts."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException:
        raise ReportError(f"no run {run_id} in the tracking store {client.tracking_uri}") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "summary.json", tmp)
        except (MlflowException, OSError):
            raise ReportError(
                f"run {run_id} has no summary.json (it did not finish an evaluation; a failed "
                "or killed run can be resumed with --resume)"
            ) from None
        summary = json.loads(Path(path).read_text())
        scenario = None
        try:
            scenario = json.loads(Path(client.download_artifacts(run_id, "scenario/resolved.json", tmp)).read_text())
        except (MlflowException, OSError, ValueError):
            pass
    return summary, scenario


def report(
    run_ids: list[str], uri: str | None = None, out: str | Path = "report", log: bool = True
) -> dict[str, list[Path]]:
    """Write each run's figures to ``out/<run id>/`` (and log them to the run under
    ``report/``); with several runs also ``out/compare_accuracy.png`` and ``.csv``, and with
    Byzantine runs ``out/byzantine.png``, ``.csv`` and ``.md`` (``raysim.results.byzantine``). A parent run (a sweep,
    seeded runs) stands for its children."""
    uri, client = client_for(uri)
    out = Path(out)
    made: dict[str, list[Path]] = {}
    compared = []
    runs = expand(client, run_ids)
    for run in runs:
        run_id = run.info.run_id
        summary, scenario = load(client, run_id)
        compared.append(Compared(summary, scenario, dict(run.data.tags)))
        paths = figures(summary, scenario, out / run_id)
        if log:
            for p in paths:
                client.log_artifact(run_id, str(p), "report")
        made[run_id] = paths
    if len(runs) > 1:
        p = compare_figure(compared, out)
        if p is not None:
            made["compare"] = [p, p.with_suffix(".csv")]
            timed = compare_time_figure(compared, out)
            if timed is not None:
                made["compare"].append(timed)
    byz = byzantine_figure(compared, out)
    if byz is not None:
        made["byzantine"] = [byz, byz.with_suffix(".csv"), byz.with_suffix(".md")]
    return made
