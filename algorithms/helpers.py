"""Tensor helpers several methods share, on top of the contract (``base.py``): the summable
statistics of the clients' updates (``UpdateStats``, and ``Tracked`` replies carrying them),
the classifier head's index (``head_index``), weight-space interpolation (``interpolate``),
per-set dot products (``set_dot``) and the means of ``ByKey`` replies (``means_by_key``).
Importable from ``raysim.algorithms.base`` too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class UpdateStats:
    """Summable statistics of the clients' updates Δ_k of one tensor: Σ_k Δ_k, Σ_k ‖Δ_k‖² and
    the count, whose total variance is Σ_k ‖Δ_k − Δ̄‖² = Σ_k ‖Δ_k‖² − ‖Σ_k Δ_k‖²/n (SosicFL's
    eqs. 10–11, over the round's participants). A client's Δ_k and ‖Δ_k‖² are float32 numbers
    (the norm computed in float64, then rounded), so that the replies' float64 sums of them
    come out the same for any grouping of the clients over hosts (``raysim.core.replies``)."""

    total: torch.Tensor
    squares: float
    count: float

    @classmethod
    def of(cls, delta: torch.Tensor) -> UpdateStats:
        d = delta.detach().to(torch.float32)
        return cls(d, float(np.float32((d.to(torch.float64) ** 2).sum().item())), 1.0)

    def variance(self) -> float:
        if self.count <= 0:
            return 0.0
        return max(0.0, self.squares - float((self.total * self.total).sum()) / self.count)


@dataclass
class Tracked:
    """A model reply with the statistics of the client's last-layer update beside it."""

    model: Any
    head: UpdateStats


def head_index(model) -> int:
    """Index (in ``params_of`` order) of the weight of the model's last linear layer: the
    classifier a simplex head replaces and whose updates the total variance measures."""
    names = [n for n, _ in model.named_parameters()]
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not last:
        raise ValueError(f"{type(model).__name__} has no linear layer to use as the classifier head")
    target = last[-1].weight
    return next(i for i, p in enumerate(model.parameters()) if p is target) if names else 0


def interpolate(a: list[torch.Tensor], b: list[torch.Tensor], t) -> list[torch.Tensor]:
    """(1 − t)·a + t·b tensor by tensor: the weight-space mix of two parameter sets (SuPerFed's
    W(λ), APFL's v̄). ``t``: a number; a (K,) tensor, one per stacked set; or a list with one
    such per tensor (SuPerFed's layer mixing). t = 0 gives a and t = 1 gives b exactly
    (``torch.lerp``: one pass over the tensors, six times faster than the three of the formula)."""
    ts = t if isinstance(t, (list, tuple)) else [t] * len(a)
    out = []
    for x, y, s in zip(a, b, ts):
        if isinstance(s, torch.Tensor) and s.dim() == 1:
            s = s.view(-1, *[1] * (x.dim() - 1))
        if not x.is_floating_point():  # an integer buffer (a batch count): the formula
            out.append((1 - s) * x + s * y)
            continue
        out.append(torch.lerp(x, y, s.to(x.dtype) if isinstance(s, torch.Tensor) else s))
    return out


def set_dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """Σ_i ⟨a_i, b_i⟩ for each of K stacked sets (tensors (K, ...)): (K,). ``vecdot`` row by
    row: a set's number does not depend on the others (a batched matrix product's does, and is
    four times slower here)."""
    return sum(torch.linalg.vecdot(x.flatten(1), y.flatten(1)) for x, y in zip(a, b))


def means_by_key(models: list[list[torch.Tensor]], reduced: Any) -> list[list[torch.Tensor]]:
    """``models`` with entry s replaced by the mean of the reduced ``ByKey`` reply s wherever
    it has weight; the others (nobody trained them) kept."""
    new = list(models)
    for s, r in (reduced or {}).items():
        if r.weight > 0:
            new[s] = r.mean(new[s][0].dtype)
    return new
