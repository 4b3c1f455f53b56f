"""``raysim compare``: finished runs as one table like a paper's Table 2, method x dataset, the
final metric and its bottom decile as mean ± std over seeds; printed, and written as Markdown
and CSV.

Runs are chosen by id (a sweep's or seeded run's parent stands for its children), or as every
finished run of an MLflow experiment. A row is a method: the algorithm, with the sweep variant
when the run is one; a column a dataset. Runs of the same row and column are the seeds of one
cell (a run repeated with the same seed counts once more; the CSV lists every run id). Values
are the last evaluation's, read from the runs' metrics; accuracies are shown in %.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Row:
    run_id: str
    method: str
    dataset: str
    seed: str
    metric: str
    value: float
    bottom: float | None


class CompareError(Exception):
    """Nothing to compare, or an unknown run or experiment; one line."""


def select(client, run_ids: list[str], experiment: str | None) -> list:
    """The runs to compare: the given ones (a parent expanded to its finished children) and
    every finished run of ``experiment`` that is not a parent."""
    from raysim.report import expand, ReportError
    try:
        runs = [r for r in expand(client, run_ids) if r.info.status == "FINISHED" or r.info.run_id in run_ids]
    except ReportError as e:
        raise CompareError(str(e)) from None
    if experiment is not None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            names = ", ".join(e.name for e in client.search_experiments())
            raise CompareError(f"no experiment {experiment!r} in {client.tracking_uri} (it has: {names or 'none'})")
        runs += [r for r in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'",
                                               max_results=50000, order_by=["attributes.start_time ASC"])
                 if r.data.tags.get("raysim.parent") != "1"]
    seen, out = set(), []
    for r in runs:
        if r.info.run_id not in seen:
            seen.add(r.info.run_id)
            out.append(r)
    return out


def rows(runs) -> list[Row]:
    out = []
    for r in runs:
        m = r.data.metrics
        metric = "accuracy" if "accuracy" in m else "mse" if "mse" in m else None
        if metric is None:
            continue                      # never evaluated
        tags = r.data.tags
        algorithm, variant = tags.get("algorithm", "?"), tags.get("variant")
        method = algorithm + (f" [{variant}]" if variant and variant != algorithm else "")
        out.append(Row(r.info.run_id, method, tags.get("dataset", "?"), tags.get("seed", r.data.params.get("seed", "?")),
                       metric, float(m[metric]), float(m[f"bottom_decile_{metric}"])
                       if f"bottom_decile_{metric}" in m else None))
    if not out:
        raise CompareError("none of the chosen runs has an evaluation to compare")
    return out


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


def cells(found: list[Row]) -> tuple[list[str], list[str], dict[tuple[str, str], Cell]]:
    """(methods, datasets, {(method, dataset): Cell}); std is the sample std over seeds (0 for one)."""
    methods = list(dict.fromkeys(r.method for r in found))
    datasets = list(dict.fromkeys(r.dataset for r in found))
    table = {}
    for m in methods:
        for d in datasets:
            group = [r for r in found if r.method == m and r.dataset == d]
            if not group:
                continue
            v = np.array([r.value for r in group])
            b = [r.bottom for r in group if r.bottom is not None]
            sd = lambda a: float(np.std(a, ddof=1)) if len(a) > 1 else 0.0     # noqa: E731
            table[m, d] = Cell(group[0].metric, float(v.mean()), sd(v), float(np.mean(b)) if b else None,
                               sd(np.array(b)) if b else None, len(group), [r.seed for r in group],
                               [r.run_id for r in group])
    return methods, datasets, table


def _fmt(metric: str, mean: float | None, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if metric == "accuracy":
        return f"{100 * mean:.1f} ± {100 * std:.1f}"
    return f"{mean:.4g} ± {std:.2g}"


def markdown(methods, datasets, table) -> str:
    head = "| method | " + " | ".join(f"{d} (avg / bottom decile)" for d in datasets) + " |"
    lines = [head, "|" + "---|" * (len(datasets) + 1)]
    for m in methods:
        row = []
        for d in datasets:
            c = table.get((m, d))
            row.append("-" if c is None else f"{_fmt(c.metric, c.mean, c.std)} / "
                       f"{_fmt(c.metric, c.bottom_mean, c.bottom_std)} (n={c.n})")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    metric = {c.metric for c in table.values()}
    unit = "accuracy in %" if metric == {"accuracy"} else ", ".join(sorted(metric))
    lines.append("")
    lines.append(f"Mean ± std over seeds (n runs per cell); {unit}; bottom decile: the 10th percentile of "
                 "the clients' scores (90th for an error).")
    return "\n".join(lines)


def write_csv(path: Path, methods, datasets, table) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "dataset", "metric", "mean", "std", "bottom_decile_mean", "bottom_decile_std",
                    "n", "seeds", "run_ids"])
        for m in methods:
            for d in datasets:
                c = table.get((m, d))
                if c is not None:
                    w.writerow([m, d, c.metric, c.mean, c.std, c.bottom_mean, c.bottom_std, c.n,
                                " ".join(c.seeds), " ".join(c.run_ids)])


def table(client, run_ids: list[str], experiment: str | None = None) -> tuple[str, tuple]:
    """(the Markdown table, (methods, datasets, cells)) of the chosen runs."""
    found = cells(rows(select(client, run_ids, experiment)))
    return markdown(*found), found


def compare(run_ids: list[str], experiment: str | None = None, uri: str | None = None,
            out: str | Path = "report") -> tuple[str, Path, Path]:
    """The table as Markdown, and the paths of ``compare.md`` and ``compare.csv`` in ``out``."""
    from raysim.report import client_for
    if not run_ids and experiment is None:
        raise CompareError("give run ids (a sweep's parent stands for its runs) or --experiment NAME")
    _, client = client_for(uri)
    text, found = table(client, run_ids, experiment)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, cv = out / "compare.md", out / "compare.csv"
    md.write_text(text + "\n")
    write_csv(cv, *found)
    return text, md, cv
