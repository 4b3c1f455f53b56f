"""``raysim compare``: finished runs as one table like a paper's Table 2, method x dataset, the
final metric and its bottom decile as mean ± std over seeds; printed, and written as Markdown
and CSV.

``metrics`` picks the columns (any metric the runs logged: ``accuracy``, ``top5_accuracy``,
``ece``, ``test_loss``, ``global_accuracy``, ``best_accuracy``, ``mse``, ...; default the
primary one, accuracy or mse). ``over``: ``seeds`` (default) gives the mean ± sample std over
seeds; ``clients`` gives the papers' mean ± std over clients (each run's ``<metric>_std``, the
test-size-weighted population std), both averaged over the seeds of a cell.

``select`` (``--select val_accuracy``) picks, per method and dataset, one variant of a sweep:
the one whose mean of a validation metric over its seeds is best (the largest; the smallest for
a loss or error), and shows that variant's test metrics, naming it in the cell; the Markdown
lists every candidate's validation mean under the table, and each cell the mean wall seconds per
run of the chosen variant (MLflow's end minus start time; the CSV's ``seconds_per_run`` for every
cell). Only validation metrics (``val_*``,
``best_val_*``) select: choosing a setting by its test score would report a maximum over the
grid.

Runs are chosen by id (a sweep's or seeded run's parent stands for its children), or as every
finished run of an MLflow experiment. A row is a method: the algorithm (and its server optimizer
where one is set: ``fedavg (server adam)``), with the sweep variant when the run is one; a
column a dataset, or a dataset and its partition (``fashion_mnist (shards)``, ``fashion_mnist
(dirichlet)``) where the runs of one dataset differ in
``data.partition.kind``. Runs of the same row and column are the seeds of one
cell (a run repeated with the same seed counts once more; the CSV lists every run id). Values
are the last evaluation's, read from the runs' metrics; accuracies are shown in %. The table is
written out (Markdown, CSV) by ``raysim.results.tables``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.errors import BadInput
from raysim.results.tables import _lower, markdown, percent, write_csv  # noqa: F401 - percent re-exported


@dataclass
class Row:
    run_id: str
    method: str
    dataset: str
    seed: str
    metric: str
    value: float
    bottom: float | None
    client_std: float | None = None
    algorithm: str = ""
    variant: str | None = None  # the sweep variant, None for a run of no sweep
    partition: str = ""  # data.partition.kind
    seconds: float | None = None  # the run's wall time in MLflow (end - start)


OVER = ("seeds", "clients")


class CompareError(BadInput):
    """Nothing to compare, or an unknown run or experiment; one line."""


def select(client, run_ids: list[str], experiment: str | None) -> list:
    """The runs to compare: the given ones (a parent expanded to its finished children) and
    every finished run of ``experiment`` that is not a parent."""
    from raysim.results.report import ReportError, expand

    try:
        runs = [r for r in expand(client, run_ids) if r.info.status == "FINISHED" or r.info.run_id in run_ids]
    except ReportError as e:
        raise CompareError(str(e)) from None
    if experiment is not None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            names = ", ".join(e.name for e in client.search_experiments())
            raise CompareError(f"no experiment {experiment!r} in {client.tracking_uri} (it has: {names or 'none'})")
        runs += [
            r
            for r in client.search_runs(
                [exp.experiment_id],
                "attributes.status = 'FINISHED'",
                max_results=50000,
                order_by=["attributes.start_time ASC"],
            )
            if r.data.tags.get("raysim.parent") != "1"
        ]
    seen, out = set(), []
    for r in runs:
        if r.info.run_id not in seen:
            seen.add(r.info.run_id)
            out.append(r)
    return out


def method_name(algorithm: str, params: dict[str, str]) -> str:
    """The method a run is: its algorithm, and the server optimizer where one steps its global
    model (``fedavg (server adam)`` is FedAdam): another method, whose lr ``--select`` chooses
    apart from the plain algorithm's."""
    opt = params.get("server.optimizer", "none")
    return algorithm if opt in ("none", "None", "") else f"{algorithm} (server {opt})"


