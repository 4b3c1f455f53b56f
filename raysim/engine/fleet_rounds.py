"""The simulated fleet in a server's rounds (scenario ``systems``): the virtual clock, the
clients invited from those online, who of them reports in time, each client's device seconds
for a round, and the evaluation's fleet scores. A part of ``RoundDriver`` (``FleetRounds``, one
of its bases), apart because it is an idea of its own: the rounds without a fleet never use it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from raysim.core.replies import float_numbers
from raysim.engine.sampling import sample_clients, sample_size
from raysim.federation import compression
from raysim.federation.fleet import Fleet
from raysim.scenario.config import Scenario, ScenarioError


class FleetRounds:
    """``RoundDriver``'s methods for the simulated fleet; they read and move the driver's clock
    and participation counts (the attributes below, set by ``RoundDriver.__init__``)."""

    sc: Scenario
    algo: Any
    source: Any
    fleet: Fleet | None
    train_ids: np.ndarray
    eval_ids: np.ndarray
    clock: float
    round_start: float
    participation: np.ndarray
    _n_train: dict[int, int]

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
