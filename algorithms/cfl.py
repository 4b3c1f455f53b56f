"""Clustered FL — Sattler, Müller & Samek, "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020 (Alg. 1–3).

One cluster of all clients at first. Each round the selected clients of cluster c train from
θ_c and reply with their update Δθ_i = θ_i − θ_c; every member of c gets θ_c + mean Δθ. A
cluster splits when its federated solution is near a stationary point while some clients are
not: ‖mean Δθ‖ < ``eps1`` and max_i ‖Δθ_i‖ > ``eps2``, after round ``split_after`` and for
clusters of more than ``min_split_size`` clients (official notebook: 0.4, 1.6, 20, 2). The
bipartition minimizes the largest cross-cluster cosine similarity of the updates: complete-
linkage agglomerative clustering into two (scikit-learn, precomputed distances 1 − cos);
clusters split recursively over the rounds. The part holding the cluster's lowest client id
keeps its index, the other gets the next free one. Each part's model is θ_c + the mean update of its
own members; θ_c + mean Δθ of the whole cluster is cached.

Evaluation: each client scores its current cluster model and every model cached along its
cluster's history (the federated model of each cluster it belonged to at a split) on its
validation split (its train split when it has none) and is scored on its test split with the
best: ``accuracy``/``mse``; ``cluster_*``: the current cluster model.

Choices: ``weighting`` ``uniform`` (default: the official code's unweighted mean of the updates,
which the ε thresholds were tuned on) or ``samples`` (the paper's |D_i|/|D_c|). The paper's
optional γ_max acceptance test is not in the official code and not here. Clients not selected
in the round a cluster splits stay with the part that keeps the cluster's index. Defaults
otherwise follow the official notebook: SGD lr 0.1, momentum 0.9, lr ×0.99 per round, 1 epoch
of batch 128.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import (
    Algorithm,
    ByKey,
    LocalTraining,
    Message,
    PerClient,
    Weighted,
    flatten,
    lower_is_better,
    params_of,
    training_field,
    unflatten,
)


@dataclass(frozen=True)
class CFLHyper(LocalTraining):
    lr: float = training_field("lr", 0.1)
    momentum: float = training_field("momentum", 0.9)
    batch_size: int = training_field("batch_size", 128)
    lr_schedule: str = training_field("lr_schedule", "exponential")
    lr_decay: float = training_field("lr_decay", 0.99)
    eps1: float = field(default=0.4, metadata={"gt": 0.0, "help": "split when ‖mean update‖ < eps1 ..."})
    eps2: float = field(default=1.6, metadata={"gt": 0.0, "help": "... and max ‖update‖ > eps2"})
    split_after: int = field(default=20, metadata={"min": 0, "help": "no split in the first split_after rounds"})
    min_split_size: int = field(default=2, metadata={"min": 1, "help": "split only clusters of more clients"})
    weighting: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "samples"),
            "help": "mean update: unweighted (official code) or weighted by n_k (the paper)",
        },
    )


@dataclass
class CFLServer:
    models: list[list[torch.Tensor]]  # current model of each cluster
    member: dict[int, int]  # client -> cluster, for clients not in cluster 0
    cache: list[list[torch.Tensor]]  # models cached at splits
    lineage: list[list[int]]  # per cluster, the cache entries along its history


def bipartition(updates: torch.Tensor) -> np.ndarray:
    """Labels 0/1 of the rows of ``updates`` (m, d): complete linkage on 1 − cosine similarity."""
    from sklearn.cluster import AgglomerativeClustering  # here: scikit-learn costs every host ~1 s to import

    unit = updates / updates.norm(dim=1, keepdim=True).clamp_min(1e-12)
    dist = (1.0 - unit @ unit.T).clamp_min(0.0).double().numpy()
    np.fill_diagonal(dist, 0.0)
    return AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(dist).labels_


class CFL(Algorithm):
    no_gossip = "the server splits the clients into clusters"
    name = "cfl"
    summary = "Clustered FL (Sattler et al. 2020): recursive bipartition by cosine similarity of updates"
    paper = "Sattler, Müller & Samek, IEEE TNNLS 2020"
    family = "clustered"
    personal = "nothing (the server keeps each client's cluster)"
    sends = "its update Δθ_i = θ_i − θ_c, under its cluster's key"
    Hyper = CFLHyper

    def init_server(self, rng) -> CFLServer:
        return CFLServer([params_of(self.model_fn(0))], {}, [], [[]])

    def cluster_of(self, server, cid: int) -> int:
        return server.member.get(int(cid), 0)

    def select(self, server, round_, sampled, candidates, rng):
        return {int(c): self.cluster_of(server, c) for c in sampled}

    def eval_groups(self, server, cids):
        return {int(c): self.cluster_of(server, c) for c in cids}

    def message(self, server, round_):
        # a cluster's part: its model, then the models cached along its history
        return Message(
            None, {c: [m, *(server.cache[j] for j in server.lineage[c])] for c, m in enumerate(server.models)}
        )

    def centers(self, server):
        return server.models

    def train(self, state, received, data, ctx):
        start = received.part[0]
        (fitted,) = yield [self.job(start, data, ctx)]
        delta = [a - b for a, b in zip(fitted.params, start)]
        w = float(data.num_train) if self.hp.weighting == "samples" else float(data.num_train > 0)
        reply = (
            ByKey({ctx.group: Weighted(delta, w)}),
            PerClient({ctx.cid: [flatten([delta]), torch.tensor(w, dtype=torch.float64)]}),
        )
        return state, reply, fitted.loss

    def aggregate(self, server, reduced, round_):
        if reduced is None:
            return server
        sums, updates = reduced
        models, member = list(server.models), dict(server.member)
        cache, lineage = list(server.cache), [list(x) for x in server.lineage]
        for c in sorted(sums):
            r = sums[c]
            if r.weight == 0:
                continue
            theta = models[c]
            mean = r.mean(theta[0].dtype)
            models[c] = [t + d for t, d in zip(theta, mean)]
            cids = sorted(k for k in updates if self.cluster_of(server, k) == c)
            if round_ + 1 <= self.hp.split_after or len(cids) <= self.hp.min_split_size:
                continue
            flat = torch.stack([updates[k][0] for k in cids])
            mean_norm = float(flatten([mean]).norm())
            if mean_norm >= self.hp.eps1 or float(flat.norm(dim=1).max()) <= self.hp.eps2:
                continue
            labels = bipartition(flat)
            labels = labels if labels[0] == 0 else 1 - labels  # the lowest id's part keeps index c
            new = len(models)
            cache.append(models[c])  # the cluster's federated model
            lineage[c] = lineage[c] + [len(cache) - 1]
            lineage.append(list(lineage[c]))
            weights = torch.stack([updates[k][1] for k in cids])
            for part, side in ((c, 0), (new, 1)):
                rows = np.flatnonzero(labels == side)
                w = weights[rows]
                step = (flat[rows].double() * w[:, None]).sum(0) / w.sum()
                shifted = [t + d for t, d in zip(theta, unflatten([theta], step.to(theta[0].dtype))[0])]
                if part == new:
                    models.append(shifted)
                else:
                    models[c] = shifted
                for i in rows:
                    if part == 0:
                        member.pop(cids[i], None)
                    else:
                        member[cids[i]] = part
        return CFLServer(models, member, cache, lineage)

    def evaluate(self, state, received, data, ctx):
        models = received.part
        task = self.task
        if len(models) > 1:
            x, y = (data.val_x, data.val_y) if data.num_val else (data.train_x, data.train_y)
            scores = [task.scores(o, y).get(task.metric, 0.0) for o in self.outputs(models, x, ctx.device)]
            pick = min if lower_is_better(task.metric) else max
            best = pick(range(len(models)), key=lambda i: scores[i])
        else:
            best = 0
        out = self.outputs(models, data.test_x, ctx.device)
        return {**task.scores(out[best], data.test_y), **task.scores(out[0], data.test_y, "cluster_")}
