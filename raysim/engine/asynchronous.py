"""Asynchronous aggregation on the virtual clock: FedBuff and FedAsync (``systems.aggregation``).

K clients (the sampling section's count or fraction) train at any time. A client starts from
the global model of that moment (version s), takes its device's time (``systems.Profiles``),
and its reply arrives at the server, which has meanwhile moved to version v: τ = v − s steps
stale. FedBuff (Nguyen et al., AISTATS 2022, Algorithm 1) collects ``buffer`` replies and
steps

    x ← x + η_g · (1/B) Σ_k s(τ_k) Δ_k,         Δ_k = x_k − x_{s_k},

where x_k is the model client k's reply alone makes of the model it started from (the method's
own ``aggregate`` of that reply: for FedAvg, the client's trained model) and s(τ) is the
staleness weight. FedAsync (Xie et al. 2019) mixes each reply in as it arrives:
x ← (1 − α s(τ)) x + α s(τ) x_k. Each freed place is given at once to a client drawn from those
online and idle, which starts from the model of that moment (the place of the reply that
completes a buffer, from the model that buffer makes).

Everything is an event on the virtual clock, ordered by arrival time (ties: lower client id):
the same clients arrive in the same order whatever the number of hosts. A client's training is
a function of its state, the model it started from and (round = its start version, client),
so it is trained when its reply is needed, from the stored model of its start: no reply waits
on a host, and a checkpoint holds the clients in flight and the models they started from.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.engine.driver import RoundDriver, check_finite, groups_by_host, mean_train_loss, sample_size, server_math
from raysim.engine.trees import state_to_tree, tree_map, tree_to_state


class AsyncDriver(RoundDriver):
    def __init__(self, sc, transport, source=None):
        super().__init__(sc, transport, source)
        cfg = sc.systems
        self.concurrency = sample_size(sc, len(self.train_ids))
        self.buffer = cfg.buffer if cfg.aggregation == "fedbuff" else 1
        # clients in flight: (arrival time, client, start version, fails) as a heap
        self.flight: list[tuple[float, int, int, bool]] = []
        self.versions: dict[int, Any] = {}  # the models clients in flight started from
        self._launches = 0  # launches at the current version (their draws' key)
        self.arrivals: list[tuple[int, int]] = []  # the last step's (client, start version), in arrival order

    # -- clients in flight ------------------------------------------------------------------------
    def _launch(self, count: int, version: int) -> int:
        """Start up to ``count`` idle, online clients now from the current model (version
        ``version``); returns how many started."""
        if count <= 0:
            return 0
        busy = np.zeros(self.sc.data.clients, dtype=bool)
        busy[[c for _, c, _, _ in self.flight]] = True
        idle = self.train_ids[self.fleet.available(self.train_ids, self.clock, version) & ~busy[self.train_ids]]
        if not len(idle):
            return 0
        g = rng.generator(self.sc.seed, "systems", "launch", version, self._launches)
        fails = rng.generator(self.sc.seed, "systems", "dropout", version, self._launches)
        self._launches += 1
        cids = np.sort(g.choice(idle, size=min(count, len(idle)), replace=False))
        if version not in self.versions:
            self.versions[version] = tree_map(lambda t: t.clone(), self.server_state)
        with server_math():
            message = self.algo.message(self.server_state, version)
        secs = self.device_seconds(cids, message)
        until = self.fleet.online_until(cids, self.clock)
        dropped = fails.random(len(cids)) < self.sc.systems.dropout
        for c, s, u, d in zip(cids.tolist(), secs.tolist(), until.tolist(), dropped.tolist()):
            heapq.heappush(self.flight, (self.clock + s, c, version, bool(d or self.clock + s > u)))
        return len(cids)

    def _top_up(self, version: int) -> None:
        """Fill the free places; with nobody online and nobody in flight, wait on the clock for
        the next client to come online (``wait_online``: the run stops where none ever will)."""
        self._launch(self.concurrency - len(self.flight), version)
        if not self.flight:
            self.wait_online(version)
            self._launch(self.concurrency, version)

    # -- a server step --------------------------------------------------------------------------
    def step(self) -> dict:
        t0 = time.perf_counter()
        r = self.round
        start = self.clock
        self._top_up(r)
        arrived: list[tuple[int, int]] = []  # (client, start version) in arrival order
        failed = 0
        while len(arrived) < self.buffer and self.flight:
            finish, c, s, fails = heapq.heappop(self.flight)
            self.clock = max(self.clock, finish)
            if fails:
                failed += 1
            else:
                arrived.append((c, s))
            if fails or len(arrived) < self.buffer:
                self._launch(1, r)
        self.arrivals = arrived
        losses, compute, stale = self._apply(r, arrived)
        self.round = r + 1
        self._launches = 0
        self._launch(self.concurrency - len(self.flight), self.round)  # the buffer's last place: the new model
        live = {s for _, _, s, _ in self.flight}
        self.versions = {s: m for s, m in self.versions.items() if s in live}
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(arrived)),
            "train_loss": mean_train_loss(losses),
            "staleness_mean": float(np.mean(stale)) if stale else 0.0,
            "staleness_max": float(max(stale)) if stale else 0.0,
            "dropped_out": float(failed),
            "in_flight": float(len(self.flight)),
            "round_virtual_s": self.clock - start,
            "virtual_time_s": self.clock,
        }
        return self._finish(record, t0, compute)

    def _apply(self, r: int, arrived: list[tuple[int, int]]) -> tuple[dict, float, list[int]]:
        """Train the arrived clients from the models they started from (one call per start
        version), and step the global model with their replies, each on its own."""
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        if not arrived:
            return losses, compute, []
        by_start: dict[int, list[int]] = {}
        for c, s in arrived:
            by_start.setdefault(s, []).append(c)
        models: dict[int, tuple[int, Any, Any]] = {}  # client -> (start, its model x_k, x_{s_k})
        for s in sorted(by_start):
            start_state = self.versions[s]
            with server_math():
                message = self.algo.message(start_state, s)
            groups = {c: 0 for c in by_start[s]}
            for replies, loss, secs in self.transport.train(
                s, message, groups_by_host(groups, self.transport.placement), each=True
            ):
                losses.update(loss)
                compute += secs
                for c, acc in replies.items():
                    with server_math():
                        own = self.algo.aggregate(start_state, acc.result(), s)
                        models[int(c)] = (s, self.algo.server_params(own), self.algo.server_params(start_state))
        check_finite(losses, r + 1)
        cfg = self.sc.systems
        order = sorted(models)  # sums in client-id order
        with server_math():
            x = self.algo.server_params(self.server_state)
            if cfg.aggregation == "fedbuff":
                total = [torch.zeros_like(t, dtype=torch.float64) for t in x]
                for c in order:
                    s, xk, xs = models[c]
                    w = self.fleet.staleness(r - s)
                    for acc, a, b in zip(total, xk, xs):
                        acc += w * (a.double() - b.double())
                new = [(t.double() + cfg.server_lr * d / len(order)).to(t.dtype) for t, d in zip(x, total)]
            else:
                (c,) = order
                s, xk, _ = models[c]
                a = cfg.alpha * self.fleet.staleness(r - s)
                new = [((1 - a) * t.double() + a * k.double()).to(t.dtype) for t, k in zip(x, xk)]
            self.server_state = self.algo.with_server_params(self.server_state, new)
        self.participation[np.array(order, dtype=np.int64)] += 1
        return losses, compute, [r - models[c][0] for c in order]

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, folder: str, extra: dict | None = None) -> None:
        flight = sorted(self.flight)
        super().save(
            folder,
            {
                **(extra or {}),
                "async": {
                    "finish": torch.tensor([f for f, _, _, _ in flight], dtype=torch.float64),
                    "cid": torch.tensor([c for _, c, _, _ in flight], dtype=torch.long),
                    "start": torch.tensor([s for _, _, s, _ in flight], dtype=torch.long),
                    "fails": torch.tensor([d for _, _, _, d in flight], dtype=torch.bool),
                    "versions": {str(s): state_to_tree(m) for s, m in self.versions.items()},
                    "launches": self._launches,
                },
            },
        )

    def restore(self, folder: str) -> int:
        from raysim.engine import checkpoint

        r = super().restore(folder)
        _, ck = checkpoint.read(folder)
        a = ck.get("async")
        if a is None:
            raise checkpoint.CheckpointError(
                f"{folder}: the checkpoint has no clients in flight (written by a synchronous run?)"
            )
        t = type(self.server_state)
        self.flight = [
            (float(f), int(c), int(s), bool(d))
            for f, c, s, d in zip(a["finish"].tolist(), a["cid"].tolist(), a["start"].tolist(), a["fails"].tolist())
        ]
        heapq.heapify(self.flight)
        self.versions = {int(s): tree_to_state(t, m) for s, m in a["versions"].items()}
        self._launches = int(a["launches"])
        return r