def rows(runs, metrics: list[str] | None = None) -> list[Row]:
    """One row per run and metric (``metrics``; default: the run's accuracy, or mse)."""
    out = []
    for r in runs:
        m = r.data.metrics
        primary = "accuracy" if "accuracy" in m else "mse" if "mse" in m else None
        if primary is None:
            continue  # never evaluated
        tags = r.data.tags
        algorithm, variant = method_name(tags.get("algorithm", "?"), r.data.params), tags.get("variant")
        method = algorithm + (f" [{variant}]" if variant and variant != algorithm else "")
        for metric in metrics or [primary]:
            if metric not in m:
                continue
            get = lambda k: float(m[k]) if k in m else None  # noqa: E731, B023 - used in this pass only
            out.append(
                Row(
                    r.info.run_id,
                    method,
                    tags.get("dataset", "?"),
                    tags.get("seed", r.data.params.get("seed", "?")),
                    metric,
                    float(m[metric]),
                    get(bottom_decile(metric)),
                    get(f"{metric}_std"),
                    algorithm,
                    variant,
                    r.data.params.get("data.partition.kind", ""),
                    wall_seconds(r),
                )
            )
    if not out:
        if metrics and any(r.data.metrics for r in runs):
            have = sorted(
                {k for r in runs for k in r.data.metrics if "bottom_decile_" not in k and not k.endswith("_std")}
            )
            raise CompareError(f"none of the chosen runs logged {', '.join(metrics)} (they have: {', '.join(have)})")
        raise CompareError("none of the chosen runs has an evaluation to compare")
    return by_partition(out)


def by_partition(found: list[Row]) -> list[Row]:
    """The rows with ``dataset`` ``"fashion_mnist (shards)"``, ``"fashion_mnist (dirichlet)"``
    where runs of one dataset differ in ``data.partition.kind`` (two splits, two columns); as
    they were where they do not."""
    kinds: dict[str, set[str]] = {}
    for r in found:
        kinds.setdefault(r.dataset, set()).add(r.partition)
    return [
        dataclasses.replace(r, dataset=f"{r.dataset} ({r.partition or 'default'})") if len(kinds[r.dataset]) > 1 else r
        for r in found
    ]


def wall_seconds(run) -> float | None:
    """The run's wall time from MLflow, its end minus its start (start-up, data, rounds,
    evaluations and checkpoints; a resumed run's from its first start); None while it runs."""
    start, end = run.info.start_time, run.info.end_time
    return (end - start) / 1000.0 if start and end else None


def bottom_decile(k: str) -> str:
    """The key of mean k's bottom decile: ``driver.summarize`` writes its prefix (``unseen_``,
    ``val_``, ``val_unseen_``) before ``bottom_decile_``."""
    for prefix in ("val_unseen_", "val_", "unseen_"):
        if k.startswith(prefix):
            return f"{prefix}bottom_decile_{k.removeprefix(prefix)}"
    return f"bottom_decile_{k}"


@dataclass
class Cell:
    metric: str
    mean: float
    std: float
    bottom_mean: float | None
    bottom_std: float | None
    n: int
    seeds: list[str]
    run_ids: list[str]
    variant: str | None = None  # with select: the variant chosen
    selected_by: str | None = None
    selection_mean: float | None = None
    seconds: float | None = None  # the mean wall seconds per run (None where none recorded)


@dataclass
class Choice:
    """The variant a method gets on a dataset (``pick_variants``) and every candidate's mean
    of the selection metric over its seeds: [(variant, mean, n)], in the runs' order."""

    method: str
    variant: str
    mean: float
    candidates: list[tuple[str, float, int]]
    selected_by: str | None = None


def validation_metric(metric: str) -> bool:
    """A metric a variant may be chosen by: a validation one (``val_*``, ``best_val_*``)."""
    return "val" in metric.split("_")


def pick_variants(found: list[Row], metric: str) -> dict[tuple[str, str], Choice]:
    """{(algorithm, dataset): Choice} from rows of the selection ``metric``: per algorithm and
    dataset, the variant (the row's method) whose mean of ``metric`` over its runs (seeds) is
    best, the largest or, for a loss or error, the smallest; of equal means the first in the
    runs' order. The means are taken over the seeds every candidate has, where they share any:
    a variant run at more seeds once it was chosen (``raysim run --best-of``) is compared with
    the others on the seeds they were all tuned at."""
    from raysim.core.tasks import lower_is_better

    sign = 1.0 if lower_is_better(metric) else -1.0
    groups: dict[tuple[str, str], dict[str, list[Row]]] = {}
    for r in found:
        if r.metric == metric:
            groups.setdefault((r.algorithm, r.dataset), {}).setdefault(r.method, []).append(r)
    out = {}
    for key, by_method in groups.items():
        shared = set.intersection(*({r.seed for r in rs} for rs in by_method.values()))
        scored = {m: [r for r in rs if r.seed in shared] or rs for m, rs in by_method.items()}
        means = [(m, float(np.mean([r.value for r in rs])), len(rs)) for m, rs in scored.items()]
        best = min(range(len(means)), key=lambda i: (sign * means[i][1], i))
        label = lambda m: by_method[m][0].variant or by_method[m][0].algorithm  # noqa: E731, B023 - used in this pass only
        out[key] = Choice(
            means[best][0], label(means[best][0]), means[best][1], [(label(m), v, n) for m, v, n in means]
        )
    return out


