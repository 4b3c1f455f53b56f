"""The round driver: sampling, broadcast, dispatch, reduction, evaluation, checkpoints.

Transport-agnostic: it talks to hosts through a Transport (in-process hosts for the serial
engine, Ray actors for the Ray engine), so both engines share every line of round logic.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from algorithms.base import EvalResult, state_to_tree, tree_to_state
from raysim import rng
from raysim.config import Scenario
from raysim.engine import checkpoint
from raysim.engine.reduce import Accumulator
from raysim.setup import make_algorithm, make_source


class Transport(Protocol):
    num_hosts: int

    def train(self, round_: int, message: Any, by_host: list[list[int]]) -> list[tuple]: ...
    def evaluate(self, round_: int, message: Any, by_host: list[list[int]], unseen: list[int]) -> list[dict]: ...
    def get_states(self) -> dict[int, Any]: ...
    def set_states(self, trees: dict[int, Any]) -> None: ...
    def message_nbytes(self, message: Any) -> int: ...
    def shutdown(self) -> None: ...


def host_of(cid: int, num_hosts: int) -> int:
    """Clients live on host cid mod H for the whole run (sampled clients spread evenly)."""
    return cid % num_hosts


def split_unseen(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """(training client ids, unseen client ids), the unseen drawn from (seed, "unseen")."""
    n = sc.data.clients
    k = int(round(sc.eval.unseen_fraction * n))
    perm = rng.generator(sc.seed, "unseen").permutation(n)
    return np.sort(perm[: n - k]), np.sort(perm[n - k:])


def sample_clients(sc: Scenario, train_ids: np.ndarray, round_: int) -> np.ndarray:
    s = sc.sampling
    k = s.count if s.count is not None else max(1, int(round(s.fraction * len(train_ids))))
    if k >= len(train_ids):
        return train_ids
    chosen = rng.generator(sc.seed, "sample", round_).choice(len(train_ids), size=k, replace=False)
    return np.sort(train_ids[chosen])


def mean_train_loss(losses: dict[int, tuple[float, int]]) -> float:
    """Training loss averaged over clients weighted by their train sizes, summed in id order."""
    ls = [losses[c] for c in sorted(losses)]
    n = sum(k for _, k in ls)
    return float(sum(l * k for l, k in ls) / n) if n else float("nan")


@dataclass
class EvalSummary:
    accuracy: float
    bottom_decile_accuracy: float
    loss: float
    global_accuracy: float | None
    extras: dict[str, float]


def summarize(results: dict[int, EvalResult]) -> EvalSummary | None:
    """Accuracy weighted by local test size, 10th percentile of per-client accuracy, loss."""
    rs = [results[c] for c in sorted(results) if results[c].total > 0]
    if not rs:
        return None
    correct = np.array([r.correct for r in rs], dtype=np.float64)
    total = np.array([r.total for r in rs], dtype=np.float64)
    per_client = correct / total
    glob = None
    if all(r.global_correct is not None for r in rs):
        glob = float(sum(r.global_correct for r in rs) / total.sum())
    extras = {k: float(np.mean([r.extras[k] for r in rs])) for k in rs[0].extras}
    return EvalSummary(float(correct.sum() / total.sum()), float(np.percentile(per_client, 10)),
                       float(sum(r.loss_sum for r in rs) / total.sum()), glob, extras)


class RoundDriver:
    def __init__(self, sc: Scenario, transport: Transport):
        self.sc = sc
        self.transport = transport
        source = make_source(sc)
        self.algo = make_algorithm(sc, source)
        self.server_state = self.algo.init_server(self.algo.model_fn(), rng.generator(sc.seed, "server_init"))
        self.train_ids, self.unseen_ids = split_unseen(sc)
        self.round = 0              # rounds completed
        self.history: list[dict] = []

    def _by_host(self, cids) -> list[list[int]]:
        groups: list[list[int]] = [[] for _ in range(self.transport.num_hosts)]
        for c in cids:
            groups[host_of(int(c), self.transport.num_hosts)].append(int(c))
        return groups

    def step(self) -> dict:
        """Run the next round; return its metrics record."""
        t0 = time.perf_counter()
        r = self.round
        sampled = sample_clients(self.sc, self.train_ids, r)
        message = self.algo.broadcast(self.server_state, r)
        groups = self._by_host(sampled)
        parts = self.transport.train(r, message, groups)
        total = Accumulator()
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for acc, loss, secs in parts:        # host order, not arrival order
            total.merge(acc)
            losses.update(loss)
            compute += secs
        self.server_state = self.algo.aggregate(self.server_state, total.result(), r)
        self.round = r + 1
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(sampled)),
            "train_loss": mean_train_loss(losses),
            "bytes_down": float(self.transport.message_nbytes(message) * sum(1 for g in groups if g)),
            "bytes_up": float(sum(a.nbytes() for a, _, _ in parts)),
        }
        return self._finish(record, t0, compute)

    def _finish(self, record: dict, t0: float, compute: float) -> dict:
        if self.round % self.sc.eval.every == 0 or self.round == self.sc.rounds:
            t_eval = time.perf_counter()
            record.update(self.evaluate())
            record["eval_seconds"] = time.perf_counter() - t_eval
        record["round_seconds"] = time.perf_counter() - t0
        record["host_compute_seconds"] = compute
        self.history.append(record)
        return record

    def eval_message(self) -> Any:
        return self.algo.broadcast(self.server_state, self.round)

    def evaluate(self) -> dict[str, float]:
        message = self.eval_message()
        everyone = np.concatenate([self.train_ids, self.unseen_ids])
        results: dict[int, EvalResult] = {}
        unseen = [int(c) for c in self.unseen_ids]
        for part in self.transport.evaluate(self.round, message, self._by_host(everyone), unseen):
            results.update(part)
        out: dict[str, float] = {}
        seen = summarize({c: results[int(c)] for c in self.train_ids})
        if seen is not None:
            out.update(accuracy=seen.accuracy, bottom_decile_accuracy=seen.bottom_decile_accuracy,
                       test_loss=seen.loss)
            if seen.global_accuracy is not None and self.algo.has_global_model:
                out["global_accuracy"] = seen.global_accuracy
            out.update(seen.extras)
        if len(self.unseen_ids):
            unseen = summarize({c: results[int(c)] for c in self.unseen_ids})
            if unseen is not None:
                out.update(unseen_accuracy=unseen.accuracy,
                           unseen_bottom_decile_accuracy=unseen.bottom_decile_accuracy)
                out.update({f"unseen_{k}": v for k, v in unseen.extras.items()})
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str, extra: dict | None = None) -> None:
        checkpoint.save(path, {
            **(extra or {}),
            "round": self.round,
            "server": state_to_tree(self.server_state),
            "clients": self.transport.get_states(),
            "history": self.history,
        })

    def restore(self, path: str) -> int:
        ck = checkpoint.load(path)
        self.round = int(ck["round"])
        self.server_state = _restore_server(self.server_state, ck["server"])
        self.transport.set_states(ck["clients"])
        self.history = list(ck["history"])
        return self.round


def _restore_server(template: Any, tree: Any) -> Any:
    """Server states are plain trees of tensors (lists) or dataclasses of them."""
    import dataclasses
    if dataclasses.is_dataclass(template):
        return tree_to_state(type(template), tree)
    return tree


def make_driver(sc: Scenario, transport: Transport) -> RoundDriver:
    """The server's round driver, or the gossip scheduler when the scenario has a topology."""
    if sc.topology is not None:
        from raysim.engine.gossip import GossipDriver
        return GossipDriver(sc, transport)
    return RoundDriver(sc, transport)
