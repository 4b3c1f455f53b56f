"""Which clients take part: the sample a round trains (from (seed, "sample", round)) and the
training clients every evaluation scores (from (seed, "eval_clients"))."""

from __future__ import annotations

import numpy as np

from raysim import rng
from raysim.scenario.config import Scenario


def eval_sample(sc: Scenario, train_ids: np.ndarray) -> np.ndarray:
    """The training clients every evaluation scores (``eval.clients``): all, or one sample
    drawn from (seed, "eval_clients") for the whole run."""
    want = sc.eval.clients
    if want is None:
        return train_ids
    k = max(1, int(round(want * len(train_ids)))) if want <= 1 else int(want)
    if k >= len(train_ids):
        return train_ids
    return np.sort(rng.generator(sc.seed, "eval_clients").choice(train_ids, size=k, replace=False))


def sample_size(sc: Scenario, clients: int) -> int:
    """K, the clients a round wants out of ``clients``: the sampling section's count or fraction."""
    s = sc.sampling
    return s.count if s.count is not None else max(1, int(round(s.fraction * clients)))


def sample_clients(
    sc: Scenario, train_ids: np.ndarray, round_: int, k: int | None = None, always: np.ndarray | None = None
) -> np.ndarray:
    """The round's sample of ``k`` (default ``sample_size``) of ``train_ids``, from (seed, "sample", round);
    ``always``: clients in every round (the adversary's with ``participation: always``), the
    others' k − len(always) drawn from the rest."""
    if k is None:
        k = sample_size(sc, len(train_ids))
    if always is not None and len(always):
        rest = np.setdiff1d(train_ids, always)
        return (
            np.union1d(always, sample_clients(sc, rest, round_, max(0, k - len(always))))
            if k > len(always)
            else np.sort(always)
        )
    if k >= len(train_ids):
        return train_ids
    chosen = rng.generator(sc.seed, "sample", round_).choice(len(train_ids), size=k, replace=False)
    return np.sort(train_ids[chosen])
