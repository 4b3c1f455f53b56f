"""The one local-training loop every algorithm uses (DESIGN.md §3).

Mini-batch SGD over a client's train split with optional hooks:
- ``sample_weight``: per-sample weights w_i; the batch loss is mean_i(w_i * loss_i) (FedEM);
- ``penalty``: a function of the model returning an extra scalar loss (FedProx, Ditto, ...);
- ``before_step``: called before each forward pass (SuPerFed/SosicFL parameter mixing).
Batches come from the client's derived generator, so the same (seed, round, client) always sees
the same order, whichever host runs it.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, LocalTraining


def load_params(model: nn.Module, params: list[torch.Tensor]) -> None:
    """Copy a flat list of tensors into the model's parameters (no new modules)."""
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)


def get_params(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the model's parameters (safe to keep after the model is reused)."""
    return [p.detach().clone() for p in model.parameters()]


class SGD:
    """torch.optim.SGD's update (momentum, weight decay; no dampening, no Nesterov) in three
    foreach calls: the same arithmetic without the optimizer's per-step bookkeeping, which costs
    as much as the step itself for the small models clients train many times a round."""

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.params, self.lr, self.momentum, self.wd = params, lr, momentum, weight_decay
        self.bufs: list[torch.Tensor | None] = [None] * len(params)   # momentum, per parameter

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]   # as torch: skip no-grad
        ps = [self.params[i] for i in idx]
        grads = [p.grad for p in ps]
        if self.wd:
            grads = torch._foreach_add(grads, ps, alpha=self.wd)
        if self.momentum:
            if all(self.bufs[i] is not None for i in idx):
                bufs = [self.bufs[i] for i in idx]
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, grads)
            else:                                 # first step: the buffer is the gradient
                for i, g in zip(idx, grads):
                    if self.bufs[i] is None:
                        self.bufs[i] = g.clone()
                    else:
                        self.bufs[i].mul_(self.momentum).add_(g)
            grads = [self.bufs[i] for i in idx]
        torch._foreach_add_(ps, grads, alpha=-self.lr)


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    hp: LocalTraining,
    ctx: Context,
    *,
    epochs: int | None = None,
    lr: float | None = None,
    sample_weight: torch.Tensor | None = None,
    penalty: Callable[[nn.Module], torch.Tensor] | None = None,
    before_step: Callable[[], None] | None = None,
    params: list[torch.Tensor] | None = None,
    momentum: list[torch.Tensor | None] | None = None,
) -> float:
    """Train ``model`` in place; return the mean (unpenalized) training loss over all samples seen.

    ``params`` restricts the optimizer to those tensors (default: all model parameters).
    ``momentum``: SGD momentum buffers to continue from (None entries: fresh), one per
    parameter; the list is updated in place with the final buffers (the tensors passed in are
    not modified).
    """
    n = int(y.shape[0])
    if n == 0:
        return 0.0
    epochs = hp.local_epochs if epochs is None else epochs
    lr = hp.lr_at(ctx.round, ctx.rounds) if lr is None else lr
    opt = SGD(list(model.parameters()) if params is None else list(params), lr, hp.momentum, hp.weight_decay)
    if momentum is not None:
        opt.bufs = [None if b is None else b.clone() for b in momentum]
    bs = hp.batch_size
    total = torch.zeros((), device=x.device)
    seen = 0
    model.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=ctx.generator)
        if ctx.device.type != "cpu":
            order = order.to(ctx.device)
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            xb, yb = x[idx], y[idx]
            if before_step is not None:
                before_step()
            out = model(xb)
            if sample_weight is None:
                loss = F.cross_entropy(out, yb)
                data_loss = loss
            else:
                per = F.cross_entropy(out, yb, reduction="none")
                data_loss = per.mean()
                loss = (per * sample_weight[idx]).mean()
            if penalty is not None:
                loss = loss + penalty(model)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += data_loss.detach() * len(idx)
            seen += len(idx)
    if momentum is not None:
        momentum[:] = opt.bufs
    return float(total) / seen


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    model.eval()
    if x.shape[0] <= batch:
        return model(x)
    return torch.cat([model(x[i:i + batch]) for i in range(0, x.shape[0], batch)])


@torch.no_grad()
def accuracy_and_loss(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(number correct, summed cross-entropy) for logits or log-probabilities."""
    if y.shape[0] == 0:
        return 0.0, 0.0
    correct = float((logits.argmax(1) == y).sum())
    loss = float(F.cross_entropy(logits, y, reduction="sum"))
    return correct, loss
