"""One run's figures, drawn with matplotlib from its summary (and, for a gossip run's graph,
its resolved scenario), each written into a folder where the run has what it shows:

- ``accuracy.png``: the mean (weighted by test size) and bottom decile of the task's metric
  per evaluated round, and the global model's where there is one;
- ``clients.png``: the distribution of the final per-client metric (histogram and violin;
  unseen clients apart);
- ``fleet.png``: a simulated fleet's metric against virtual hours, and each client's final
  metric against its device's seconds for a round;
- ``mixture_weights.png``: FedEM's mixture weights π, clients x components;
- ``clusters.png``: a clustered method's assignments (clients per cluster, from each client's
  largest weight) and its center/source table;
- ``graph.png`` and ``consensus.png``: a gossip run's communication graph and the consensus
  distance per round;
- ``lambda_curve.png``: SuPerFed's accuracy against the mixing weight λ (``write_curve``, which
  also draws the curves a run logs to MLflow under ``curves/``);
- ``simplex.png``: SosicFL's simplex: client α's, the cluster centres and their subregions.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from pathlib import Path

import numpy as np

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


def write_curve(folder: str, key: str, curve: dict, std: dict | None, title: str) -> list[str]:
    """``<key>.csv`` (x, mean[, std]) and ``<key>.png`` (the mean with a ±std band) in
    ``folder``; returns their paths."""
    xs = list(curve)
    ys = [float(curve[x]) for x in xs]
    sd = [float(std[x]) for x in xs] if std else None
    name = key[: -len("_curve")]
    csv_path = os.path.join(folder, f"{key}.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([name, "mean", *(["std"] if sd else [])])
        w.writerows([[x, y, *([s] if sd else [])] for x, y, s in zip(xs, ys, sd or ys)])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    try:
        pos = [float(x) for x in xs]
    except ValueError:
        pos = list(range(len(xs)))
    ax.plot(pos, ys, marker="o")
    if sd:
        ax.fill_between(pos, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.25)
    ax.set_xlabel(name)
    ax.set_ylabel("mean over clients (± std)" if sd else "mean over clients")
    ax.set_title(title or key)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png_path = os.path.join(folder, f"{key}.png")
    fig.savefig(png_path)
    plt.close(fig)
    return [csv_path, png_path]
