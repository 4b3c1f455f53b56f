"""FEMNIST in LEAF's JSON format (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018).

LEAF writes ``train/*.json`` and ``test/*.json``; each file is
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``.
One writer is one client (natural partition); clients are the writers in sorted order, the
first ``data.clients`` of them. With ``leaf_split: true`` (default) a client's train/test are
LEAF's, and ``data.splits.val`` carves a validation share out of its train part; with ``false``
both are pooled and split by ``data.splits``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from raysim.core.data import ClientData
from raysim.rng import generator

from .base import DataError, FederatedSource, Splits, split_client

HOW = ("produce it with LEAF (github.com/TalwalkarLab/leaf): cd leaf/data/femnist && "
       "./preprocess.sh -s niid --sf 0.15 -k 0 -t sample --tf 0.8  (FedEM's setup: 15 % of writers, "
       "80/20 train/test per writer), then set data.root to leaf/data/femnist/data")


@dataclass(frozen=True)
class LeafParams:
    root: str = field(default="data/femnist", metadata={"help": "folder with LEAF's train/ and test/ JSON folders"})
    leaf_split: bool = True


def _read_folder(folder: Path) -> dict[str, tuple[list, list]]:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"leaf_femnist: no JSON files in {folder}; {HOW}")
    users: dict[str, tuple[list, list]] = {}
    for f in files:
        try:
            doc = json.loads(f.read_text())
            for u in doc["users"]:
                d = doc["user_data"][u]
                users[u] = (d["x"], d["y"])
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise DataError(f"leaf_femnist: {f} is not a LEAF JSON file (needs users, num_samples, "
                            f"user_data with x and y): {type(e).__name__}") from None
    return users


class LeafFEMNIST(FederatedSource):
    def __init__(self, params: LeafParams, clients: int, partition, splits: Splits, seed: int):
        self.root, self.leaf_split = Path(params.root), params.leaf_split
        self.splits, self.seed = splits, seed
        self.num_clients, self.input_shape, self.num_classes = clients, (1, 28, 28), 62
        self._users = None

    def users(self):
        if self._users is None:
            for sub in ("train", "test"):
                if not (self.root / sub).is_dir():
                    raise DataError(f"leaf_femnist: no {sub}/ folder under {self.root}; {HOW}")
            train, test = _read_folder(self.root / "train"), _read_folder(self.root / "test")
            names = sorted(set(train) | set(test))
            if len(names) < self.num_clients:
                raise DataError(f"leaf_femnist: {self.root} holds {len(names)} writers, the scenario asks "
                                f"for data.clients = {self.num_clients}")
            self._users = [(n, train.get(n, ([], [])), test.get(n, ([], []))) for n in names[:self.num_clients]]
        return self._users

    def num_samples(self, cid: int) -> int:
        _, tr, te = self.users()[cid]
        return len(tr[1]) + len(te[1])

    def client(self, cid: int) -> ClientData:
        _, (trx, try_), (tex, tey) = self.users()[cid]
        def arrays(x, y):
            return (np.asarray(x, dtype=np.float32).reshape(-1, 1, 28, 28), np.asarray(y, dtype=np.int64))
        (trx, try_), (tex, tey) = arrays(trx, try_), arrays(tex, tey)
        if not self.leaf_split:
            return split_client(cid, np.concatenate([trx, tex]), np.concatenate([try_, tey]), self.splits, self.seed)
        n_val = int(round(self.splits.val * len(try_)))
        perm = generator(self.seed, "split", cid).permutation(len(try_))
        va, tr = perm[:n_val], perm[n_val:]
        t = torch.from_numpy
        return ClientData(cid, t(trx[tr]), t(try_[tr]), t(trx[va]), t(try_[va]), t(tex), t(tey))
