"""The systems side of a simulated fleet, on a virtual clock: device speeds and links,
availability, dropouts, deadlines and over-selection (the scenario's ``systems`` section).

Every client has a device profile: compute speed (training samples a second), download and
upload bandwidth (Mbit/s) and a one-way latency (s), drawn once per run from the scenario's
distributions or read from a trace file. A selected client's time in a round is

    t_k = latency + bytes_down / down  +  work_k / speed  +  latency + bytes_up / up

where ``work_k`` is the training samples it processes (``Algorithm.client_work``: E·n_k for
one model) and the bytes are what the server sends it and what it sends back. The server's
round starts at the clock's current value T; a client takes part only if it is available at T
(always, with a probability each round, or online in its window of a daily cycle or of a
trace), may drop out during the round (with a probability; the server hears nothing), and
with a deadline D only the clients that finish by T + D count. With over-selection the server
invites ⌈K·f⌉ clients and keeps the first K to report. The round then lasts until the last
kept reply arrives, or until the deadline where a client it waited for never reported, and the
clock moves on by that much.

Nothing here is real time: every draw comes from (seed, "systems", purpose, round), so a run
is identical for any number of hosts and whatever order they finish in, and the simulation
costs a few array operations a round on the driver.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass

import numpy as np

from raysim import rng
from raysim.errors import BadInput

MBIT = 1e6 / 8  # bytes a second in one Mbit/s
DAY = 86400.0
MAX_WAITS = 1000  # openings first_online tries (a window narrower than a float step at the clock's time never opens)


class TraceError(BadInput, ValueError):
    """A device or availability trace file that cannot be read (its message names file, line and column)."""


@dataclass(frozen=True)
class Profiles:
    """Every client's device: speed (samples/s), down and up (bytes/s), latency (s)."""

    speed: np.ndarray
    down: np.ndarray
    up: np.ndarray
    latency: np.ndarray

    def seconds(self, cids: np.ndarray, work: np.ndarray, bytes_down: np.ndarray, bytes_up: np.ndarray) -> np.ndarray:
        """Each client's time in a round: download, local work, upload (each link with its latency)."""
        return (
            2 * self.latency[cids] + bytes_down / self.down[cids] + self.compute(cids, work) + bytes_up / self.up[cids]
        )

    def compute(self, cids: np.ndarray, work: np.ndarray) -> np.ndarray:
        """The training part: ``work`` samples at each device's speed."""
        return work / self.speed[cids]


def draw(dist, n: int, g: np.random.Generator) -> np.ndarray:
    """n values of a ``systems`` distribution (``sections.DistCfg``)."""
    if dist.dist == "constant":
        return np.full(n, dist.value, dtype=np.float64)
    if dist.dist == "uniform":
        return g.uniform(dist.low, dist.high, n)
    # lognormal: the median is `value`, log-values have standard deviation `sigma`
    return dist.value * np.exp(dist.sigma * g.standard_normal(n))


def read_devices(path: str, clients: int) -> Profiles:
    """A device trace: CSV with a header ``client,speed,down_mbps,up_mbps,latency_s`` (any
    column order), one row per client 0..N−1 (speed in training samples a second). Clients
    missing from the file and a client's second row are errors; rows for ids N and above are
    ignored (a trace of a larger fleet serves a smaller one)."""
    cols = ("speed", "down_mbps", "up_mbps", "latency_s")
    out = {c: np.full(clients, np.nan) for c in cols}
    first = np.zeros(clients, dtype=np.int64)  # each client's row's line (0: none yet)
    for line, row in _rows(path, ("client",) + cols):
        cid = _client(path, line, row["client"])
        if cid < clients:
            if first[cid]:
                raise TraceError(
                    f"{path}: line {line}: a second row for client {cid} (the first is line "
                    f"{first[cid]}); give one row a client"
                )
            first[cid] = line
            for c in cols:
                v = _number(path, line, c, row[c])
                if v < 0 or (v == 0 and c != "latency_s"):
                    raise TraceError(f"{path}: line {line}: {c}: {v} must be {'≥' if c == 'latency_s' else '>'} 0")
                out[c][cid] = v
    missing = np.flatnonzero(np.isnan(out["speed"]))
    if len(missing):
        raise TraceError(
            f"{path}: no row for client {int(missing[0])} ({len(missing)} of the {clients} clients missing)"
        )
    return Profiles(out["speed"], out["down_mbps"] * MBIT, out["up_mbps"] * MBIT, out["latency_s"])


