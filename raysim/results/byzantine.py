"""The Byzantine grid's figure (Blades' headline figure): the honest clients' final accuracy
against the malicious share, one panel per attack, one line per method and defence, the mean over
seeds; for a backdoor, its attack success rate dashed in the same colour. ``byzantine.csv``
beside it holds every point drawn, and ``byzantine.md`` the same numbers as tables, one per
malicious share: a row per method and defence, its clean accuracy (no malicious client, the
mean over the runs at 0 %), then a column per attack (``acc (ASR a)`` for a backdoor).
``raysim report`` writes all three for runs with an ``adversary``.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.results.curves import Compared


@dataclass(frozen=True)
class Point:
    attack: str
    line: str  # "method / defence"
    share: float  # the malicious share of the training clients, in %
    honest: float  # the honest clients' final accuracy
    asr: float | None  # a backdoor's attack success rate


def points(runs: list[Compared]) -> list[Point]:
    """One point per run whose scenario has an adversary and whose summary an honest accuracy."""
    out = []
    for run in runs:
        sc = run.scenario or {}
        adv, final = sc.get("adversary"), run.summary.get("final", {})
        if not adv or "honest_accuracy" not in final:
            continue
        clients = (sc.get("data") or {}).get("clients") or 1
        share = adv["fraction"] if adv.get("fraction") is not None else len(adv.get("clients") or ()) / clients
        gossip = sc.get("topology") is not None
        defence = (sc.get("defence") or {}).get("rule", "gossip" if gossip else "mean")
        method = sc["algorithm"]["name"]
        if gossip:  # a decentralized run: D-SGD, D-FedEM, ...
            method = "d-sgd" if method == "fedavg" else f"d-{method}"
        asr = final.get("attack_success_rate")
        out.append(
            Point(
                adv["attack"]["name"],
                f"{method} / {defence}",
                round(100 * float(share), 6),
                float(final["honest_accuracy"]),
                None if asr is None else float(asr),
            )
        )
    return out


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs))


def tables(pts: list[Point]) -> str:
    """``byzantine.md``: per malicious share above 0, a Markdown table of the honest clients'
    accuracy (mean over the runs of a cell), a row per line, a column per attack."""
    attacks = list(dict.fromkeys(p.attack for p in pts))
    lines = list(dict.fromkeys(p.line for p in pts))
    shares = sorted({p.share for p in pts if p.share > 0})
    out = []
    for share in shares:
        head = ["method / defence", "clean", *attacks]
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for line in lines:
            clean = [p.honest for p in pts if p.line == line and p.share == 0]
            cells = [line, f"{_mean(clean):.3f}" if clean else ""]
            for attack in attacks:
                cell = [p for p in pts if p.line == line and p.attack == attack and p.share == share]
                if not cell:
                    cells.append("")
                    continue
                text = f"{_mean([p.honest for p in cell]):.3f}"
                asr = [p.asr for p in cell if p.asr is not None]
                if asr:
                    text += f" (ASR {_mean(asr):.2f})"
                cells.append(text)
            rows.append("| " + " | ".join(cells) + " |")
        out.append(f"Malicious clients: {share:g} %\n\n" + "\n".join(rows))
    return "\n\n".join(out) + "\n"


def byzantine_figure(runs: list[Compared], out: Path) -> Path | None:
    """``byzantine.png`` (and ``byzantine.csv``, ``byzantine.md``) in ``out``; None without a
    Byzantine run."""
    pts = points(runs)
    return draw(pts, out) if pts else None


def draw(pts: list[Point], out: Path, stem: str = "byzantine") -> Path:
    """``<stem>.png``, ``.csv`` and ``.md`` of the points in ``out``."""
    from raysim.results.figures import _plt

    attacks = list(dict.fromkeys(p.attack for p in pts))
    lines = list(dict.fromkeys(p.line for p in pts))
    cells: dict[tuple[str, str, float], list[Point]] = defaultdict(list)
    for p in pts:
        cells[(p.attack, p.line, p.share)].append(p)
    plt = _plt()
    cols = min(4, len(attacks))
    rows = -(-len(attacks) // cols)
    legend_rows = -(-len(lines) // 4)
    below = 0.15 + 0.2 * legend_rows  # inches under the panels for the legend
    height = 3.2 * rows + below
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, height), squeeze=False, sharey=True)
    colors = {line: plt.cm.tab10(i % 10) for i, line in enumerate(lines)}
    table = []
    for ax, attack in zip(axes.flat, attacks):
        for line in lines:
            shares = sorted(s for a, ln, s in cells if a == attack and ln == line)
            if not shares:
                continue
            acc = [float(np.mean([p.honest for p in cells[(attack, line, s)]])) for s in shares]
            ax.plot(shares, acc, "-o", ms=3, color=colors[line], label=line)
            asr = [[p.asr for p in cells[(attack, line, s)] if p.asr is not None] for s in shares]
            if all(asr):
                ax.plot(shares, [float(np.mean(a)) for a in asr], "--", color=colors[line])
            for s, a, r in zip(shares, acc, asr):
                table.append([attack, line, s, a, float(np.mean(r)) if r else "", len(cells[(attack, line, s)])])
        ax.set(title=attack, xlabel="malicious clients (%)")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("honest accuracy (dashed: ASR)")
    for ax in list(axes.flat)[len(attacks) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(lines)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, below / height, 1, 1))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["attack", "method / defence", "malicious_percent", "honest_accuracy", "attack_success_rate", "runs"]
        )
        w.writerows(table)
    (out / f"{stem}.md").write_text(tables(pts))
    fig.savefig(out / f"{stem}.png", dpi=110)
    plt.close(fig)
    return out / f"{stem}.png"
