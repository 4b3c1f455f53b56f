"""Derived random generators.

Every random draw comes from a generator derived from (scenario seed, round, client id,
purpose); never from global RNG state or from the order in which work finishes. The key is
hashed with SeedSequence, so generators for different keys are independent streams.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def _entropy(seed: int, keys: tuple) -> list[int]:
    out = [int(seed) & 0xFFFFFFFF]
    for k in keys:
        if isinstance(k, str):
            out.append(zlib.crc32(k.encode()) | (1 << 32))   # tag strings apart from ints
        else:
            out.append(int(k) & 0xFFFFFFFF)
    return out


def generator(seed: int, *keys) -> np.random.Generator:
    """numpy Generator for (seed, *keys), e.g. generator(seed, "sample", round)."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, keys)))


def torch_generator(seed: int, *keys, device: str | torch.device = "cpu") -> torch.Generator:
    """torch Generator seeded from the same derivation (for shuffles and dropout)."""
    s = np.random.SeedSequence(_entropy(seed, keys)).generate_state(2, np.uint64)
    g = torch.Generator(device=device)
    g.manual_seed(int(s[0]) >> 1)        # (as a Python int: numpy's uint64 shift costs ~10 µs)
    return g
