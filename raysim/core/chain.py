"""Gradients by hand for chains of linear layers (the loop's fast path).

Most personalized-FL workloads train small multilayer perceptrons with batches of 10: a step
is then a few small matrix products, and autograd's graph, its per-node allocations and the
cross-entropy's backward cost more than the products themselves (about 2.5x a step for the
784-100-10 MLP, bench/pfl_workload.py). For a model that is a chain of ``Linear`` layers and
element-wise activations (``Flatten`` first allowed), trained on ``Supervised``'s loss, this
module runs the step's forward pass and writes each parameter's gradient directly:

    z_i = a_{i-1} W_iᵀ + b_i            a_i = σ_i(z_i)
    δ_L = w ⊙ (softmax(z_L) − onehot(y))                      cross-entropy
    δ_L = w ⊙ 2 (z_L − y) / D                                  squared error (mean over D outputs)
    ∂W_i = δ_iᵀ a_{i-1}     ∂b_i = Σ_rows δ_i     δ_{i-1} = (δ_i W_i) ⊙ σ'_{i-1}(z_{i-1})

for K parameter sets at once (batched products, as ``forward.stacked_forward``), with w the
batch's per-row loss weights (per-sample weight / rows in the batch, 0 on padding), plus the
objective's constant terms: μ (W − anchor) for a proximal pull and ``linear`` for a gradient
correction. The optimizer step is the loop's own (optim.Stacked), unchanged.

The same (model, objective) always takes the same path, so a run's numbers never depend on
which path another run took; stacked and one-job passes of this path agree bit for bit, as
the autograd path's do (each set's products are computed on their own). The two paths agree
to float32 rounding, not bitwise: tests hold them within 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .tasks import Classification, Regression

ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.Identity)


def plan(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The model as [(kind, layer)] where it is a chain this module differentiates, else None:
    an optional leading Flatten(1, -1), then Linear layers with element-wise activations
    between or after them, no buffers."""
    from .forward import layers

    if any(True for _ in model.buffers()):
        return None
    out: list[tuple[str, nn.Module]] = []
    for i, layer in enumerate(layers(model)):
        if isinstance(layer, nn.Linear):
            out.append(("linear", layer))
        elif isinstance(layer, ACTIVATIONS):
            if not out:  # an activation on the raw inputs: leave it to autograd
                return None
            out.append(("act", layer))
        elif isinstance(layer, nn.Flatten) and i == 0 and layer.start_dim == 1 and layer.end_dim == -1:
            continue
        else:
            return None
    return out if any(k == "linear" for k, _ in out) else None


def shared_row(t: torch.Tensor, fn) -> torch.Tensor:
    """fn of a tensor whose K rows are one row (stride 0 along dim 0), computed once and seen
    K times; of any other tensor, computed whole."""
    if t.dim() and t.stride(0) == 0 and t.shape[0] > 0:
        return fn(t[:1]).expand_as(t)
    return fn(t)


@dataclass
class Terms:
    """An objective's gradient terms beside the data's for the sets of a pass: c·w + d, c (K,)
    per set, d one tensor per trained parameter (either None). ``scale`` and ``shift`` are the
    optimizer's own form of them, made once per pass (``optim.Stacked.prepare``)."""

    c: torch.Tensor | None = None
    d: list[torch.Tensor] | None = None
    scale: torch.Tensor | None = None
    shift: list[torch.Tensor] | None = None

    def head(self, n: int) -> Terms:
        """The terms of the first n sets (a pass's last steps, where its shorter jobs are done)."""

        def cut(v):
            return None if v is None else v[:n] if isinstance(v, torch.Tensor) else [u[:n] for u in v]

        return Terms(cut(self.c), cut(self.d), cut(self.scale), cut(self.shift))


