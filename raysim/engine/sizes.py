"""Byte counts of messages (for the bytes-moved metrics)."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch


def nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(nbytes(o) for o in obj.values())
    if dataclasses.is_dataclass(obj):
        return sum(nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0
