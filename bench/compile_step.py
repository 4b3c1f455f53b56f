"""Would ``torch.compile`` make the training step faster on a CPU? One client-step of an MLP at
batch 10 with SGD (momentum 0.9, weight decay 1e-4), one thread, three ways:

- raysim's loop (``Trainer``, K clients stacked in one pass, gradients by hand, the SGD step
  fused into the gradient products: raysim/core/chain.py, optim.py);
- the peers' step (PFLlib, FL-bench): an ``nn.Module``, autograd, ``torch.optim.SGD``, client
  after client;
- that step under ``torch.compile`` (Inductor's C++ backend; needs a C++ compiler), with the
  time the first call takes to compile it.

    python bench/compile_step.py                 # MLP 784-200-200-10, K = 1 and 5
    python bench/compile_step.py --hidden 100 --clients 1 3

Prints microseconds per client-step (median of alternated repeats) and the ratios to raysim's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from raysim.core import forward as fwd
from raysim.core.loop import Job, Settings, Supervised, Trainer, draw_orders
from raysim.core.tasks import TASKS
from raysim.models import MLPParams, mlp

LR, MOMENTUM, WD, BATCH, N = 0.01, 0.9, 1e-4, 10, 840


def raysim_fit(hidden: list[int], k: int):
    models = [mlp(MLPParams(tuple(hidden)), (784,), 10) for _ in range(k)]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, 784, generator=g), torch.randint(0, 10, (N,), generator=g)
    s = Settings(lr=LR, batch_size=BATCH, momentum=MOMENTUM, weight_decay=WD)
    jobs = [
        Job(fwd.params_of(models[i]), x, y, draw_orders(g, N, 1), s, Supervised(TASKS["classification"]), None, cid=i)
        for i in range(k)
    ]
    trainer = Trainer(models[0], "always")
    return lambda: trainer.fit(jobs)


def peer_step(hidden: list[int]):
    g = torch.Generator().manual_seed(0)
    model = mlp(MLPParams(tuple(hidden)), (784,), 10)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(BATCH, 784, generator=g), torch.randint(0, 10, (BATCH,), generator=g)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, x, y


def per_step(fn, steps: int) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, nargs="+", default=[200, 200])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 5], help="clients stacked in raysim's pass")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    eager, x, y = peer_step(args.hidden)
    compiled_step, cx, cy = peer_step(args.hidden)
    t0 = time.perf_counter()
    compiled = torch.compile(compiled_step)
    compiled(cx, cy)
    compile_s = time.perf_counter() - t0
    steps = N // BATCH
    ours = {k: raysim_fit(args.hidden, k) for k in args.clients}
    for fit in ours.values():
        fit()  # warm-up
    for _ in range(5):
        compiled(cx, cy)
    res: dict[str, list[float]] = {name: [] for name in ["eager", "compiled", *[f"raysim K={k}" for k in ours]]}
    for _ in range(args.repeats):
        res["eager"].append(per_step(lambda: [eager(x, y) for _ in range(steps)], steps))
        res["compiled"].append(per_step(lambda: [compiled(cx, cy) for _ in range(steps)], steps))
        for k, fit in ours.items():
            res[f"raysim K={k}"].append(per_step(fit, steps * k))
    med = {name: statistics.median(v) for name, v in res.items()}
    base = med[f"raysim K={args.clients[0]}"]
    print(
        f"MLP 784-{'-'.join(map(str, args.hidden))}-10, batch {BATCH}, SGD momentum {MOMENTUM}, one thread; "
        f"torch.compile's first call: {compile_s:.1f} s"
    )
    print(f"{'step':<22} {'us per client-step':>18} {'/ raysim K=' + str(args.clients[0]):>16}")
    for name, v in med.items():
        print(f"{name:<22} {v:18.0f} {v / base:16.2f}")


if __name__ == "__main__":
    main()
