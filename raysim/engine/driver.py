"""The round driver: statistics, selection, messages, dispatch, reduction, evaluation,
checkpoints.

Transport-agnostic: it talks to hosts through a Transport (in-process hosts for the serial
engine, Ray actors for the Ray engine), so both engines share every line of round logic.
Beside it: ``placement`` (the Transport, where clients live, HostLost), ``sampling`` (who takes
part), ``metrics`` (the clients' numbers reduced, the divergence checks) and ``fleet_rounds``
(the simulated fleet's clock); their names are importable from here too, as before.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import is_dataclass
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core import server_opt
from raysim.core.replies import Accumulator
from raysim.core.tasks import lower_is_better
from raysim.engine import checkpoint
from raysim.engine.fleet_rounds import FleetRounds
from raysim.engine.metrics import (  # noqa: F401 - re-exported
    Diverged,
    check_finite,
    check_scores,
    mean_train_loss,
    summarize,
    validation,
)
from raysim.engine.placement import HostLost, Placement, Transport, groups_by_host, place, prepared_source  # noqa: F401
from raysim.engine.sampling import eval_sample, sample_clients, sample_size
from raysim.engine.trees import state_to_tree, tree_to_state
from raysim.federation import privacy
from raysim.federation.fleet import Fleet
from raysim.federation.robust_round import RobustRound
from raysim.scenario.build import make_algorithm
from raysim.scenario.config import Scenario, ScenarioError, make_source, split_unseen  # noqa: F401 - re-exported


def _nbytes(reply: Any) -> int:
    """Bytes of a host's reply: its sum, or each client's."""
    return sum(a.nbytes() for a in reply.values()) if isinstance(reply, dict) else reply.nbytes()


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


class RoundDriver(FleetRounds):
    """A server's rounds over a ``Transport``: each ``step`` samples, trains, reduces and
    aggregates a round, and evaluates every ``eval.every`` rounds; ``save`` and ``restore``
    checkpoint it exactly. Its methods for the simulated fleet come from ``FleetRounds``."""

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
        # Byzantine clients and a robust rule (scenario ``adversary``/``defence``): each client's
        # reply comes to the server on its own (raysim/federation/robust_round.py), checkpointed
        self.robust = RobustRound(sc, self.train_ids) if sc.adversary is not None or sc.defence is not None else None
        self.malicious = np.array(sorted(self.robust.malicious), dtype=np.int64) if self.robust else None

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
        assignment, message, wanted, fleet = self._open_round(r)
        work = None
        if self.fleet is not None:  # only the replies the server gets in time are trained and used
            assignment, work, outcome = self._clock_round(r, assignment, message, wanted)
            fleet.update(outcome)
        by_host = groups_by_host(assignment, self.transport.placement)
        each = self.robust is not None
        root = self.robust.root_id if self.robust is not None and assignment else None
        if root is not None:  # FLTrust: the server's update, trained on its root set by host 0
            by_host[0][root] = 0
        parts = (
            self.transport.train(r, message, by_host, each=each, work=work or None, clip=self.dp_clip)
            if assignment
            else []
        )
        total, losses, compute = self._collect(r, parts)
        root_reply = None
        if root is not None:
            root_reply = total.pop(root)
            losses.pop(root, None)
        round_metrics: dict[str, float] = {}
        upload_metrics: dict[str, float] = {}  # privacy's, communication's and the adversary's
        if assignment:  # a round nobody reported in leaves the server as it was
            if each:
                assert self.robust is not None  # each client's reply is kept only for the robust round
                with server_math():
                    reduced, upload_metrics = self.robust.reduce(r, total, self.algo.update_origin(message), root_reply)
            else:
                reduced = total.result()
            round_metrics = self._aggregate(r, message, reduced, upload_metrics)
        self.round = r + 1
        if self.sc.privacy is not None and self.sc.privacy.noise_multiplier > 0:
            upload_metrics.update(self._epsilon(self.round))
        withheld = self.sc.privacy is not None and not self.sc.privacy.debug_exact_metrics
        record: dict[str, float] = {
            "round": self.round,
            "clients": float(len(assignment)),
            **({} if withheld else {"train_loss": mean_train_loss(losses)}),  # privacy keeps it on the hosts
            "bytes_down": float(self.transport.message_nbytes(message, by_host)),
            "bytes_up": float(sum(_nbytes(a) for a, _, _ in parts)),
            **fleet,
            **round_metrics,
            **upload_metrics,
        }
        return self._finish(record, t0, compute)

    def _open_round(self, r: int) -> tuple[dict[int, int], Any, int, dict[str, float]]:
        """The round's clients and message: its sample (with a fleet, the clients invited from
        those online, ``_invite``), the statistics phase, the method's selection and its
        message; (assignment {cid: group}, message, K the fleet wants (0 without a fleet),
        the fleet's record so far)."""
        fleet: dict[str, float] = {}
        wanted = 0  # (the K a fleet wants of the invited clients: none without one)
        if self.fleet is None:
            always = (
                self.malicious
                if self.sc.adversary is not None and self.sc.adversary.participation == "always"
                else None
            )
            sampled = sample_clients(self.sc, self.train_ids, r, always=always)
        else:
            sampled, wanted, fleet["available"] = self._invite(r)
        self._prepare(r, sampled)
        with server_math():
            assignment = self.algo.select(
                self.server_state, r, sampled, self.train_ids, rng.generator(self.sc.seed, "select", r)
            )
            message = self.algo.message(self.server_state, r)
        return assignment, message, wanted, fleet

    def _collect(self, r: int, parts: list[tuple]) -> tuple[Any, dict[int, tuple[float, int]], float]:
        """The hosts' replies, merged in host order (not arrival order): (their sum, or with
        each client's reply on its own {cid: Accumulator}; each client's loss, the hosts' compute
        seconds). A non-finite loss raises Diverged before the server takes the updates; at the
        sample level of privacy each trained client's round counts towards its ε."""
        total: Any = {} if self.robust is not None else Accumulator()
        losses: dict[int, tuple[float, int]] = {}
        compute = 0.0
        for acc, loss, secs in parts:  # host order, not arrival order
            if isinstance(total, dict):
                total.update(acc)
            else:
                total.merge(acc)
            losses.update(loss)
            compute += secs
        check_finite(losses, r + 1)
        if self.dp_rounds is not None:
            self.dp_rounds[np.searchsorted(self.train_ids, np.fromiter(losses, dtype=np.int64))] += 1
        return total, losses, compute

    def _aggregate(self, r: int, message: Any, reduced: Any, upload_metrics: dict[str, float]) -> dict[str, float]:
        """The server's update from the round's reduced replies: what the uploads carried
        (``_uploaded``), the method's aggregation, the server optimizer's step; the method's
        round metrics (the uploads' go into ``upload_metrics``)."""
        reduced = self._uploaded(r, message, reduced, upload_metrics)
        before = self.server_state
        with server_math():
            self.server_state = self.algo.aggregate(self.server_state, reduced, r)
            self._server_step(before)
            return self.algo.round_metrics(reduced)

    def _uploaded(self, r: int, message: Any, reduced: Any, upload_metrics: dict[str, float]) -> Any:
        """The reduced replies as the server aggregates them: compressed uploads as the models the
        server rebuilt from them (their bytes counted), and with client-level privacy the
        clipped updates' sum with noise (``_privatize``)."""
        if self.sc.communication is not None:  # the models the server rebuilt from compressed uploads
            upload_metrics["upload_bytes"] = reduced.nbytes
            upload_metrics["upload_bytes_total"] = reduced.nbytes + sum(
                h.get("upload_bytes", 0.0) for h in self.history
            )
            reduced = reduced.model
        if self.dp_clip is not None:  # client level's noise and clipping
            reduced = self._privatize(r, message, reduced, upload_metrics)
        return reduced

    def _privatize(self, r: int, message: Any, clipped: Any, upload_metrics: dict[str, float]) -> Any:
        """Noise on the clipped updates' sum (raysim/federation/privacy.py), and with adaptive
        clipping the bound C for the next round."""
        dp = self.sc.privacy
        k = sample_size(self.sc, len(self.train_ids))
        with server_math():
            reduced, clipping = privacy.privatize(
                clipped, message.shared, k, self.dp_clip, privacy.update_multiplier(dp, k), self.sc.seed, r
            )
        upload_metrics.update(clipping, dp_clip=self.dp_clip)
        if dp.target_quantile is not None:  # adaptive clipping: C for the next round
            self.dp_clip, upload_metrics["dp_unclipped_share"] = privacy.next_clip(
                self.dp_clip, clipped.below, k, dp, self.sc.seed, r
            )
        return reduced

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
        if self.malicious is not None:  # the honest clients' own scores (the referee knows who is who)
            bad = set(self.malicious.tolist())
            out.update(summarize({int(c): results[int(c)] for c in self.eval_ids if int(c) not in bad}, "honest_"))
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
                    **({"robust": self.robust.state()} if self.robust is not None else {}),
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
        if self.robust is not None:
            if "robust" not in ck:
                raise checkpoint.CheckpointError(
                    f"{folder}: the checkpoint has no defence state (written without the adversary and defence sections?)"
                )
            self.robust.load(ck["robust"])
        self.transport.load_clients(str(folder), doc, checkpoint.token(folder))
        self.history = list(ck["history"])
        return self.round
