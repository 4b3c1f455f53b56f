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
(``systems.availability_trace``) for raysim's clients 0..N−1, taken from the traces' clients in
ascending id order.
"""
from __future__ import annotations

import csv
import pickletools
import sys
from pathlib import Path

from raysim.systems import TraceError

_MAX_NODES = 100_000_000      # values in one built object, each shared reference counted in full
_MAX_DEPTH = 32               # containers inside containers (FedScale's traces nest 3 deep)
_HASH_MODULUS = sys.hash_info.modulus
_KEY_TYPES = frozenset({str, int, float, bool, type(None), bytes})
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})
_CHANGEABLE = frozenset({dict, list, set})
_SCALAR_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                         "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
                         "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
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
    stack: list = []
    marks: list[list] = []                 # the stacks below each MARK
    memo: dict = {}
    made: dict[int, list] = {}             # id of a container holding containers: [values, depth, container]
    changeable: set[int] = set()           # ids of the dicts, lists and sets not yet put inside another
    name, pos = "the first opcode", 0

    def at() -> str:
        return f"{path}: {name} at byte {pos}"

    def pop_mark() -> list:
        nonlocal stack
        if not marks:
            raise TraceError(f"{at()}: a malformed pickle (no mark)")
        items, stack = stack, marks.pop()
        return items

    def pop_top(k: int) -> list:
        if len(stack) < k:
            raise IndexError
        items = stack[-k:]
        del stack[-k:]
        return items

    def build(container, items) -> None:
        """Push a new container holding items (already in it)."""
        _count(made, changeable, container, items, at, fresh=True)
        if type(container) in _CHANGEABLE:
            changeable.add(id(container))
        stack.append(container)

    def grow(items) -> None:
        """Add items to the container below them (APPEND, SETITEM, ADDITEMS and their batches)."""
        kind = _GROW[name]
        if not stack:
            raise TraceError(f"{at()}: a malformed pickle (no container to add to)")
        target = stack[-1]
        if type(target) is not kind:
            raise TraceError(f"{at()} adds to a {type(target).__name__}; it adds only to a {kind.__name__}")
        if id(target) not in changeable:
            raise TraceError(f"{at()} changes a {kind.__name__} already inside another container "
                             f"(a cycle, or a shared value changed after it was used)")
        pairs = _pairs(items, at) if kind is dict else _keys(items, at) if kind is set else None
        _count(made, changeable, target, items, at, fresh=False)
        if id(target) not in changeable:
            raise TraceError(f"{at()} puts a {kind.__name__} inside itself (a cycle)")
        if kind is list:
            target.extend(items)
        else:
            target.update(pairs)

    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name in _SCALAR_OPS:
                stack.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
                grow(pop_mark())
            elif name in ("APPEND", "SETITEM"):
                grow(pop_top(2 if name == "SETITEM" else 1))
            elif name == "EMPTY_DICT":
                build({}, ())
            elif name == "EMPTY_LIST":
                build([], ())
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name in ("PROTO", "FRAME"):
                continue
            elif name == "STOP":
                if marks or len(stack) != 1:
                    raise TraceError(f"{at()}: a malformed pickle ({len(stack)} values and {len(marks)} marks "
                                     f"left at the end)")
                return stack[0]
            elif name == "EMPTY_TUPLE":
                build((), ())
            elif name == "EMPTY_SET":
                build(set(), ())
            elif name == "DICT":
                items = pop_mark()
                build(dict(_pairs(items, at)), items)
            elif name == "LIST":
                items = pop_mark()
                build(list(items), items)
            elif name == "TUPLE":
                items = pop_mark()
                build(tuple(items), items)
            elif name == "FROZENSET":
                items = pop_mark()
                build(frozenset(_keys(items, at)), items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                items = pop_top(int(name[-1]))
                build(tuple(items), items)
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name == "POP":
                stack.pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            else:
                raise TraceError(f"{path}: opcode {name} at byte {pos} is not plain data (it would import, call "
                                 f"or build an object); raysim reads only dicts, lists, numbers and strings "
                                 f"from a pickle")
    except IndexError:
        raise TraceError(f"{at()}: a malformed pickle (too few values on the stack)") from None
    except KeyError:
        raise TraceError(f"{at()}: a malformed pickle (it reads a memo entry never stored)") from None
    except ValueError as e:                # pickletools' own messages quote the file's bytes: not repeated
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"{path}: not a readable pickle (an opcode or its argument after byte {pos} is "
                         f"unknown, malformed or cut short)") from None
    raise TraceError(f"{path}: a malformed pickle (no STOP)")


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
        if depth:                          # (one holding only scalars has none)
            made[id(container)] = record
    record[0] += values
    record[1] = max(record[1], depth + 1)
    if record[0] > _MAX_NODES:
        raise TraceError(f"{at()} builds a {type(container).__name__} of more than {_MAX_NODES:,} values "
                         f"(each shared reference counted in full); a FedScale trace holds a few million")
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
            raise TraceError(f"{at()}: a dict key or set item is a {kind.__name__}; only str, int, float, bool, "
                             f"None or bytes are read")
        if kind is int and not -_HASH_MODULUS < k < _HASH_MODULUS:
            raise TraceError(f"{at()}: an int dict key or set item beyond ±2^61 (a client id is far smaller)")
    return keys


def _clients(trace: object, path: Path, clients: int) -> list:
    if not isinstance(trace, dict) or not trace:
        raise TraceError(f"{path}: expected a mapping of client id to its record, got {type(trace).__name__}")
    keys = sorted(trace, key=lambda k: (not isinstance(k, (int, float)), k if isinstance(k, (int, float)) else str(k)))
    if len(keys) < clients:
        raise TraceError(f"{path}: {len(keys)} clients in the trace, fewer than the {clients} asked for")
    return keys[:clients]


def _id(key) -> str:
    """A client id for a message (``literal`` makes every key a scalar), a long one cut short."""
    if isinstance(key, (str, bytes)) and len(key) > 40:
        return f"{key[:40]!r}..."
    return repr(key) if type(key) in _KEY_TYPES else f"(a {type(key).__name__})"


def devices_csv(src: str | Path, out: str | Path, clients: int) -> int:
    """FedScale's ``client_device_capacity`` as raysim's device trace: speed = 1000 / (3 ×
    computation) training samples a second (FedScale charges a sample's forward and backward
    pass three times its ``computation`` milliseconds), down = up = communication / 1000 Mbit/s,
    no latency. Returns the rows written."""
    src = Path(src)
    trace = literal(src)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client", "speed", "down_mbps", "up_mbps", "latency_s"])
        for cid, key in enumerate(_clients(trace, src, clients)):
            rec = trace[key]
            try:
                comp, comm = float(rec["computation"]), float(rec["communication"])
            except (TypeError, KeyError, ValueError, OverflowError):
                raise TraceError(f"{src}: client {_id(key)}: expected {{'computation': ms, 'communication': "
                                 f"kbit/s}}, got a {type(rec).__name__}") from None
            if comp <= 0 or comm <= 0:
                raise TraceError(f"{src}: client {_id(key)}: computation and communication must be above 0")
            w.writerow([cid, repr(1000.0 / (3.0 * comp)), repr(comm / 1000.0), repr(comm / 1000.0), 0])
    return clients


def windows_csv(src: str | Path, out: str | Path, clients: int) -> int:
    """FedScale's ``client_behave_trace`` as raysim's availability trace: each ``active[i]``
    paired with the next ``inactive`` time after it (or ``finish_time``) as an interval in
    which the client is online. Returns the intervals written."""
    src = Path(src)
    trace = literal(src)
    rows = 0
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client", "start_s", "end_s"])
        for cid, key in enumerate(_clients(trace, src, clients)):
            rec = trace[key]
            try:
                active = sorted(float(t) for t in rec["active"])
                inactive = sorted(float(t) for t in rec["inactive"])
                finish = float(rec.get("finish_time", max(active + inactive, default=0.0)))
            except (TypeError, KeyError, ValueError, AttributeError, OverflowError):
                raise TraceError(f"{src}: client {_id(key)}: expected {{'active': [...], 'inactive': [...]}}") from None
            for a in active:
                end = next((b for b in inactive if b > a), finish)
                if end > a:
                    w.writerow([cid, repr(a), repr(end)])
                    rows += 1
    return rows
