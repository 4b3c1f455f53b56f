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

from dataclasses import field

import torch
import torch.nn.functional as F
from torch import nn

from .base import Context, LocalTraining

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


# Measured on one CPU thread (bench/stacking.py): stacking 3 copies cuts the time of a linear
# model or a 64-100-10 MLP by about a third, breaks even near 50 000 parameters per copy and loses
# beyond (the stacked gradients and momentum no longer fit in cache); grouped convolutions lose
# (FEMNIST CNN: 0.85 s against 0.50 s a client).
AUTO_MAX_PARAMS = 20_000


def worth_stacking(model: nn.Module) -> bool:
    """The ``auto`` rule: no convolution and at most AUTO_MAX_PARAMS parameters per copy."""
    return (not any(isinstance(layer, nn.Conv2d) for layer in layers(model))
            and sum(p.numel() for p in model.parameters()) <= AUTO_MAX_PARAMS)


STACK_MODES = ("auto", "always", "never")


def stack_mode_field(copies: str):
    """The hyperparameter that switches stacking for an algorithm (``copies``: what is stacked)."""
    return field(default="auto", metadata={
        "choices": STACK_MODES,
        "help": f"train {copies} as one stacked model: one pass per batch for all copies, the same "
                "batches and arithmetic. auto: for small models without convolutions, where it is "
                "faster (bench/stacking.py); always: whenever the architecture allows; never: one "
                "after another"})


def use_stacking(mode: str, model: nn.Module) -> bool:
    return mode != "never" and stackable(model) and (mode == "always" or worth_stacking(model))


def use_batching(mode: str, model: nn.Module) -> bool:
    """Stacking across a host's clients too (needs models without convolutions)."""
    return use_stacking(mode, model) and batchable(model)


class Stacking:
    """Mixin for an algorithm whose hyperparameter ``stack_field`` (a ``stack_mode_field``)
    chooses stacking: the decisions, made once from the run's model."""

    stack_field = "stack_clients"

    def _stacking(self) -> bool:
        if getattr(self, "_stack_decision", None) is None:
            self._stack_decision = use_stacking(getattr(self.hp, self.stack_field), self.model_fn())
        return self._stack_decision

    def _batching(self) -> bool:
        """Stack across a host's clients too."""
        if getattr(self, "_batch_decision", None) is None:
            self._batch_decision = use_batching(getattr(self.hp, self.stack_field), self.model_fn())
        return self._batch_decision


