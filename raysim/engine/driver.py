"""The round driver: statistics, selection, messages, dispatch, reduction, evaluation,
checkpoints.

Transport-agnostic: it talks to hosts through a Transport (in-process hosts for the serial
engine, Ray actors for the Ray engine), so both engines share every line of round logic.
"""

from __future__ import annotations

import heapq
import math
import time
from contextlib import contextmanager
from dataclasses import is_dataclass
from typing import Any, Protocol

import numpy as np
import torch

from raysim import rng
from raysim.core import server_opt
from raysim.core.replies import Accumulator, float_numbers
from raysim.core.tasks import VAL, Bins, lower_is_better, mean_std, val_name
from raysim.engine import checkpoint
from raysim.engine.trees import state_to_tree, tree_to_state
from raysim.federation import compression, privacy
from raysim.federation.fleet import Fleet
from raysim.scenario.build import make_algorithm
from raysim.scenario.config import Scenario, ScenarioError, make_source, split_unseen  # noqa: F401 - re-exported


class Transport(Protocol):
    num_hosts: int
    placement: Placement

    def stats(self, round_: int, message: Any, by_host: list[list[int]]) -> list: ...
    def train(
        self,
        round_: int,
        message: Any,
        by_host: list[dict[int, int]],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ) -> list[tuple]: ...
    def evaluate(self, round_: int, message: Any, by_host: list[dict[int, int]], unseen: list[int]) -> list[dict]: ...
    def save_clients(self, folder: str, rdir: str, token: str, head: dict) -> list[dict]: ...
    def load_clients(self, folder: str, doc: dict, token: str) -> None: ...
    def message_nbytes(self, message: Any, by_host: list[dict[int, int]]) -> int: ...
    def shutdown(self) -> None: ...


class Placement:
    """Which host holds each client, for the whole run (``owner[cid]``).

    ``balanced`` (``resources.placement: samples``, the default) balances the hosts' work: the
    clients, largest first (ties: lower id first), each go to the host with the fewest samples
    so far (ties: lower host index) — greedy longest-processing-time, deterministic, within
    4/3 of the best balance; with equal sizes it is round robin. ``round_robin`` puts client c
    on host c mod H whatever its size. Results never depend on placement (replies are reduced
    in client-id order)."""

    def __init__(self, owner: np.ndarray, hosts: int):
        self.owner = np.asarray(owner, dtype=np.int64)
        self.hosts = hosts
        self._clients = [np.flatnonzero(self.owner == h).tolist() for h in range(hosts)]

    @classmethod
    def round_robin(cls, clients: int, hosts: int) -> Placement:
        return cls(np.arange(clients) % hosts, hosts)

    @classmethod
    def balanced(cls, sizes, hosts: int) -> Placement:
        sizes = np.asarray(sizes, dtype=np.int64)
        order = np.lexsort((np.arange(len(sizes)), -sizes))  # largest first, then by id
        owner = np.empty(len(sizes), dtype=np.int64)
        heap = [(0, h) for h in range(hosts)]
        for c in order.tolist():
            load, h = heapq.heappop(heap)
            owner[c] = h
            heapq.heappush(heap, (load + int(sizes[c]), h))
        return cls(owner, hosts)

    def host(self, cid: int) -> int:
        return int(self.owner[cid])

    def clients(self, h: int) -> list[int]:
        """Host h's clients, ascending."""
        return self._clients[h]


def prepared_source(sc: Scenario):
    """The scenario's data source with its once-only work done (``FederatedSource.prepare``):
    the engine makes one per run in the driver and hands it to every host and the server."""
    source = make_source(sc)
    source.prepare()
    return source


def place(sc: Scenario, hosts: int | None = None, source=None) -> Placement:
    """The scenario's placement over ``hosts`` (default ``resources.hosts``) hosts."""
    hosts = hosts or sc.resources.hosts
    if sc.resources.placement == "round_robin" or hosts == 1:
        return Placement.round_robin(sc.data.clients, hosts)
    source = source or make_source(sc)
    return Placement.balanced([source.num_samples(c) for c in range(sc.data.clients)], hosts)


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


