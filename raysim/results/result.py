"""The Python API's results: ``Result`` (one finished run) and ``SweepResult`` (the runs
under one parent MLflow run, with ``raysim compare``'s table), made from the summaries of the
runs just made or read back from MLflow. ``raysim.api`` returns them (and re-exports them:
``raysim.Result``, ``raysim.api.Result``).

Nothing heavy at import: pandas and MLflow are imported when a result is made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysim.scenario.schema import ScenarioError

if TYPE_CHECKING:  # pragma: no cover - for type checkers and the API reference only
    import pandas as pd

    from raysim.scenario.sections import Scenario

DICT_LABEL = "<dict>"  # how errors name a scenario given as a dict


@dataclass(eq=False)
class Result:
    """One finished run.

    Attributes:
        run_id: The MLflow run's id (``raysim.load(run_id)`` reads it back).
        name: The scenario's name (the MLflow run's name).
        final: The last evaluation's headline metrics (every number of the summary's
            ``final``: means over clients, their ``_std``, ``bottom_decile_``, ``best_``, ...).
        history: One row per round (index ``round``), one column per metric the run logged
            for that round (NaN in a round that did not evaluate, e.g. between ``eval.every``).
        clients: One row per evaluated client (index ``client``): ``unseen`` (a client that
            never trained, ``eval.unseen_fraction``), its final score (``accuracy`` or
            ``mse``) and, where the method estimates them, its mixture or cluster weights
            (``weight_0``, ...) and the data's true shares (``true_share_0``, ...).
        summary: The run's summary (the ``summary.json`` logged to MLflow: ``final``,
            ``history``, ``wall_seconds``, ...).
        scenario: The validated scenario (None when a loaded run's scenario no longer
            validates, e.g. a file it names is gone).
        tracking_uri: The MLflow store holding the run.
        variant: The sweep variant the run is, or None.
        seed: The seed the run used.
    """

    run_id: str
    name: str
    final: dict[str, float]
    history: pd.DataFrame
    clients: pd.DataFrame
    summary: dict = field(repr=False)
    scenario: Scenario | None = field(repr=False)
    tracking_uri: str = ""
    variant: str | None = None
    seed: int | None = None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={self.final[k]:.4g}" for k in ("accuracy", "bottom_decile_accuracy", "mse") if k in self.final
        )
        what = f"variant={self.variant!r}, " if self.variant is not None else ""
        return (
            f"Result(run_id={self.run_id!r}, name={self.name!r}, {what}seed={self.seed}, "
            f"rounds={len(self.history)}{', ' + shown if shown else ''})"
        )


@dataclass(eq=False)
class SweepResult:
    """Several runs nested under one parent MLflow run: a sweep's variants, each at each seed.

    Attributes:
        parent_run_id: The parent MLflow run's id (``raysim.load`` of it reads the whole
            sweep back; ``raysim compare`` and ``raysim report`` take it too).
        runs: Each finished run, keyed by ``(variant, seed)`` (variant None for the seeds of
            a scenario without a sweep), in the sweep's order.
        table: ``raysim compare``'s table as a DataFrame: one row per method (the algorithm,
            with the variant) and dataset and metric, with the ``mean`` and ``std`` over
            seeds (sample std, 0 for one seed), the bottom decile's, ``n`` and the run ids.
            Accuracies are fractions here (the Markdown shows %).
        markdown: The same table as ``raysim compare`` prints it.
        tracking_uri: The MLflow store holding the runs.
    """

    parent_run_id: str
    runs: dict[tuple[str | None, int], Result]
    table: pd.DataFrame
    markdown: str = field(repr=False)
    tracking_uri: str = ""

    @property
    def history(self) -> pd.DataFrame:
        """Every run's history in one DataFrame, indexed by (variant, seed, round)."""
        import pandas as pd

        frames = [
            r.history.assign(variant=v, seed=s)
            .set_index(["variant", "seed"], append=True)
            .reorder_levels(["variant", "seed", "round"])
            for (v, s), r in self.runs.items()
        ]
        return pd.concat(frames) if frames else pd.DataFrame()

    def compare(
        self, metrics: Sequence[str] | None = None, over: str = "seeds", select: str | None = None
    ) -> pd.DataFrame:
        """The table again with other columns or spread (``raysim compare --metrics --over
        --select``).

        Args:
            metrics: Metrics the runs logged, e.g. ``["accuracy", "global_accuracy",
                "best_accuracy"]`` (default: accuracy, or mse).
            over: ``"seeds"``: the std over seeds; ``"clients"``: the mean over seeds of each
                run's std over clients, as the papers report it.
            select: A validation metric, e.g. ``"val_accuracy"``: per method and dataset only
                the variant whose mean of it over the seeds is best, its test metrics in the
                rows (``method`` is then the algorithm; ``variant`` names the one chosen,
                ``selection_mean`` its mean validation score). Every row has
                ``seconds_per_run``, the mean wall time of its runs (MLflow's end minus start);
                ``dataset`` is ``"name (partition kind)"`` where the runs differ in partition.

        Returns:
            The table as a DataFrame, as ``table``.

        Raises:
            ScenarioError: ``metrics`` is not a metric's name or a list of them, or
                ``select`` not a metric's name.
            raysim.results.compare.CompareError: None of the runs logged these metrics, ``over``
                is neither ``"seeds"`` nor ``"clients"``, or ``select`` is not a validation
                metric the runs logged.
        """
        metrics = [metrics] if isinstance(metrics, str) else metrics
        if metrics is not None and not (
            isinstance(metrics, (list, tuple)) and all(isinstance(m, str) and m for m in metrics)
        ):
            raise ScenarioError(
                f"metrics: {metrics!r}: give metrics the runs logged, e.g. ['accuracy', 'global_accuracy']"
            )
        check_text("select", select, "a validation metric the runs logged, e.g. 'val_accuracy'")
        _, client = open_client(self.tracking_uri)
        return compare_table(
            client, self.parent_run_id, list(metrics) if metrics else None, over, strict=True, select=select
        )[0]

    def __repr__(self) -> str:
        return f"SweepResult(parent_run_id={self.parent_run_id!r}, runs={list(self.runs)})\n{self.markdown}"

    def _repr_markdown_(self) -> str:
        return f"Parent MLflow run `{self.parent_run_id}`, {len(self.runs)} runs\n\n{self.markdown}"


