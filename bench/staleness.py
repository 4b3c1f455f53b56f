"""Does a client's final score depend on how long ago it last trained?

With a sample of the clients each round, a method that keeps part of each client's model at the
client (FedBN's normalization layers, a personal head) scores every client with the newest
global part and the local part from the client's last round. This reads, for each finished run
of an experiment (those whose variant matches ``--variant``, a shell pattern), each training
client's final score (``client_<metric>`` in the run's ``summary.json``), replays the run's
round samples from its resolved scenario and seed (``raysim.engine.driver.sample_clients``: the
sample of round r is drawn from (seed, "sample", r), so no training is needed), and prints
Spearman's ρ between the rounds since a client last trained and its score, and the mean score
of the clients trained in the last 5 rounds and of those idle for 20 rounds or more.

    python bench/staleness.py --tracking-uri sqlite:///pfl.db --experiment pfl-benchmark --variant 'fedbn-*'

Runs with a ``systems`` section (availability, dropouts, deadlines) sample from the clients
online, which this replay does not model: they are skipped.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from raysim.engine.driver import sample_clients, split_unseen  # noqa: E402
from raysim.results import report
from raysim.scenario import config  # noqa: E402


def rounds_idle(scenario: dict) -> dict[int, int]:
    """Each training client's rounds since it last trained (``rounds`` if it never did)."""
    sc = config.validate(dict(scenario), "<the run's resolved scenario>", check_data=False)
    train, _ = split_unseen(sc)
    last = {int(c): 0 for c in train}
    for r in range(1, sc.rounds + 1):
        for c in sample_clients(sc, train, r):
            last[int(c)] = r
    return {c: sc.rounds - r for c, r in last.items()}


def staleness(summary: dict, idle: dict[int, int], metric: str) -> dict[str, float]:
    """ρ(idle rounds, score), p, and the mean score of the recent (< 5) and idle (>= 20) clients."""
    scores = summary["final"][f"client_{metric}"]
    clients = sorted(int(c) for c in scores)
    x = np.array([idle[c] for c in clients], dtype=float)
    y = np.array([scores[str(c)] if str(c) in scores else scores[c] for c in clients], dtype=float)
    rho = spearmanr(x, y)
    mean = lambda mask: float(y[mask].mean()) if mask.any() else float("nan")  # noqa: E731
    return {
        "rho": float(rho.statistic),
        "p": float(rho.pvalue),
        "recent": mean(x < 5),
        "n_recent": int((x < 5).sum()),
        "idle": mean(x >= 20),
        "n_idle": int((x >= 20).sum()),
        "score": float(summary["final"][metric]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--variant", default="*", help="a shell pattern of the variants to read")
    ap.add_argument("--metric", default="accuracy")
    a = ap.parse_args(argv)
    _, client = report.client_for(a.tracking_uri)
    exp = client.get_experiment_by_name(a.experiment)
    if exp is None:
        raise SystemExit(f"staleness: no experiment {a.experiment!r}")
    runs = client.search_runs(
        [exp.experiment_id],
        "attributes.status = 'FINISHED'",
        max_results=50000,
        order_by=["tags.variant ASC", "tags.seed ASC"],
    )
    print(
        f"| variant | seed | {a.metric} | ρ(rounds idle, score) | p | trained in the last 5 rounds | idle 20+ rounds |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        variant = r.data.tags.get("variant")
        if variant is None or not fnmatch.fnmatchcase(variant, a.variant):
            continue
        summary, scenario = report.load(client, r.info.run_id)
        if scenario is None or scenario.get("systems") or f"client_{a.metric}" not in summary["final"]:
            continue
        s = staleness(summary, rounds_idle(scenario), a.metric)
        print(
            f"| {variant} | {r.data.tags.get('seed')} | {100 * s['score']:.1f} | {s['rho']:.2f} | {s['p']:.1g} "
            f"| {100 * s['recent']:.1f} (n={s['n_recent']}) | {100 * s['idle']:.1f} (n={s['n_idle']}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
