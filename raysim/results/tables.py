"""The ``raysim compare`` table written out: its cells as Markdown (accuracies in %, a mean ± std
and the bottom decile per cell, and with ``--select`` how each cell's variant was chosen) and
as CSV (every cell's numbers, seeds and run ids).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path


def percent(metric: str) -> bool:
    """Shown in %: accuracies (top-1, top-5, global, best, worst, ...), not the entropy of their
    distribution over clients (``entropy_accuracy``, in nats)."""
    parts = metric.split("_")
    return "accuracy" in parts and "entropy" not in parts


def _fmt(metric: str, mean: float | None, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if percent(metric):
        return f"{100 * mean:.1f}" + ("" if std is None else f" ± {100 * std:.1f}")
    return f"{mean:.4g}" + ("" if std is None else f" ± {std:.2g}")


def markdown(methods, columns, table, over: str = "seeds", choices: dict | None = None) -> str:
    one = len({metric for _, metric in columns}) == 1
    head = (
        "| method | "
        + " | ".join(f"{d}{'' if one else ' ' + metric} (avg / bottom decile)" for d, metric in columns)
        + " |"
    )
    lines = [head, "|" + "---|" * (len(columns) + 1)]
    for m in methods:
        row = []
        for d, metric in columns:
            c = table.get((m, d, metric))
            row.append(
                "-"
                if c is None
                else f"{_fmt(c.metric, c.mean, c.std)} / "
                f"{_fmt(c.metric, c.bottom_mean, c.bottom_std)} (n={c.n}"
                + ("" if c.variant is None else f"; {c.variant}")
                + ("" if c.variant is None or c.seconds is None else f"; {_seconds(c.seconds)}/run")
                + ")"
            )
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    metric = {c.metric for c in table.values()}
    shown = sorted(x for x in metric if percent(x))
    unit = (("accuracy" if shown == ["accuracy"] else ", ".join(shown)) + " in %") if shown else ""
    unit = "; ".join(u for u in (unit, ", ".join(sorted(metric - set(shown)))) if u)
    lines.append("")
    what = (
        "Mean ± std over seeds (n runs per cell)"
        if over == "seeds"
        else "Mean ± std over clients (weighted by test size) and bottom decile, each averaged over the n runs "
        "(seeds) of a cell"
    )
    lines.append(f"{what}; {unit}; bottom decile: the 10th percentile of the clients' scores (90th for an error).")
    if choices:
        lines += _selection(choices)
    return "\n".join(lines)


def _seconds(s: float) -> str:
    """Wall time as a cell shows it: 4.2 s, 95 s, 12.5 min, 3.1 h."""
    return (
        f"{s:.2g} s"
        if s < 10
        else f"{s:.0f} s"
        if s < 600
        else f"{s / 60:.1f} min"
        if s < 7200
        else f"{s / 3600:.1f} h"
    )


def _selection(choices: dict) -> list[str]:
    """The Markdown under a table with ``select``: how each cell's variant was chosen."""
    metric = next(iter(choices.values())).selected_by
    lines = [
        "",
        f"Each cell is the variant (named in it) whose mean {metric} over its seeds is the "
        f"{'lowest' if _lower(metric) else 'highest'} among the method's variants on that dataset; "
        f"the table shows its test metrics, and the mean wall time of its runs (MLflow's end minus "
        f"start: start-up, data, training and evaluation).",
        "",
        f"| method | dataset | variant | {metric} (mean over seeds) | n |",
        "|---|---|---|---|---|",
    ]
    for (algorithm, dataset), c in choices.items():
        for variant, mean, n in c.candidates:
            mark = f"**{variant}** (chosen)" if variant == c.variant else variant
            lines.append(f"| {algorithm} | {dataset} | {mark} | {_fmt(metric, mean, None)} | {n} |")
    return lines


def _lower(metric: str) -> bool:
    from raysim.core.tasks import lower_is_better

    return lower_is_better(metric)


def write_csv(path: Path, methods, columns, table, over: str = "seeds") -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "method",
                "dataset",
                "metric",
                "mean",
                "std",
                "bottom_decile_mean",
                "bottom_decile_std",
                "n",
                "seeds",
                "run_ids",
                "std_over",
                "variant",
                "selected_by",
                "selection_mean",
                "seconds_per_run",
            ]
        )
        for m in methods:
            for d, metric in columns:
                c = table.get((m, d, metric))
                if c is not None:
                    w.writerow(
                        [
                            m,
                            d,
                            c.metric,
                            c.mean,
                            "" if c.std is None else c.std,
                            c.bottom_mean,
                            c.bottom_std,
                            c.n,
                            " ".join(c.seeds),
                            " ".join(c.run_ids),
                            over,
                            c.variant or "",
                            c.selected_by or "",
                            "" if c.selection_mean is None else c.selection_mean,
                            "" if c.seconds is None else c.seconds,
                        ]
                    )
