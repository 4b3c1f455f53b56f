"""Loading dataclasses from YAML mappings, with one-line errors naming the key.

Generic: any frozen dataclass whose fields are annotated with int, float, bool, str, tuple[...]
or unions with None, and whose ``metadata`` may give ``min``/``max`` (inclusive), ``gt``/``lt``
(strict) and ``choices``. Classes may also declare ``CHOICES``, ``POSITIVE`` and ``NONNEGATIVE``.

Numbers follow the field's type, not YAML's: YAML 1.1 reads ``1e-3`` (no dot, no exponent
sign) as a string, so a number field takes a string written as a number (ASCII digits only); an
integer field takes a float with an integral value. Beyond their own bounds, integers must fit
int64 (numpy's and torch's index type) and floats float32 (what the models compute in).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import types
import typing
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from raysim.errors import ScenarioError  # noqa: F401 - the scenario's error, raised and re-exported here
from raysim.rng import SEED  # noqa: F401 - the seeds' range, checked here

INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # int64
FLOAT_MAX = 3.4028234663852886e38  # float32's largest
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class Component:
    """A named component with its own options dataclass (dataset, model, algorithm, partition)."""

    name: str
    params: Any


class Ctx:
    def __init__(self, file: str):
        self.file = file

    def fail(self, path: str, msg: str) -> typing.NoReturn:
        raise ScenarioError(f"{self.file}: {path}: {msg}" if path else f"{self.file}: {msg}")


def _type_name(t) -> str:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(t))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(t)[0])}"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string", type(None): "null"}.get(
        t, getattr(t, "__name__", str(t))
    )


def coerce(ctx: Ctx, path: str, t, value):
    """Check ``value`` against the annotation ``t``; return it converted (int->float, list->tuple)."""
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(t)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(ctx, path, a, value)
            except ScenarioError:
                pass
        ctx.fail(path, f"{value!r} is not {_type_name(t)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            ctx.fail(path, f"{value!r} is not {_type_name(t)}")
        elem = typing.get_args(t)[0]
        return tuple(coerce(ctx, f"{path}[{i}]", elem, v) for i, v in enumerate(value))
    if t is bool:
        if not isinstance(value, bool):
            ctx.fail(path, f"{value!r} is not true/false")
        return value
    if t in (int, float):
        number = value
        if isinstance(value, str) and _NUMBER.fullmatch(value):
            number = int(value) if value.lstrip("+-").isdigit() else float(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            ctx.fail(path, f"{value!r} is not {_type_name(t)}")
        if isinstance(number, float) and not math.isfinite(number):
            ctx.fail(path, f"{value!r} is not a finite number")
        if t is float:
            try:
                return float(number)
            except OverflowError:  # an integer beyond even float64
                ctx.fail(path, f"{_show(number)} is out of range; it must be within ±{FLOAT_MAX}")
        if isinstance(number, float) and not number.is_integer():
            ctx.fail(path, f"{value!r} is not an integer")
        return int(number)
    if t is str:
        if not isinstance(value, str):
            ctx.fail(path, f"{value!r} is not a string")
        return value
    raise TypeError(f"unsupported schema type {t!r} at {path}")


def _show(v) -> str:
    """A number for a message: a huge integer (say 1e30 given for an int) as 1.000e+30."""
    return format(Decimal(v), ".4g") if isinstance(v, int) and abs(v) > INT_MAX else repr(v)


def check_range(ctx: Ctx, path: str, meta, value) -> None:
    """``value`` (a number, or each of a tuple's) within ``meta``'s bounds and its type's."""
    if value is None:
        return
    many = isinstance(value, tuple)
    for i, v in enumerate(value if many else (value,)):
        if isinstance(v, (str, bool)):
            continue
        if isinstance(v, int):
            lo = max(INT_MIN, math.ceil(meta.get("min", INT_MIN)), math.floor(meta.get("gt", INT_MIN - 1)) + 1)
            hi = min(INT_MAX, math.floor(meta.get("max", INT_MAX)), math.ceil(meta.get("lt", INT_MAX + 1)) - 1)
            ok, allowed = lo <= v <= hi, f"an integer from {lo} to {hi}"
        else:
            low = [(op, meta[k]) for k, op in (("min", ">="), ("gt", ">")) if k in meta] or [(">=", -FLOAT_MAX)]
            high = [(op, meta[k]) for k, op in (("max", "<="), ("lt", "<")) if k in meta] or [("<=", FLOAT_MAX)]
            ok = all(_OPS[op](v, b) for op, b in low + high)
            allowed = " and ".join(f"{op} {b}" for op, b in low + high)
        if not ok:
            ctx.fail(f"{path}[{i}]" if many else path, f"{_show(v)} is out of range; it must be {allowed}")
    if "choices" in meta and value not in meta["choices"]:
        ctx.fail(path, f"{value!r} is not allowed; choose one of {', '.join(_choice(c) for c in meta['choices'])}")


def _choice(c) -> str:
    """A choice as YAML writes it (true/false, not Python's True/False)."""
    return str(c).lower() if isinstance(c, bool) else str(c)


def load_dataclass(ctx: Ctx, path: str, cls: type, mapping: Any, skip: tuple[str, ...] = ()):
    """Build ``cls`` from ``mapping``: unknown keys, wrong types and out-of-range values fail."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        ctx.fail(path, f"expected a mapping of options, got {type(mapping).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in mapping if k not in fields and k not in skip]
    if unknown:
        allowed = ", ".join(fields) or "(no options)"
        ctx.fail(_join(path, str(unknown[0])), f"unknown key; allowed keys here: {allowed}")
    kwargs = {}
    choices = getattr(cls, "CHOICES", {})
    positive = getattr(cls, "POSITIVE", ())
    nonneg = getattr(cls, "NONNEGATIVE", ())
    for name, f in fields.items():
        if name not in mapping:
            continue
        p = _join(path, name)
        value = coerce(ctx, p, hints[name], mapping[name])
        meta = dict(f.metadata)
        if name in choices:
            meta["choices"] = choices[name]
        if name in positive:
            meta.setdefault("gt", 0)
        if name in nonneg:
            meta.setdefault("min", 0)
        check_range(ctx, p, meta, value)
        kwargs[name] = value
    return cls(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def component(ctx: Ctx, path: str, mapping: Any, key: str, registry: dict, params_of, default=None):
    """A section ``{key: NAME, ...options}``: NAME picked from ``registry``; options into its Params."""
    if mapping is None:
        mapping = {}
    if isinstance(mapping, str):
        mapping = {key: mapping}
    if not isinstance(mapping, dict):
        ctx.fail(path, f"expected a mapping with '{key}', got {type(mapping).__name__}")
    name = mapping.get(key, default)
    if name is None:
        ctx.fail(_join(path, key), f"missing; choose one of {', '.join(registry)}")
    if not isinstance(name, str) or name not in registry:
        ctx.fail(_join(path, key), f"{name!r} is not one of the choices; choose one of {', '.join(registry)}")
    options = {k: v for k, v in mapping.items() if k != key}
    return Component(name, load_dataclass(ctx, path, params_of(registry[name]), options))
