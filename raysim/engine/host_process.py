"""What a host's process needs apart from its clients: the device it trains on
(``pick_device``; on a GPU, ``deterministic_cuda``: the same numbers from every run) and the
memory it hands back to the system after loading shards and after each round
(``release_freed_memory``)."""

from __future__ import annotations

import os
from typing import Any

import torch


def pick_device(gpus: float) -> torch.device:
    if gpus > 0 and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def deterministic_cuda() -> None:
    """The same numbers from every run on a GPU, whichever hosts share it: cuBLAS with a fixed
    workspace (read at its first use in the process, so set before the host's first product),
    and cuDNN's deterministic kernels instead of the fastest ones it would pick at run time
    (some of which add in an order that changes from run to run)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


# glibc's malloc_trim, looked up once (False: this C library has none)
_TRIM: Any = None


def release_freed_memory(collect: bool = True) -> None:
    """Hand the memory the process has freed back to the system (glibc's ``malloc_trim``;
    elsewhere nothing to do). glibc keeps freed memory on its heap for the next allocations, and
    what it keeps grows with the sizes it has seen freed:

    - after the shards are loaded (``collect``): their many few-MB temporaries (each client's
      inputs before its split, its train split before packing), about 90 MB a host of 25
      Fashion-MNIST clients. They are freed as their references go; a collection of the young
      generations catches any left in a cycle (a full one, over every object PyTorch and MLflow
      made, took 0.1 to 0.2 s a host);
    - after each training and evaluation of a server's round (``train``, ``evaluate``; a gossip
      round's hosts keep their clients' rows in place and do not call it): the stacked passes'
      parameters, gradients and batches, a few to tens of MB each, which glibc's heap keeps at
      the largest sizes the rounds have freed. On Ditto 784-100-10 (50 clients, 2 hosts) the
      run's peak went from 1 075 to 1 040-1 049 MB; the trim takes about 2 ms a host and round
      (of 600 ms)."""
    global _TRIM
    if collect:
        import gc

        gc.collect(1)
    if _TRIM is None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        try:
            _TRIM = getattr(ctypes.CDLL(name), "malloc_trim", False) if name else False
        except OSError:
            _TRIM = False
    if _TRIM:
        _TRIM(0)
