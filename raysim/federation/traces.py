"""FedScale's device and availability traces into raysim's CSV traces, without unpickling.

FedScale (Lai et al., "FedScale: Benchmarking Model and System Performance of Federated
Learning at Scale", ICML 2022) publishes its traces as Python pickles: ``client_device_capacity``
maps a client id to ``{'computation': ms per sample, 'communication': kbit/s}``, and
``client_behave_trace`` maps a client id to ``{'active': [s, ...], 'inactive': [s, ...],
'finish_time': s, ...}``. Unpickling runs whatever code a file names, so raysim never does it:
``literal`` (``plain_pickle``) reads a pickle's opcodes (``pickletools``) as a small stack
machine that builds only dicts, lists, tuples, sets, strings, numbers, booleans and None, and
refuses any opcode that would import or call something. The two traces are plain data, so they
read; a file that holds objects is refused with the opcode named, and so is one crafted to hang,
exhaust memory or crash the reader (shared references that expand past 10^8 values, nesting past
32, tuple keys, an opcode adding to the wrong kind of container), fast and in memory
proportional to the file.

    raysim data fedscale --devices client_device_capacity --availability client_behave_trace \\
        --clients 1000 --out traces/

writes ``traces/devices.csv`` (``systems.device_trace``) and ``traces/windows.csv``
(``systems.availability_trace``, with each client's ``finish_time`` as its ``period_s``, the
period FedScale replays its trace with) for raysim's clients 0..N−1, taken from the traces'
clients in ascending id order.
"""

from __future__ import annotations

import csv
import math
import os
import reprlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from raysim.federation.fleet import TraceError
from raysim.federation.plain_pickle import literal


def _records(path: str | Path, clients: int) -> Iterator[tuple[int, object, object]]:
    """A FedScale trace's first ``clients`` records as (raysim's id, the trace's id, record),
    the trace's ids in ascending order (numbers first, then strings)."""
    path = Path(path)
    try:
        trace = literal(path)
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a trace") from None
    if not isinstance(trace, dict) or not trace:
        raise TraceError(f"{path}: expected a mapping of client id to its record, got {type(trace).__name__}")
    if len(trace) < clients:
        raise TraceError(f"{path}: {len(trace)} clients in the trace, fewer than the {clients} asked for")
    for key in trace:
        if isinstance(key, bool) or not isinstance(key, (int, float, str)) or key != key:
            raise TraceError(f"{path}: client id {_show(key)}: expected a number or a string")
    keys = sorted(trace, key=lambda k: (isinstance(k, str), k))
    for cid, key in enumerate(keys[:clients]):
        yield cid, key, trace[key]


def _number(path, key, what: str, value) -> float:
    """A record's number (an int or a float, not a bool) as a finite float; TraceError naming
    the client otherwise (raysim's own reader refuses what is not finite, so none is written)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{path}: client {_show(key)}: {what}: expected a number, got {_show(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise TraceError(
            f"{path}: client {_show(key)}: {what}: {_show(value)} is too large for a number of seconds or a rate"
        ) from None
    if not math.isfinite(v):
        raise TraceError(f"{path}: client {_show(key)}: {what}: {_show(value)} is not a finite number")
    return v


def _times(path, key, what: str, values) -> list[float]:
    """A record's list of times (seconds, at least 0), sorted."""
    if not isinstance(values, (list, tuple)):
        raise TraceError(f"{path}: client {_show(key)}: {what}: expected a list of seconds, got {_show(values)}")
    out = sorted(_number(path, key, what, v) for v in values)
    if out and out[0] < 0:
        raise TraceError(f"{path}: client {_show(key)}: {what}: {out[0]:g} s; times are at least 0")
    return out


class _Short(reprlib.Repr):
    """Values in an error message: nesting and length cut, a huge int by its size (``repr``
    of one past 4300 digits raises)."""

    def repr_int(self, x, level):
        return f"<an integer of {x.bit_length()} bits>" if x.bit_length() > 64 else repr(x)


_show = _Short().repr


def device_rows(src: str | Path, clients: int) -> Iterator[list]:
    """FedScale's ``client_device_capacity`` as the rows of raysim's device trace, its header
    first: speed = 1000 / (3 × computation) training samples a second (FedScale charges a
    sample's forward and backward pass three times its ``computation`` milliseconds), down = up
    = communication / 1000 Mbit/s, no latency."""
    yield ["client", "speed", "down_mbps", "up_mbps", "latency_s"]
    for cid, key, rec in _records(src, clients):
        if not isinstance(rec, dict) or "computation" not in rec or "communication" not in rec:
            raise TraceError(
                f"{src}: client {_show(key)}: expected {{'computation': ms, 'communication': kbit/s}}, got {_show(rec)}"
            )
        comp = _number(src, key, "computation", rec["computation"])
        comm = _number(src, key, "communication", rec["communication"])
        speed, mbps = 1000.0 / (3.0 * comp) if comp > 0 else 0.0, comm / 1000.0
        if not (0 < speed < math.inf and 0 < mbps < math.inf):
            raise TraceError(
                f"{src}: client {_show(key)}: computation {comp:g} ms and communication {comm:g} kbit/s "
                f"give {speed:g} samples/s and {mbps:g} Mbit/s; both must be finite and above 0"
            )
        yield [cid, repr(speed), repr(mbps), repr(mbps), 0]