def sample_clients(sc: Scenario, train_ids: np.ndarray, round_: int, k: int | None = None) -> np.ndarray:
    """The round's sample of ``k`` (default ``sample_size``) of ``train_ids``, from (seed, "sample", round)."""
    if k is None:
        k = sample_size(sc, len(train_ids))
    if k >= len(train_ids):
        return train_ids
    chosen = rng.generator(sc.seed, "sample", round_).choice(len(train_ids), size=k, replace=False)
    return np.sort(train_ids[chosen])


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


def groups_by_host(assignment: dict[int, int], placement: Placement) -> list[dict[int, int]]:
    out: list[dict[int, int]] = [{} for _ in range(placement.hosts)]
    owner = placement.owner
    for c in sorted(assignment):
        out[owner[c]][c] = assignment[c]
    return out


class HostLost(RuntimeError):
    """A host actor died (its process killed, out of memory, its node gone) or did not answer
    in time. The run rolls back to its last checkpoint on a fresh set of hosts and goes on:
    client work is a pure function of state, message, round and client id, so the redone
    rounds give the same results."""


@contextmanager
def server_math():
    """The server's computations (the algorithm's init_server, absorb_stats, select, message,
    aggregate, the server optimizer, the cluster centers' scores) on one thread: a result must
    not depend on the process's thread count, and a BLAS product sums in another order on more
    threads (pFedHN's hypernetwork differed in the 9th digit between the serial engine, whose
    process runs hosts at ``cpus_per_host`` threads, and a Ray driver at the machine's)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class RoundDriver:
    def __init__(self, sc: Scenario, transport: Transport, source=None):
        self.sc = sc
        self.transport = transport
        self.source = source if source is not None else make_source(sc)
        self.algo = make_algorithm(sc, self.source)
        self.clusters: dict[str, Any] = {}  # the last evaluation's cluster report
        self._source_tests: list | None = None
        self._shares: dict[int, list[float]] | None = None
        with server_math():
            self.server_state = self.algo.init_server(rng.generator(sc.seed, "server_init"))
        # the server optimizer's state (scenario ``server``; None: none), checkpointed beside
        self.server_opt = None
        if sc.server.optimizer != "none":
            self.server_opt = server_opt.init_state(sc.server, self.algo.server_params(self.server_state))
        # client-level privacy's C, adapted or not (level sample clips on the hosts, in the loop)
        self.dp_clip = sc.privacy.clip if sc.privacy is not None and sc.privacy.level == "client" else None
        self.train_ids, self.unseen_ids = split_unseen(sc)
        # sample-level privacy: the rounds each training client has trained in (its ε counts those)
        self.dp_rounds = (
            np.zeros(len(self.train_ids), dtype=np.int64)
            if sc.privacy is not None and sc.privacy.level == "sample"
            else None
        )
        self.eval_ids = eval_sample(sc, self.train_ids)
        self.round = 0  # rounds completed
        self.history: list[dict] = []
        # the simulated fleet (scenario ``systems``): the virtual clock (seconds) and each
        # client's count of rounds whose update counted, both checkpointed
        self.fleet = Fleet(sc.systems, sc.data.clients, sc.seed) if sc.systems is not None else None
        self.clock = 0.0
        self.participation = np.zeros(sc.data.clients if self.fleet is not None else 0, dtype=np.int64)
        self._n_train: dict[int, int] = {}

    def _by_host(self, cids) -> list[list[int]]:
        groups: list[list[int]] = [[] for _ in range(self.transport.num_hosts)]
        owner = self.transport.placement.owner
        for c in cids:
            groups[owner[int(c)]].append(int(c))
        return groups

    def _prepare(self, r: int, sampled: np.ndarray) -> None:
        """The algorithm's statistics phase: as long as it asks this round (e.g. until its
        initialization suits it), the clients answer and it updates the server state."""
        while (req := self.algo.stats_request(self.server_state, r)) is not None:
            who = self.train_ids if req.clients == "all" else sampled
            total = Accumulator()
            for acc in self.transport.stats(r, req.message, self._by_host(who)):
                total.merge(acc)
            with server_math():
                self.server_state = self.algo.absorb_stats(self.server_state, total.result(), r)

    def step(self) -> dict:
        """Run the next round; return its metrics record."""
        t0 = time.perf_counter()
        r = self.round
        fleet: dict[str, float] = {}
        if self.fleet is None:
            sampled = sample_clients(self.sc, self.train_ids, r)
        else:
            sampled, wanted, fleet["available"] = self._invite(r)
        self._prepare(r, sampled)
        with server_math():
            assignment = self.algo.select(
                self.server_state, r, sampled, self.train_ids, rng.generator(self.sc.seed, "select", r)
            )
            message = self.algo.message(self.server_state, r)
        work = None
        if self.fleet is not None:  # only the replies the server gets in time are trained and used
            assignment, work, outcome = self._clock_round(r, assignment, message, wanted)
            fleet.update(outcome)
        by_host = groups_by_host(assignment, self.transport.placement)
        dp = self.sc.privacy if self.dp_clip is not None else None  # client level's noise and clipping
        parts = self.transport.train(r, message, by_host, work=work or None, clip=self.dp_clip) if assignment else []
        total = Accumulator()
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for acc, loss, secs in parts:  # host order, not arrival order
            total.merge(acc)
            losses.update(loss)
            compute += secs
        check_finite(losses, r + 1)
        if self.dp_rounds is not None:
            self.dp_rounds[np.searchsorted(self.train_ids, np.fromiter(losses, dtype=np.int64))] += 1
        round_metrics: dict[str, float] = {}
        upload_metrics: dict[str, float] = {}  # privacy's and communication's
        if assignment:  # a round nobody reported in leaves the server as it was
            reduced = total.result()
            if self.sc.communication is not None:  # the models the server rebuilt from compressed uploads
                upload_metrics["upload_bytes"] = reduced.nbytes
                upload_metrics["upload_bytes_total"] = reduced.nbytes + sum(
                    h.get("upload_bytes", 0.0) for h in self.history
                )
                reduced = reduced.model
            if dp is not None:  # noise on the clipped updates' sum (raysim/federation/privacy.py)
                k = sample_size(self.sc, len(self.train_ids))
                clipped = reduced
                with server_math():
                    reduced, clipping = privacy.privatize(
                        clipped, message.shared, k, self.dp_clip, privacy.update_multiplier(dp, k), self.sc.seed, r
                    )
                upload_metrics.update(clipping, dp_clip=self.dp_clip)
                if dp.target_quantile is not None:  # adaptive clipping: C for the next round
                    self.dp_clip, upload_metrics["dp_unclipped_share"] = privacy.next_clip(
                        self.dp_clip, clipped.below, k, dp, self.sc.seed, r
                    )
            before = self.server_state
            with server_math():
                self.server_state = self.algo.aggregate(self.server_state, reduced, r)
                self._server_step(before)
                round_metrics = self.algo.round_metrics(reduced)
        self.round = r + 1
        if self.sc.privacy is not None and self.sc.privacy.noise_multiplier > 0:
            upload_metrics.update(self._epsilon(self.round))
        withheld = self.sc.privacy is not None and not self.sc.privacy.debug_exact_metrics
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(assignment)),
            **({} if withheld else {"train_loss": mean_train_loss(losses)}),  # privacy keeps it on the hosts
            "bytes_down": float(self.transport.message_nbytes(message, by_host)),
            "bytes_up": float(sum(a.nbytes() for a, _, _ in parts)),
            **fleet,
            **round_metrics,
            **upload_metrics,
        }
        return self._finish(record, t0, compute)

    def _epsilon(self, rounds: int) -> dict[str, float]:
        """ε spent after ``rounds`` rounds (privacy's accountant, at the scenario's δ): the
        metrics ``dp_epsilon`` and, at the sample level, ``dp_epsilon_median`` (each client's ε
        counts every DP-SGD epoch its rounds take, ``Algorithm.private_epochs``)."""
        dp, n = self.sc.privacy, len(self.train_ids)
        if dp.level == "sample":  # each client's record-level ε, over the rounds it trained in
            sizes = self.n_train(self.train_ids).astype(np.int64)
            eps = privacy.client_epsilons(
                self.dp_rounds,
                sizes,
                self.algo.private_epochs(),
                self.sc.algorithm.params.batch_size,
                dp.noise_multiplier,
                dp.delta if dp.delta is not None else privacy.default_delta(int(sizes.max())),
            )
            out = {"dp_epsilon": float(eps.max()), "dp_epsilon_median": float(np.median(eps))}
        else:
            k = sample_size(self.sc, n)
            out = {
                "dp_epsilon": privacy.epsilon(
                    rounds,
                    n,
                    k,
                    privacy.accountant_multiplier(dp, k),
                    dp.delta if dp.delta is not None else privacy.default_delta(n),
                    dp.accounting,
                )
            }
        if dp.debug_exact_metrics:  # the exact metrics logged beside the model have no guarantee
            out = {
                "dp_epsilon": math.inf,
                **{name.replace("dp_epsilon", "dp_epsilon_model"): v for name, v in out.items()},
            }
        return out

    # -- the simulated fleet (``systems``) ------------------------------------------------------
    def _invite(self, r: int) -> tuple[np.ndarray, int, float]:
        """The clients invited to round r: ⌈K·over_selection⌉ drawn from those online at the
        clock's time, once the clock has waited for one to be (``wait_online``); (invited, K,
        how many were online)."""
        self.round_start = self.clock
        self.wait_online(r)
        online = self.train_ids[self.fleet.available(self.train_ids, self.clock, r)]
        k = sample_size(self.sc, len(self.train_ids))
        return sample_clients(self.sc, online, r, self.fleet.invite(k)), k, float(len(online))

    def n_train(self, cids) -> np.ndarray:
        """Each client's train-split size (from its sample count and ``data.splits``)."""
        from raysim.data.base import Splits, split_sizes

        sp = self.sc.data.splits
        splits = Splits(sp.train, sp.val, sp.test)
        for c in cids:
            if c not in self._n_train:
                self._n_train[c] = split_sizes(self.source.num_samples(c), splits)[0]
        return np.array([self._n_train[c] for c in cids], dtype=np.float64)

    def device_seconds(
        self, cids: np.ndarray, message: Any, groups: dict[int, int] | None = None, compute: bool = False
    ):
        """Each client's virtual seconds for a round with ``message``: download what it gets,
        its ``client_work`` at its speed, upload as much (its update of what it got); with
        ``compute``, (those seconds, their training part)."""
        from raysim.engine.trees import nbytes

        shared = nbytes(message.shared)
        part = {g: nbytes(p) for g, p in message.groups.items()}
        size = np.array([shared + part.get((groups or {}).get(int(c), 0), 0) for c in cids], dtype=np.float64)
        up = size
        comm = self.sc.communication
        if comm is not None:  # compressed: the upload's size depends on the model's only
            up = np.full(
                len(cids),
                compression.sent_bytes(
                    float_numbers(message.shared), comm.compress, comm.levels, comm.ratio, comm.bucket
                ),
            )
        work = np.array([self.algo.client_work(n) for n in self.n_train(cids.tolist()).tolist()])
        secs = self.fleet.profiles.seconds(cids, work, size, up)
        return (secs, self.fleet.profiles.compute(cids, work)) if compute else secs

    def _clock_round(
        self, r: int, assignment: dict[int, int], message: Any, wanted: int
    ) -> tuple[dict[int, int], dict[int, float], dict[str, float]]:
        """Who of the selected clients reports in time (``systems.Fleet.round``), and the share of
        its steps each straggler with partial work trains: the clock moves on by the round's
        virtual duration; the kept clients' participation counts."""
        cids = np.array(sorted(assignment), dtype=np.int64)
        waited = self.clock - self.round_start  # for a client to come online
        if not len(cids):
            return (
                {},
                {},
                {
                    "invited": 0.0,
                    "dropped_out": 0.0,
                    "stragglers": 0.0,
                    "partial": 0.0,
                    "round_virtual_s": waited,
                    "virtual_time_s": self.clock,
                },
            )
        secs, compute = self.device_seconds(cids, message, assignment, compute=True)
        out = self.fleet.round(r, self.clock, cids, wanted, secs, compute)
        self.clock += out.duration
        kept = cids[out.kept]
        self.participation[kept] += 1
        work = {int(c): float(w) for c, w in zip(kept.tolist(), out.work[out.kept].tolist()) if w < 1}
        return (
            {int(c): assignment[int(c)] for c in kept},
            work,
            {**out.record(), "round_virtual_s": waited + out.duration, "virtual_time_s": self.clock},
        )

    def wait_online(self, r: int) -> None:
        """With no training client online, move the clock on to the first time one is
        (``Fleet.first_online``); where none ever will be, stop the run: it would train nobody
        and log the untrained model's scores round after round."""
        t = self.fleet.first_online(self.train_ids, self.clock, r)
        if t == math.inf:  # (a trace: the other kinds bring someone online in time)
            cfg = self.sc.systems
            why = (
                "gives no training client a window"
                if cfg.trace_repeats
                else "plays once (trace_repeats: false) and no training client's window opens after it"
            )
            raise ScenarioError(
                f"{self.sc.path}: systems.availability_trace: round {r + 1}: no training client is "
                f"online at virtual time {self.clock:g} s or after ({cfg.availability_trace} {why}); "
                f"{r} of the {self.sc.rounds} rounds ran"
            )
        self.clock = t

    def fleet_scores(self, results: dict[int, tuple], seconds: dict[int, float]) -> dict[str, float]:
        """Who is left behind: the primary metric of the slowest and the fastest tenth of the
        evaluated clients (by ``seconds``, their device's time for a round with this
        evaluation's model), and how often the clients took part (rounds whose update counted)."""
        metric = self.algo.task.metric
        ids = np.array(
            [c for c in sorted(int(c) for c in self.eval_ids) if results[c][1] > 0 and metric in results[c][0]],
            dtype=np.int64,
        )
        out: dict[str, float] = {}
        if len(ids):
            secs = np.array([seconds[c] for c in ids.tolist()])
            order = np.lexsort((ids, secs))  # fastest first (ties: lower id)
            m = max(1, int(round(0.1 * len(ids))))
            for name, pick in (("fastest", order[:m]), ("slowest", order[-m:])):
                v = np.array([results[int(c)][0][metric] for c in ids[pick]], dtype=np.float64)
                w = np.array([results[int(c)][1] for c in ids[pick]], dtype=np.float64)
                out[f"{name}_decile_{metric}"] = float((v * w).sum() / w.sum())
                out[f"{name}_decile_participation"] = float(self.participation[ids[pick]].mean())
        part = self.participation[self.train_ids]
        out["participation_mean"] = float(part.mean())
        out["never_participated"] = float((part == 0).mean())
        out["virtual_hours"] = self.clock / 3600.0
        return out

    def _server_step(self, before: Any) -> None:
        """The server optimizer's step on the global model (``Algorithm.server_params``): the
        pseudo-gradient is the aggregate minus the model before the round. A round that left the
        model as it was (nobody trained) takes no step."""
        if self.server_opt is None:
            return
        old = self.algo.server_params(before)
        new = self.algo.server_params(self.server_state)
        if all(a is b or torch.equal(a, b) for a, b in zip(old, new)):
            return
        stepped, self.server_opt = server_opt.step(self.sc.server, self.server_opt, old, new)
        self.server_state = self.algo.with_server_params(self.server_state, stepped)

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
        with server_math():
            return self.algo.message(self.server_state, self.round)

    def evaluate(self) -> dict[str, float]:
        everyone = np.concatenate([self.eval_ids, self.unseen_ids])
        with server_math():
            chosen = self.algo.eval_groups(self.server_state, everyone)
        groups = {int(c): 0 for c in everyone}
        groups.update(chosen)
        results: dict[int, tuple[dict[str, float], int]] = {}
        unseen = [int(c) for c in self.unseen_ids]
        for part in self.transport.evaluate(
            self.round, self.eval_message(), groups_by_host(groups, self.transport.placement), unseen
        ):
            results.update(part)
        check_scores(results, self.round)
        out = summarize({int(c): results[int(c)] for c in self.eval_ids})
        if len(self.unseen_ids):
            out.update(summarize({c: results[c] for c in unseen}, "unseen_"))
        out.update(validation(results, [int(c) for c in self.eval_ids], unseen))
        if self.fleet is not None:  # each evaluated client's device time for a round
            scored = np.array(sorted(int(c) for c in self.eval_ids), dtype=np.int64)
            seconds = dict(zip(scored.tolist(), self.device_seconds(scored, self.eval_message()).tolist()))
            out.update(self.fleet_scores(results, seconds))
        importance = {c: r[2] for c, r in results.items() if r[2] is not None}
        centers = self.algo.centers(self.server_state)
        if not importance and centers is not None and chosen:  # hard clusters held by the server
            importance = {c: [float(g == k) for k in range(len(centers))] for c, g in chosen.items() if g >= 0}
        with server_math():
            out.update(self._cluster_report(importance, centers))
            self.clusters.update(
                self.algo.report({int(c): results[int(c)][:2] for c in self.eval_ids}, self.server_state)
            )
        # each client's primary score (the distribution behind the mean and bottom decile)
        metric = self.algo.task.metric
        for prefix, ids in (("", [int(c) for c in self.eval_ids]), ("unseen_", unseen)):
            scores = {c: results[c][0][metric] for c in sorted(ids) if results[c][1] > 0 and metric in results[c][0]}
            if scores:
                self.clusters[f"{prefix}client_{metric}"] = scores
        if self.fleet is not None:  # each evaluated client's rounds taken part in, and its device's round
            self.clusters["participation"] = dict(zip(scored.tolist(), self.participation[scored].tolist()))
            self.clusters["device_seconds"] = {c: round(t, 6) for c, t in seconds.items()}
        return out

    def _cluster_report(self, importance: dict[int, list[float]], centers) -> dict[str, float]:
        """A clustered method's report (kept in ``self.clusters``): each cluster model's score
        on each source's held-out set (``center_source``: row c = center c), each source's best
        center (``association``), the clients' estimated weights (``importance``) and, where
        the data know them, the true shares. Returns the table as per-round metrics
        ``center<c>_source<s>_<metric>``."""
        report: dict[str, Any] = {}
        metrics: dict[str, float] = {}
        if centers is not None and self.source.num_sources:
            if self._source_tests is None:
                self._source_tests = [self.source.source_test(s) for s in range(self.source.num_sources)]
            task = self.algo.task
            cols = []
            for x, y in self._source_tests:
                out = self.algo.outputs(centers, x, torch.device("cpu"))
                cols.append([task.scores(o, y)[task.metric] for o in out])
            table = [[cols[s][c] for s in range(len(cols))] for c in range(len(centers))]
            pick = min if lower_is_better(task.metric) else max
            report["center_source"] = table
            report["association"] = [pick(range(len(centers)), key=lambda c: table[c][s]) for s in range(len(cols))]
            metrics = {
                f"center{c}_source{s}_{task.metric}": v for c, row in enumerate(table) for s, v in enumerate(row)
            }
        if importance:
            report["importance"] = {c: importance[c] for c in sorted(importance)}
            shares = self._true_shares()
            if shares is not None:
                report["true_shares"] = shares
                # agreement of the hard assignments (largest estimated weight vs largest true share)
                from sklearn.metrics import adjusted_rand_score

                cids = sorted(importance)
                metrics["cluster_ari"] = float(
                    adjusted_rand_score(
                        [int(np.argmax(shares[c])) for c in cids], [int(np.argmax(importance[c])) for c in cids]
                    )
                )
        self.clusters = report
        return metrics

    def _true_shares(self) -> dict[int, list[float]] | None:
        """Every client's true shares (fixed by the data: computed once)."""
        if self._shares is None:
            everyone = sorted(int(c) for c in np.concatenate([self.train_ids, self.unseen_ids]))
            shares = {c: self.source.true_shares(c) for c in everyone}
            self._shares = {} if shares[everyone[0]] is None else {c: [float(v) for v in u] for c, u in shares.items()}
        return self._shares or None

    def report(self) -> dict[str, Any]:
        """The last evaluation's report: a clustered method's cluster report, the algorithm's
        own entries (``Algorithm.report``, e.g. SuPerFed's λ curve), and each evaluated
        client's primary score (``client_accuracy`` / ``client_mse``; ``unseen_client_...``)."""
        return self.clusters

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, folder: str, extra: dict | None = None) -> None:
        """Checkpoint this round into ``folder`` (``raysim.engine.checkpoint``): the hosts write
        their clients' states, this driver the server state, history and the hosts' entries,
        then the manifest. A failed write leaves the last complete round in place."""
        head = checkpoint.header(folder, self.round)
        token = checkpoint.token(folder)
        rdir = checkpoint.round_folder(folder, self.round)
        with checkpoint.writing(folder, rdir):
            hosts = self.transport.save_clients(str(folder), str(rdir), token, head)
            server = checkpoint.save(
                rdir / checkpoint.SERVER,
                {
                    **(extra or {}),
                    **head,
                    "hosts": hosts,
                    "server": state_to_tree(self.server_state),
                    **({"server_opt": state_to_tree(self.server_opt)} if self.server_opt is not None else {}),
                    **({"privacy": {"clip": self.dp_clip}} if self.dp_clip is not None else {}),
                    **(
                        {"privacy": {"rounds": torch.from_numpy(self.dp_rounds.copy())}}
                        if self.dp_rounds is not None
                        else {}
                    ),
                    **(
                        {"fleet": {"clock": self.clock, "participation": torch.from_numpy(self.participation.copy())}}
                        if self.fleet is not None
                        else {}
                    ),
                    "history": self.history,
                },
            )
            checkpoint.commit(folder, head, server, hosts)

    def restore(self, folder: str) -> int:
        """Go on from the checkpoint in ``folder``, every file verified as it is read (a
        damaged one raises ``checkpoint.CheckpointError``)."""
        doc, ck = checkpoint.read(folder)
        self.round = int(ck["round"])
        t = type(self.server_state)
        self.server_state = tree_to_state(t, ck["server"]) if is_dataclass(t) else ck["server"]
        if self.server_opt is not None:
            if "server_opt" not in ck:
                raise checkpoint.CheckpointError(
                    f"{folder}: the checkpoint has no server optimizer state (written with server.optimizer: none?)"
                )
            self.server_opt = {k: list(v) for k, v in ck["server_opt"].items()}
        if self.dp_clip is not None:
            if "privacy" not in ck:
                raise checkpoint.CheckpointError(
                    f"{folder}: the checkpoint has no clipping bound (written without the privacy section?)"
                )
            self.dp_clip = float(ck["privacy"]["clip"])
        if self.dp_rounds is not None:
            if "privacy" not in ck or "rounds" not in ck["privacy"]:
                raise checkpoint.CheckpointError(
                    f"{folder}: the checkpoint has no per-client training rounds "
                    f"(written without privacy.level: sample?)"
                )
            self.dp_rounds = ck["privacy"]["rounds"].numpy().astype(np.int64)
        if self.fleet is not None:
            if "fleet" not in ck:
                raise checkpoint.CheckpointError(
                    f"{folder}: the checkpoint has no virtual clock (written without the systems section?)"
                )
            self.clock = float(ck["fleet"]["clock"])
            self.participation = ck["fleet"]["participation"].numpy().astype(np.int64)
        self.transport.load_clients(str(folder), doc, checkpoint.token(folder))
        self.history = list(ck["history"])
        return self.round
