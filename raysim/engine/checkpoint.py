"""Checkpoints: one file of tensors and plain containers, written atomically.

Loaded with ``torch.load(..., weights_only=True)``: nothing in a checkpoint is unpickled as code.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def path_for(directory: str, run_id: str) -> Path:
    return Path(directory) / run_id / "checkpoint.pt"


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)