@dataclass(frozen=True)
class Windows:
    """An availability trace: each client's online intervals (sorted by start) and the period
    its trace repeats with (inf: it plays once)."""

    intervals: list[list[tuple[float, float]]]
    period: np.ndarray

    def openings(self) -> list[list[float]]:
        """Each client's times into its period at which a window opens, ascending: of its
        windows those that can open at all (start before the period, end after 0), a start
        before 0 as 0. A client with none is never online."""
        return [
            sorted(max(a, 0.0) for a, b in w if a < p and b > 0) for w, p in zip(self.intervals, self.period.tolist())
        ]


def read_windows(path: str, clients: int, period_s: float | None = None) -> Windows:
    """An availability trace: CSV with a header ``client,start_s,end_s`` and optionally
    ``period_s``: the intervals of virtual seconds in which each client is online (several
    rows a client allowed; a client without rows is never online; rows for ids N and above are
    ignored). The trace repeats every ``period_s`` (None: it plays once), or with a client's own
    period where its rows give one (FedScale's traces repeat with each client's
    ``finish_time``); one client's rows must agree on it. Where the trace repeats, a window
    must start before its period (one starting later would never open)."""
    out: list[list[tuple[float, float]]] = [[] for _ in range(clients)]
    period = np.full(clients, math.inf if period_s is None else float(period_s))
    given: dict[int, tuple[int, float | None]] = {}  # client: (its first line, its period_s there)
    for line, row in _rows(path, ("client", "start_s", "end_s"), ("period_s",)):
        cid = _client(path, line, row["client"])
        a, b = _number(path, line, "start_s", row["start_s"]), _number(path, line, "end_s", row["end_s"])
        if b <= a:
            raise TraceError(f"{path}: line {line}: end_s {b} must be > start_s {a}")
        own = _number(path, line, "period_s", row["period_s"]) if row.get("period_s") else None
        if own is not None and own <= 0:
            raise TraceError(f"{path}: line {line}: period_s: {own} must be > 0")
        first = given.setdefault(cid, (line, own))
        if first[1] != own:
            raise TraceError(
                f"{path}: line {line}: period_s {_or_none(own)} for client {cid}, but line {first[0]} "
                f"gives it {_or_none(first[1])}; a client's trace repeats with one period"
            )
        p = own if own is not None else period_s
        if period_s is not None and a >= p:
            where = "its period_s" if own is not None else "systems.period_s"
            raise TraceError(
                f"{path}: line {line}: start_s {a:g} is not before the period {p:g} s the trace repeats "
                f"with ({where}), so this window never opens; give start_s within the period"
            )
        if cid < clients:
            out[cid].append((a, b))
            if period_s is not None and own is not None:
                period[cid] = own
    return Windows([sorted(w) for w in out], period)


def _or_none(value: float | None) -> str:
    return "none" if value is None else str(value)


def _rows(path: str, need: tuple[str, ...], optional: tuple[str, ...] = ()):
    """A CSV trace's rows, one at a time (a trace of a million rows is never held whole), as
    (line, {column: text}) for the columns ``need``, which the header must have, and those of
    ``optional`` it has; a UTF-8 byte-order mark before the header (spreadsheets write one) is
    skipped, and blank lines too."""
    reader = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            lack = [c for c in need if c not in header]
            if lack:
                raise TraceError(f"{path}: the header lacks column '{lack[0]}'; it needs {', '.join(need)}")
            cols = [(c, header.index(c)) for c in need + tuple(c for c in optional if c in header)]
            for row in reader:
                if row:
                    yield reader.line_num, {c: row[i].strip() if i < len(row) else "" for c, i in cols}
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text (CSV) file") from None
    except csv.Error as e:  # e.g. a field past csv's limit of 128 KiB
        raise TraceError(f"{path}: line {reader.line_num}: not a CSV row raysim can read ({e})") from None


