"""The gossip scheduler: decentralized rounds over a communication graph (D-FedEM, D-SGD).

Each round every client takes its local step on its own parameters (inside its host); the
scheduler then tells each host, for each of its clients i, the weights W_ij and *handles* of
its neighbours' messages; hosts fetch exactly those messages (through the object store, peer to
peer) and set θ_i <- Σ_j W_ij θ_j. The scheduler moves handles and weights, never models.
Consensus distance comes from per-host sums of θ and ‖θ‖², like any other reply.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from raysim import rng, topology
from raysim.config import Scenario
from raysim.engine.driver import RoundDriver, host_of, mean_train_loss
from raysim.engine.reduce import Accumulator


class GossipDriver(RoundDriver):
    def __init__(self, sc: Scenario, transport):
        super().__init__(sc, transport)
        counts = self.transport.gossip_init(self.algo.broadcast(self.server_state, 0))
        self.counts = np.array([counts.get(c, 0) for c in range(sc.data.clients)], dtype=np.float64)
        self.graph_round: int | None = None
        self.W: np.ndarray | None = None

    def _mixing(self, r: int) -> tuple[np.ndarray, bool]:
        """W for round r (redrawn each round with ``resample``); True when it changed."""
        t = self.sc.topology
        key = r if (t.resample and t.kind == "erdos_renyi") else 0
        if self.graph_round == key and self.W is not None:
            return self.W, False
        g = topology.build(t.kind, self.sc.data.clients, rng.generator(self.sc.seed, "topology", key),
                           p=t.p, edges=t.edges)
        w = topology.mixing_matrix(g, t.mixing)
        if t.weighting == "samples":
            w = topology.sample_weighted(w, self.counts)
            topology.check_reversible(w, g, self.counts)
        self.W, self.graph_round = w, key
        return self.W, True

    def restore(self, path: str) -> int:
        r = super().restore(path)
        if r > 0:
            self._mixing(r - 1)        # the graph in force, so a fixed one is not reported again
        return r

    def eval_message(self) -> Any:
        return None                    # each client evaluates its own parameters

    def step(self) -> dict:
        t0 = time.perf_counter()
        r = self.round
        everyone = [int(c) for c in self.train_ids]
        groups = self._by_host(everyone)
        parts = self.transport.gossip_train(r, groups)
        handles: dict[int, Any] = {}
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for msgs, loss, secs in parts:
            handles.update(msgs)
            losses.update(loss)
            compute += secs
        W, changed = self._mixing(r)
        plans = []
        fetched = 0
        for h, cids in enumerate(groups):
            rows = {}
            for i in cids:
                nbrs = np.flatnonzero(W[i])
                rows[i] = [(int(j), float(W[i, j])) for j in nbrs]
            needed = sorted({j for row in rows.values() for j, _ in row})
            fetched += sum(1 for j in needed if host_of(j, len(groups)) != h)
            plans.append(({j: handles[j] for j in needed}, rows))
        self.transport.gossip_mix(plans)
        self.round = r + 1
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(everyone)),
            "train_loss": mean_train_loss(losses),
            "messages_fetched_across_hosts": float(fetched),
        }
        record.update(self.consensus())
        if changed:
            record["spectral_gap"] = topology.spectral_gap(
                W, self.counts if self.sc.topology.weighting == "samples" else None)
        return self._finish(record, t0, compute)

    def consensus(self) -> dict[str, float]:
        """mean_k ‖θ_k − θ̄‖² per parameter group (component), from summed θ and ‖θ‖²."""
        total = Accumulator()
        for acc in self.transport.consensus():
            total.merge(acc)
        groups = total.result()
        out = {}
        for m, g in enumerate(groups):
            k = g.weight
            *sums, sq = g.values
            mean_sq = float(sq) / k
            norm_mean = sum(float(((s / k) ** 2).sum()) for s in sums)
            out[f"consensus_distance_{m}"] = max(0.0, mean_sq - norm_mean)
        out["consensus_distance"] = float(np.mean(list(out.values())))
        # the float64 sums above depend on how clients are grouped into hosts in their last bits;
        # reported at float32 precision they do not (as the model sums, DESIGN.md §1.4)
        return {k: float(np.float32(v)) for k, v in out.items()}
