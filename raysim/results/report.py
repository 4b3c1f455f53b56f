"""``raysim report RUN_ID...``: a run's results as the figures of a paper, written to a folder
and logged to the run in MLflow (``report/``).

Everything is read back from MLflow: the run's ``summary.json`` artifact (per-round history,
the final evaluation with each client's score, a clustered method's report) and its resolved
scenario (to redraw a gossip run's graph, which is a function of the scenario and seed).

Figures, where the run has what they show:

- ``accuracy.png``: the mean (weighted by test size) and bottom decile of the task's metric
  per evaluated round, and the global model's where there is one;
- ``clients.png``: the distribution of the final per-client metric (histogram and violin;
  unseen clients apart);
- ``mixture_weights.png``: FedEM's mixture weights π, clients x components;
- ``clusters.png``: a clustered method's assignments (clients per cluster, from each client's
  largest weight) and its center/source table;
- ``graph.png`` and ``consensus.png``: a gossip run's communication graph and the consensus
  distance per round;
- ``lambda_curve.png``: SuPerFed's accuracy against the mixing weight λ;
- ``simplex.png``: SosicFL's simplex: client α's, the cluster centres and their subregions.

With several runs, ``compare_accuracy.png`` draws their curves together: one per configuration
(name, method, sweep variant and every other key that changes results), the mean over its
seeds with a ±std band; ``compare_accuracy.csv`` holds the numbers drawn.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysim.errors import BadInput

_ROWS = 200  # clients drawn at most in a heat map
_NODES = 300  # graph nodes drawn at most


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def metric_of(summary: dict) -> str:
    """The task's primary metric: accuracy, or mse for regression."""
    hist = summary.get("history", [])
    return "mse" if any("mse" in h for h in hist) and not any("accuracy" in h for h in hist) else "accuracy"


def _evaluated(summary: dict, key: str) -> tuple[list[int], list[float]]:
    rows = [h for h in summary.get("history", []) if key in h and isinstance(h[key], (int, float))]
    return [int(h["round"]) for h in rows], [float(h[key]) for h in rows]


def accuracy_figure(summary: dict, out: Path) -> Path | None:
    m = metric_of(summary)
    xs, ys = _evaluated(summary, m)
    if not xs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o", label=f"{m} (mean over clients)")
    for key, style in ((f"bottom_decile_{m}", "--"), (f"global_{m}", ":"), (f"unseen_{m}", "-.")):
        bx, by = _evaluated(summary, key)
        if bx:
            ax.plot(bx, by, style, marker=".", label=key.replace("_", " "))
    ax.set(
        xlabel="round",
        ylabel=m,
        title=f"{summary.get('name', '')}: {summary.get('algorithm', '')} on {summary.get('dataset', '')}",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out / "accuracy.png")