def chosen_rows(runs, metrics: list[str] | None, select: str) -> tuple[list[Row], dict]:
    """The rows of the variants ``pick_variants`` chooses by ``select``, each under its
    algorithm's name, and the choices."""
    if not validation_metric(select):
        raise CompareError(
            f"--select {select}: not a validation metric; choose a variant by one the runs "
            f"scored on their validation split, e.g. val_accuracy, val_mse or best_val_accuracy "
            f"(choosing by a test score reports the best of the grid on test data)"
        )
    try:
        sel = rows(runs, [select])
    except CompareError as e:
        scored = any(k.startswith("val_") for r in runs for k in r.data.metrics)
        hint = (
            ""
            if scored
            else (
                "; no run scored a validation split: a run does when its clients have one "
                "(data.splits.val > 0) and eval.validation is not false"
            )
        )
        raise CompareError(f"--select {select}: {e}{hint}") from None
    choices = pick_variants(sel, select)
    found = [
        dataclasses.replace(r, method=r.algorithm)
        for r in rows(runs, metrics)
        if (c := choices.get((r.algorithm, r.dataset))) is not None and c.method == r.method
    ]
    # the methods in the order they first come among the runs compared (a sweep's order), not in
    # that of their chosen variants' runs (a method whose first grid point lost would sink)
    first = {a: i for i, a in enumerate(dict.fromkeys(r.algorithm for r in sel))}
    found.sort(key=lambda r: first.get(r.algorithm, len(first)))
    return found, choices


def best_variants(uri: str | None, parent_ids: list[str]) -> dict[str, set[str]]:
    """The sweep variants ``--select val_<metric>`` chooses among the finished runs of these
    sweeps' parents (``pick_variants``: per method and dataset, the grid point of best mean
    validation score), by ``val_accuracy`` where the runs logged it, else ``val_mse``: what
    ``raysim run --best-of`` runs at its seeds; each with the seeds it ran at there."""
    from raysim.results.report import client_for

    _, client = client_for(uri)
    runs = select(client, parent_ids, None)
    logged = {k for r in runs for k in r.data.metrics}
    metric = next((m for m in ("val_accuracy", "val_mse") if m in logged), None)
    if metric is None:
        raise CompareError(
            f"--best-of {' '.join(parent_ids)}: no finished run scored a validation split "
            f"(val_accuracy or val_mse) to choose by"
        )
    _, choices = chosen_rows(runs, None, metric)
    seeds: dict[str, set[str]] = {}
    for r in runs:
        if (v := r.data.tags.get("variant")) is not None:
            seeds.setdefault(v, set()).add(r.data.tags.get("seed", r.data.params.get("seed", "?")))
    names = [c.variant for c in choices.values()]
    untagged = [n for n in names if n not in seeds]
    if untagged:
        raise CompareError(
            f"--best-of {' '.join(parent_ids)}: {', '.join(untagged)} is no sweep variant; give the parent of a sweep"
        )
    return {n: seeds[n] for n in names}


def cells(found: list[Row], over: str = "seeds") -> tuple[list[str], list[tuple[str, str]], dict]:
    """(methods, columns: (dataset, metric), {(method, dataset, metric): Cell}). ``over``
    seeds: the mean and sample std over seeds (0 for one); clients: the mean over seeds of each
    run's mean and of its std over clients (None where the run logged none, e.g. ``best_*``),
    and of its bottom decile (no std)."""
    if over not in OVER:
        raise CompareError(f"--over {over!r}: choose {' or '.join(OVER)}")
    methods = list(dict.fromkeys(r.method for r in found))
    columns = list(dict.fromkeys((r.dataset, r.metric) for r in found))
    sd = lambda a: float(np.std(a, ddof=1)) if len(a) > 1 else 0.0  # noqa: E731
    table = {}
    for m in methods:
        for d, metric in columns:
            group = [r for r in found if r.method == m and r.dataset == d and r.metric == metric]
            if not group:
                continue
            v = np.array([r.value for r in group])
            b = [r.bottom for r in group if r.bottom is not None]
            if over == "seeds":
                std = sd(v)
            else:
                c = [r.client_std for r in group if r.client_std is not None]
                std = float(np.mean(c)) if len(c) == len(group) else None
            t = [r.seconds for r in group if r.seconds is not None]
            table[m, d, metric] = Cell(
                metric,
                float(v.mean()),
                std,
                float(np.mean(b)) if b else None,
                sd(np.array(b)) if b and over == "seeds" else None,
                len(group),
                [r.seed for r in group],
                [r.run_id for r in group],
                seconds=float(np.mean(t)) if t else None,
            )
    return methods, columns, table


