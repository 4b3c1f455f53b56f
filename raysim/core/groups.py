"""Named parameter groups: which of a model's parameters are its head, its body, its layers.

A method that keeps part of the model on the client (FedPer, FedRep, LG-FedAvg, ...) selects,
trains, sends and averages parameters by group, never by position. Parameters are numbered in
``model.parameters()`` order (the order of ``params_of`` and of every parameter list the loop
trains); a group is a tuple of those indices.

Groups every model has:

- ``head``: the classifier. By default the last layer that owns parameters (for the zoo's
  models the last linear layer: weight and bias); a model may name its own (attribute
  ``raysim_head``: module names), and a scenario may override it with ``model.head``: a number
  n (the last n layers with parameters) or a list of layer or parameter names.
- ``body``: every other parameter (the feature extractor, with its layers' running statistics).
- ``stats``: running statistics of normalization layers (batch norm's mean and variance),
  wherever they are: part of the model's state like the parameters (sent, averaged or kept by
  the same rules), never trained by the optimizer (they are parameters with
  ``requires_grad=False``; the loop updates them in the forward pass).
- ``norm``: every parameter of the normalization layers (batch, group, layer and instance norm):
  their affine weight and bias and their running statistics (FedBN keeps it local).
- ``all``; each layer by its module name (``"0"``, ``"features.3"``, ``"out"``); each parameter
  by its full name (``"0.weight"``).
- ``~group``: the complement of any of these (``~norm``: everything but the normalization layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Groups:
    names: tuple[str, ...]  # parameter names, in parameters() order
    layers: dict[str, tuple[int, ...]]  # layer (module name) -> its parameters, in order
    head: tuple[int, ...]
    body: tuple[int, ...]
    stats: tuple[int, ...]
    norm: tuple[int, ...] = ()

    def of(self, group: str | Sequence[int]) -> tuple[int, ...]:
        """The indices of a group: head, body, stats, norm, all, a layer name, a parameter name,
        ``~`` and any of these (its complement), or already indices."""
        if not isinstance(group, str):
            return tuple(int(i) for i in group)
        if group.startswith("~"):
            out = set(self.of(group[1:]))
            return tuple(i for i in range(len(self.names)) if i not in out)
        if group == "head":
            return self.head
        if group == "body":
            return self.body
        if group == "stats":
            return self.stats
        if group == "norm":
            return self.norm
        if group == "all":
            return tuple(range(len(self.names)))
        if group in self.layers:
            return self.layers[group]
        if group in self.names:
            return (self.names.index(group),)
        raise KeyError(
            f"no parameter group {group!r}; groups: head, body, stats, norm, all, or a layer: {', '.join(self.layers)}"
        )

    def mask(self, group) -> tuple[bool, ...]:
        """True at the group's parameters (an ``Objective.trainable``)."""
        idx = set(self.of(group))
        return tuple(i in idx for i in range(len(self.names)))

    def pick(self, params: Sequence[torch.Tensor], group) -> list[torch.Tensor]:
        """The group's tensors, in order."""
        return [params[i] for i in self.of(group)]

    def merge(self, params: Sequence[torch.Tensor], group, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` with the group's tensors replaced by ``values`` (in the group's order)."""
        idx = self.of(group)
        if len(values) != len(idx):
            raise ValueError(f"{len(values)} tensors for a group of {len(idx)}")
        out = list(params)
        for i, v in zip(idx, values):
            out[i] = v
        return out


NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _owner(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def groups_of(model: nn.Module, head: int | Sequence[str] | None = None) -> Groups:
    """The model's groups; ``head`` overrides the model's own head (``raysim_head``, else its
    last layer with parameters): a count of trailing layers, or layer/parameter names.
    ValueError (one line, naming the layers) for a name the model lacks. The body may be empty
    (a linear model is all head); a method that needs both (``Algorithm.split``) says so at
    validation."""
    named = list(model.named_parameters())
    names = tuple(n for n, _ in named)
    layers: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        layers.setdefault(_owner(n), []).append(i)
    stats = tuple(i for i, (_, p) in enumerate(named) if not p.requires_grad)
    in_norm = {id(p) for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)}
    norm = tuple(i for i, (_, p) in enumerate(named) if id(p) in in_norm)
    order = list(layers)
    spec = head if head is not None else getattr(model, "raysim_head", None)
    if spec is None:
        spec = 1
    if isinstance(spec, int):
        if not 1 <= spec <= len(order):
            raise ValueError(
                f"model.head: {spec} layers; the model has {len(order)} layers with parameters ({', '.join(order)})"
            )
        chosen = [i for layer in order[-spec:] for i in layers[layer]]
    else:
        chosen = []
        for want in spec:
            if want in layers:
                hit = [i for lay, idx in layers.items() if lay == want or lay.startswith(want + ".") for i in idx]
            else:
                hit = [i for i, n in enumerate(names) if n == want or n.startswith(want + ".")]
                if not hit:
                    hit = [i for lay, idx in layers.items() if lay.startswith(want + ".") for i in idx]
            if not hit:
                raise ValueError(
                    f"model.head: {want!r} is not a layer or parameter of the model; layers: {', '.join(order)}"
                )
            chosen += [i for i in hit if i not in chosen]
    head_idx = tuple(sorted(set(chosen)))
    body = tuple(i for i in range(len(names)) if i not in head_idx)
    return Groups(names, {k: tuple(v) for k, v in layers.items()}, head_idx, body, stats, norm)
