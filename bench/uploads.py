"""What privacy's clipping and each compressor cost a client, against the local training they
follow: microseconds per client upload on one thread, for models of d numbers, beside the time
one local epoch of the bare loop takes for the same MLP (the work the upload follows).

    python bench/uploads.py                       # d of the MLPs 784-100-10 and 784-200-200-10
    python bench/uploads.py --hidden 1000,1000    # a larger model

Each transform runs on a client's reply as the hosts run it (raysim/federation/privacy.py,
raysim/federation/compression.py), the median of --repeat calls after a warm-up. The bare epoch is one
client's 1 000 samples at batch 10 through an nn.Module, autograd and torch.optim.SGD, the way
the peers train.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raysim.core.replies import Weighted  # noqa: E402
from raysim.federation import (
    compression,  # noqa: E402
    privacy,
)
from raysim.scenario.sections import CommunicationCfg  # noqa: E402


def timed(fn, repeat: int) -> float:
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def bare_epoch(model: nn.Module, n: int = 1000, batch: int = 10) -> float:
    x, y = torch.randn(n, 784), torch.randint(0, 10, (n,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = nn.CrossEntropyLoss()

    def epoch():
        for i in range(0, n, batch):
            opt.zero_grad()
            loss(model(x[i : i + batch]), y[i : i + batch]).backward()
            opt.step()

    return timed(epoch, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", action="append", help="hidden sizes, e.g. 100 or 200,200 (repeatable)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for spec in args.hidden or ["100", "200,200"]:
        sizes = [784, *map(int, spec.split(",")), 10]
        layers: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        shared = [p.detach().clone() for p in model.parameters()]
        reply = Weighted([p + 0.01 * torch.randn_like(p) for p in shared], 100.0)
        d = sum(p.numel() for p in shared)
        rows = [("privacy: clip", lambda: privacy.clip(reply, shared, 0.1))]
        for name, cfg in (
            ("qsgd, s = 16", CommunicationCfg("qsgd", 16)),
            ("topk 1 %", CommunicationCfg("topk", ratio=0.01)),
            ("topk 1 %, error feedback", CommunicationCfg("topk", ratio=0.01, error_feedback=True)),
            ("randk 1 %", CommunicationCfg("randk", ratio=0.01)),
        ):
            rows.append((name, lambda cfg=cfg: compression.upload(reply, shared, cfg, None, 0, 0, 0)))
        epoch = bare_epoch(model)
        print(
            f"MLP {'-'.join(map(str, sizes))} (d = {d}): one local epoch of the bare loop, 1 000 samples: "
            f"{epoch * 1e3:.1f} ms"
        )
        print(f"  {'transform':28s} {'µs per client':>14s} {'/ bare epoch':>13s}")
        for name, fn in rows:
            s = timed(fn, args.repeat)
            print(f"  {name:28s} {s * 1e6:14.0f} {s / epoch:13.3f}")


if __name__ == "__main__":
    main()
