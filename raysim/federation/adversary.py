"""The malicious clients of a run (the scenario's ``adversary``): who they are, the data they train
on, and the triggered test inputs that score a backdoor.

Who is malicious is drawn once from the seed (``malicious_ids``: a share of the training clients,
or the scenario's list) and known only to the simulation of the attackers themselves: the hosts
poison those clients' training data (``poisoned``), the driver crafts their updates
(``raysim.federation.robust_round``); honest clients and the server's rule never read it, and the
engine's referee uses it only to score (honest-client metrics, detection, the attack success rate).

Data attacks (``raysim.federation.poisoning``): ``label_flip`` relabels an attacker's whole training
split; ``backdoor`` and ``dba`` stamp their trigger on ``fraction`` of its training samples
(drawn from (seed, "poison", cid)) and relabel those to ``target``, DBA's attacker i stamping local
trigger i mod P (i its rank among the malicious ids) while the test trigger is their union. Images
stored as uint8 pixels take the trigger's value times 255.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core.data import ClientData
from raysim.federation import poisoning


def malicious_ids(sc: Any, train_ids: np.ndarray) -> np.ndarray:
    """The run's malicious clients, sorted: the scenario's list, or round(fraction × training
    clients) of the training clients drawn without replacement from (seed, "adversary")."""
    adv = sc.adversary
    if adv is None:
        return np.zeros(0, dtype=np.int64)
    if adv.clients is not None:
        return np.array(sorted(adv.clients), dtype=np.int64)
    m = malicious_count(adv, len(train_ids))
    pick = rng.generator(sc.seed, "adversary").choice(np.asarray(train_ids, dtype=np.int64), m, replace=False)
    return np.sort(pick).astype(np.int64)


def malicious_count(adv: Any, train_clients: int) -> int:
    """How many clients are malicious: the list's length, or round(fraction × training clients)."""
    if adv is None:
        return 0
    return len(adv.clients) if adv.clients is not None else int(round(adv.fraction * train_clients))


def expected_malicious(adv: Any, k: int, train_clients: int) -> int:
    """The malicious clients of a round of ``k``: with ``always`` all of them (at most k), else their
    share of k rounded up (the count a defence assumes by default)."""
    m = malicious_count(adv, train_clients)
    if adv is None or not m:
        return 0
    if adv.participation == "always":
        return min(m, k)
    return min(k, math.ceil(k * m / train_clients)) if train_clients else 0


def _value(p: Any, x: torch.Tensor) -> float:
    return round(p.value * 255) if x.dtype == torch.uint8 else p.value


def poisoned(sc: Any, data: ClientData, num_classes: int, image_shape, rank: int) -> ClientData:
    """Malicious client ``data.cid``'s shard with its training split poisoned by the scenario's
    data attack (``rank``: its place among the malicious ids); the shard itself for a model attack."""
    a = sc.adversary.attack
    p = a.params
    if a.name == "label_flip":
        y = poisoning.flip_labels(data.train_y, num_classes, p.mode, tuple(zip(p.sources, p.targets)))
        return ClientData(data.cid, data.train_x, y, data.val_x, data.val_y, data.test_x, data.test_y)
    if a.name not in ("backdoor", "dba"):
        return data
    local, _ = poisoning.triggers(p, tuple(image_shape))
    g = rng.torch_generator(sc.seed, "poison", data.cid)
    x, y, _ = poisoning.poison(
        data.train_x,
        data.train_y,
        p.target,
        p.fraction,
        g,
        poisoning.dba_local(local, rank),
        _value(p, data.train_x),
        image_shape,
    )
    return ClientData(data.cid, x, y, data.val_x, data.val_y, data.test_x, data.test_y)


def triggered(sc: Any, data: ClientData, image_shape) -> ClientData | None:
    """An honest client's shard whose test split is its test inputs of classes other than the
    target, stamped with the test-time trigger and labelled the target: its accuracy is the
    backdoor's success rate on this client. None without a backdoor, or with no such input."""
    a = sc.adversary.attack if sc.adversary is not None else None
    if a is None or a.name not in ("backdoor", "dba"):
        return None
    p = a.params
    keep = data.test_y != p.target
    if not bool(keep.any()):
        return None
    _, trigger = poisoning.triggers(p, tuple(image_shape))
    x = poisoning.apply(data.test_x[keep], trigger, _value(p, data.test_x), image_shape)
    y = torch.full_like(data.test_y[keep], p.target)
    return ClientData(data.cid, data.train_x, data.train_y, data.val_x[:0], data.val_y[:0], x, y)