def _client(path: str, line: int, text: str) -> int:
    """A row's client id: a whole number, at least 0."""
    cid = _number(path, line, "client", text, integer=True)
    if cid < 0:
        raise TraceError(f"{path}: line {line}: client: {cid} is negative; client ids run from 0 to N-1")
    return cid


def _number(path: str, line: int, col: str, text: str, integer: bool = False):
    try:
        v = float(text)
    except ValueError:
        raise TraceError(f"{path}: line {line}: {col}: {text!r} is not a number") from None
    if not math.isfinite(v) or (integer and not v.is_integer()):
        raise TraceError(
            f"{path}: line {line}: {col}: {text!r} is not {'an integer' if integer else 'a finite number'}"
        )
    return int(v) if integer else v


class Fleet:
    """A run's fleet: the profiles, availability and the clock's rules (``sc.systems``)."""

    def __init__(self, cfg, clients: int, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.clients = clients
        if cfg.device_trace:
            self.profiles = read_devices(cfg.device_trace, clients)
        else:
            g = rng.generator(seed, "systems", "devices")
            self.profiles = Profiles(
                draw(cfg.speed, clients, g),
                draw(cfg.down, clients, g) * MBIT,
                draw(cfg.up, clients, g) * MBIT,
                draw(cfg.latency, clients, g),
            )
        self.windows = None
        if cfg.availability == "trace":  # each client's intervals, and the period they repeat with
            trace = read_windows(cfg.availability_trace, clients, cfg.period_s if cfg.trace_repeats else None)
            self.windows, self.period = trace.intervals, trace.period
            self.starts = trace.openings()
        elif cfg.availability == "diurnal":  # an online window of online·period at a seeded phase
            self.phase = rng.generator(seed, "systems", "phase").uniform(0.0, cfg.period_s, clients)

    def available(self, cids: np.ndarray, t: float, round_: int) -> np.ndarray:
        """Which of ``cids`` are online at virtual time ``t`` (a boolean mask)."""
        kind = self.cfg.availability
        if kind == "always":
            return np.ones(len(cids), dtype=bool)
        if kind == "probability":
            u = rng.generator(self.seed, "systems", "available", round_).random(self.clients)
            return u[cids] < self.cfg.available_p
        if kind == "diurnal":
            return ((t - self.phase[cids]) % self.cfg.period_s) < self.cfg.online * self.cfg.period_s
        into = (t % self.period[cids]).tolist()  # the time into each client's own period
        return np.array([any(a <= x < b for a, b in self.windows[c]) for c, x in zip(cids.tolist(), into)], dtype=bool)

    def online_until(self, cids: np.ndarray, t: float) -> np.ndarray:
        """When each of ``cids`` (online at ``t``) goes offline: inf where it stays on."""
        kind = self.cfg.availability
        if kind == "diurnal":
            p = self.cfg.period_s
            into = (t - self.phase[cids]) % p
            return t + self.cfg.online * p - into
        if kind == "trace":
            into = t % self.period[cids]
            out = np.full(len(cids), np.inf)
            for i, (c, x, p) in enumerate(zip(cids.tolist(), into.tolist(), self.period[cids].tolist())):
                for a, b in self.windows[c]:
                    if a <= x < b:
                        out[i] = t - x + min(b, p)  # (a window past its period closes with it)
                        break
            return out
        return np.full(len(cids), np.inf)

    def next_online(self, cids: np.ndarray, t: float) -> float:
        """The first time after ``t`` at which one of ``cids`` comes online (inf: never; for
        availability by probability, ``t``: the next server step draws again)."""
        kind = self.cfg.availability
        if kind in ("always", "probability"):
            return t
        if not len(cids):
            return math.inf
        if kind == "diurnal":
            return t + float(((self.phase[cids] - t) % self.cfg.period_s).min())
        best = math.inf
        for c in cids.tolist():
            starts, p = self.starts[c], float(self.period[c])
            if starts:
                x = t % p  # the time into its period
                i = bisect.bisect_right(starts, x)
                best = min(best, t - x + (starts[i] if i < len(starts) else p + starts[0]))
        return best

    def first_online(self, cids: np.ndarray, t: float, round_: int) -> float:
        """The first time from ``t`` on at which one of ``cids`` is online: ``t`` where one is
        (and for availability by probability, whose next draw decides); inf where none ever
        will be (no window at all, or a trace played once and over)."""
        if self.cfg.availability in ("always", "probability"):
            return t
        for _ in range(MAX_WAITS):
            if self.available(cids, t, round_).any():
                return t
            # on to the next opening, and by one float step at least (a window's start plus its
            # period's multiple may round to just before the window)
            t = max(self.next_online(cids, t), float(np.nextafter(t, math.inf)))
            if t == math.inf:
                break
        return math.inf

    def staleness(self, tau: int) -> float:
        """s(τ), the weight of a reply τ server steps stale."""
        a, b = self.cfg.staleness_a, self.cfg.staleness_b
        if self.cfg.staleness == "polynomial":
            return float((1.0 + tau) ** -a)
        if self.cfg.staleness == "hinge":
            return 1.0 if tau <= b else float(1.0 / (a * (tau - b) + 1.0))
        return 1.0

    def invite(self, k: int) -> int:
        """How many clients to invite for K wanted (over-selection: ⌈K·f⌉)."""
        return int(math.ceil(k * self.cfg.over_selection - 1e-9))

    def round(
        self, round_: int, t: float, cids: np.ndarray, wanted: int, secs: np.ndarray, compute: np.ndarray | None = None
    ) -> Outcome:
        """The round starting at virtual time ``t`` with the selected ``cids`` (ascending), each
        needing ``secs`` (``Profiles.seconds``; ``compute`` of them training), of which the server
        wants ``wanted`` replies: who reports in time, with what share of its work, and how long
        the round lasts."""
        n = len(cids)
        secs = np.asarray(secs, dtype=np.float64).copy()
        g = rng.generator(self.seed, "systems", "dropout", round_)
        dropped = g.random(n) < self.cfg.dropout
        deadline = self.cfg.deadline_s
        work = np.ones(n)
        if deadline is not None and self.cfg.stragglers == "partial" and compute is not None:
            comm = secs - compute  # a straggler trains what fits after its transfers
            over = (secs > deadline) & (deadline > comm) & (compute > 0)
            work[over] = (deadline - comm[over]) / compute[over]
            secs[over] = deadline
        finish = t + secs
        offline = finish > self.online_until(cids, t)  # went offline before reporting
        failed = dropped | offline
        late = ~failed & (secs > deadline) if deadline is not None else np.zeros(n, dtype=bool)
        ok = ~failed & ~late
        order = np.lexsort((cids, finish))  # first to report first (ties: lower id)
        kept = np.zeros(n, dtype=bool)
        kept[[i for i in order.tolist() if ok[i]][:wanted]] = True
        if kept.sum() >= wanted and wanted > 0:  # the server stops at the wanted-th reply
            duration = float(secs[kept].max())
        elif (failed | late).any():  # it waited for someone who never came
            duration = float(deadline) if deadline is not None else float(secs[~late].max(initial=0.0))
        else:
            duration = float(secs[kept].max(initial=0.0))
        return Outcome(cids, secs, kept, dropped, offline & ~dropped, late, duration, work)


@dataclass
class Outcome:
    cids: np.ndarray
    seconds: np.ndarray  # each invited client's time for the whole round
    kept: np.ndarray  # its reply was used
    dropped: np.ndarray  # dropped out (the dropout probability)
    offline: np.ndarray  # went offline before it could report
    late: np.ndarray  # missed the deadline (a straggler)
    duration: float  # the round's virtual seconds
    work: np.ndarray | None = None  # the share of its steps each trains (below 1: a straggler's partial work)

    def record(self) -> dict[str, float]:
        partial = 0.0 if self.work is None else float((self.kept & (self.work < 1)).sum())
        return {
            "invited": float(len(self.cids)),
            "dropped_out": float(self.dropped.sum() + self.offline.sum()),
            "stragglers": float(self.late.sum()),
            "partial": partial,
            "round_virtual_s": self.duration,
        }
