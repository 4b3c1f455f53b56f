"""SuPerFed-MM's mixing phase: raysim against a bare PyTorch implementation written the way the
official code is (github.com/vaseline555/SuPerFed: every layer holds a global and a local
weight, λ set on the modules before each mini-batch, one SGD optimizer over both, the prox and
cos² terms summed in Python), on the same workload (bench/superfed.yaml): the same shapes,
clients, batches, optimizer and loss terms, one process, one thread.

    python bench/superfed.py               # bare loop, then raysim (serial engine, 1 host)
    python bench/superfed.py --engine ray  # raysim through Ray (1 host actor, 1 CPU)

Prints the bare loop's training seconds, raysim's (its rounds without the final evaluation),
raysim's whole process and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
CLIENTS, TRAIN, SHAPE, CLASSES, BATCH, LR, MU, NU, ROUNDS = 5, 1000, (1, 28, 28), 10, 10, 0.01, 0.01, 1.0, 3


class LinesLinear(nn.Linear):
    """A bias-free linear layer with a global and a local weight mixed by ``lam``."""

    def __init__(self, i, o, seed_local):
        super().__init__(i, o, bias=False)
        nn.init.xavier_normal_(self.weight)
        self.weight_local = nn.Parameter(torch.empty_like(self.weight))
        g = torch.Generator().manual_seed(seed_local)
        std = (2.0 / (i + o)) ** 0.5
        with torch.no_grad():
            self.weight_local.copy_(torch.randn(o, i, generator=g) * std)
        self.lam = 0.0

    def forward(self, x):
        return F.linear(x, (1 - self.lam) * self.weight + self.lam * self.weight_local)


def two_nn(seed_local):
    return nn.Sequential(
        nn.Flatten(),
        LinesLinear(784, 200, seed_local),
        nn.ReLU(),
        LinesLinear(200, 200, seed_local),
        nn.ReLU(),
        LinesLinear(200, 200, seed_local),
        nn.ReLU(),
        LinesLinear(200, CLASSES, seed_local),
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
    models = [two_nn(k) for k in range(CLIENTS)]
    glob = {n: p.detach().clone() for n, p in models[0].named_parameters() if not n.endswith("_local")}
    lines = [m for m in models[0] if isinstance(m, LinesLinear)]
    warm = two_nn(99)  # one-time setup outside the timing
    warm(torch.zeros(BATCH, *SHAPE)).sum().backward()
    t0 = time.perf_counter()
    for _ in range(ROUNDS):
        new = {n: torch.zeros_like(p) for n, p in glob.items()}
        for k, model in enumerate(models):
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in glob:
                        p.copy_(glob[n])
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)
            lines = [m for m in model if isinstance(m, LinesLinear)]
            x, y = data[k]
            order = torch.randperm(TRAIN)
            for i in range(0, TRAIN, BATCH):
                idx = order[i : i + BATCH]
                lam = float(np.random.uniform(0.0, 1.0))
                for m in lines:
                    m.lam = lam
                loss = F.cross_entropy(model(x[idx]), y[idx])
                prox = sum(((m.weight - glob[f"{j}.weight"]) ** 2).sum() for j, m in zip((1, 3, 5, 7), lines))
                dot = sum((m.weight * m.weight_local).sum() for m in lines)
                nf = sum((m.weight**2).sum() for m in lines)
                nl = sum((m.weight_local**2).sum() for m in lines)
                loss = loss + MU * prox + NU * dot**2 / (nf * nl)
                opt.zero_grad()
                loss.backward()
                opt.step()
            for n, p in model.named_parameters():
                if n in new:
                    new[n] += p.detach() / CLIENTS
        glob = new
    return time.perf_counter() - t0


def raysim(engine: str, scenario: str = "superfed.yaml") -> tuple[float, float]:
    """raysim on bench/``scenario`` in a fresh process, one thread: (training seconds of its
    rounds without the final evaluation, the whole process's seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [
            sys.executable,
            "-m",
            "raysim.cli",
            "run",
            str(HERE / scenario),
            "-q",
            "--engine",
            engine,
            "--summary",
            str(summary),
            "--set",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            "--set",
            f"checkpoint.dir={tmp}/ck",
        ]
        t0 = time.perf_counter()
        subprocess.run(
            cmd, check=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
        )
        whole = time.perf_counter() - t0
        s = json.loads(summary.read_text())
    train = sum(h["round_seconds"] - h.get("eval_seconds", 0.0) for h in s["history"])
    return train, whole


def compare(name: str, bare_loop, scenario: str) -> None:
    """Time the bare loop, then raysim on the same workload; print both and the ratios."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="serial", choices=("serial", "ray"))
    args = ap.parse_args()
    b = bare_loop()
    train, whole = raysim(args.engine, scenario)
    print(
        f"{'workload':<10} {'bare train s':>12} {'raysim train s':>15} {'ratio':>6} {'raysim process s':>17} {'ratio':>6}"
    )
    print(f"{name:<10} {b:12.2f} {train:15.2f} {train / b:6.2f} {whole:17.2f} {whole / b:6.2f}")


def main() -> None:
    compare("superfed", bare, "superfed.yaml")


if __name__ == "__main__":
    main()
