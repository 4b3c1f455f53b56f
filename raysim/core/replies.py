"""Client replies and their reduction: hosts pre-sum their clients, the server sums host sums.

A reply is any nesting of dataclasses, lists and tuples whose leaves are tensors, numbers,
``Weighted`` terms (added as weight·value), ``PerClient`` dicts (united: values keyed by client
id) or ``ByKey`` dicts (summed key by key: e.g. one ``Weighted`` per cluster a client trained).
Numeric leaves are accumulated in float64: float32 values times integer weights are exact
there, and the float64 rounding of the running sum sits ~2^-29 below float32 resolution, so
casting the final mean back to float32 gives the same numbers for 1 host or 8 and any arrival
order (the server merges host sums in host order and hosts add their clients in client-id
order).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def tree_map(fn: Callable[[Any], Any], obj: Any, leaf_types=(torch.Tensor,)) -> Any:
    """Apply ``fn`` to every leaf of ``leaf_types`` inside lists, tuples, dicts and dataclasses."""
    if isinstance(obj, leaf_types):
        return fn(obj)
    if isinstance(obj, list):
        return [tree_map(fn, o, leaf_types) for o in obj]
    if isinstance(obj, tuple):
        return tuple(tree_map(fn, o, leaf_types) for o in obj)
    if isinstance(obj, dict):
        return type(obj)({k: tree_map(fn, v, leaf_types) for k, v in obj.items()})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: tree_map(fn, getattr(obj, f.name), leaf_types) for f in dataclasses.fields(obj) if f.init}
        )
    return obj


def on_cpu(obj: Any) -> Any:
    """``obj`` with its tensors on the CPU (the server's device): a host's replies leave it
    there, whatever device trained them (no copy for CPU tensors)."""
    return tree_map(lambda t: t.detach().cpu(), obj)


class PerClient(dict):
    """A reply field keyed by client id; reduction takes the union."""


class ByKey(dict):
    """A reply field of sub-replies keyed by a group (cluster, component, ...); reduction sums
    the sub-replies of equal keys and keeps every key that occurs."""


@dataclass
class Weighted:
    """A weighted term of a sum: the reduction adds ``weight * v`` for each tensor and ``weight``.

    After reduction ``values`` hold the float64 sums Σ_k w_k·v_k and ``weight`` holds Σ_k w_k.
    """

    values: list[torch.Tensor]
    weight: float

    def mean(self, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Σ w·v / Σ w, cast back to ``dtype``."""
        return [(v / self.weight).to(dtype) for v in self.values]


def model_update(reply: Any, shared: list[torch.Tensor], what: str) -> list[torch.Tensor | None]:
    """A client's update θ_k − θ from a reply that is its trained copy (``Weighted``) of the
    model ``shared`` it received, per tensor; None for a tensor that is not floating point
    (counters, which no update carries). What privacy's clipping and compression act on."""
    if not isinstance(reply, Weighted) or len(reply.values) != len(shared):
        raise TypeError(f"{what} needs a reply of the model the server sent, got {type(reply).__name__}")
    return [p - s if s.is_floating_point() else None for p, s in zip(reply.values, shared)]


def float_numbers(tensors: list[torch.Tensor]) -> int:
    """How many numbers the floating-point tensors hold: the size d of an update."""
    return sum(t.numel() for t in tensors if t.is_floating_point())


def _flatten(obj: Any, leaves: list) -> Any:
    """Describe ``obj``'s structure; append its leaves in order: PerClient dicts, dicts of
    Accumulators (ByKey) or (tensor, scale) pairs meaning ``scale * tensor``."""
    if obj is None:
        return ("none",)
    if isinstance(obj, PerClient):
        leaves.append(PerClient(on_cpu(dict(obj))))
        return ("per_client",)
    if isinstance(obj, ByKey):
        subs = {}
        for key, sub in obj.items():
            subs[key] = Accumulator()
            subs[key].add(sub)
        leaves.append(_Keyed(subs))
        return ("by_key",)
    if isinstance(obj, Weighted):
        w = float(obj.weight)
        leaves.extend((v.detach(), w) for v in obj.values)
        leaves.append((torch.tensor(w, dtype=torch.float64), None))
        return ("weighted", len(obj.values))
    if isinstance(obj, torch.Tensor):
        leaves.append((obj.detach(), None))
        return ("tensor",)
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        leaves.append((torch.tensor(float(obj), dtype=torch.float64), None))
        return ("number",)
    if dataclasses.is_dataclass(obj):
        return (
            "dataclass",
            type(obj),
            [(f.name, _flatten(getattr(obj, f.name), leaves)) for f in dataclasses.fields(obj)],
        )
    if isinstance(obj, (list, tuple)):
        return ("seq", type(obj), [_flatten(o, leaves) for o in obj])
    raise TypeError(f"cannot sum a reply leaf of type {type(obj).__name__}")


def _unflatten(spec: Any, it) -> Any:
    kind = spec[0]
    if kind == "none":
        return None
    if kind == "per_client":
        return next(it)
    if kind == "by_key":
        return ByKey({k: acc.result() for k, acc in sorted(next(it).items())})
    if kind == "weighted":
        values = [next(it) for _ in range(spec[1])]
        return Weighted(values, float(next(it)))
    if kind == "tensor":
        return next(it)
    if kind == "number":
        return float(next(it))
    if kind == "dataclass":
        return spec[1](**{name: _unflatten(s, it) for name, s in spec[2]})
    return spec[1](_unflatten(s, it) for s in spec[2])


class _Keyed(dict):
    """key -> Accumulator (a ByKey leaf being summed)."""


class Accumulator:
    """Running sum of replies with the same structure. Picklable (sent from host to server)."""

    def __init__(self) -> None:
        self.spec: Any = None
        self.leaves: list | None = None
        self.count = 0
        self._scratch: list | None = None

    def add(self, reply: Any) -> None:
        if reply is None:
            return
        leaves: list = []
        spec = _flatten(reply, leaves)
        self._add_leaves(spec, leaves)
        self.count += 1

    def add_rows(self, values: torch.Tensor) -> None:
        """Add each row of ``values`` (n, ...) as a reply of its own: their sum in float64
        (summed in row order) and n replies."""
        # a cumulative sum is the running sum, row after row: as adding the rows one by one
        total = torch.from_numpy(np.cumsum(values.detach().cpu().to(torch.float64).numpy(), axis=0)[-1].copy())
        self._add_leaves(("tensor",), [(total, None)])
        self.count += int(values.shape[0])

    def merge(self, other: Accumulator) -> None:
        if other.leaves is None:
            return
        self._add_leaves(
            other.spec, [v if isinstance(v, (PerClient, _Keyed)) else (v.cpu(), None) for v in other.leaves]
        )
        self.count += other.count

    def _add_leaves(self, spec, leaves) -> None:
        if self.leaves is None:
            self.spec = spec
            self.leaves = []
            for leaf in leaves:
                if isinstance(leaf, PerClient):
                    self.leaves.append(PerClient(leaf))
                    continue
                if isinstance(leaf, _Keyed):
                    self.leaves.append(_Keyed())
                    _merge_keyed(self.leaves[-1], leaf)
                    continue
                t, scale = leaf
                # summed where the reply is (a GPU host's sums stay on its GPU until they leave
                # it: no wait for the GPU per client), in float64 either way
                buf = t.to(dtype=torch.float64, copy=True)
                self.leaves.append(buf if scale is None else buf.mul_(scale))
            return
        if len(leaves) != len(self.leaves):
            raise ValueError("replies of one round must share one structure")
        if self._scratch is None:
            self._scratch = [None] * len(self.leaves)
        for i, (mine, leaf) in enumerate(zip(self.leaves, leaves)):
            if isinstance(mine, PerClient):
                mine.update(leaf)
                continue
            if isinstance(mine, _Keyed):
                _merge_keyed(mine, leaf)
                continue
            t, scale = leaf
            if t.dtype != torch.float64 or t.device != mine.device:
                # convert into a reused buffer: a fresh 64-bit copy per client costs page faults,
                # and a mixed-dtype add_ is 2x slower than converting first
                buf = self._scratch[i]
                if buf is None or buf.shape != t.shape:
                    buf = self._scratch[i] = torch.empty(t.shape, dtype=torch.float64, device=mine.device)
                t = buf.copy_(t)
            if scale is None:
                mine.add_(t)
            else:
                mine.add_(t, alpha=scale)

    def result(self) -> Any:
        """The summed reply (float64 tensors on the CPU), or None if nothing was added."""
        if self.leaves is None:
            return None
        return _unflatten(self.spec, iter([v if isinstance(v, (PerClient, _Keyed)) else v.cpu() for v in self.leaves]))

    # Ray moves numpy arrays out of band; torch tensors would be pickled byte by byte (~10x slower)
    def __getstate__(self) -> dict:
        leaves = (
            None
            if self.leaves is None
            else [v if isinstance(v, (PerClient, _Keyed)) else v.cpu().numpy() for v in self.leaves]
        )
        return {"spec": self.spec, "leaves": leaves, "count": self.count}

    def __setstate__(self, st: dict) -> None:
        self.spec, self.count, self._scratch = st["spec"], st["count"], None
        self.leaves = (
            None
            if st["leaves"] is None
            else [v if isinstance(v, (PerClient, _Keyed)) else _tensor(v) for v in st["leaves"]]
        )

    def nbytes(self) -> int:
        total = 0
        for v in self.leaves or ():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
            elif isinstance(v, _Keyed):
                total += sum(a.nbytes() for a in v.values())
        return total


def _merge_keyed(mine: _Keyed, other: _Keyed) -> None:
    for key, acc in other.items():
        if key not in mine:
            mine[key] = Accumulator()
        mine[key].merge(acc)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a`` without copying; arrays from Ray's object store are read-only and
    stay so here (merge() copies before it writes)."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def reduce(replies: list[Any]) -> Any:
    """The sum of a list of replies (in list order)."""
    acc = Accumulator()
    for r in replies:
        acc.add(r)
    return acc.result()
