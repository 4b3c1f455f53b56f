"""Plain data out of a pickle file, without unpickling (``literal``).

Unpickling runs whatever code a file names, so raysim never does it: ``literal`` reads a
pickle's opcodes (``pickletools``) as a small stack machine (``_Reader``) that builds only dicts,
lists, tuples, sets, strings, numbers, booleans and None, and refuses any opcode that would
import or call something. A file that holds objects is refused with the opcode named, and so is
one crafted to hang, exhaust memory or crash the reader (shared references that expand past
10^8 values, nesting past 32, tuple keys, an opcode adding to the wrong kind of container),
fast and in memory proportional to the file. ``traces`` reads FedScale's traces with it.
"""

from __future__ import annotations

import pickletools
import sys
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
    """``literal``'s stack machine over one pickle's opcodes. ``read`` runs the commonest ones
    itself (scalars, the memo's, MARK) and hands each of the others to the handler of its kind
    (``_HANDLERS``: those that take the values above the last MARK, those that take the top
    few values, the empty containers, the constants, ...); an opcode with no handler is
    refused. ``stack`` holds the values built so far, ``marks`` the stacks below each MARK,
    ``made`` the size and depth of each container that holds containers (``_count``),
    ``changeable`` the ids of the dicts, lists and sets not yet put inside another; ``at()``
    says where the reader is, for the messages."""

    __slots__ = ("path", "stack", "marks", "memo", "made", "changeable", "at")

    def __init__(self, path: Path):
        self.path = path
        self.stack: list = []
        self.marks: list[list] = []  # the stacks below each MARK
        self.memo: dict = {}
        self.made: dict[int, list] = {}  # id of a container holding containers: [values, depth, container]
        self.changeable: set[int] = set()  # ids of the dicts, lists and sets not yet put inside another

    def read(self, data: bytes) -> object:
        """Run the opcodes until STOP; its value. A malformed pickle (too few values on the
        stack, a memo entry never stored, an opcode pickletools cannot read) is a TraceError."""
        stack, marks, memo, handlers = self.stack, self.marks, self.memo, _HANDLERS
        name, pos = "the first opcode", 0

        def at() -> str:
            return f"{self.path}: {name} at byte {pos}"

        self.at = at
        try:
            for op, arg, pos in pickletools.genops(data):
                name = op.name
                if name in _SCALAR_OPS:
                    stack.append(arg)
                elif name == "MEMOIZE":
                    memo[len(memo)] = stack[-1]
                elif name in _GETS:
                    stack.append(memo[arg])
                elif name == "MARK":
                    marks.append(stack)
                    self.stack = stack = []
                elif (handler := handlers.get(name)) is not None:
                    handler(self, name, arg)
                    stack = self.stack  # (a handler may have taken the values above a mark)
                elif name == "STOP":
                    return self.stop()
                else:
                    raise TraceError(
                        f"{self.path}: opcode {name} at byte {pos} is not plain data (it would import, call "
                        f"or build an object); raysim reads only dicts, lists, numbers and strings "
                        f"from a pickle"
                    )
        except IndexError:
            raise TraceError(f"{at()}: a malformed pickle (too few values on the stack)") from None
        except KeyError:
            raise TraceError(f"{at()}: a malformed pickle (it reads a memo entry never stored)") from None
        except ValueError as e:  # pickletools' own messages quote the file's bytes: not repeated
            if isinstance(e, TraceError):
                raise
            raise TraceError(
                f"{self.path}: not a readable pickle (an opcode or its argument after byte {pos} is "
                f"unknown, malformed or cut short)"
            ) from None
        raise TraceError(f"{self.path}: a malformed pickle (no STOP)")

    def stop(self) -> object:
        """STOP: the one value left, where no mark is."""
        if self.marks or len(self.stack) != 1:
            raise TraceError(
                f"{self.at()}: a malformed pickle ({len(self.stack)} values and {len(self.marks)} marks left at the end)"
            )
        return self.stack[0]

    # -- the handlers, a kind of opcode each (each takes the opcode's name and argument) -----
    def from_mark(self, name: str, arg) -> None:
        """The opcodes that take the values above the last MARK (the stack below it restored):
        APPENDS, SETITEMS and ADDITEMS add them to the container below; DICT, LIST, TUPLE and
        FROZENSET build one of them; POP_MARK drops them."""
        if not self.marks:
            raise TraceError(f"{self.at()}: a malformed pickle (no mark)")
        items, self.stack = self.stack, self.marks.pop()
        if name in _GROW:
            self.grow(name, items)
        elif name == "DICT":
            self.build(dict(_pairs(items, self.at)), items)
        elif name == "LIST":
            self.build(list(items), items)
        elif name == "TUPLE":
            self.build(tuple(items), items)
        elif name == "FROZENSET":
            self.build(frozenset(_keys(items, self.at)), items)

    def from_top(self, name: str, arg) -> None:
        """The opcodes that take the top values of the stack: APPEND (one) and SETITEM (two)
        add them to the container below; TUPLE1, TUPLE2 and TUPLE3 build a tuple of them."""
        k = 1 if name == "APPEND" else 2 if name == "SETITEM" else int(name[-1])
        if len(self.stack) < k:
            raise IndexError
        items = self.stack[-k:]
        del self.stack[-k:]
        if name in _GROW:
            self.grow(name, items)
        else:
            self.build(tuple(items), items)

    def empty_dict(self, name: str, arg) -> None:
        self.build({}, ())

    def empty_list(self, name: str, arg) -> None:
        self.build([], ())

    def empty_tuple(self, name: str, arg) -> None:
        self.build((), ())

    def empty_set(self, name: str, arg) -> None:
        self.build(set(), ())

    def constant(self, name: str, arg) -> None:
        """NONE, NEWTRUE, NEWFALSE."""
        self.stack.append(None if name == "NONE" else name == "NEWTRUE")

    def put(self, name: str, arg) -> None:
        """PUT, BINPUT, LONG_BINPUT: the top value into the memo, at ``arg``."""
        self.memo[arg] = self.stack[-1]

    def pop(self, name: str, arg) -> None:
        self.stack.pop()

    def dup(self, name: str, arg) -> None:
        self.stack.append(self.stack[-1])

    def framing(self, name: str, arg) -> None:
        """PROTO, FRAME: nothing to build."""

    # -- containers --------------------------------------------------------------------------
    def build(self, container, items) -> None:
        """Push a new container holding items (already in it)."""
        _count(self.made, self.changeable, container, items, self.at, fresh=True)
        if type(container) in _CHANGEABLE:
            self.changeable.add(id(container))
        self.stack.append(container)

    def grow(self, name: str, items) -> None:
        """Add items to the container below them (APPEND, SETITEM, ADDITEMS and their batches)."""
        kind = _GROW[name]
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


_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_HANDLERS = {
    **dict.fromkeys(
        ("APPENDS", "SETITEMS", "ADDITEMS", "DICT", "LIST", "TUPLE", "FROZENSET", "POP_MARK"), _Reader.from_mark
    ),
    **dict.fromkeys(("APPEND", "SETITEM", "TUPLE1", "TUPLE2", "TUPLE3"), _Reader.from_top),
    "EMPTY_DICT": _Reader.empty_dict,
    "EMPTY_LIST": _Reader.empty_list,
    "EMPTY_TUPLE": _Reader.empty_tuple,
    "EMPTY_SET": _Reader.empty_set,
    **dict.fromkeys(("NONE", "NEWTRUE", "NEWFALSE"), _Reader.constant),
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), _Reader.put),
    "POP": _Reader.pop,
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
