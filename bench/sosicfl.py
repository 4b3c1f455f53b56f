"""SosicFL's simplex training: raysim against a bare PyTorch implementation written the way the
authors' Floco code is (github.com/dennis-grinwald/floco: a ``SimplexLinear`` classifier whose
weight is Σ α_m W_m over a ParameterList of endpoints, α drawn in every forward pass, one SGD
optimizer over the whole model), on the same workload (bench/sosicfl.yaml): the SimpleCNN on
1x28x28 inputs, 5 endpoints, the same clients, batches and optimizer, one process, one thread.

    python bench/sosicfl.py               # bare loop, then raysim (serial engine, 1 host)
    python bench/sosicfl.py --engine ray  # raysim through Ray (1 host actor, 1 CPU)

Prints the bare loop's training seconds, raysim's (its rounds without the final evaluation),
raysim's whole process and the ratios.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from superfed import compare  # noqa: E402  (the shared bare-vs-raysim runner)

CLIENTS, TRAIN, SHAPE, CLASSES, BATCH, LR, ENDPOINTS, ROUNDS = 5, 1000, (1, 28, 28), 10, 50, 0.02, 5, 3


class SimplexLinear(nn.Linear):
    """The classifier: its weight is Σ_m α_m W_m, α ~ U(Δ) drawn in every training forward pass."""

    def __init__(self, i, o, endpoints, seed):
        super().__init__(i, o)
        self._weights = nn.ParameterList()
        for m in range(endpoints):
            w = torch.empty(o, i)
            torch.manual_seed(seed + m)
            nn.init.xavier_normal_(w)
            self._weights.append(nn.Parameter(w))
        del self.weight

    def forward(self, x):
        e = torch.empty(len(self._weights)).exponential_()
        alpha = e / e.sum()
        w = sum(a * t for a, t in zip(alpha, self._weights))
        return F.linear(x, w, self.bias)


def simple_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 5),
        nn.LeakyReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=1),
        nn.LeakyReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.LeakyReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(256, 128),
        nn.LeakyReLU(),
        SimplexLinear(128, CLASSES, ENDPOINTS, 0),
    )


def bare() -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    data = [
        (
            torch.from_numpy(rng.standard_normal((TRAIN, *SHAPE)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, CLASSES, TRAIN)),
        )
        for _ in range(CLIENTS)
    ]
    model = simple_cnn()
    glob = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.zeros(BATCH, *SHAPE)).sum().backward()  # one-time setup outside the timing
    t0 = time.perf_counter()
    for _ in range(ROUNDS):
        new = {n: torch.zeros_like(p) for n, p in glob.items()}
        for k in range(CLIENTS):
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(glob[n])
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5, weight_decay=5e-4)
            x, y = data[k]
            order = torch.randperm(TRAIN)
            for i in range(0, TRAIN, BATCH):
                idx = order[i : i + BATCH]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            for n, p in model.named_parameters():
                new[n] += p.detach() / CLIENTS
        glob = new
    return time.perf_counter() - t0


def main() -> None:
    compare("sosicfl", bare, "sosicfl.yaml")


if __name__ == "__main__":
    main()