def check_text(name: str, value: Any, what: str) -> None:
    """An optional text argument is None or a non-empty string; ScenarioError naming the
    argument and ``what`` it must be otherwise."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ScenarioError(f"{name}: {value!r}: give {what}")


def open_client(uri: str | None):
    from raysim.results.report import client_for

    return client_for(uri)


def _numbers(final: dict) -> dict[str, float]:
    return {k: v for k, v in final.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _history(summary: dict) -> pd.DataFrame:
    import pandas as pd

    history = pd.DataFrame(summary.get("history") or [])
    if "round" in history:
        history = history.set_index(history["round"].astype(int)).drop(columns="round")
    history.index.name = "round"
    return history


def _clients(final: dict) -> pd.DataFrame:
    """The summary's per-client entries as one table: ``client_<metric>`` (and the unseen
    clients' ``unseen_client_<metric>``), ``importance`` (estimated weights) and
    ``true_shares``."""
    import pandas as pd

    rows: dict[int, dict[str, Any]] = {}
    for key, scores in final.items():
        m = re.fullmatch(r"(unseen_)?client_(\w+)", key)
        if m and isinstance(scores, dict):
            for c, v in scores.items():
                rows.setdefault(int(c), {"unseen": bool(m.group(1))})[m.group(2)] = v
    for key, column in (("importance", "weight"), ("true_shares", "true_share")):
        for c, values in (final.get(key) or {}).items():
            row = rows.setdefault(int(c), {"unseen": False})
            row.update({f"{column}_{j}": v for j, v in enumerate(values)})
    table = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    table.index.name = "client"
    return table


def result_of(summary: dict, scenario: Scenario | None, variant: str | None) -> Result:
    final = summary.get("final", {})
    return Result(
        run_id=summary["mlflow_run_id"],
        name=summary.get("name", ""),
        final=_numbers(final),
        history=_history(summary),
        clients=_clients(final),
        summary=summary,
        scenario=scenario,
        tracking_uri=summary.get("tracking_uri", ""),
        variant=variant,
        seed=int(summary["seed"]) if summary.get("seed") is not None else None,
    )


def sweep_result_of(summaries: list[dict], variants: list) -> SweepResult:
    """The runs just made, with the parent they are nested under and its table."""
    from raysim.results.report import INDEX_TAG

    uri, client = open_client(summaries[0]["tracking_uri"])
    children, parent = {}, None
    for summary in summaries:
        tags = client.get_run(summary["mlflow_run_id"]).data.tags
        parent = tags["mlflow.parentRunId"]
        variant, sc = variants[int(tags[INDEX_TAG])]
        r = result_of(summary, sc, variant)
        children[(variant, r.seed)] = r
    table, markdown = compare_table(client, parent)
    return SweepResult(parent, children, table, markdown, uri)


def loaded(client, run, uri: str) -> Result:
    """A finished run read back: its summary.json, and its recorded scenario validated
    again (without opening its data)."""
    from raysim.results import report

    summary, raw = report.load(client, run.info.run_id)
    scenario = None
    if raw is not None:
        from raysim.scenario import config

        try:
            scenario = config.validate(
                raw, summary.get("scenario") or run.data.tags.get("scenario", DICT_LABEL), check_data=False
            )
        except ScenarioError:
            pass
    summary = {**summary, "tracking_uri": summary.get("tracking_uri") or uri}
    return result_of(summary, scenario, run.data.tags.get("variant"))


def compare_table(
    client,
    parent_run_id: str,
    metrics: list[str] | None = None,
    over: str = "seeds",
    strict: bool = False,
    select: str | None = None,
) -> tuple[pd.DataFrame, str]:
    """``raysim compare``'s table of a parent run's children: (DataFrame, Markdown); when
    there is nothing to compare (no run evaluated), an empty DataFrame and the reason, or
    with ``strict`` the CompareError."""
    import pandas as pd

    from raysim.results import compare

    try:
        markdown, (methods, columns, cells) = compare.table(client, [parent_run_id], None, metrics, over, select)
    except compare.CompareError as e:
        if strict:
            raise
        return pd.DataFrame(), str(e)
    rows = [
        {
            "method": m,
            "dataset": d,
            "metric": c.metric,
            "mean": c.mean,
            "std": c.std,
            "bottom_decile_mean": c.bottom_mean,
            "bottom_decile_std": c.bottom_std,
            "n": c.n,
            "seeds": [int(s) if s.isdigit() else s for s in c.seeds],
            "run_ids": c.run_ids,
            "seconds_per_run": c.seconds,
            **({"variant": c.variant, "selection_mean": c.selection_mean} if select else {}),
        }
        for m in methods
        for d, metric in columns
        if (c := cells.get((m, d, metric))) is not None
    ]
    return pd.DataFrame(rows), markdown
