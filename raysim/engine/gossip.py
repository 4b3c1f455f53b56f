"""The gossip scheduler: decentralized rounds over a communication graph (D-FedEM, D-SGD, ...).

Every client keeps its own copy of the server state. Each round the scheduler first works out,
from W, which messages each host needs from each other host. Every client then takes its local
step as its own server (inside its host); a host keeps its clients' shared parameters for its
own mixing and puts one bundle per host that needs some of them into the object store, holding
exactly those. The scheduler passes each host the refs of the bundles made for it and its
clients' rows W_ij; the host fetches them (peer to peer) and sets θ_i <- Σ_j W_ij θ_j. The
scheduler moves refs and weights, never models.

Consensus distance mean_k ‖θ_k − θ̄‖², per group of shared parameters: the hosts return the
sum of their mixed θ with the mix; θ̄ (rounded to float32, so it does not depend on how the
float64 sums were grouped) goes back to them, and each client's ‖θ_k − θ̄‖² comes back keyed
by client id and is summed in id order: computed directly (no cancellation near consensus),
identical for any number of hosts.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core.replies import Accumulator
from raysim.engine.driver import RoundDriver, check_finite, mean_train_loss
from raysim.federation import compression, robust_gossip, topology
from raysim.scenario.config import Scenario


class GossipDriver(RoundDriver):
    def __init__(self, sc: Scenario, transport, source=None):
        super().__init__(sc, transport, source)
        counts = self.transport.gossip_init(self.server_state)
        self.counts = np.array([counts.get(c, 0) for c in range(sc.data.clients)], dtype=np.float64)
        self.graph_round: int | None = None
        self.W = None  # scipy.sparse CSR
        self._plan_cache = None  # (rows per host, outboxes) for the W in force
        self._edges = None  # the graph's edges (with failures: each round's survivors come from them)
        self.down = np.zeros(sc.data.clients, dtype=bool)  # clients unavailable this round
        self.failures: dict[str, float] = {}

    def _mixing(self, r: int):
        """W for round r (redrawn each round with ``resample``; with failures, Metropolis on the
        round's working links); True when it changed."""
        t = self.sc.topology
        key = r if (t.resample and t.kind == "erdos_renyi") else 0
        if t.link_failure or t.node_failure:
            return self._unreliable(r, key), True
        if self.graph_round == key and self.W is not None:
            return self.W, False
        g = topology.scenario_graph(t, self.sc.data.clients, self.sc.seed, key)
        w = topology.mixing_matrix(g, t.mixing, t.fmmc_iters)
        if t.weighting == "samples":
            w = topology.sample_weighted(w, self.counts)
            topology.check_mixing(w, g, counts=self.counts)
        self.W, self.graph_round = w, key
        return self.W, True

    def _unreliable(self, r: int, key: int):
        """Round r's W on an unreliable network: the graph's links that work this round, the
        clients that are up (``topology.surviving``, drawn from (seed, "failures", r)),
        Metropolis weights on them, sample-weighted where asked; the down clients in
        ``self.down``."""
        t = self.sc.topology
        n = self.sc.data.clients
        if self.graph_round != key or self._edges is None:
            self._edges = topology.edge_array(topology.scenario_graph(t, n, self.sc.seed, key))
            self.graph_round = key
        edges, self.down = topology.surviving(
            self._edges, n, t.link_failure, t.node_failure, rng.generator(self.sc.seed, "failures", r)
        )
        w = topology.from_edge_weights(n, edges, topology.metropolis_weights(n, edges))
        if t.weighting == "samples":
            w = topology.sample_weighted(w, self.counts)
        self.W = w
        self.failures = {"links_failed": float(len(self._edges) - len(edges)), "clients_down": float(self.down.sum())}
        return w

    def restore(self, path: str) -> int:
        r = super().restore(path)
        self._plan_cache = None  # hosts get their rows again
        if r > 0:
            self._mixing(r - 1)  # the graph in force, so a fixed one is not reported again
        return r

    def eval_message(self) -> Any:
        return None  # each client is scored with its own copy

    def evaluate(self) -> dict[str, float]:
        # no global model exists: each client's copy is its own model
        return {k: v for k, v in super().evaluate().items() if "global_" not in k}

    @staticmethod
    def _plan(W, groups: list[list[int]], owner: np.ndarray):
        """Each host's rows of W, as (client ids, indptr, indices, weights): row i's neighbours j
        in ascending order, zeros left out (``mixing.Rows``), and, per source host, which of its
        clients' messages each other host needs (its clients' neighbours held elsewhere). Array
        operations only: O(edges), no Python per client."""
        hosts = len(groups)
        rows_by_host: list[tuple] = []
        outboxes: list[dict[int, list[int]]] = [{} for _ in range(hosts)]
        W = W.tocsr().copy()
        W.eliminate_zeros()
        W.sort_indices()
        for h, cids in enumerate(groups):
            ids = np.asarray(cids, dtype=np.int64)
            sub = W[ids] if len(ids) else W[:0]
            rows_by_host.append(
                (ids, sub.indptr.astype(np.int64), sub.indices.astype(np.int64), sub.data.astype(np.float64))
            )
            needed = np.unique(sub.indices)
            src = owner[needed]
            for other in np.unique(src).tolist():
                if other != h:
                    outboxes[other][h] = needed[src == other].tolist()
        return rows_by_host, outboxes

    def step(self) -> dict:
        t0 = time.perf_counter()
        r = self.round
        W, changed = self._mixing(r)
        everyone = [int(c) for c in self.train_ids if not self.down[c]]
        groups = self._by_host(everyone)
        hosts = len(groups)
        send_rows = changed or self._plan_cache is None
        if send_rows:  # hosts keep their rows while W stays the same
            self._plan_cache = self._plan(W, groups, self.transport.placement.owner)
        rows_by_host, outboxes = self._plan_cache
        parts = self.transport.gossip_train(r, groups, outboxes)
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for _, loss, secs in parts:
            losses.update(loss)
            compute += secs
        check_finite(losses, r + 1)
        plans = [
            ([bundles[h] for bundles, _, _ in parts if h in bundles], rows_by_host[h] if send_rows else None)
            for h in range(hosts)
        ]
        sums = self.transport.gossip_mix(plans)
        self.round = r + 1
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(everyone)),
            "train_loss": mean_train_loss(losses),
            "messages_fetched_across_hosts": float(sum(len(v) for out in outboxes for v in out.values())),
        }
        record.update(self.failures)
        if self.sc.defence is not None:  # nodes whose neighbourhood this round is too small for the rule
            A = W.tocsr().copy()
            A.setdiag(0)
            A.eliminate_zeros()
            degrees = np.diff(A.indptr)[np.asarray(everyone, dtype=np.int64)]
            record["defence_fallbacks"] = float(robust_gossip.fallback_rows(self.sc, degrees))
        comm = self.sc.communication
        if comm is not None:  # CHOCO-gossip: each client sends one compressed difference a round
            d = sum(t.numel() for g in self.algo.shared(self.server_state) for t in g if t.is_floating_point())
            record["upload_bytes"] = len(everyone) * compression.sent_bytes(
                d, comm.compress, comm.levels, comm.ratio, comm.bucket
            )
            record["upload_bytes_total"] = record["upload_bytes"] + sum(
                h.get("upload_bytes", 0.0) for h in self.history
            )
        record.update(self.consensus(sums))
        if changed and self.sc.data.clients <= topology.GAP_MAX and not self.failures:
            record["spectral_gap"] = topology.spectral_gap(
                W, self.counts if self.sc.topology.weighting == "samples" else None
            )
        return self._finish(record, t0, compute)

    def consensus(self, sums: list[Accumulator]) -> dict[str, float]:
        """mean_k ‖θ_k − θ̄‖² per group of shared parameters and over all groups."""
        total = Accumulator()
        for acc in sums:
            total.merge(acc)
        mean = (total.result() / total.count).to(torch.float32)
        parts = [(np.asarray(c), np.asarray(d)) for c, d in self.transport.consensus(mean) if len(c)]
        ids = np.concatenate([c for c, _ in parts])
        d = np.concatenate([d for _, d in parts]).astype(np.float64)[
            np.argsort(ids, kind="stable")
        ]  # (clients, groups), by id
        out = {f"consensus_distance_{m}": float(v) for m, v in enumerate(d.mean(axis=0))}
        out["consensus_distance"] = float(d.mean(axis=0).mean())
        return out
