"""The reference for bench/pfl_workload.py: a personalized-FL run written the way PFLlib and
FL-bench train, in one process with no framework.

Fashion-MNIST from the IDX files (read here, normalized as raysim does), the pathological
split raysim's ``shards`` partition makes (sorted by label, 2 x 50 shards, client c holds
shards c and c + 50) and the same per-client 80/20 train/test sizes, so both sides take the
same number of steps. Every round, every client, one after another: a model (nn.Module) loaded
with the global weights, a fresh torch.optim.SGD, a shuffling DataLoader of batch 10, one
epoch; the server averages the clients' state dicts weighted by their sample counts. Ditto
also trains each client's personal model v for one epoch with the gradient of
F_k(v) + (λ/2)‖v − w‖² (PFLlib's and FL-bench's personal step). Evaluation once, after the last
round. PyTorch's default thread count (the machine's cores), as the peers run.

    python bench/bare_pfl.py fedavg 100          # FedAvg, MLP 784-100-10
    python bench/bare_pfl.py ditto 200,200       # Ditto, MLP 784-200-200-10
    python bench/bare_pfl.py fedavg 100 --rounds 3 --root /usr/share/datasets/fashion-mnist
"""

from __future__ import annotations

import argparse
import copy
import gzip
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MEAN, STD = 0.2860, 0.3530


def read_idx(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(root: Path) -> tuple[np.ndarray, np.ndarray]:
    def find(name):
        return next(p for p in (root / name, root / f"{name}.gz") if p.is_file())

    x = np.concatenate([read_idx(find("train-images-idx3-ubyte")), read_idx(find("t10k-images-idx3-ubyte"))])
    y = np.concatenate([read_idx(find("train-labels-idx1-ubyte")), read_idx(find("t10k-labels-idx1-ubyte"))])
    return x, y.astype(np.int64)


def clients(x: np.ndarray, y: np.ndarray, n: int, seed: int = 0):
    order = np.argsort(y, kind="stable")
    pieces = np.array_split(order, 2 * n)
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        idx = np.sort(np.concatenate([pieces[c], pieces[c + n]]))
        idx = idx[rng.permutation(len(idx))]
        k = int(np.floor(0.8 * len(idx) + 0.5))
        xs = torch.from_numpy(((x[idx].astype(np.float32) / 255.0 - MEAN) / STD)[:, None])
        ys = torch.from_numpy(y[idx])
        out.append(((xs[:k], ys[:k]), (xs[k:], ys[k:])))
    return out


def model_of(hidden: list[int]) -> nn.Module:
    layers, width = [nn.Flatten()], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 10))


def train(model: nn.Module, data, lr: float, anchor: list[torch.Tensor] | None = None, lam: float = 0.0) -> None:
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    for xb, yb in DataLoader(TensorDataset(*data), batch_size=10, shuffle=True):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        if anchor is not None:  # the personal objective's pull towards w
            with torch.no_grad():
                for p, a in zip(model.parameters(), anchor):
                    p.grad.add_(p - a, alpha=lam)
        opt.step()


@torch.no_grad()
def accuracy(model: nn.Module, data) -> tuple[int, int]:
    model.eval()
    x, y = data
    return int((model(x).argmax(1) == y).sum()), len(y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("method", choices=("fedavg", "ditto"))
    ap.add_argument("hidden", help="hidden widths, e.g. 100 or 200,200")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    torch.manual_seed(0)
    data = clients(*load(Path(args.root)), args.clients)
    glob = model_of([int(h) for h in args.hidden.split(",")])
    personal = [copy.deepcopy(glob) for _ in data] if args.method == "ditto" else None
    local = copy.deepcopy(glob)
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        states, weights = [], []
        start = [p.detach().clone() for p in glob.parameters()]
        for k, (tr, _) in enumerate(data):
            if personal is not None:
                train(personal[k], tr, args.lr, start, args.lam)
            local.load_state_dict(glob.state_dict())
            train(local, tr, args.lr)
            states.append(copy.deepcopy(local.state_dict()))
            weights.append(len(tr[1]))
        total = sum(weights)
        glob.load_state_dict({key: sum(s[key] * (w / total) for s, w in zip(states, weights)) for key in states[0]})
    rounds = time.perf_counter() - t0
    scored = [accuracy(personal[k] if personal is not None else glob, te) for k, (_, te) in enumerate(data)]
    print(f"rounds={rounds:.2f}s accuracy={sum(c for c, _ in scored) / sum(n for _, n in scored):.4f}")


if __name__ == "__main__":
    main()