def window_rows(src: str | Path, clients: int, own_period: bool = True) -> Iterator[list]:
    """FedScale's ``client_behave_trace`` as the rows of raysim's availability trace, its
    header first: each ``active`` time paired with the next ``inactive`` time after it (or
    ``finish_time``) as an interval in which the client is online. With ``own_period`` each
    row also carries the client's ``finish_time`` as its ``period_s``: FedScale replays a
    client's trace with that period (``norm_time = cur_time % finish_time`` in its
    ``ClientMetadata.is_active``), so an interval is cut at it and one starting after it, which
    FedScale never reaches, is left out."""
    yield ["client", "start_s", "end_s"] + (["period_s"] if own_period else [])
    for cid, key, rec in _records(src, clients):
        if not isinstance(rec, dict) or "active" not in rec or "inactive" not in rec:
            raise TraceError(
                f"{src}: client {_show(key)}: expected {{'active': [s, ...], 'inactive': [s, ...], "
                f"'finish_time': s}}, got {_show(rec)}"
            )
        active, inactive = _times(src, key, "active", rec["active"]), _times(src, key, "inactive", rec["inactive"])
        if "finish_time" in rec:
            finish = _number(src, key, "finish_time", rec["finish_time"])
            if finish <= 0:
                raise TraceError(f"{src}: client {_show(key)}: finish_time: {finish:g} must be above 0")
        else:
            finish = max(active[-1:] + inactive[-1:], default=0.0)
        for a, b in _intervals(active, inactive, finish, own_period):
            yield [cid, repr(a), repr(b)] + ([repr(finish)] if own_period else [])


def _intervals(active: list[float], inactive: list[float], finish: float, cut: bool) -> Iterator[tuple[float, float]]:
    """Each (sorted) active time with the first inactive time after it, else ``finish`` (with
    ``cut``, at most ``finish``): one pass over the two sorted lists."""
    j = 0
    for a in active:
        while j < len(inactive) and inactive[j] <= a:
            j += 1
        end = inactive[j] if j < len(inactive) else finish
        if cut:
            end = min(end, finish)
        if end > a:
            yield a, end


def write_tables(folder: str | Path, tables: dict[str, Iterable[list]]) -> dict[Path, int]:
    """Each table (a file name: its rows, header first) as a CSV in ``folder``, with the rows
    written after its header counted. Every table goes to a temporary file beside its target,
    and only when all of them are complete are they moved into place (``os.replace``): a
    refused input (a TraceError while the rows are made) leaves the folder as it was, the
    folder itself too where this made it."""
    folder = Path(folder)
    made = _make_folder(folder)
    parts: list[tuple[Path, Path]] = []
    counts: dict[Path, int] = {}
    try:
        for name, rows in tables.items():
            target = folder / name
            if target.exists() and not target.is_file():
                raise TraceError(f"{target}: exists and is not a file; raysim writes its {name} there")
            part = folder / f".{name}.{os.getpid()}.part"
            parts.append((part, target))
            with open(part, "w", newline="") as f:
                w = csv.writer(f)
                counts[target] = -1  # (the header)
                for row in rows:
                    w.writerow(row)
                    counts[target] += 1
        for part, target in parts:
            os.replace(part, target)
    except OSError as e:
        _discard(parts, made)
        raise TraceError(f"{folder}: cannot write the traces there ({e.strerror or e})") from None
    except BaseException:
        _discard(parts, made)
        raise
    return counts


def _make_folder(folder: Path) -> list[Path]:
    """Make ``folder`` (and its missing parents); the folders made, deepest first."""
    missing, p = [], folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise TraceError(f"{folder}: --out must be a folder, but {p} is a file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceError(f"{folder}: cannot make the folder ({e.strerror or e})") from None
    return missing


def _discard(parts: list[tuple[Path, Path]], made: list[Path]) -> None:
    """Remove the temporary files and the folders ``write_tables`` made."""
    for part, _ in parts:
        part.unlink(missing_ok=True)
    for d in made:
        try:
            d.rmdir()
        except OSError:
            break
