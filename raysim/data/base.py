"""Data-layer basics: the FederatedSource interface, per-client splits, DataError."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from algorithms.base import ClientData
from raysim.rng import generator


class DataError(Exception):
    """Missing or malformed data; the message is one line saying where we looked and what to do."""


@dataclass(frozen=True)
class Splits:
    train: float = 0.8
    val: float = 0.0
    test: float = 0.2


class FederatedSource:
    """A federated dataset: ``client(cid)`` gives one client's split shard, deterministically.

    Built cheaply in every host process; each host only materializes its own clients.
    """

    num_clients: int
    input_shape: tuple[int, ...]
    num_classes: int

    def client(self, cid: int) -> ClientData:
        raise NotImplementedError

    def num_samples(self, cid: int) -> int:
        raise NotImplementedError


def split_client(cid: int, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                 splits: Splits, seed: int) -> ClientData:
    """Shuffle a client's samples with (seed, "split", cid) and cut train/val/test.

    With n >= 2 samples, train and test each get at least one sample.
    """
    x = torch.as_tensor(x, dtype=torch.float32)
    y = torch.as_tensor(y, dtype=torch.int64)
    n = int(y.shape[0])
    perm = torch.from_numpy(generator(seed, "split", cid).permutation(n))
    n_test = int(round(splits.test * n))
    n_val = int(round(splits.val * n))
    if n >= 2:
        n_test = min(max(n_test, 1), n - 1)
        n_val = min(n_val, n - 1 - n_test)
    n_train = n - n_test - n_val
    tr, va, te = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    return ClientData(cid, x[tr].contiguous(), y[tr].contiguous(), x[va].contiguous(),
                      y[va].contiguous(), x[te].contiguous(), y[te].contiguous())
