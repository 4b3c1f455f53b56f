"""Maps over nested containers of tensors (messages, replies, states)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from raysim.core.replies import tree_map  # noqa: F401  (one definition, used here and by the engine)


def nbytes(obj: Any) -> int:
    total = 0

    def count(t):
        nonlocal total
        total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else t.nbytes
        return t

    tree_map(count, obj, (torch.Tensor, np.ndarray))
    return total


def to_device(obj: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return obj
    return tree_map(lambda t: t.to(device), obj)


def to_numpy(obj: Any) -> Any:
    """CPU tensors -> numpy arrays (Ray moves numpy through its object store without pickling
    the bytes; torch tensors cost ~10x more per round trip)."""
    return tree_map(lambda t: t.detach().cpu().numpy(), obj)


def from_numpy(obj: Any) -> Any:
    """numpy arrays -> tensors (copies: object-store arrays are read-only)."""
    return tree_map(lambda a: torch.from_numpy(np.array(a, copy=True)), obj, (np.ndarray,))


def state_to_tree(state: Any) -> Any:
    """A client or server state as plain containers of tensors/numbers (loadable with
    ``torch.load(weights_only=True)``): dataclasses become dicts."""
    if state is None:
        return None
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {f.name: state_to_tree(getattr(state, f.name)) for f in dataclasses.fields(state)}
    if isinstance(state, (list, tuple)):
        return [state_to_tree(s) for s in state]
    if isinstance(state, dict):
        return {k: state_to_tree(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    return state


def tree_to_state(cls: type | None, tree: Any) -> Any:
    """Inverse of ``state_to_tree`` for a state of dataclass ``cls`` (None: the tree itself)."""
    if tree is None or cls is None or not dataclasses.is_dataclass(cls):
        return tree
    return cls(**tree)
