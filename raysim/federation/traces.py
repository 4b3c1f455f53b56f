"""FedScale's device and availability traces into raysim's CSV traces, without unpickling.

FedScale (Lai et al., "FedScale: Benchmarking Model and System Performance of Federated
Learning at Scale", ICML 2022) publishes its traces as Python pickles: ``client_device_capacity``
maps a client id to ``{'computation': ms per sample, 'communication': kbit/s}``, and
``client_behave_trace`` maps a client id to ``{'active': [s, ...], 'inactive': [s, ...],
'finish_time': s, ...}``. Unpickling runs whatever code a file names, so raysim never does it:
``literal`` reads a pickle's opcodes (``pickletools``) as a small stack machine that builds only
dicts, lists, tuples, sets, strings, numbers, booleans and None, and refuses any opcode that
would import or call something. The two traces are plain data, so they read; a file that holds
objects is refused with the opcode named, and so is one crafted to hang, exhaust memory or crash
the reader (shared references that expand past 10^8 values, nesting past 32, tuple keys, an
opcode adding to the wrong kind of container), fast and in memory proportional to the file.

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
import pickletools
import reprlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from raysim.federation.fleet import TraceError

_MAX_NODES = 100_000_000  # values in one built object, each shared reference counted in full
_MAX_DEPTH = 32  # containers inside containers (FedScale's traces nest 3 deep)
_HASH_MODULUS = sys.hash_info.modulus
_KEY_TYPES = frozenset({str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
_CHANGEABLE = frozenset({dict, list, set})
_SCALAR_OPS = frozenset(
    {
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
    }
)
_GROW = {"APPEND": list, "APPENDS": list, "SETITEM": dict, "SETITEMS": dict, "ADDITEMS": set}


def literal(path: str | Path) -> object:
    """The plain data a pickle file holds (dicts, lists, tuples, sets, str, bytes, int, float,
    bool, None), read from its opcodes without unpickling; TraceError naming the first opcode
    that is not plain data (an import, a call, an object's state).

    A crafted file must not hang, exhaust memory or crash the reader or the code that walks what
    it returns, so every built container carries its size with each shared (memoized) reference
    counted in full, and its depth: more than 100 million values in one object (FedScale's traces
    hold a few million: 500 000 clients, each a small dict or a few short lists of floats) or
    containers nested more than 32 deep (FedScale's nest 3) are refused. Dict keys and set items
    must be str, int, float, bool, None or bytes (a tuple key would be hashed through every
    shared path; an int key beyond ±2^61 could collide with any number of others), a container
    can be changed only before it is put inside another (which rules out cycles and makes the
    sizes exact), and each opcode that adds to a container checks its type. Messages name the
    opcode, its byte offset and types, never the file's data."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    return _Reader(path).read(data)


class _Reader:
    """``literal``'s stack machine over one pickle's opcodes: a handler per opcode it reads
    (``_HANDLERS``), the others refused. The stack holds the values built so far; ``marks``
    the stacks below each MARK; ``made`` the size and depth of each container that holds
    containers (``_count``); ``changeable`` the ids of the dicts, lists and sets not yet put
    inside another."""

    def __init__(self, path: Path):
        self.path = path
        self.stack: list = []
        self.marks: list[list] = []  # the stacks below each MARK
        self.memo: dict = {}
        self.made: dict[int, list] = {}  # id of a container holding containers: [values, depth, container]
        self.changeable: set[int] = set()  # ids of the dicts, lists and sets not yet put inside another
        self.name, self.pos = "the first opcode", 0

    def read(self, data: bytes) -> object:
        """Run the opcodes until STOP; its value. A malformed pickle (too few values on the
        stack, a memo entry never stored, an opcode pickletools cannot read) is a TraceError."""
        handlers = _HANDLERS
        try:
            for op, arg, self.pos in pickletools.genops(data):
                self.name = name = op.name
                if name in _SCALAR_OPS:
                    self.stack.append(arg)
                elif name == "STOP":
                    return self.stop()
                else:
                    handlers.get(name, _Reader.refuse)(self, arg)
        except IndexError:
            raise TraceError(f"{self.at()}: a malformed pickle (too few values on the stack)") from None
        except KeyError:
            raise TraceError(f"{self.at()}: a malformed pickle (it reads a memo entry never stored)") from None
        except ValueError as e:  # pickletools' own messages quote the file's bytes: not repeated
            if isinstance(e, TraceError):
                raise
            raise TraceError(
                f"{self.path}: not a readable pickle (an opcode or its argument after byte {self.pos} is "
                f"unknown, malformed or cut short)"
            ) from None
        raise TraceError(f"{self.path}: a malformed pickle (no STOP)")

    def at(self) -> str:
        return f"{self.path}: {self.name} at byte {self.pos}"

    # -- the stack ---------------------------------------------------------------------------
    def pop_mark(self) -> list:
        """The values above the last MARK (the stack below it restored)."""
        if not self.marks:
            raise TraceError(f"{self.at()}: a malformed pickle (no mark)")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def pop_top(self, k: int) -> list:
        """The top ``k`` values of the stack."""
        if len(self.stack) < k:
            raise IndexError
        items = self.stack[-k:]
        del self.stack[-k:]
        return items

    # -- containers --------------------------------------------------------------------------
    def build(self, container, items) -> None:
        """Push a new container holding items (already in it)."""
        _count(self.made, self.changeable, container, items, self.at, fresh=True)
        if type(container) in _CHANGEABLE:
            self.changeable.add(id(container))
        self.stack.append(container)

    def grow(self, items) -> None:
        """Add items to the container below them (APPEND, SETITEM, ADDITEMS and their batches)."""
        kind = _GROW[self.name]
        if not self.stack:
            raise TraceError(f"{self.at()}: a malformed pickle (no container to add to)")
        target = self.stack[-1]
        if type(target) is not kind:
            raise TraceError(f"{self.at()} adds to a {type(target).__name__}; it adds only to a {kind.__name__}")
        if id(target) not in self.changeable:
            raise TraceError(
                f"{self.at()} changes a {kind.__name__} already inside another container "
                f"(a cycle, or a shared value changed after it was used)"
            )
        pairs = _pairs(items, self.at) if kind is dict else _keys(items, self.at) if kind is set else None
        _count(self.made, self.changeable, target, items, self.at, fresh=False)
        if id(target) not in self.changeable:
            raise TraceError(f"{self.at()} puts a {kind.__name__} inside itself (a cycle)")
        if kind is list:
            target.extend(items)
        else:
            target.update(pairs)

    # -- the opcodes (each handler takes the opcode's argument) ------------------------------
    def memoize(self, arg) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def get(self, arg) -> None:
        self.stack.append(self.memo[arg])

    def put(self, arg) -> None:
        self.memo[arg] = self.stack[-1]

    def mark(self, arg) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def grow_by_batch(self, arg) -> None:
        self.grow(self.pop_mark())

    def grow_by_one(self, arg) -> None:
        self.grow(self.pop_top(2 if self.name == "SETITEM" else 1))

    def empty_dict(self, arg) -> None:
        self.build({}, ())

    def empty_list(self, arg) -> None:
        self.build([], ())

    def empty_tuple(self, arg) -> None:
        self.build((), ())

    def empty_set(self, arg) -> None:
        self.build(set(), ())

    def dict_(self, arg) -> None:
        items = self.pop_mark()
        self.build(dict(_pairs(items, self.at)), items)

    def list_(self, arg) -> None:
        items = self.pop_mark()
        self.build(list(items), items)

    def tuple_(self, arg) -> None:
        items = self.pop_mark()
        self.build(tuple(items), items)

    def frozenset_(self, arg) -> None:
        items = self.pop_mark()
        self.build(frozenset(_keys(items, self.at)), items)

    def small_tuple(self, arg) -> None:
        items = self.pop_top(int(self.name[-1]))
        self.build(tuple(items), items)

    def none(self, arg) -> None:
        self.stack.append(None)

    def boolean(self, arg) -> None:
        self.stack.append(self.name == "NEWTRUE")

    def pop(self, arg) -> None:
        self.stack.pop()

    def pop_to_mark(self, arg) -> None:
        self.pop_mark()

    def dup(self, arg) -> None:
        self.stack.append(self.stack[-1])

    def framing(self, arg) -> None:
        """PROTO, FRAME: nothing to build."""

    def stop(self) -> object:
        """STOP: the one value left, where no mark is."""
        if self.marks or len(self.stack) != 1:
            raise TraceError(
                f"{self.at()}: a malformed pickle ({len(self.stack)} values and {len(self.marks)} marks left at the end)"
            )
        return self.stack[0]

    def refuse(self, arg) -> None:
        """Any other opcode: an import, a call, an object's state."""
        raise TraceError(
            f"{self.path}: opcode {self.name} at byte {self.pos} is not plain data (it would import, call "
            f"or build an object); raysim reads only dicts, lists, numbers and strings "
            f"from a pickle"
        )


_HANDLERS = {
    "MEMOIZE": _Reader.memoize,
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), _Reader.get),
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), _Reader.put),
    "MARK": _Reader.mark,
    **dict.fromkeys(("APPENDS", "SETITEMS", "ADDITEMS"), _Reader.grow_by_batch),
    **dict.fromkeys(("APPEND", "SETITEM"), _Reader.grow_by_one),
    "EMPTY_DICT": _Reader.empty_dict,
    "EMPTY_LIST": _Reader.empty_list,
    "EMPTY_TUPLE": _Reader.empty_tuple,
    "EMPTY_SET": _Reader.empty_set,
    "DICT": _Reader.dict_,
    "LIST": _Reader.list_,
    "TUPLE": _Reader.tuple_,
    "FROZENSET": _Reader.frozenset_,
    **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _Reader.small_tuple),
    "NONE": _Reader.none,
    **dict.fromkeys(("NEWTRUE", "NEWFALSE"), _Reader.boolean),
    "POP": _Reader.pop,
    "POP_MARK": _Reader.pop_to_mark,
    "DUP": _Reader.dup,
    **dict.fromkeys(("PROTO", "FRAME"), _Reader.framing),
}


