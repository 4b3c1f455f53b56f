"""A model run for K parameter sets at once (the batched path).

The K parameter sets are stacked along a new leading dimension and every layer runs once for
all of them: ``Linear`` as a batched matrix product, ``Conv2d`` as a grouped convolution
(groups = K), pools and activations unchanged. One backward pass then gives every set its own
gradient (they share no parameter). A model this cannot stack (other layers, buffers such as
batch-norm statistics) runs set by set through ``torch.func.functional_call``: the same results,
one set at a time.

Batched matrix products compute each matrix on its own, so with conv-free models a set's
numbers do not depend on which other sets share the pass (tests check this bitwise). Grouped
convolutions do not have that property (the kernel depends on the group count), so models with
convolutions are stacked only within one client (``Trainer``, trainer.py), never across clients.
"""

from __future__ import annotations

from dataclasses import field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

ELEMENTWISE = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Identity,
    nn.Dropout,
)
POOLS = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)


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
    """Every leaf is supported and the model has no buffers (batch-norm statistics would need
    per-set handling)."""
    return all(_supported(layer) for layer in layers(model)) and not any(True for _ in model.buffers())


def batchable(model: nn.Module) -> bool:
    """Stackable and made of matrix products only: stacking across clients keeps each client's
    numbers independent of the others."""
    return stackable(model) and not any(isinstance(layer, nn.Conv2d) for layer in layers(model))


STACK_MODES = ("auto", "always", "padded", "never")
GPU_PASS = 32
"""Jobs per stacked pass with ``stacking: padded`` (``fixed_width``)."""


def stacking_field():
    """The hyperparameter every algorithm has for the batched path."""
    return field(
        default="auto",
        metadata={
            "choices": STACK_MODES,
            "help": "train a host's clients (and each client's parameter sets, e.g. FedEM's components) as "
            "stacked models: one pass per batch for many, the same batches and arithmetic. auto: models "
            "without convolutions, as many sets a pass as measured fastest on this machine (widths.Widths; "
            "the numbers do not depend on it); on a GPU, each client's own sets only (across clients, "
            "the stack's width picks the GPU's kernels, and with them the last bits); padded: clients "
            "stacked in passes of exactly 32 sets, the last padded, so the shapes, hence a GPU's kernels, "
            "do not depend on the hosts (on a GPU much faster than auto for MLPs; see the GPU guide for "
            "what was checked); always: every set in one pass wherever the architecture allows "
            "(convolutions within a client only; on a GPU the numbers then depend on how clients are "
            "spread over hosts); never: one set after another",
        },
    )


def stack_within(mode: str, model: nn.Module) -> bool:
    """Stack the parameter sets of one client (exact batch sizes; on any device): wherever the
    sets can be stacked across clients on the CPU, and with ``always`` for convolutions too (grouped
    convolutions: the numbers depend on the group count, so never by default)."""
    return stack_across(mode, model) or (mode == "always" and stackable(model))


def stack_across(mode: str, model: nn.Module, device: torch.device | None = None) -> bool:
    """Stack the parameter sets of all a host's clients in lockstep (padded batches): models
    made of matrix products only, unless ``never``. On a GPU not with ``auto``: there a
    batched product's kernel, and so the order of its additions, is chosen by the number of
    sets in it, and that number (a host's clients) changes with the hosts (``padded`` fixes
    it); on the CPU each set's product comes out the same in any stack."""
    if device is not None and device.type != "cpu" and mode == "auto":
        return False
    return mode != "never" and batchable(model)


def fixed_width(mode: str, model: nn.Module) -> int:
    """With ``padded``: every pass, and every step of it, holds ``GPU_PASS`` jobs (the last
    pass filled with copies of its last job, jobs whose steps are done computing on, their
    results put back), so the shapes every kernel sees do not depend on which, or how many,
    other clients a host holds. 0 otherwise (widths measured, ``widths.Widths``)."""
    return GPU_PASS if mode == "padded" and stack_across(mode, model) else 0