def stack(copies: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """[[p_1 of copy 0, p_2 of copy 0, ...], ...] -> [stacked p_1, stacked p_2, ...] (M, ...)."""
    return [torch.stack(ts) for ts in zip(*copies)]


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
def logits(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """Logits of every copy on shared inputs, (M, n, classes)."""
    m = params[0].shape[0]
    model.eval()
    return torch.cat([forward(model, params, x[i:i + batch].unsqueeze(0).expand(m, *x[i:i + batch].shape))
                      for i in range(0, max(int(x.shape[0]), 1), batch)], dim=1)


@torch.no_grad()
def per_sample_losses(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every copy on every sample, (M, n); x and y are shared by the copies."""
    out = logits(model, params, x)
    m, n = out.shape[0], out.shape[1]
    return F.cross_entropy(out.reshape(m * n, -1), y.repeat(m), reduction="none").view(m, n)


def local_sgd(model: nn.Module, params: list[list[torch.Tensor]], x: torch.Tensor, y: torch.Tensor,
              hp: LocalTraining, ctx: Context, sample_weight: torch.Tensor,
              momentum: list[list[torch.Tensor] | None] | None = None
              ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]] | None]:
    """``local_sgd`` for M copies at once: copy m starts from ``params[m]`` and minimizes
    mean_i sample_weight[m, i]·ℓ_i over its own batch order. The orders are drawn as the
    sequential loop draws them (copy 0's epochs first, then copy 1's, ...), so both paths see
    the same batches. ``momentum``: per-copy buffers to continue from (as ``local_sgd_many``).
    Returns the trained per-copy parameter lists and, with SGD momentum, the final buffers."""
    n = int(y.shape[0])
    if n == 0:
        return [[p.detach().clone() for p in ps] for ps in params], momentum
    orders = torch.stack([torch.randperm(n, generator=ctx.generator) for _ in range(len(params) * hp.local_epochs)])
    group = (0, orders.view(len(params), hp.local_epochs, n).to(x.device), sample_weight)
    trained, _, bufs = local_sgd_many(model, params, x, y, [group], hp, hp.lr_at(ctx.round, ctx.rounds),
                                      momentum=momentum, exact=True)
    return trained, bufs


# -- many clients at once (DESIGN.md §3, the batched path) ---------------------------------------
# A host hands FedEM all its sampled clients; their (client, component) copies then train in
# lockstep: step t runs batch t of every copy that still has one, as one stacked pass. Every
# copy's batch is padded to the full batch size (zero weights), so each copy's matrix products
# have the same shapes whichever other copies share the pass. Batched matrix products compute
# each matrix on its own, so a client's numbers do not depend on which clients share its host
# (tests check this bitwise). Grouped convolutions do not have that property (the kernel depends
# on the group count), so models with convolutions stay on the per-client path.

def batchable(model: nn.Module) -> bool:
    """Stackable and made of matrix products only (no convolution)."""
    return stackable(model) and not any(isinstance(layer, nn.Conv2d) for layer in layers(model))


def _copies_per_pass(params: list[torch.Tensor], sample_numel: int, batch: int, budget: int) -> int:
    per_copy = 3 * sum(p[0].numel() for p in params) + batch * sample_numel
    return max(1, budget // max(per_copy, 1))


@torch.no_grad()
def losses_many(model: nn.Module, params: list[list[torch.Tensor]], xs: list[torch.Tensor],
                ys: list[torch.Tensor], block: int = 128, budget: int = 1 << 24) -> list[torch.Tensor]:
    """Per-sample cross-entropy of client c's M copies (``params[c]``, stacked (M, ...)) on its
    own samples ``xs[c]``, ``ys[c]``: a list of (M, n_c). Each client's samples are cut into
    zero-padded blocks of ``block`` rows, so the result depends on the client alone. When every
    client passes the same ``params`` object (FedEM's broadcast), it is not copied per block."""
    model.eval()
    m = params[0][0].shape[0]
    counts = [int(y.shape[0]) for y in ys]
    nblocks = [-(-n // block) for n in counts]
    shape = xs[0].shape[1:]
    if sum(counts) == 0:
        return [xs[0].new_zeros(m, 0) for _ in xs]
    xb = torch.cat([torch.cat([x, x.new_zeros(nb * block - n, *shape)]) for x, n, nb in zip(xs, counts, nblocks)])
    yb = torch.cat([torch.cat([y, y.new_zeros(nb * block - n)]) for y, n, nb in zip(ys, counts, nblocks)])
    xb, yb = xb.view(-1, block, *shape), yb.view(-1, block)
    shared = all(p is params[0] for p in params)
    if not shared:
        owner = torch.repeat_interleave(torch.arange(len(xs), device=xb.device),
                                        torch.tensor(nblocks, device=xb.device))
        per_client = [torch.stack(p) for p in zip(*params)]     # (C, M, ...) per parameter
    step = _copies_per_pass(params[0], shape.numel(), block, budget)
    out = torch.empty(m, xb.shape[0], block, device=xb.device)
    for k in range(m):
        for i in range(0, xb.shape[0], step):                  # blocks i..i+step, copy k
            j = min(xb.shape[0], i + step)
            if shared:
                ps = [p[k].expand(j - i, *p.shape[1:]) for p in params[0]]
            else:
                ps = [p[owner[i:j], k] for p in per_client]
            logits = forward(model, ps, xb[i:j])
            out[k, i:j] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb[i:j].reshape(-1),
                                          reduction="none").view(j - i, block)
    res, start = [], 0
    for n, nb in zip(counts, nblocks):
        res.append(out[:, start:start + nb].reshape(m, -1)[:, :n])
        start += nb
    return res


def local_sgd_many(model: nn.Module, starts: list[list[torch.Tensor]], x: torch.Tensor, y: torch.Tensor,
                   groups: list[tuple[int, torch.Tensor, torch.Tensor]], hp: LocalTraining, lr: float,
                   prox_mu: float = 0.0, momentum: list[list[torch.Tensor] | None] | None = None,
                   exact: bool = False, budget: int = 1 << 26
                   ) -> tuple[list[list[torch.Tensor]], list[float], list[list[torch.Tensor]] | None]:
    """Local SGD of K copies in lockstep, in groups that share samples: a group
    ``(offset, orders, weights)`` with orders (G, epochs, n) and weights (G, n) stands for G
    consecutive copies of ``starts``; its copy g trains on the pooled rows offset..offset+n-1 of
    ``x``, ``y`` in the orders ``orders[g]``, on the loss mean_i weights[g, i]·ℓ_i per batch,
    plus (prox_mu/2)·‖w − start‖² when ``prox_mu`` > 0 (FedProx) — what ``local_sgd`` does with
    those orders (same batches, same SGD arithmetic; float rounding aside). ``momentum[k]``, if
    given, is copy k's SGD momentum buffer to continue from (None: a fresh one, as each call of
    ``local_sgd``). Returns the trained copies, each copy's mean unweighted loss over the samples
    it saw (``local_sgd``'s value) and, with SGD momentum, each copy's final momentum buffer.
    ``exact`` (one group only: the copies of one client): a batch keeps its true size instead of
    being padded to the batch size, which no longer has to be fixed across clients."""
    bs = hp.batch_size
    steps, idx, wts, vals = [], [], [], []
    for offset, o, w in groups:
        g, epochs, n = o.shape
        nb = -(-n // bs)
        pos = torch.zeros(g, epochs, nb * bs, dtype=torch.long, device=x.device)
        pos[:, :, :n] = o
        valid = torch.zeros(epochs, nb * bs, dtype=w.dtype, device=x.device)
        valid[:, :n] = 1.0
        scale = valid / valid.view(epochs, nb, bs).sum(dim=2, keepdim=True).expand(-1, -1, bs).reshape(epochs, -1)
        idx.append((pos + offset).view(g, -1, bs))                              # (G, T, bs)
        wts.append((torch.gather(w, 1, pos.view(g, -1)).view(g, epochs, -1) * scale).view(g, -1, bs))
        vals += [valid.view(-1, bs)] * g
        steps += [epochs * nb] * g
    idx = [t for group in idx for t in group]
    wts = [t for group in wts for t in group]
    k_all = len(starts)
    order = sorted(range(k_all), key=lambda k: -steps[k])     # longest first: active copies are a prefix
    t_max = steps[order[0]]
    active = [sum(1 for k in order if steps[k] > t) for t in range(t_max)]
    # every copy's steps one after another (no padding to the longest copy): copy i of the
    # sorted order has its step t at row first[i] + t
    IDX = torch.cat([idx[k] for k in order])                   # (Σ T_k, bs)
    WT = torch.cat([wts[k] for k in order])
    VAL = torch.cat([vals[k] for k in order])
    seen = torch.tensor([float(vals[k].sum()) for k in order], dtype=torch.float64, device=x.device)
    loss_sums = torch.zeros(k_all, dtype=torch.float64, device=x.device)
    first = torch.tensor([0] + [steps[k] for k in order[:-1]], device=x.device).cumsum(0)
    P = [torch.stack(ts) for ts in zip(*(starts[k] for k in order))]
    anchors = [p.clone() for p in P] if prox_mu else None
    # momentum buffers start at zero (mu·0 + g = g: torch's first step) or where they left off
    bufs = [torch.zeros_like(p) for p in P] if hp.momentum else None
    if bufs is not None and momentum is not None:
        for i, k in enumerate(order):
            if momentum[k] is not None:
                for b, v in zip(bufs, momentum[k]):
                    b[i] = v
    chunk = _copies_per_pass(P, x.shape[1:].numel(), bs, budget)
    if exact and len(groups) != 1:
        raise ValueError("exact batches need a single group of copies")
    widths = VAL[:t_max].sum(dim=1).long().tolist() if exact else [bs] * t_max
    model.train()
    for t in range(t_max):
        kt = active[t]
        width = widths[t]
        for c0 in range(0, kt, chunk):                         # copies c0..c1 in one pass
            c1 = min(kt, c0 + chunk)
            sub = [p[c0:c1].detach().requires_grad_(True) for p in P]
            at = first[c0:c1] + t
            rows_t = IDX[at][:, :width]
            out = forward(model, sub, x[rows_t])
            per = F.cross_entropy(out.reshape(-1, out.shape[-1]), y[rows_t].reshape(-1), reduction="none")
            per = per.view(c1 - c0, width)
            loss = (per * WT[at][:, :width]).sum()
            grads = list(torch.autograd.grad(loss, sub))
            with torch.no_grad():
                loss_sums[c0:c1] += (per * VAL[at][:, :width]).sum(dim=1).to(torch.float64)
                if prox_mu:                       # ∇ (mu/2)‖w − anchor‖² = mu (w − anchor)
                    grads = torch._foreach_add(grads, torch._foreach_sub(sub, [a[c0:c1] for a in anchors]),
                                               alpha=prox_mu)
                if hp.weight_decay:
                    grads = torch._foreach_add(grads, sub, alpha=hp.weight_decay)
                if bufs is not None:
                    b = [buf[c0:c1] for buf in bufs]
                    torch._foreach_mul_(b, hp.momentum)
                    torch._foreach_add_(b, grads)
                    grads = b
                torch._foreach_add_([p[c0:c1] for p in P], grads, alpha=-lr)
    out: list = [None] * k_all
    losses = [0.0] * k_all
    bufs_out: list | None = [None] * k_all if bufs is not None else None
    mean = (loss_sums / seen.clamp_min(1)).tolist()
    for i, k in enumerate(order):
        out[k] = [p[i].clone() for p in P]      # own storage: states outlive this call
        losses[k] = mean[i]
        if bufs_out is not None:
            bufs_out[k] = [b[i].clone() for b in bufs]
    return out, losses, bufs_out


def train_clients(model: nn.Module, starts: list[list[torch.Tensor]], datas: list, ctxs: list[Context],
                  hp: LocalTraining, prox_mu: float = 0.0) -> list[tuple[list[torch.Tensor], float]]:
    """``local_sgd`` for many clients at once, one copy each: client c starts from ``starts[c]``
    and trains on its train split with the batch orders ``local_sgd`` draws from its
    generator. Returns (parameters, mean training loss) per client."""
    out: list = [None] * len(datas)
    live = [c for c, d in enumerate(datas) if d.num_train > 0]
    for c, d in enumerate(datas):
        if d.num_train == 0:
            out[c] = ([p.clone() for p in starts[c]], 0.0)
    if not live:
        return out
    x = torch.cat([datas[c].train_x for c in live])
    y = torch.cat([datas[c].train_y for c in live])
    groups, offset = [], 0
    for c in live:
        n = datas[c].num_train
        orders = torch.stack([torch.randperm(n, generator=ctxs[c].generator) for _ in range(hp.local_epochs)])
        groups.append((offset, orders.unsqueeze(0).to(x.device), torch.ones(1, n, device=x.device)))
        offset += n
    trained, losses, _ = local_sgd_many(model, [starts[c] for c in live], x, y, groups, hp,
                                        hp.lr_at(ctxs[0].round, ctxs[0].rounds), prox_mu=prox_mu)
    for c, params, loss in zip(live, trained, losses):
        out[c] = (params, loss)
    return out
