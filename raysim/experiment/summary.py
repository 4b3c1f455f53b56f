"""A finished run's summary: the last evaluation's headline metrics (``FINAL``), every mean
over clients with its std and bottom decile, the best of each over the evaluations (ACC(T)),
the round picked on validation data and its test metrics, the time to ``eval.target``, a
clustered method's report, and the history of every round.
"""

from __future__ import annotations

import math

from raysim.results.compare import bottom_decile
from raysim.scenario.config import Scenario

FINAL = (
    "accuracy",
    "bottom_decile_accuracy",
    "global_accuracy",
    "unseen_accuracy",
    "unseen_bottom_decile_accuracy",
    "test_loss",
    "mse",
    "bottom_decile_mse",
    "train_mse",
    "train_accuracy",
    "unseen_mse",
    "global_mse",
    "local_accuracy",
    "local_mse",
    "accuracy_test_chosen",
    "mse_test_chosen",
    "lambda_chosen",
    "cluster_ari",
    "slowest_decile_accuracy",
    "fastest_decile_accuracy",
    "slowest_decile_mse",
    "fastest_decile_mse",
    "slowest_decile_participation",
    "fastest_decile_participation",
    "participation_mean",
    "never_participated",
    "virtual_hours",
)


def means(record: dict) -> list[str]:
    """The metrics of an evaluation over the clients (``driver.summarize``): the means, reported
    with their std beside them, and the values on the union of the test splits (``*_union``)."""
    return [k for k in record if f"{k}_std" in record or k.endswith("_union")]


def best_over(evaluated: list[dict]) -> dict[str, float]:
    """ACC(T) for every mean (SosicFL: max_t): ``best_<metric>``, its best over the evaluations
    (the largest, the smallest for a metric where lower is better: losses, errors, ECE)."""
    from raysim.core.tasks import lower_is_better

    out = {}
    for k in means(evaluated[-1]) if evaluated else []:
        vals = [h[k] for h in evaluated if k in h and math.isfinite(h[k])]
        if vals:
            out[f"best_{k}"] = (min if lower_is_better(k) else max)(vals)
    return out


AT_VAL_BEST = "test_at_val_best_"


def val_selection(evaluated: list[dict], metric: str) -> dict[str, float]:
    """The round picked on validation data: ``val_best_round``, the evaluated round whose mean
    validation score of ``metric`` (``val_accuracy``, ``val_mse``: ``tasks.val_name``) is best
    (the largest; the smallest where lower is better; the earliest of equal ones), and the test
    metrics of that round: for every mean k over clients (``means``; not the ``val_*`` ones)
    ``test_at_val_best_<k>``, its ``test_at_val_best_<k>_std`` and
    ``bottom_decile_test_at_val_best_<k>`` (so ``raysim compare --metrics
    test_at_val_best_accuracy`` finds them as it finds accuracy's). {} when no evaluation
    scored a validation split."""
    from raysim.core.tasks import VAL, lower_is_better, val_name

    key = val_name(metric)
    scored = [h for h in evaluated if key in h and math.isfinite(h[key])]
    if not scored:
        return {}
    sign = 1.0 if lower_is_better(key) else -1.0
    best = min(scored, key=lambda h: (sign * h[key], h["round"]))
    out: dict[str, float] = {"val_best_round": int(best["round"])}
    for k in means(best):
        if k.startswith(VAL):
            continue
        for name, new in (
            (k, AT_VAL_BEST + k),
            (f"{k}_std", f"{AT_VAL_BEST}{k}_std"),
            (bottom_decile(k), f"bottom_decile_{AT_VAL_BEST}{k}"),
        ):
            if name in best:
                out[new] = best[name]
    return out


def time_to_target(history: list[dict], metric: str, target: float) -> dict[str, float]:
    """Time-to-accuracy (``eval.target``): the first evaluated round whose mean ``metric``
    reaches ``target`` (>=, or <= where lower is better), ``target_round``, and the seconds the
    rounds took up to and including it (their ``round_seconds`` summed: training and evaluation,
    without start-up and checkpoints), ``target_seconds``; with a simulated fleet (``systems``)
    also the virtual clock then, ``target_virtual_hours``; {} when never reached."""
    from raysim.core.tasks import lower_is_better

    seconds = 0.0
    for h in history:
        seconds += h.get("round_seconds", 0.0)
        v = h.get(metric)
        if v is not None and (v <= target if lower_is_better(metric) else v >= target):
            out = {"target_round": int(h["round"]), "target_seconds": seconds}
            if "virtual_time_s" in h:  # a simulated fleet: the virtual clock at that round
                out["target_virtual_hours"] = h["virtual_time_s"] / 3600.0
            return out
    return {}


def make_summary(sc: Scenario, history: list[dict], wall: float, tracker, clusters: dict | None = None) -> dict:
    """The run's summary; ``final`` holds the last evaluation's headline metrics, every mean
    over clients with its ``_std``, ``bottom_decile_`` and ``best_`` (ACC(T)), with a
    validation split the round picked on it and that round's test metrics (``val_best_round``,
    ``test_at_val_best_*``: ``val_selection``), the time to ``eval.target`` (``target_round``,
    ``target_seconds``) and, for a clustered method, its
    cluster report: ``center_source`` (row c: center c's score on each source),
    ``association`` (each source's best center), ``importance`` and ``true_shares`` ({client
    id: weights})."""
    evaluated = [h for h in history if "eval_seconds" in h]
    last = evaluated[-1] if evaluated else {}
    final: dict = {k: last[k] for k in FINAL if k in last}
    for k in means(last):
        final.update({name: last[name] for name in (k, f"{k}_std", bottom_decile(k)) if name in last})
    final.update(best_over(evaluated))
    from raysim.core.tasks import TASKS

    metric = next((t.metric for t in TASKS.values() if t.metric in last), None)
    if metric is not None:
        final.update(val_selection(evaluated, metric))
    if sc.eval.target is not None and metric is not None:
        final.update(time_to_target(history, metric, sc.eval.target))
    for key, value in (clusters or {}).items():
        final[key] = {str(c): v for c, v in value.items()} if isinstance(value, dict) else value
    return {
        "scenario": sc.path,
        "name": sc.name,
        "algorithm": sc.algorithm.name,
        "dataset": sc.data.dataset.name,
        "clients": sc.data.clients,
        "rounds": sc.rounds,
        "seed": sc.seed,
        "wall_seconds": round(wall, 3),
        "mlflow_run_id": tracker.run_id,
        "tracking_uri": tracker.uri,
        "final": final,
        "history": history,
    }