def _count(made: dict, changeable: set, container, items, at, fresh: bool) -> None:
    """Count items into a container's size (its values, each shared container counted in full)
    and depth, and make the containers among them unchangeable from now on; TraceError past the
    caps. A container that holds only scalars needs no record: its size follows from its length
    (and every container with a record is kept alive in it, so ids are never reused)."""
    values, depth = len(items), 0
    for x in items:
        kind = type(x)
        if kind in _CONTAINERS:
            inner = made.get(id(x))
            if inner is None:
                values += (2 if kind is dict else 1) * len(x)
                depth = depth or 1
            else:
                values += inner[0] - 1
                depth = max(depth, inner[1])
            changeable.discard(id(x))
    record = made.get(id(container))
    if record is None:
        record = [1 if fresh else 1 + (2 if type(container) is dict else 1) * len(container), 1, container]
        if depth:  # (one holding only scalars has none)
            made[id(container)] = record
    record[0] += values
    record[1] = max(record[1], depth + 1)
    if record[0] > _MAX_NODES:
        raise TraceError(
            f"{at()} builds a {type(container).__name__} of more than {_MAX_NODES:,} values "
            f"(each shared reference counted in full); a FedScale trace holds a few million"
        )
    if record[1] > _MAX_DEPTH:
        raise TraceError(f"{at()} nests containers more than {_MAX_DEPTH} deep (a FedScale trace nests 3)")


def _pairs(items: list, at) -> zip:
    """Key, value pairs of a DICT or SETITEMS batch, its keys checked."""
    if len(items) % 2:
        raise TraceError(f"{at()}: a malformed pickle (a key without a value)")
    keys = items[::2]
    _keys(keys, at)
    return zip(keys, items[1::2])


def _keys(keys: list, at) -> list:
    """Dict keys or set items: scalars only, ints within hash's range (see ``literal``)."""
    for k in keys:
        kind = type(k)
        if kind not in _KEY_TYPES:
            raise TraceError(
                f"{at()}: a dict key or set item is a {kind.__name__}; only str, int, float, bool, "
                f"None or bytes are read"
            )
        if kind is int and not -_HASH_MODULUS < k < _HASH_MODULUS:
            raise TraceError(f"{at()}: an int dict key or set item beyond ±2^61 (a client id is far smaller)")
    return keys


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
