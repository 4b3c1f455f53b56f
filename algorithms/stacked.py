"""M copies of one architecture trained as one stacked model (FedEM's components, DESIGN.md §3).

FedEM multiplies a client's work by M: M forward passes, M backward passes, M optimizer steps
per batch, each too small to keep a core busy. Here the M parameter sets are stacked along a new
leading dimension and every layer runs once for all M copies: ``Linear`` as a batched matrix
product, ``Conv2d`` as a grouped convolution (groups = M), pools and activations unchanged.
One backward pass then gives every copy its own gradient (the copies share no parameter), and
one foreach SGD step updates them all. The arithmetic per copy is the sequential one; results
agree with training the copies one after another to float rounding (tests check this).

Supported: ``nn.Linear``, ``nn.Conv2d`` (zero padding, groups 1), element-wise activations,
dropout, 1-D/2-D pooling, ``nn.Flatten`` from dim 1, and ``nn.Sequential`` nesting of these.
``stackable(model)`` says whether a model qualifies; callers fall back to one copy at a time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, LocalTraining
from .local_sgd import SGD

ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid,
               nn.Softplus, nn.Identity, nn.Dropout)
POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
         nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


def layers(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, nn.Sequential):
        return [leaf for child in model for leaf in layers(child)]
    return [model]


def _supported(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear) or isinstance(layer, ELEMENTWISE + POOLS):
        return True
    if isinstance(layer, nn.Conv2d):
        return layer.groups == 1 and layer.padding_mode == "zeros"
    if isinstance(layer, nn.Flatten):
        return layer.start_dim == 1 and layer.end_dim == -1
    return False


def stackable(model: nn.Module) -> bool:
    """True when every leaf is supported and the model has no buffers (batch-norm statistics
    would need per-copy handling)."""
    return all(_supported(layer) for layer in layers(model)) and not any(True for _ in model.buffers())


def stack(copies: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """[[p_1 of copy 0, p_2 of copy 0, ...], ...] -> [stacked p_1, stacked p_2, ...] (M, ...)."""
    return [torch.stack(ts) for ts in zip(*copies)]


def unstack(stacked: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Inverse of ``stack``: per-copy lists of (contiguous, detached) tensors."""
    m = stacked[0].shape[0]
    return [[p[i].detach().clone() for p in stacked] for i in range(m)]


def forward(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Outputs of the M copies: ``params`` are the model's parameters stacked (M, ...) in
    ``model.parameters()`` order, ``x`` is (M, B, ...) (copy m sees x[m]); returns (M, B, ...).

    Convolutions keep the grouped layout (B, M·C, H, W) between layers and return to
    (M, B, ...) at a flatten or linear layer."""
    m, b = x.shape[0], x.shape[1]
    it = iter(params)
    grouped = False                      # True: x is (B, M*C, ...)
    for layer in layers(model):
        if isinstance(layer, nn.Conv2d):
            if not grouped:
                x = x.transpose(0, 1).reshape(b, -1, *x.shape[3:])
                grouped = True
            w = next(it)
            bias = next(it) if layer.bias is not None else None
            x = F.conv2d(x, w.reshape(-1, *w.shape[2:]), None if bias is None else bias.reshape(-1),
                         layer.stride, layer.padding, layer.dilation, groups=m)
        elif isinstance(layer, POOLS):
            if grouped:
                x = layer(x)
            else:
                y = layer(x.reshape(m * b, *x.shape[2:]))
                x = y.reshape(m, b, *y.shape[1:])
        elif isinstance(layer, nn.Flatten):
            x = x.reshape(b, m, -1).transpose(0, 1) if grouped else x.reshape(m, b, -1)
            grouped = False
        elif isinstance(layer, nn.Linear):
            if grouped:
                x = x.reshape(b, m, -1).transpose(0, 1)
                grouped = False
            w = next(it)
            bias = next(it) if layer.bias is not None else None
            shape = x.shape
            flat = x.reshape(m, -1, shape[-1])
            out = torch.bmm(flat, w.transpose(1, 2)) if bias is None else torch.baddbmm(bias.unsqueeze(1), flat, w.transpose(1, 2))
            x = out.reshape(*shape[:-1], w.shape[1])
        else:                            # element-wise: any layout
            x = layer(x)
    if grouped:
        x = x.reshape(b, m, -1, *x.shape[2:]).transpose(0, 1)
    return x


@torch.no_grad()
def per_sample_losses(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                      batch: int = 4096) -> torch.Tensor:
    """Cross-entropy of every copy on every sample, (M, n); x and y are shared by the copies."""
    m = params[0].shape[0]
    model.eval()
    out = []
    for i in range(0, max(int(y.shape[0]), 1), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        logits = forward(model, params, xb.unsqueeze(0).expand(m, *xb.shape))
        out.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.repeat(m), reduction="none").view(m, -1))
    return torch.cat(out, dim=1)


@torch.no_grad()
def logits(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """Logits of every copy on shared inputs, (M, n, classes)."""
    m = params[0].shape[0]
    model.eval()
    return torch.cat([forward(model, params, x[i:i + batch].unsqueeze(0).expand(m, *x[i:i + batch].shape))
                      for i in range(0, x.shape[0], batch)], dim=1)


def local_sgd(model: nn.Module, params: list[list[torch.Tensor]], x: torch.Tensor, y: torch.Tensor,
              hp: LocalTraining, ctx: Context, sample_weight: torch.Tensor) -> list[list[torch.Tensor]]:
    """``local_sgd`` for M copies at once: copy m starts from ``params[m]`` and minimizes
    mean_i sample_weight[m, i]·ℓ_i over its own batch order. The orders are drawn as the
    sequential loop draws them (copy 0's epochs first, then copy 1's, ...), so both paths see
    the same batches. Returns the trained per-copy parameter lists."""
    n = int(y.shape[0])
    m = len(params)
    if n == 0:
        return [[p.detach().clone() for p in ps] for ps in params]
    epochs = hp.local_epochs
    orders = torch.stack([torch.stack([torch.randperm(n, generator=ctx.generator) for _ in range(epochs)])
                          for _ in range(m)]).to(x.device)          # (M, epochs, n)
    stacked = [p.detach().clone().requires_grad_(True) for p in stack(params)]
    opt = SGD(stacked, hp.lr_at(ctx.round, ctx.rounds), hp.momentum, hp.weight_decay)
    bs = hp.batch_size
    model.train()
    for e in range(epochs):
        for start in range(0, n, bs):
            idx = orders[:, e, start:start + bs]                    # (M, B)
            out = forward(model, stacked, x[idx])
            per = F.cross_entropy(out.reshape(-1, out.shape[-1]), y[idx].reshape(-1), reduction="none")
            loss = (per.view(idx.shape) * torch.gather(sample_weight, 1, idx)).mean(dim=1).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return unstack(stacked)