def stack(sets: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """[[p_1 of set 0, p_2 of set 0, ...], ...] -> [stacked p_1, stacked p_2, ...] (K, ...)."""
    return [torch.stack(ts) for ts in zip(*sets)]


def _plan(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's leaves with their kind, worked out once per model."""
    plan = getattr(model, "_raysim_plan", None)
    if plan is None:
        plan = []
        for layer in layers(model):
            kind = (
                "conv"
                if isinstance(layer, nn.Conv2d)
                else "pool"
                if isinstance(layer, POOLS)
                else "flatten"
                if isinstance(layer, nn.Flatten)
                else "linear"
                if isinstance(layer, nn.Linear)
                else "elementwise"
            )
            plan.append((kind, layer))
        object.__setattr__(model, "_raysim_plan", plan)
    return plan


def stacked_forward(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Outputs of K sets: ``params`` are the model's parameters stacked (K, ...) in
    ``model.parameters()`` order, ``x`` is (K, B, ...) (set k sees x[k]); returns (K, B, ...).

    Convolutions keep the grouped layout (B, K·C, H, W) between layers and return to
    (K, B, ...) at a flatten or linear layer."""
    m, b = x.shape[0], x.shape[1]
    it = iter(params)
    grouped = False  # True: x is (B, K*C, ...)
    for kind, layer in _plan(model):
        if kind == "conv":
            if not grouped:
                x = x.transpose(0, 1).reshape(b, -1, *x.shape[3:])
                grouped = True
            x = _conv(layer, x, it, m)
        elif kind == "pool":
            x = layer(x) if grouped else _pool_stacked(layer, x, m, b)
        elif kind == "flatten":
            x = x.reshape(b, m, -1).transpose(0, 1) if grouped else x.reshape(m, b, -1)
            grouped = False
        elif kind == "linear":
            if grouped:
                x = x.reshape(b, m, -1).transpose(0, 1)
                grouped = False
            x = _linear(layer, x, it, m)
        else:  # element-wise: any layout
            x = layer(x)
    if grouped:
        x = x.reshape(b, m, -1, *x.shape[2:]).transpose(0, 1)
    return x


def _conv(layer: nn.Module, x: torch.Tensor, it, m: int) -> torch.Tensor:
    """A convolution of the K sets as one grouped convolution (groups = K) on the grouped layout
    (B, K·C, H, W); its weight (and bias) the next stacked parameters of ``it``."""
    w = next(it)
    bias = next(it) if layer.bias is not None else None
    return F.conv2d(
        x,
        w.reshape(-1, *w.shape[2:]),
        None if bias is None else bias.reshape(-1),
        layer.stride,
        layer.padding,
        layer.dilation,
        groups=m,
    )


def _pool_stacked(layer: nn.Module, x: torch.Tensor, m: int, b: int) -> torch.Tensor:
    """A pool on the stacked layout (K, B, ...): the K·B samples as one batch."""
    y = layer(x.reshape(m * b, *x.shape[2:]))
    return y.reshape(m, b, *y.shape[1:])


def _linear(layer: nn.Module, x: torch.Tensor, it, m: int) -> torch.Tensor:
    """A linear layer of the K sets as one batched matrix product on the stacked layout
    (K, B, ..., in); its weight (and bias) the next stacked parameters of ``it``."""
    w = next(it)
    bias = next(it) if layer.bias is not None else None
    shape = x.shape
    flat = x.reshape(m, -1, shape[-1])
    if torch.is_grad_enabled():
        # (W x^T)^T rather than x W^T: the weight's gradient (grad · x) then comes out
        # contiguous, which the optimizer's foreach step needs to be fast
        out = (
            torch.bmm(w, flat.transpose(1, 2))
            if bias is None
            else torch.baddbmm(bias.unsqueeze(2), w, flat.transpose(1, 2))
        ).transpose(1, 2)
    else:  # no gradient: the faster layout for many rows
        out = (
            torch.bmm(flat, w.transpose(1, 2))
            if bias is None
            else torch.baddbmm(bias.unsqueeze(1), flat, w.transpose(1, 2))
        )
    return out.reshape(*shape[:-1], w.shape[1])


def make_forward(model: nn.Module):
    """``forward(params, x)`` for K sets at once, (K, B, ...) -> (K, B, outputs)."""
    if stackable(model):
        return lambda params, x: stacked_forward(model, params, x)
    names = [n for n, _ in model.named_parameters()]

    def one_by_one(params, x):
        return torch.stack(
            [functional_call(model, {n: p[k] for n, p in zip(names, params)}, (x[k],)) for k in range(x.shape[0])]
        )

    return one_by_one


def params_of(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of a model's parameters, in ``model.parameters()`` order."""
    return [p.detach().clone() for p in model.parameters()]