def clients_figure(summary: dict, out: Path) -> Path | None:
    m = metric_of(summary)
    final = summary.get("final", {})
    groups = [
        (name, np.array(list(final[key].values()), dtype=float))
        for name, key in (("clients", f"client_{m}"), ("unseen clients", f"unseen_client_{m}"))
        if final.get(key)
    ]
    if not groups:
        return None
    plt = _plt()
    fig, (h, v) = plt.subplots(1, 2, figsize=(10, 4))
    for name, vals in groups:
        h.hist(vals, bins=min(30, max(5, len(vals) // 3)), alpha=0.6, label=f"{name} ({len(vals)})")
        h.axvline(np.percentile(vals, 90 if m == "mse" else 10), ls="--", color="k", lw=0.8)
    h.set(xlabel=f"final {m} per client", ylabel="clients", title="distribution (dashed: bottom decile)")
    h.legend()
    v.violinplot([vals for _, vals in groups], showmeans=True)
    v.set_xticks(range(1, len(groups) + 1), [name for name, _ in groups])
    v.set(ylabel=m, title=f"{summary.get('name', '')}: per-client {m}")
    return _save(fig, out / "clients.png")


def fleet_figure(summary: dict, out: Path) -> Path | None:
    """A simulated fleet's run (``systems``): the metric against virtual hours, and each
    evaluated client's final metric against its device's seconds for a round, coloured by the
    rounds it took part in (who is left behind)."""
    m = metric_of(summary)
    rows = [h for h in summary.get("history", []) if "virtual_time_s" in h and isinstance(h.get(m), (int, float))]
    if not rows:
        return None
    final = summary.get("final", {})
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot([h["virtual_time_s"] / 3600 for h in rows], [h[m] for h in rows], marker="o", label=f"{m} (mean)")
    for key, style in ((f"slowest_decile_{m}", "--"), (f"fastest_decile_{m}", ":")):
        pts = [(h["virtual_time_s"] / 3600, h[key]) for h in rows if key in h]
        if pts:
            a.plot(*zip(*pts), style, marker=".", label=key.replace("_", " "))
    a.set(xlabel="virtual time (hours)", ylabel=m, title=f"{summary.get('name', '')}: {m} against the clock")
    a.grid(alpha=0.3)
    a.legend()
    scores, secs, part = final.get(f"client_{m}", {}), final.get("device_seconds", {}), final.get("participation", {})
    ids = [c for c in scores if c in secs]
    if ids:
        sc = b.scatter(
            [secs[c] for c in ids], [scores[c] for c in ids], c=[part.get(c, 0) for c in ids], cmap="viridis", s=14
        )
        fig.colorbar(sc, ax=b, label="rounds taken part in")
        b.set_xscale("log")
        b.set(xlabel="device seconds for a round (log)", ylabel=f"final {m}", title="per client")
        b.grid(alpha=0.3)
    else:
        b.axis("off")
    return _save(fig, out / "fleet.png")


def _weights(final: dict) -> tuple[list[str], np.ndarray] | None:
    imp = final.get("importance")
    if not imp:
        return None
    cids = sorted(imp, key=int)
    return cids, np.array([imp[c] for c in cids], dtype=float)


def mixture_figure(summary: dict, out: Path) -> Path | None:
    """FedEM's π per client (rows sorted by their dominant component)."""
    if summary.get("algorithm") != "fedem":
        return None
    got = _weights(summary.get("final", {}))
    if got is None:
        return None
    cids, w = got
    order = np.lexsort((-w.max(1), w.argmax(1)))[:_ROWS]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 6))
    im = ax.imshow(w[order], aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=1)
    ax.set(
        xlabel="component m", ylabel=f"client (sorted; {len(order)} of {len(cids)})", title="FedEM mixture weights π"
    )
    ax.set_xticks(range(w.shape[1]))
    fig.colorbar(im, ax=ax, label="π_m")
    return _save(fig, out / "mixture_weights.png")


def clusters_figure(summary: dict, out: Path) -> Path | None:
    """Clients per cluster (largest weight) and, where the data have sources, the center x
    source table with each source's best center."""
    final = summary.get("final", {})
    got = _weights(final)
    table = final.get("center_source")
    if summary.get("algorithm") == "fedem" and table is None:
        return None
    if got is None and table is None:
        return None
    plt = _plt()
    panels = (got is not None) + (table is not None)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    i = 0
    if got is not None:
        cids, w = got
        counts = np.bincount(w.argmax(1), minlength=w.shape[1])
        axes[0][i].bar(range(len(counts)), counts, color="#4c72b0")
        axes[0][i].set(
            xlabel="cluster (a client's largest weight)",
            ylabel="clients",
            title=f"cluster assignments ({len(cids)} clients)",
        )
        axes[0][i].set_xticks(range(len(counts)))
        i += 1
    if table is not None:
        t = np.array(table, dtype=float)
        ax = axes[0][i]
        im = ax.imshow(t, aspect="auto", cmap="viridis")
        for (c, s), val in np.ndenumerate(t):
            ax.text(s, c, f"{val:.3g}", ha="center", va="center", color="w", fontsize=8)
        for s, c in enumerate(final.get("association", [])):
            ax.add_patch(_plt().Rectangle((s - 0.5, c - 0.5), 1, 1, fill=False, ec="red", lw=2))
        ax.set(xlabel="source", ylabel="center", title=f"center x source {metric_of(summary)} (red: best)")
        ax.set_xticks(range(t.shape[1]))
        ax.set_yticks(range(t.shape[0]))
        fig.colorbar(im, ax=ax)
    return _save(fig, out / "clusters.png")


def graph_figures(summary: dict, scenario: dict | None, out: Path) -> list[Path]:
    """A gossip run's communication graph (rebuilt from its scenario and seed, as the run
    built it) and its consensus distance per round."""
    paths = []
    xs, ys = _evaluated(summary, "consensus_distance")
    if xs:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, ys, marker=".")
        if all(y > 0 for y in ys):
            ax.set_yscale("log")
        ax.set(xlabel="round", ylabel="mean ‖θ_k − θ̄‖²", title="consensus distance")
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out / "consensus.png"))
    if scenario and scenario.get("topology"):
        from raysim.federation import topology
        from raysim.scenario import config

        sc = config.validate(dict(scenario), "resolved.json", check_data=False)
        g = topology.scenario_graph(sc.topology, sc.data.clients, sc.seed, 0)
        import networkx as nx

        shown = g if g.number_of_nodes() <= _NODES else g.subgraph(range(_NODES))
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 6))
        pos = nx.spring_layout(shown, seed=0) if sc.topology.kind not in ("ring",) else nx.circular_layout(shown)
        nx.draw_networkx(shown, pos, ax=ax, node_size=30, with_labels=False, width=0.4, node_color="#4c72b0")
        gaps = [h["spectral_gap"] for h in summary.get("history", []) if isinstance(h.get("spectral_gap"), float)]
        gap = gaps[-1] if gaps else None
        note = f", spectral gap {gap:.3g}" if isinstance(gap, float) else ""
        part = "" if shown is g else f" (first {_NODES} of {g.number_of_nodes()} clients)"
        ax.set_title(f"{sc.topology.kind}: {g.number_of_nodes()} clients, {g.number_of_edges()} edges{note}{part}")
        ax.axis("off")
        paths.append(_save(fig, out / "graph.png"))
    return paths


