"""Summing client replies: hosts pre-sum their clients, the server sums the host sums.

A reply is any nesting of dataclasses, lists and tuples whose leaves are tensors, numbers,
``Weighted`` terms (added as weight·value) or ``PerClient`` dicts (united). Numeric leaves are
accumulated in float64: float32 values times integer weights are exact there, and the float64
rounding of the running sum sits ~2^-29 below float32 resolution, so casting the final mean back
to float32 gives the same numbers for 1 host or 8 and any arrival order (the server merges host
sums in host order and hosts add their clients in client-id order).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch

from algorithms.base import PerClient, Weighted


def _flatten(obj: Any, leaves: list) -> Any:
    """Describe ``obj``'s structure; append its leaves in order as PerClient dicts or
    (tensor, scale) pairs meaning ``scale * tensor`` (scale None: the tensor itself)."""
    if obj is None:
        return ("none",)
    if isinstance(obj, PerClient):
        leaves.append(obj)
        return ("per_client",)
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
        return ("dataclass", type(obj), [(f.name, _flatten(getattr(obj, f.name), leaves))
                                         for f in dataclasses.fields(obj)])
    if isinstance(obj, (list, tuple)):
        return ("seq", type(obj), [_flatten(o, leaves) for o in obj])
    raise TypeError(f"cannot sum a reply leaf of type {type(obj).__name__}")


def _unflatten(spec: Any, it) -> Any:
    kind = spec[0]
    if kind == "none":
        return None
    if kind == "per_client":
        return next(it)
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

    def merge(self, other: "Accumulator") -> None:
        if other.leaves is None:
            return
        self._add_leaves(other.spec, [v if isinstance(v, PerClient) else (v, None) for v in other.leaves])
        self.count += other.count

    def _add_leaves(self, spec, leaves) -> None:
        if self.leaves is None:
            self.spec = spec
            self.leaves = []
            for leaf in leaves:
                if isinstance(leaf, PerClient):
                    self.leaves.append(PerClient(leaf))
                    continue
                t, scale = leaf
                buf = t.to(device="cpu", dtype=torch.float64, copy=True)
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
            t, scale = leaf
            if t.dtype != torch.float64 or t.device.type != "cpu":
                # convert into a reused buffer: a fresh 64-bit copy per client costs page faults,
                # and a mixed-dtype add_ is 2x slower than converting first
                buf = self._scratch[i]
                if buf is None or buf.shape != t.shape:
                    buf = self._scratch[i] = torch.empty(t.shape, dtype=torch.float64)
                t = buf.copy_(t)
            if scale is None:
                mine.add_(t)
            else:
                mine.add_(t, alpha=scale)

    def result(self) -> Any:
        """The summed reply (float64 tensors), or None if nothing was added."""
        if self.leaves is None:
            return None
        return _unflatten(self.spec, iter(self.leaves))

    # Ray moves numpy arrays out of band; torch tensors would be pickled byte by byte (~10x slower)
    def __getstate__(self) -> dict:
        leaves = None if self.leaves is None else [
            v if isinstance(v, PerClient) else v.numpy() for v in self.leaves]
        return {"spec": self.spec, "leaves": leaves, "count": self.count}

    def __setstate__(self, st: dict) -> None:
        self.spec, self.count, self._scratch = st["spec"], st["count"], None
        self.leaves = None if st["leaves"] is None else [
            v if isinstance(v, PerClient) else _tensor(v) for v in st["leaves"]]

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.leaves or () if isinstance(v, torch.Tensor))


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a`` without copying; arrays from Ray's object store are read-only and
    stay so here (merge() copies before it writes)."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)
