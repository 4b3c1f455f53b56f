"""Representations: a model's features z (the input of its classifier head) beside its outputs,
for K stacked parameter sets, and the per-class summaries of them that prototype methods
exchange.

``Features(model, body, head)`` runs a model split at its head (the ``head`` parameter group,
``model.head``: ``raysim.core.groups``). A sequence of layers (``nn.Sequential``: the zoo's MLPs
and CNNs) runs as two stacked sequences, body then head, so a job can ask for z alone (the body's
parameters only) or for z and the outputs; any other model (ResNets, VGG) runs whole, set by
set, z caught by a forward pre-hook on the head's first layer (for the zoo's ResNets and VGGs
the pooled, flattened features). ``frozen=True`` gives a copy in evaluation mode (dropout off,
batch norm with its running statistics): what a frozen teacher's or a scoring pass uses.

Prototypes (FedProto, FedPAC): ``class_sums`` sums a client's features per class,
``prototype_reply`` turns them into the summable reply of its per-class means (one ``Weighted``
per class it holds, ``ByKey`` by class), ``prototypes_of`` the server's table of them (C, d) with
the mask of the classes some client holds, and ``squared_distances`` the (K, B, C) distances
that the regularizer and nearest-prototype prediction read.

Used by MOON (contrastive representations), FedProto and FedPAC.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from . import forward as fwd
from .replies import ByKey, Weighted


def split_model(model: nn.Module, body: tuple[int, ...]) -> tuple[nn.Sequential, nn.Sequential]:
    """A sequence of layers (``nn.Sequential``) as (body, head) sequences whose parameters are,
    in order, the body's and the head's: the body ends before the first layer with a head
    parameter (activations and flattening before it are the body's). ValueError where the model
    is not a sequence of layers or its head is not its last layers."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"{type(model).__name__} is not a sequence of layers (nn.Sequential)")
    leaves = fwd.layers(model)
    ids = [id(p) for p in model.parameters()]
    body_ids = {ids[i] for i in body}
    cut = next((i for i, m in enumerate(leaves) if any(id(p) not in body_ids for p in m.parameters())), len(leaves))
    first, second = nn.Sequential(*leaves[:cut]), nn.Sequential(*leaves[cut:])
    if [id(p) for p in first.parameters()] + [id(p) for p in second.parameters()] != ids or {
        id(p) for p in first.parameters()
    } != body_ids:
        raise ValueError("the head must be the model's last layers (model.head)")
    return first, second


class _HeadInput:
    """Any other model: the whole model run set by set (``functional_call``), the input of its
    head's first layer caught by a forward pre-hook."""

    def __init__(self, model: nn.Module, head: tuple[int, ...]):
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        target = list(model.parameters())[head[0]]
        layer = next(m for m in model.modules() if any(p is target for p in m.parameters(recurse=False)))
        self.caught: list[torch.Tensor] = []
        layer.register_forward_pre_hook(lambda _m, args: self.caught.append(args[0]))

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(representations (K, B, ...), outputs (K, B, ...)) of the K stacked sets."""
        outs, zs = [], []
        for k in range(x.shape[0]):
            self.caught.clear()
            outs.append(functional_call(self.model, {n: p[k] for n, p in zip(self.names, params)}, (x[k],)))
            zs.append(self.caught[0])
        self.caught.clear()
        return torch.stack(zs), torch.stack(outs)


class Features:
    """A model's features and outputs for K stacked parameter sets (see the module's text).
    ``body`` and ``head``: the indices of the two groups' parameters in model order."""

    def __init__(self, model: nn.Module, body: tuple[int, ...], head: tuple[int, ...], frozen: bool = False):
        self.body_idx, self.head_idx = tuple(body), tuple(head)
        model = copy.deepcopy(model).eval() if frozen else model
        try:
            b, h = split_model(model, self.body_idx)
            self.body_only = True
        except ValueError:
            self.body_only = False
        if self.body_only:
            self.modules: list[nn.Module] = [b, h]
            self._body, self._head = fwd.make_forward(b), fwd.make_forward(h)
        else:
            self.modules = [model]
            self._whole = _HeadInput(model, self.head_idx)
        self.device = torch.device("cpu")

    def to(self, device: torch.device) -> None:
        """The layers' buffers, if any, where the parameters are (the first call on a device)."""
        if device != self.device:
            for m in self.modules:
                m.to(device)
            self.device = device

    def carried(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """What of a parameter set ``z`` needs: the body's for a sequence of layers, else all."""
        return [params[i] for i in self.body_idx] if self.body_only else list(params)

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z (K, B, ...), outputs (K, B, ...)) of the K stacked full parameter sets on x."""
        self.to(x.device)
        if self.body_only:
            z = self._body([params[i] for i in self.body_idx], x)
            return z, self._head([params[i] for i in self.head_idx], z)
        return self._whole(params, x)

    def z(self, carried: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """z (K, B, ...) alone, from ``carried`` parameter sets (``carried``)."""
        self.to(x.device)
        return self._body(carried, x) if self.body_only else self._whole(carried, x)[0]

    def head(self, params: list[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        """The head's outputs on features z, from the full stacked sets (a sequence of layers)."""
        if not self.body_only:
            raise ValueError("a model that is not a sequence of layers has no separate head pass")
        return self._head([params[i] for i in self.head_idx], z)


# -- prototypes -----------------------------------------------------------------------------
def class_sums(z: torch.Tensor, y: torch.Tensor, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums of features z (n, d) by label y (n,): (C, d) in float64 and the counts
    (C,)."""
    z = z.reshape(z.shape[0], -1).to(torch.float64)
    y = y.reshape(-1).long()
    sums = torch.zeros(classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, z)
    return sums, torch.bincount(y, minlength=classes).to(torch.float64)


def prototype_reply(sums: torch.Tensor, counts: torch.Tensor, weighting: str) -> ByKey:
    """A client's per-class means as a summable reply: ``ByKey`` {class: Weighted([mean], w)}
    over the classes it holds, w = its count of the class (``weighting: samples``) or 1
    (``clients``: each holder's mean counts once). Summed over clients and divided by the
    weight (``prototypes_of``), that is Σ_k n_kc·μ_kc / Σ_k n_kc, or the plain mean over the
    clients that hold class c."""
    if weighting not in ("samples", "clients"):
        raise ValueError(f"weighting must be samples or clients, got {weighting!r}")
    out = ByKey()
    for c in torch.nonzero(counts > 0).reshape(-1).tolist():
        w = float(counts[c]) if weighting == "samples" else 1.0
        out[c] = Weighted([(sums[c] / counts[c]).to(torch.float32)], w)
    return out


def prototypes_of(reduced: ByKey | None, classes: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global prototypes from the reduced replies: (C, d) float32, zero where no client
    held the class, and the mask (C,) of the classes some client held."""
    table = torch.zeros(classes, dim)
    has = torch.zeros(classes, dtype=torch.bool)
    for c, r in (reduced or {}).items():
        if r.weight > 0:
            table[int(c)] = r.mean()[0]
            has[int(c)] = True
    return table, has


def squared_distances(z: torch.Tensor, protos: torch.Tensor) -> torch.Tensor:
    """‖z_b − P_c‖² for features z (K, B, d) and prototypes P (K, C, d): (K, B, C), by the
    difference (not the expanded square, whose cancellation loses digits near a prototype)."""
    return ((z.unsqueeze(2) - protos.unsqueeze(1)) ** 2).sum(-1)