def lambda_figure(summary: dict, out: Path) -> Path | None:
    final = summary.get("final", {})
    curve = final.get("lambda_curve")
    if not curve:
        return None
    from raysim.results.tracking import write_curve

    with tempfile.TemporaryDirectory() as tmp:
        _, png = write_curve(tmp, "lambda_curve", curve, final.get("lambda_curve_std"), summary.get("name", ""))
        target = out / "lambda_curve.png"
        target.write_bytes(Path(png).read_bytes())
    return target


def _polygon(d: int) -> np.ndarray:
    """The vertices of the simplex drawn as a regular d-gon (a triangle for 3 endpoints)."""
    a = np.pi / 2 + 2 * np.pi * np.arange(d) / d
    return np.stack([np.cos(a), np.sin(a)], 1)


def simplex_figure(summary: dict, out: Path) -> Path | None:
    """SosicFL: each client's α (coloured by its cluster), the centres (stars) and their
    subregions (circles of radius η), the simplex projected on a regular polygon (exact for
    three endpoints)."""
    s = summary.get("final", {}).get("simplex")
    if not s or not s.get("alpha"):
        return None
    cids = sorted(s["alpha"], key=int)
    alpha = np.array([s["alpha"][c] for c in cids], dtype=float)
    cluster = np.array([s["cluster"].get(c, 0) for c in cids])
    centres = np.array(s.get("centres") or [], dtype=float)
    V = _polygon(alpha.shape[1])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.fill(*np.vstack([V, V[:1]]).T, fc="#f0f0f0", ec="k", lw=1)
    for k, v in enumerate(V):
        ax.annotate(f"e{k}", v * 1.08, ha="center", va="center")
    pts = alpha @ V
    colours = plt.get_cmap("tab10")
    ax.scatter(
        pts[:, 0], pts[:, 1], c=[colours(int(g) % 10) for g in cluster], s=18, label="client α (colour: cluster)"
    )
    if len(centres):
        cp = centres @ V
        ax.scatter(
            cp[:, 0],
            cp[:, 1],
            marker="*",
            s=250,
            c=[colours(k % 10) for k in range(len(cp))],
            ec="k",
            label="cluster centres",
        )
        eta = float(s.get("eta") or 0)
        scale = float(np.linalg.norm(V[0] - V[1]) / math.sqrt(2))  # |e_i - e_j| = √2 on the simplex
        for c in cp:
            ax.add_patch(plt.Circle(c, eta * scale, fill=False, ls="--", ec="k"))
    ax.set_xlim(-1.25, 1.25)
    ax.set_ylim(-1.25, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"SosicFL simplex: {len(cids)} clients, {len(centres)} subregions (dashed: radius η)")
    return _save(fig, out / "simplex.png")


def figures(summary: dict, scenario: dict | None, out: Path) -> list[Path]:
    """Every figure this run has data for, written into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    made = [
        accuracy_figure(summary, out),
        clients_figure(summary, out),
        mixture_figure(summary, out),
        clusters_figure(summary, out),
        *graph_figures(summary, scenario, out),
        lambda_figure(summary, out),
        simplex_figure(summary, out),
        fleet_figure(summary, out),
    ]
    return [p for p in made if p is not None]


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


# ---------------------------------------------------------------------------------------------
# MLflow


def client_for(uri: str | None):
    """(URI, MlflowClient) on ``uri``, else MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    (``raysim.results.tracking.resolve_uri``: the rule runs use)."""
    from mlflow.tracking import MlflowClient

    from raysim.results.tracking import resolve_uri

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
    ``report/``); with several runs also ``out/compare_accuracy.png`` and ``.csv``. A parent run (a sweep,
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
    return made
