"""Derived random generators.

Every random draw comes from a generator derived from (scenario seed, round, client id,
purpose); never from global RNG state or from the order in which work finishes. The key is
hashed with SeedSequence, so generators for different keys are independent streams.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

SEED = {"min": 0, "max": 2**32 - 1}  # every generator derives from a seed's low 32 bits

if TYPE_CHECKING:  # torch is imported where a torch generator is made: the fleet's and the trace
    import torch  # tools' draws (numpy only) keep it out of processes that never train


def _entropy(seed: int, keys: tuple) -> list[int]:
    out = [int(seed) & 0xFFFFFFFF]
    for k in keys:
        if isinstance(k, str):
            out.append(zlib.crc32(k.encode()) | (1 << 32))  # tag strings apart from ints
        else:
            out.append(int(k) & 0xFFFFFFFF)
    return out


def generator(seed: int, *keys) -> np.random.Generator:
    """numpy Generator for (seed, *keys), e.g. generator(seed, "sample", round)."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, keys)))


def torch_generator(seed: int, *keys, device: str | torch.device = "cpu") -> torch.Generator:
    """torch Generator seeded from the same derivation (for shuffles and dropout)."""
    import torch

    s = np.random.SeedSequence(_entropy(seed, keys)).generate_state(2, np.uint64)
    g = torch.Generator(device=device)
    g.manual_seed(int(s[0]) >> 1)  # (as a Python int: numpy's uint64 shift costs ~10 µs)
    return g


# numpy's SeedSequence hash (O'Neill's seed_seq with numpy's constants), over many keys at once
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def torch_seeds(seed: int, purpose: str, round_: int, cids) -> list[int]:
    """The seeds ``torch_generator(seed, purpose, round_, cid)`` gives each of ``cids``, all at
    once (SeedSequence's hash on arrays: ~1 µs a client instead of ~15): a host seeds 50 000
    clients' generators without hashing each in Python. Equal to the one-at-a-time derivation
    (tests/test_rng.py checks it against numpy's SeedSequence)."""
    cids = np.asarray(cids, dtype=np.int64)
    words = [int(w) for w in _entropy(seed, (purpose, round_))]
    cols: list[np.ndarray] = []
    for w in words:  # each int as 32-bit words, least significant first
        while True:
            cols.append(np.full(cids.shape, w & 0xFFFFFFFF, dtype=np.uint32))
            w >>= 32
            if not w:
                break
    cols.append((cids & 0xFFFFFFFF).astype(np.uint32))
    u32 = np.uint32
    with np.errstate(over="ignore"):
        hc = [u32(_INIT_A)]

        def hashmix(v):
            v = v ^ hc[0]
            hc[0] = u32(hc[0] * u32(_MULT_A))
            v = v * hc[0]
            return v ^ (v >> u32(16))

        def mix(x, y):
            r = u32(_MIX_L) * x - u32(_MIX_R) * y
            return r ^ (r >> u32(16))

        zero = np.zeros(cids.shape, dtype=np.uint32)
        pool = [hashmix(cols[i] if i < len(cols) else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL, len(cols)):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], hashmix(cols[src]))
        hb = u32(_INIT_B)
        out = []
        for i in range(2):  # the first uint64 of generate_state: two 32-bit words
            v = pool[i] ^ hb
            hb = u32(hb * u32(_MULT_B))
            v = v * hb
            out.append(v ^ (v >> u32(16)))
    first = out[0].astype(np.uint64) | (out[1].astype(np.uint64) << np.uint64(32))
    return (first >> np.uint64(1)).tolist()
