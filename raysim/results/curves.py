"""Several runs' curves compared (``raysim report`` of more than one run): the runs grouped by
configuration (name, method, sweep variant and every other key that changes results; the seeds
of one configuration together), each group's mean curve over its seeds with a ±std band in
``compare_accuracy.png`` (the numbers drawn in ``compare_accuracy.csv``), and runs on a simulated
fleet against virtual hours in ``compare_time.png``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysim.results.figures import _evaluated, _plt, _save, metric_of


@dataclass
class Compared:
    """One run to compare: its summary, its recorded scenario (``scenario/resolved.json``, or
    None) and its MLflow tags."""

    summary: dict
    scenario: dict | None = None
    tags: dict = field(default_factory=dict)


@dataclass
class Curve:
    """One configuration's curve of ``compare_accuracy.png``: the mean over its runs (its
    seeds) of ``key`` at the rounds every run evaluated, with the std over them (ddof 1; 0 for
    one run)."""

    label: str
    key: str
    rounds: list[int]
    mean: list[float]
    std: list[float]
    runs: list[str]


# a scenario's keys that do not make another configuration: the seed (its runs are averaged)
# and where and how a run executes (they change no result)
_NOT_CONFIG = ("seed", "resources", "tracking", "checkpoint")


def _configuration(run: Compared) -> str:
    """What tells two runs' configurations apart: their recorded scenario but for the seed and
    the keys that change no result; without one, the name, method and sweep variant."""
    if isinstance(run.scenario, dict):
        return json.dumps({k: v for k, v in run.scenario.items() if k not in _NOT_CONFIG}, sort_keys=True, default=str)
    s = run.summary
    return json.dumps([s.get("name"), s.get("algorithm"), run.tags.get("variant")])


def _flat(d, prefix: str = "") -> dict[str, str]:
    if isinstance(d, dict):
        return {k: v for key, value in d.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.dumps(d, default=str)}


def compare_groups(runs: list[Compared]) -> list[tuple[str, list[Compared]]]:
    """The runs grouped by configuration (``_configuration``: seeds of one configuration
    together), in the order first seen, each labelled ``name (method[, variant], n runs)``.
    Groups that would share a label (one file run with different ``--set`` options, say) also
    name the keys whose values tell them apart (``algorithm.lr=0.05``)."""
    groups: dict[str, list[Compared]] = {}
    for run in runs:
        groups.setdefault(_configuration(run), []).append(run)

    def base(members: list[Compared]) -> str:
        s, variant = members[0].summary, members[0].tags.get("variant")
        name = str(s.get("name", "?"))
        parts = [str(s.get("algorithm", "?"))]
        if variant and not name.endswith(f"-{variant}"):
            parts.append(f"variant {variant}")
        return f"{name} ({', '.join(parts)}"

    labels = {key: base(members) for key, members in groups.items()}
    for label in set(labels.values()):
        same = [key for key in groups if labels[key] == label]
        if len(same) < 2:
            continue
        flats = {
            key: _flat({k: v for k, v in (groups[key][0].scenario or {}).items() if k not in _NOT_CONFIG})
            for key in same
        }
        keys = sorted({k for f in flats.values() for k in f})
        differ = [k for k in keys if len({f.get(k) for f in flats.values()}) > 1]
        for key in same:
            shown = ", ".join(f"{k}={flats[key][k] if k in flats[key] else '-'}" for k in differ[:3])
            labels[key] = f"{label}, {shown or 'run ' + groups[key][0].summary.get('mlflow_run_id', '?')[:8]}"
    return [
        (f"{labels[key]}, {len(members)} run{'s' if len(members) > 1 else ''})", members)
        for key, members in groups.items()
    ]


def compare_curves(runs: list[Compared]) -> list[Curve]:
    """Each configuration's mean curve of the task's metric and of its bottom decile."""
    curves = []
    for label, members in compare_groups(runs):
        m = metric_of(members[0].summary)
        for key in (m, f"bottom_decile_{m}"):
            points = [dict(zip(*_evaluated(r.summary, key))) for r in members]
            xs = sorted(set.intersection(*(set(p) for p in points)))
            if not xs:
                continue
            ys = np.array([[p[x] for x in xs] for p in points])
            std = ys.std(0, ddof=1) if len(members) > 1 else np.zeros(len(xs))
            curves.append(
                Curve(
                    label,
                    key,
                    xs,
                    ys.mean(0).tolist(),
                    std.tolist(),
                    [r.summary.get("mlflow_run_id", "") for r in members],
                )
            )
    return curves


def compare_figure(runs: list[Compared], out: Path) -> Path | None:
    """Every configuration's curve (``compare_curves``): the mean over its seeds with a ±std
    band, the bottom decile dashed in the same colour; ``compare_accuracy.csv`` beside it holds
    the numbers drawn (label, metric, round, mean, std, n)."""
    curves = compare_curves(runs)
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5.5))
    colors: dict[str, str] = {}
    for c in curves:
        bottom = c.key.startswith("bottom_decile_")
        (line,) = ax.plot(
            c.rounds,
            c.mean,
            "--" if bottom else "-",
            marker=None if bottom else ".",
            label=None if bottom else c.label,
            color=colors.get(c.label),
        )
        colors.setdefault(c.label, line.get_color())
        if len(c.runs) > 1:
            ax.fill_between(
                c.rounds, np.subtract(c.mean, c.std), np.add(c.mean, c.std), color=colors[c.label], alpha=0.15
            )
    ax.set(xlabel="round", ylabel="metric (dashed: bottom decile; band: ±std over seeds)", title="runs compared")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "compare_accuracy.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "metric", "round", "mean", "std", "n", "run_ids"])
        for c in curves:
            w.writerows(
                [c.label, c.key, r, m, sd, len(c.runs), " ".join(c.runs)] for r, m, sd in zip(c.rounds, c.mean, c.std)
            )
    return _save(fig, out / "compare_accuracy.png")


def time_curves(runs: list[Compared]) -> list[tuple[str, list[float], list[float]]] | None:
    """Runs on a simulated fleet (``systems``: every run has a virtual clock): each
    configuration's (label, virtual hours, metric), the mean over its seeds of both at the
    rounds every seed evaluated; None where some run has no clock."""
    groups = compare_groups(runs)
    if not groups or not all(
        any("virtual_time_s" in h for h in r.summary.get("history", [])) for _, members in groups for r in members
    ):
        return None
    m = metric_of(groups[0][1][0].summary)
    out = []
    for label, members in groups:
        points = [
            {
                int(h["round"]): (h["virtual_time_s"] / 3600, h[m])
                for h in r.summary["history"]
                if "virtual_time_s" in h and isinstance(h.get(m), (int, float))
            }
            for r in members
        ]
        xs = sorted(set.intersection(*(set(p) for p in points)))
        if xs:
            out.append(
                (
                    label,
                    [float(np.mean([p[x][0] for p in points])) for x in xs],
                    [float(np.mean([p[x][1] for p in points])) for x in xs],
                )
            )
    return out


def compare_time_figure(runs: list[Compared], out: Path) -> Path | None:
    """``time_curves`` drawn: synchronous and asynchronous runs, whose rounds differ, on one
    axis of virtual hours (``compare_time.png``); None without a clock."""
    curves = time_curves(runs)
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for label, hours, values in curves:
        ax.plot(hours, values, marker=".", label=label)
    m = metric_of(runs[0].summary)
    ax.set(xlabel="virtual time (hours)", ylabel=f"{m} (mean over seeds)", title="runs compared on the virtual clock")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    return _save(fig, out / "compare_time.png")