def ranked(found: tuple, metric: str) -> tuple:
    """``found`` (methods, columns, cells) with the methods ordered best first by their mean of
    ``metric`` over the datasets (lowest first where lower is better: losses, times such as
    ``target_virtual_hours``); a method without the metric (a target never reached) last."""
    methods, columns, table = found
    if not any(m == metric for _, m in columns):
        have = ", ".join(dict.fromkeys(m for _, m in columns))
        raise CompareError(f"--rank {metric}: not among the table's metrics ({have}); add it to --metrics")
    sign = 1.0 if _lower(metric) else -1.0

    def key(method):
        vals = [c.mean for (m, _, k), c in table.items() if m == method and k == metric and c.mean is not None]
        return (0, sign * float(np.mean(vals))) if vals else (1, 0.0)

    return sorted(methods, key=key), columns, table


def table(
    client,
    run_ids: list[str],
    experiment: str | None = None,
    metrics: list[str] | None = None,
    over: str = "seeds",
    select_by: str | None = None,
    rank: str | None = None,
) -> tuple[str, tuple]:
    """(the Markdown table, (methods, columns, cells)) of the chosen runs; with ``select_by``
    (a validation metric) one variant per method and dataset (``pick_variants``), each cell
    naming it (``Cell.variant``, ``selected_by``, ``selection_mean``); with ``rank`` the
    methods best first by that metric (``ranked``)."""
    runs = select(client, run_ids, experiment)
    if select_by is None:
        found = cells(rows(runs, metrics), over)
        if rank is not None:
            found = ranked(found, rank)
        return markdown(*found, over), found
    chosen, choices = chosen_rows(runs, metrics, select_by)
    found = cells(chosen, over)
    if rank is not None:
        found = ranked(found, rank)
    for (m, d, _), c in found[2].items():
        choice = choices[m, d]
        c.variant, c.selected_by, c.selection_mean = choice.variant, select_by, choice.mean
    for c in choices.values():
        c.selected_by = select_by
    return markdown(*found, over, choices), found


def sweep_progress(client, run_id: str) -> str | None:
    """For a sweep's parent some of whose runs have not finished: one line saying how many did
    (the table holds only those) and how to continue it; None otherwise."""
    run = client.get_run(run_id)
    if run.data.tags.get("raysim.parent") != "1":
        return None
    total = int(run.data.params.get("runs", 0) or 0)
    kids = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", max_results=50000)
    status = [k.info.status for k in kids]
    done = status.count("FINISHED")
    if done >= total:
        return None
    running = status.count("RUNNING")
    stopped = len(status) - done - running
    return (
        f"Sweep {run_id} ({run.data.tags.get('scenario', '?')}): {done} of {total} runs finished, "
        f"{running} running, {stopped} failed or stopped, {max(0, total - len(status))} not started; the "
        f"table holds the finished ones (`raysim run {run.data.tags.get('scenario', 'FILE')} --resume {run_id}`, "
        "with the sweep's other options, continues it)."
    )


def compare(
    run_ids: list[str],
    experiment: str | None = None,
    uri: str | None = None,
    out: str | Path = "report",
    metrics: list[str] | None = None,
    over: str = "seeds",
    select_by: str | None = None,
    rank: str | None = None,
) -> tuple[str, Path, Path]:
    """The table as Markdown, and the paths of ``compare.md`` and ``compare.csv`` in ``out``;
    ``select_by``: one variant per method and dataset, chosen by this validation metric;
    ``rank``: the methods ordered best first by this metric (e.g. ``target_virtual_hours``)."""
    from raysim.results.report import client_for

    if not run_ids and experiment is None:
        raise CompareError("give run ids (a sweep's parent stands for its runs) or --experiment NAME")
    if over not in OVER:
        raise CompareError(f"--over {over!r}: choose {' or '.join(OVER)}")
    _, client = client_for(uri)
    text, found = table(client, run_ids, experiment, metrics, over, select_by, rank)
    unfinished = [line for rid in run_ids if (line := sweep_progress(client, rid))]
    if unfinished:
        text += "\n\n" + "\n".join(unfinished)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, cv = out / "compare.md", out / "compare.csv"
    md.write_text(text + "\n")
    write_csv(cv, *found, over)
    return text, md, cv