class Chain:
    """Loss and gradients of ``Supervised``'s objective for a chain model (``plan``)."""

    def __init__(self, model: nn.Module, steps: list[tuple[str, nn.Module]]):
        self.layers: list[tuple[bool, list]] = []  # per Linear: (has bias, following activations)
        for kind, layer in steps:
            if kind == "linear":
                self.layers.append((layer.bias is not None, []))
            else:
                self.layers[-1][1].append(layer)
        self.first: list[int] = []  # each layer's first parameter index
        pos = 0
        for has_bias, _ in self.layers:
            self.first.append(pos)
            pos += 1 + has_bias
        self.count = pos  # parameters, in model order

    def supports(self, task, params: int, consts) -> bool:
        """For ``Supervised``'s loss (the loop checks the objective) on this task, with
        ``params`` parameters a job and these constants."""
        return (
            isinstance(task, (Classification, Regression))
            and params == self.count
            and set(consts) <= {"mu", "anchor", "linear"}
        )

    def terms(self, consts: dict, train_mask: tuple[bool, ...]) -> Terms:
        """The objective's gradient terms beside the data's, as c·w + d per trained parameter:
        a proximal pull μ(w − anchor) and a ``linear`` correction give c = μ (K,) and
        d = linear − μ·anchor (constant over a pass's steps: made once per pass)."""
        c = d = None
        if "mu" in consts:
            c = consts["mu"].to(torch.float32)
            anchors = [a for a, t in zip(consts["anchor"], train_mask) if t]
            uniform = bool((c == c[0]).all())
            # one anchor for every set (stride 0) and one μ: d is one row too, seen K times
            d = [
                shared_row(a, lambda r: r * -c[:1].view(-1, *([1] * (a.dim() - 1))))  # noqa: B023 - called at once
                if uniform and a.stride(0) == 0
                else a * -c.view(-1, *([1] * (a.dim() - 1)))
                for a in anchors
            ]
        if "linear" in consts:
            lins = [l for l, t in zip(consts["linear"], train_mask) if t]
            d = lins if d is None else [u + v for u, v in zip(d, lins)]
        return Terms(c, d)

    def step(
        self,
        task,
        params: list[torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        valid: torch.Tensor,
        terms: tuple,
        train_mask: tuple[bool, ...],
        opt=None,
        lo: int = 0,
        hi: int = 0,
        offset: torch.Tensor | None = None,
        outputs: bool = False,
        hidden=None,
    ):
        """One step's data loss summed over each set's valid rows (K,) and the gradients of the
        trained parameters in model order (``terms`` included: ``terms(...)`` of these sets);
        or, given an ``opt`` (optim.Stacked, sets lo..hi-1 of it: ``params`` are their slices)
        that fuses, the step itself, each parameter updated by ``opt.fused`` as soon as its
        gradient is known (and after the layer below has its error from the weights before the
        step); None then comes back for the gradients. ``offset``: a constant added to the
        model's outputs before the loss (broadcast to (K, B, out): FedRoD's log prior, a
        detached other model's logits). ``outputs``: the model's outputs (K, B, out), before
        the offset, come back third. ``hidden``: (parameter index i, fn): a loss on the input
        z of the layer whose weight is parameter i (MOON's representation) joins the data's,
        fn(z) giving its gradient at z (K, B, ...), added to the error passed down there."""
        k, b = x.shape[0], x.shape[1]
        fuse = opt is not None and opt.fusable()
        inputs, seqs, weights = self._forward_pass(params, x.reshape(k, b, -1))
        out = seqs[-1][-1]
        data_sum, delta = _output_error(task, out if offset is None else out + offset, y, weight, valid)
        grads = self._backward(
            params, inputs, seqs, weights, delta, terms, train_mask, opt if fuse else None, lo, hi, hidden
        )
        if fuse:
            return data_sum, None
        got = [grads[i] for i, t in enumerate(train_mask) if t]
        if terms.c is not None:  # the objective's terms c·w + d
            c = terms.c
            trained = [p for p, t in zip(params, train_mask) if t]
            torch._foreach_add_(got, [p * c.view(-1, *([1] * (p.dim() - 1))) for p in trained])
        if terms.d is not None:
            torch._foreach_add_(got, terms.d)
        return (data_sum, got, out) if outputs else (data_sum, got)

    def _backward(self, params, inputs, seqs, weights, delta, terms, train_mask, opt, lo, hi, hidden) -> dict:
        """The backward pass from the output error ``delta``, layer by layer down to the lowest
        trained parameter: each trained parameter's data gradient, stepped by ``opt`` (fused:
        ``opt.fused``) or kept in the dict returned (parameter index -> gradient)."""
        slot = {i: j for j, i in enumerate(i for i, t in enumerate(train_mask) if t)}
        # the earliest parameter that trains: no gradient flows below its layer
        lowest = next((i for i, t in enumerate(train_mask) if t), len(train_mask))
        grads: dict[int, torch.Tensor] = {}
        for li in range(len(self.layers) - 1, -1, -1):
            has_bias, acts = self.layers[li]
            seq = seqs[li]
            for j in range(len(acts) - 1, -1, -1):  # through this layer's activations
                delta = _act_back(acts[j], seq[j], seq[j + 1], delta)
            p = self.first[li]
            below = li > 0 and p > lowest
            prev = torch.bmm(delta, weights[li]) if below else None  # with the weights before the step
            if below and hidden is not None and hidden[0] == p:
                prev = prev + hidden[1](inputs[li])
            if train_mask[p]:
                self._apply(p, slot, params, terms, grads, opt, lo, hi, ga=delta.transpose(1, 2), gb=inputs[li])
            if has_bias and train_mask[p + 1]:
                self._apply(p + 1, slot, params, terms, grads, opt, lo, hi, g=delta.sum(1))
            if not below:
                break
            delta = prev
        return grads

    def private_step(
        self,
        task,
        params: list[torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        valid: torch.Tensor,
        clip: float,
        train_mask: tuple[bool, ...],
    ):
        """DP-SGD's data gradient for K sets (Abadi et al., CCS 2016): each sample's gradient of
        its own loss (over every trained parameter) clipped to L2 norm ``clip``, then summed over
        the batch's valid rows. A sample's squared norm is taken without forming its gradient:
        ‖δ_r a_rᵀ‖² = ‖δ_r‖²·‖a_r‖² for a layer's weight, ‖δ_r‖² for its bias; and since the
        errors δ of every layer are linear in the output's, scaling the output error of sample r
        by s_r = min(1, clip/‖g_r‖) scales its whole gradient. Returns (the data loss summed
        over valid rows (K,), the clipped sums of the trained parameters in model order, the
        clipped rows' count (K,))."""
        k, b = x.shape[0], x.shape[1]
        inputs, seqs, weights = self._forward_pass(params, x.reshape(k, b, -1))
        data_sum, delta = _output_error(task, seqs[-1][-1], y, valid, valid)  # each sample's own loss
        lowest = next((i for i, t in enumerate(train_mask) if t), len(train_mask))
        errors: dict[int, torch.Tensor] = {}  # layer -> its δ (K, B, out), unscaled
        norm2 = torch.zeros(k, b, dtype=delta.dtype, device=delta.device)
        for li in range(len(self.layers) - 1, -1, -1):
            has_bias, acts = self.layers[li]
            seq = seqs[li]
            for j in range(len(acts) - 1, -1, -1):
                delta = _act_back(acts[j], seq[j], seq[j + 1], delta)
            p = self.first[li]
            d2 = (delta * delta).sum(-1)
            if train_mask[p]:
                norm2 += d2 * (inputs[li] * inputs[li]).sum(-1)
            if has_bias and train_mask[p + 1]:
                norm2 += d2
            errors[li] = delta
            if not (li > 0 and p > lowest):
                break
            delta = torch.bmm(delta, weights[li])
        norm = norm2.sqrt_()
        scale = (clip / norm.clamp_min(1e-12)).clamp_(max=1.0)
        clipped = ((norm > clip) & (valid > 0)).sum(1)
        grads: dict[int, torch.Tensor] = {}
        for li, delta in errors.items():
            has_bias, _ = self.layers[li]
            p = self.first[li]
            scaled = delta * scale.unsqueeze(-1)
            if train_mask[p]:
                grads[p] = torch.bmm(scaled.transpose(1, 2), inputs[li])
            if has_bias and train_mask[p + 1]:
                grads[p + 1] = scaled.sum(1)
        return data_sum, [grads[i] for i, t in enumerate(train_mask) if t], clipped

    def _forward_pass(self, params: list[torch.Tensor], a: torch.Tensor) -> tuple[list, list, list]:
        """The chain's forward pass for K sets on inputs (K, B, in): (each layer's input, each
        layer's [z, activations...], each layer's weight)."""
        inputs, seqs, weights = [], [], []
        it = iter(params)
        for has_bias, acts in self.layers:
            w = next(it)
            bias = next(it) if has_bias else None
            weights.append(w)
            inputs.append(a)
            z = (
                torch.bmm(a, w.transpose(1, 2))
                if bias is None
                else torch.baddbmm(bias.unsqueeze(1), a, w.transpose(1, 2))
            )
            seq = [z]
            for act in acts:
                seq.append(_forward(act, seq[-1]))
            seqs.append(seq)
            a = seq[-1]
        return inputs, seqs, weights

    @staticmethod
    def _apply(i, slot, params, terms, grads, opt, lo, hi, ga=None, gb=None, g=None) -> None:
        """Parameter i's gradient bmm(ga, gb) (or g): its fused step, or kept in ``grads``."""
        if opt is not None:
            opt.fused(slot[i], lo, hi, params[i], terms, ga, gb, g)
        else:
            grads[i] = torch.bmm(ga, gb) if g is None else g


def _output_error(
    task, a: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the data loss summed over valid rows (K,), the loss's error at the outputs ``a``, each
    row's weighted by ``weight``): cross-entropy or squared error (mean over outputs)."""
    if isinstance(task, Classification):
        logp = a.log_softmax(-1)
        data_sum = -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * valid).sum(1)
        delta = logp.exp_().mul_(weight.unsqueeze(-1))
        delta.scatter_add_(-1, y.unsqueeze(-1), weight.neg().unsqueeze(-1))
        return data_sum, delta
    diff = a - (y.unsqueeze(-1) if y.dim() == a.dim() - 1 else y)
    data_sum = ((diff * diff).mean(-1) * valid).sum(1)
    return data_sum, diff.mul_((2.0 / a.shape[-1]) * weight.unsqueeze(-1))


def _forward(act: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """a = act(z), without the module call's overhead."""
    if isinstance(act, nn.ReLU):
        return torch.relu(z)
    if isinstance(act, nn.LeakyReLU):
        return torch.nn.functional.leaky_relu(z, act.negative_slope)
    if isinstance(act, nn.Tanh):
        return torch.tanh(z)
    if isinstance(act, nn.Sigmoid):
        return torch.sigmoid(z)
    return z


def _act_back(act: nn.Module, z: torch.Tensor, a: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """δ through a = act(z)."""
    if isinstance(act, nn.ReLU):
        return torch.ops.aten.threshold_backward(delta, a, 0)
    if isinstance(act, nn.LeakyReLU):
        return torch.where(z > 0, delta, delta * act.negative_slope)
    if isinstance(act, nn.Tanh):
        return delta * (1 - a * a)
    if isinstance(act, nn.Sigmoid):
        return delta * (a * (1 - a))
    return delta  # Identity


def make(model: nn.Module) -> Chain | None:
    steps = plan(model)
    return Chain(model, steps) if steps is not None else None
