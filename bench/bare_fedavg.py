"""The floor: plain PyTorch FedAvg, one process, one thread, no framework.

The identical computation to bench/tiny.yaml, bench/cnn.yaml and bench/mlp.yaml: the same data shapes
(standard-normal features, uniform labels), model, batch size, lr, local epochs and full
participation, with a fresh copy of the global model and a fresh SGD optimizer per client, as a
researcher would write it.

    python bench/bare_fedavg.py tiny 1000 10
    python bench/bare_fedavg.py cnn 50 5
    python bench/bare_fedavg.py mlp 100 5
    python bench/bare_fedavg.py cnn 50 5 cuda     # on the GPU (data moved there once)
"""

import copy
import sys
import time

import numpy as np
import torch
from torch import nn

SPECS = {
    "tiny": dict(shape=(150,), classes=2, samples=64, batch=32, lr=0.05),
    "cnn": dict(shape=(1, 28, 28), classes=62, samples=64, batch=32, lr=0.05),
    "mlp": dict(shape=(784,), classes=10, samples=64, batch=10, lr=0.05),
}


def make_model(kind: str) -> nn.Module:
    if kind == "tiny":
        return nn.Linear(150, 2)
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10)
        )
    return nn.Sequential(
        nn.Conv2d(1, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 2048),
        nn.ReLU(),
        nn.Linear(2048, 62),
    )


def client_data(kind: str, cid: int):
    s = SPECS[kind]
    rng = np.random.default_rng(cid)
    x = rng.standard_normal((s["samples"], *s["shape"])).astype(np.float32)
    y = rng.integers(0, s["classes"], s["samples"])
    return torch.from_numpy(x), torch.from_numpy(y)


def local_train(model: nn.Module, x, y, kind: str, gen: torch.Generator) -> int:
    s = SPECS[kind]
    opt = torch.optim.SGD(model.parameters(), lr=s["lr"])
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(x), generator=gen).to(x.device)
    for i in range(0, len(x), s["batch"]):
        idx = order[i : i + s["batch"]]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    return len(x)


def main(kind: str, clients: int, rounds: int, device: str = "cpu") -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device(device)
    warm = make_model(kind).to(dev)  # one-time setup outside the timing, as raysim's hosts do
    opt = torch.optim.SGD(warm.parameters(), lr=0.0)
    warm(torch.zeros(SPECS[kind]["batch"], *SPECS[kind]["shape"], device=dev)).sum().backward()
    opt.step()
    t0 = time.perf_counter()
    data = [tuple(t.to(dev) for t in client_data(kind, c)) for c in range(clients)]
    glob = make_model(kind).to(dev)
    gen = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        acc = [torch.zeros_like(p) for p in glob.parameters()]
        total = 0
        for x, y in data:
            m = copy.deepcopy(glob)
            n = local_train(m, x, y, kind, gen)
            total += n
            for a, p in zip(acc, m.parameters()):
                a.add_(p.detach(), alpha=n)
        with torch.no_grad():
            for g, a in zip(glob.parameters(), acc):
                g.copy_(a / total)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(f"bare {kind} clients={clients} rounds={rounds} device={device} wall={wall:.2f}s")
    return wall


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])
