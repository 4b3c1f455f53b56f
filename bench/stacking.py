"""Stacked jobs against one job after another, with the one loop (raysim/core/loop.py): FedEM's
local step for M = 3 components of each model of the zoo, one CPU thread, one client of 300
samples (batch 128, momentum .9, weight decay 5e-4). ``auto`` now stacks every model without
convolutions and measures the width of a pass as it trains (widths.Widths); the last column says
whether it stacks.

    python bench/stacking.py
"""

from __future__ import annotations

import time

import torch

from raysim.core import forward as fwd
from raysim.core.loop import Job, Settings, Supervised, Trainer, draw_orders
from raysim.core.tasks import TASKS
from raysim.models import CNNParams, LinearParams, MLPParams, femnist_cnn, linear, mlp

CASES = [
    ("linear 150->10", lambda: linear(LinearParams(), (150,), 10), (150,), 10),
    ("mlp 64-32-10", lambda: mlp(MLPParams((32,)), (64,), 10), (64,), 10),
    ("mlp 64-100-10", lambda: mlp(MLPParams((100,)), (64,), 10), (64,), 10),
    ("mlp 64-200-200-10", lambda: mlp(MLPParams((200, 200)), (64,), 10), (64,), 10),
    ("mlp 784-200-200-10", lambda: mlp(MLPParams((200, 200)), (784,), 10), (784,), 10),
    ("femnist_cnn", lambda: femnist_cnn(CNNParams(), (1, 28, 28), 62), (1, 28, 28), 62),
]


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    torch.set_num_threads(1)
    s = Settings(lr=0.05, batch_size=128, momentum=0.9, weight_decay=5e-4)
    objective = Supervised(TASKS["classification"])
    m, n = 3, 300
    print(f"{'model':<20} {'params':>8} {'stacked ms':>11} {'one by one ms':>14} {'ratio':>6}  auto")
    for name, build, shape, classes in CASES:
        models = [build() for _ in range(m)]
        x, y = torch.rand(n, *shape), torch.randint(0, classes, (n,))
        q = torch.softmax(torch.randn(m, n), dim=0)
        g = torch.Generator().manual_seed(0)
        jobs = [Job(fwd.params_of(models[i]), x, y, draw_orders(g, n, 1), s, objective, q[i], cid=0) for i in range(m)]
        stacked, alone = Trainer(models[0], "always"), Trainer(models[0], "never")
        reps = 3 if "cnn" in name else 20
        a, b = timed(lambda: stacked.fit(jobs), reps), timed(lambda: alone.fit(jobs), reps)
        size = sum(p.numel() for p in models[0].parameters())
        print(
            f"{name:<20} {size:>8} {a * 1e3:>11.2f} {b * 1e3:>14.2f} {a / b:>6.2f}  "
            f"{'stack' if fwd.stack_across('auto', models[0]) else 'one by one'}"
        )


if __name__ == "__main__":
    main()
