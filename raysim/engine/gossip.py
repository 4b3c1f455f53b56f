"""The gossip scheduler: decentralized rounds over a communication graph (D-FedEM, D-SGD).

Each round the scheduler first works out, from W, which messages each host needs from each
other host. Every client then takes its local step on its own parameters (inside its host);
a host keeps its clients' messages for its own mixing and puts one bundle per host that needs
some of them into the object store, holding exactly those. The scheduler passes each host the
refs of the bundles made for it and its clients' rows W_ij; the host fetches them (peer to
peer) and sets θ_i <- Σ_j W_ij θ_j. The scheduler moves refs and weights, never models.
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
        self._plan_cache = None         # (rows per host, outboxes) for the W in force

    def _mixing(self, r: int) -> tuple[np.ndarray, bool]:
        """W for round r (redrawn each round with ``resample``); True when it changed."""
        t = self.sc.topology
        key = r if (t.resample and t.kind == "erdos_renyi") else 0
        if self.graph_round == key and self.W is not None:
            return self.W, False
        g = topology.build(t.kind, self.sc.data.clients, rng.generator(self.sc.seed, "topology", key),
                           p=t.p, edges=t.edges)
        w = topology.mixing_matrix(g, t.mixing, t.fmmc_iters)
        if t.weighting == "samples":
            w = topology.sample_weighted(w, self.counts)
            topology.check_mixing(w, g, counts=self.counts)
        self.W, self.graph_round = w, key
        return self.W, True

    def restore(self, path: str) -> int:
        r = super().restore(path)
        self._plan_cache = None         # hosts get their rows again
        if r > 0:
            self._mixing(r - 1)        # the graph in force, so a fixed one is not reported again
        return r

    def eval_message(self) -> Any:
        return None                    # each client evaluates its own parameters

    def _plan(self, W: np.ndarray, groups: list[list[int]]):
        """Each host's rows {i: [(j, W_ij)]} and, per source host, which of its clients'
        messages each other host needs (its clients' neighbours held elsewhere)."""
        hosts = len(groups)
        rows_by_host: list[dict[int, list[tuple[int, float]]]] = []
        outboxes: list[dict[int, list[int]]] = [{} for _ in range(hosts)]
        for h, cids in enumerate(groups):
            rows = {}
            for i in cids:
                nbrs = np.flatnonzero(W[i])
                rows[i] = list(zip(nbrs.tolist(), W[i, nbrs].tolist()))
            rows_by_host.append(rows)
            for j in sorted({j for row in rows.values() for j, _ in row}):
                src = host_of(j, hosts)
                if src != h:
                    outboxes[src].setdefault(h, []).append(j)
        return rows_by_host, outboxes

    def step(self) -> dict:
        t0 = time.perf_counter()
        r = self.round
        everyone = [int(c) for c in self.train_ids]
        groups = self._by_host(everyone)
        hosts = len(groups)
        W, changed = self._mixing(r)
        send_rows = changed or self._plan_cache is None
        if send_rows:                   # hosts keep their rows while W stays the same
            self._plan_cache = self._plan(W, groups)
        rows_by_host, outboxes = self._plan_cache
        parts = self.transport.gossip_train(r, groups, outboxes)
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for _, loss, secs in parts:
            losses.update(loss)
            compute += secs
        plans = [([bundles[h] for bundles, _, _ in parts if h in bundles], rows_by_host[h] if send_rows else None)
                 for h in range(hosts)]
        stats = self.transport.gossip_mix(plans)
        self.round = r + 1
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(everyone)),
            "train_loss": mean_train_loss(losses),
            "messages_fetched_across_hosts": float(sum(len(v) for out in outboxes for v in out.values())),
        }
        record.update(self.consensus(stats))
        if changed:
            record["spectral_gap"] = topology.spectral_gap(
                W, self.counts if self.sc.topology.weighting == "samples" else None)
        return self._finish(record, t0, compute)

    def consensus(self, stats=None) -> dict[str, float]:
        """mean_k ‖θ_k − θ̄‖² per parameter group (component), from summed θ and ‖θ‖² (the
        hosts' sums, as gossip_mix returns them, or asked for now)."""
        total = Accumulator()
        for acc in (self.transport.consensus() if stats is None else stats):
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
