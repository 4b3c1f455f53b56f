"""raysim's folder in the user's cache (a module of its own: the MLflow helper process reads it
without importing the data package, which imports PyTorch)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache() -> Path:
    """``$XDG_CACHE_HOME/raysim`` (``~/.cache/raysim`` without XDG_CACHE_HOME or with a
    relative one, as the XDG spec says to ignore it)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".cache") / "raysim"
