"""DP-SGD's cost: raysim's private local training against Opacus, the PyTorch library for it,
on the same model, data and settings.

    python bench/dpsgd.py
    PYTHONPATH=/path/to/opacus python bench/dpsgd.py     # Opacus is no dependency of raysim: install
                                                         # it beside (pip install --target DIR opacus)

One client of 2 048 samples of generated data, batch 64, 2 epochs (64 steps), SGD lr 0.05, each
sample's gradient clipped to C = 1, noise multiplier 1, one thread, each run timed 3 times and
the fastest kept. Two models: the MLP 784-100-10 (raysim's chain path: per-sample norms from the
layers' errors and inputs) and the FEMNIST CNN of 2.3 million parameters (per-sample gradients
from torch.func). Lines:

- raysim, plain: ``Trainer.fit`` of one job without privacy (the floor);
- raysim, DP-SGD: the same job with ``dp_clip``/``dp_noise`` (``privacy.level: sample``);
- Opacus: ``PrivacyEngine.make_private`` on the module, a ``torch.optim.SGD`` and a shuffled
  ``DataLoader`` of batch 64 (``poisson_sampling=False``, as raysim's shuffled batches), the
  usual loop (zero_grad, forward, cross-entropy, backward, step).

It prints seconds per epoch and the ratios DP-SGD / plain and Opacus / raysim DP-SGD.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F

from raysim.core import forward as fwd
from raysim.core.data import ClientData, Context
from raysim.core.loop import Settings, Supervised, Trainer, make_job
from raysim.core.tasks import TASKS
from raysim.models import CNNParams, MLPParams, femnist_cnn, mlp

N, B, EPOCHS, LR, CLIP, Z = 2048, 64, 2, 0.05, 1.0, 1.0


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def raysim_epoch(build, shape, classes, private: bool) -> float:
    model = build()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, *shape, generator=g), torch.randint(0, classes, (N,), generator=g)
    data = ClientData(0, x, y, x[:0], y[:0], x, y)
    settings = Settings(lr=LR, epochs=EPOCHS, batch_size=B)
    if private:
        settings = dataclasses.replace(settings, dp_clip=CLIP, dp_noise=Z)
    trainer, start, objective = Trainer(model), fwd.params_of(model), Supervised(TASKS["classification"])
    return (
        best(
            lambda: trainer.fit(
                [make_job(start, data, Context(0, 1, 0, torch.Generator().manual_seed(1)), settings, objective)]
            )
        )
        / EPOCHS
    )


def opacus_epoch(build, shape, classes) -> float | None:
    try:
        from opacus import PrivacyEngine
    except ImportError:
        return None
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, *shape, generator=g), torch.randint(0, classes, (N,), generator=g)

    def run():
        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=B, shuffle=True)
        model, optimizer, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=Z,
            max_grad_norm=CLIP,
            poisson_sampling=False,
        )
        for _ in range(EPOCHS):
            for xb, yb in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                optimizer.step()

    return best(run) / EPOCHS


def main() -> None:
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    workloads = {
        "MLP 784-100-10": (lambda: mlp(MLPParams((100,)), (784,), 10), (784,), 10),
        "FEMNIST CNN": (lambda: femnist_cnn(CNNParams(), (1, 28, 28), 62), (1, 28, 28), 62),
    }
    print(
        f"{'workload':<16} {'raysim plain':>13} {'raysim DP-SGD':>14} {'Opacus':>9} {'DP/plain':>9} {'Opacus/raysim':>14}"
    )
    for name, (build, shape, classes) in workloads.items():
        plain = raysim_epoch(build, shape, classes, False)
        private = raysim_epoch(build, shape, classes, True)
        peer = opacus_epoch(build, shape, classes)
        peer_s = f"{peer:8.3f}s" if peer is not None else f"{'-':>9}"
        ratio = f"{peer / private:14.2f}" if peer is not None else f"{'(no Opacus)':>14}"
        print(f"{name:<16} {plain:12.3f}s {private:13.3f}s {peer_s} {private / plain:9.2f} {ratio}", flush=True)


if __name__ == "__main__":
    main()
