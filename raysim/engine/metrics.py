"""The clients' numbers as the server reduces them: the checks that stop a diverged run
(``Diverged``), the mean training loss, and an evaluation's summaries (means, spreads, bottom
deciles, the fairness papers' worst-client numbers; the validation metrics), summed in client-id order so that no host count changes them."""

from __future__ import annotations

import math

import numpy as np

from raysim.core.tasks import VAL, Bins, lower_is_better, mean_std, val_name


class Diverged(RuntimeError):
    """Training produced a NaN or infinite loss, or an evaluation a non-finite score: the run
    stops before checkpointing the round."""


def check_finite(losses: dict[int, tuple[float, int]], round_: int) -> None:
    """A non-finite client loss in round ``round_`` (1-based) raises Diverged naming the
    clients (before the server takes their updates)."""
    bad = [c for c in sorted(losses) if not math.isfinite(losses[c][0]) and losses[c][1] > 0]
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise Diverged(
            f"training diverged in round {round_}: non-finite loss on client"
            f"{'s' if len(bad) > 1 else ''} {shown}; lower the learning rate "
            "(algorithm.lr) or check the data"
        )


def check_scores(results: dict, round_: int) -> None:
    """A client's non-finite score in the evaluation after round ``round_`` raises Diverged
    naming the clients: its model's outputs overflowed, in training or in what the method
    does at evaluation (a local update, fine-tuning, personalization)."""
    bad = [
        c
        for c in sorted(results)
        if results[c][1] > 0 and any(isinstance(v, float) and not math.isfinite(v) for v in results[c][0].values())
    ]
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise Diverged(
            f"evaluation diverged after round {round_}: non-finite scores on client"
            f"{'s' if len(bad) > 1 else ''} {shown} (a model's outputs overflowed, in training "
            "or in a local update at evaluation); lower the learning rate (algorithm.lr, "
            "eval.finetune.lr)"
        )


def mean_train_loss(losses: dict[int, tuple[float, int]]) -> float:
    """Training loss averaged over clients weighted by their train sizes, summed in id order."""
    ls = [losses[c] for c in sorted(losses)]
    n = sum(k for _, k in ls)
    return float(sum(l * k for l, k in ls) / n) if n else float("nan")


def summarize(results: dict[int, tuple[dict[str, float], int]], prefix: str = "") -> dict[str, float]:
    """Every metric the clients report: its mean weighted by test size (clients with a test
    split), its std over clients (``<name>_std``, weighted the same way: ``mean_std``) and its
    bottom decile across clients — the 10th percentile, or the 90th for a metric where lower is
    better (losses, errors). A metric the clients report as ``Bins`` (``ece_bins``) gives the
    value on the union of their test splits instead (``ece_union``). Sums in float64 in
    client-id order: the same on any host count."""
    names: list[str] = []
    for c in sorted(results):
        names += [k for k in results[c][0] if k not in names]
    out: dict[str, float] = {}
    for name in names:
        vals = [
            (results[c][0][name], results[c][1]) for c in sorted(results) if results[c][1] > 0 and name in results[c][0]
        ]
        if not vals:
            continue
        if isinstance(vals[0][0], Bins):  # a share of a metric of the union (ECE's bins)
            out[f"{prefix}{name.removesuffix(Bins.SUFFIX)}{Bins.UNION}"] = Bins.union(*zip(*vals))
            continue
        v = np.array([x for x, _ in vals], dtype=np.float64)
        out[f"{prefix}{name}"], out[f"{prefix}{name}_std"] = mean_std(v, [n for _, n in vals])
        out[f"{prefix}bottom_decile_{name}"] = float(np.percentile(v, 90 if lower_is_better(name) else 10))
        if name.endswith("accuracy"):
            out.update({f"{prefix}{k}_{name}": x for k, x in fairness(v).items()})
    return out


def fairness(acc: np.ndarray) -> dict[str, float]:
    """What the fairness papers report of the clients' accuracies a_k (one per client with a
    test split, unweighted): the worst client's (AFL's worst domain); the mean of the worst and
    of the best 10 % (q-FFL's: the ⌊0.1·N⌋ lowest and highest, at least one client); and the
    entropy H(ā) = −Σ_k ā_k·log ā_k of the normalized accuracies ā_k = a_k / Σ_j a_j (q-FFL's
    appendix; log N at perfect uniformity, its KL from uniform is log N − H). Keys: ``worst``,
    ``worst10``, ``best10``, ``entropy`` (the last absent where every accuracy is 0)."""
    a = np.sort(acc)
    m = max(1, int(0.1 * len(a)))
    out = {"worst": float(a[0]), "worst10": float(a[:m].mean()), "best10": float(a[-m:].mean())}
    total = a.sum()
    if total > 0:
        p = a[a > 0] / total
        out["entropy"] = float(-(p * np.log(p)).sum())
    return out


def validation(results: dict[int, tuple], evaluated: list[int], unseen: list[int]) -> dict[str, float]:
    """The ``val_*`` metrics of one evaluation: every client's validation metrics (the 4th and
    5th entries of ``Host.evaluate``'s tuple: metrics, validation size), named as ``val_name``
    names them (test_loss -> val_loss) and reduced by ``summarize`` exactly as the test metrics,
    weighted by validation size; the unseen clients' as ``val_unseen_*``. {} where no client was
    scored on a validation split."""
    out: dict[str, float] = {}
    for prefix, ids in (("", evaluated), ("unseen_", unseen)):
        val = {
            c: ({val_name(k).removeprefix(VAL): v for k, v in results[c][3].items()}, results[c][4])
            for c in sorted(ids)
            if results[c][3] is not None
        }
        if val:
            out.update(summarize(val, VAL + prefix))
    return out
