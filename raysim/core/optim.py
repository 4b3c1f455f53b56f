"""SGD and Adam on stacked parameters (K sets along dim 0), in foreach calls.

The arithmetic is torch.optim's (SGD: momentum without dampening or Nesterov, coupled weight
decay; Adam: bias-corrected, coupled weight decay) applied to every set at once; the
optimizers' per-step bookkeeping, which costs as much as the step itself for the small models
clients train, is left out. Tests hold both to torch.optim on one set.

State per set is a dict of tensors, so a client can keep it across rounds (in its state) and
a checkpoint can hold it: SGD {"momentum": [...]} and Adam {"exp_avg": [...], "exp_avg_sq":
[...], "step": scalar}. A fresh state is zeros: for SGD μ·0 + g = g is torch's first step.
"""

from __future__ import annotations

import torch

from raysim.core import OPTIMIZERS  # noqa: F401 - re-exported
from raysim.core.chain import shared_row


def state_keys(name: str, momentum: float) -> tuple[str, ...]:
    if name == "adam":
        return ("exp_avg", "exp_avg_sq")
    return ("momentum",) if momentum else ()


def fresh(name: str, momentum: float, params: list[torch.Tensor]) -> dict:
    """A fresh state for one set."""
    out = {k: [torch.zeros_like(p) for p in params] for k in state_keys(name, momentum)}
    if name == "adam":
        out["step"] = torch.zeros((), dtype=torch.float64)
    return out


class Stacked:
    """The state of K sets stacked, and the step. ``params``: the trainable stacked tensors."""

    def __init__(
        self,
        name: str,
        lr: float,
        momentum: float,
        weight_decay: float,
        betas,
        eps: float,
        params: list[torch.Tensor],
        states: list[dict | None],
    ):
        self.name, self.lr, self.momentum, self.wd = name, lr, momentum, weight_decay
        self.b1, self.b2 = betas
        self.eps = eps
        self.buffers = {}
        for key in state_keys(name, momentum):
            self.buffers[key] = [
                torch.stack(
                    [p[k].new_zeros(p.shape[1:]) if s is None else s[key][i].to(p.device) for k, s in enumerate(states)]
                )
                for i, p in enumerate(params)
            ]
        if name == "adam":
            self.steps = torch.tensor(
                [0.0 if s is None else float(s["step"]) for s in states], dtype=torch.float64, device=params[0].device
            )

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], lo: int, hi: int) -> None:
        """One step of sets lo..hi-1 (``params`` and ``grads`` are those slices; the gradients
        are the step's own temporaries: weight decay is added into them, unless one is a
        broadcast view, as autograd gives for a parameter that enters the loss through a sum)."""
        if self.wd:
            if any(0 in g.stride() for g in grads):
                grads = torch._foreach_add(grads, params, alpha=self.wd)
            else:
                torch._foreach_add_(grads, params, alpha=self.wd)
        if self.name == "sgd":
            if self.momentum:
                bufs = [b[lo:hi] for b in self.buffers["momentum"]]
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, grads)
                grads = bufs
            torch._foreach_add_(params, grads, alpha=-self.lr)
            return
        m = [b[lo:hi] for b in self.buffers["exp_avg"]]
        v = [b[lo:hi] for b in self.buffers["exp_avg_sq"]]
        self.steps[lo:hi] += 1
        steps = self.steps[lo:hi]
        torch._foreach_lerp_(m, grads, 1 - self.b1)
        torch._foreach_mul_(v, self.b2)
        torch._foreach_addcmul_(v, grads, grads, 1 - self.b2)
        bc1 = 1 - self.b1**steps  # per set: steps may differ (kept states)
        bc2_sqrt = (1 - self.b2**steps).sqrt()
        for p, mi, vi in zip(params, m, v):
            shape = (-1,) + (1,) * (p.dim() - 1)
            denom = (vi.sqrt() / bc2_sqrt.to(p.dtype).view(shape)).add_(self.eps)
            p.addcdiv_(mi * (-self.lr / bc1).to(p.dtype).view(shape), denom)

    # -- the chain path's fused SGD (chain.py): a parameter's whole step at once, its gradient
    # coming as a product added straight into the tensor the step adds it to
    def fusable(self) -> bool:
        return self.name == "sgd"

    def prepare(self, terms):
        """A pass's objective terms (chain.Terms: gradient c·w + d) in the form the fused step
        uses: without momentum, w ← scale·w + shift − lr·G with scale = 1 − lr·(c + λ) (K,)
        and shift = −lr·d, so the terms cost one pass over w (``addcmul``) instead of three."""
        if self.name == "sgd" and not self.momentum:
            if terms.c is not None:  # (weight decay alone: one scalar factor in ``fused``)
                terms.scale = 1 - self.lr * (terms.c + self.wd)
            if terms.d is not None:
                terms.shift = [shared_row(d, lambda r: r * -self.lr) for d in terms.d]
        return terms

    def fused(
        self,
        j: int,
        lo: int,
        hi: int,
        p: torch.Tensor,
        terms,
        a: torch.Tensor | None = None,
        b: torch.Tensor | None = None,
        g: torch.Tensor | None = None,
    ) -> None:
        """One SGD step of sets lo..hi-1 of trained parameter j (``p``: that slice) whose
        gradient is G = bmm(a, b) (or ``g``) plus the objective's terms c·p + d (``terms``,
        ``prepare``d; c (K,) per set), and weight decay λ:

            no momentum:  p ← (1 − lr·(c + λ))·p − lr·d − lr·G
            momentum μ:   m ← μ·m + G + c·p + λ·p + d,  p ← p − lr·m

        the arithmetic of ``step`` up to rounding, in one to four passes over p instead of a
        gradient tensor and its several passes. The chain path's tensors track no gradient, so
        no ``no_grad`` here (its per-call cost is a tenth of a small step's)."""
        shape = (-1,) + (1,) * (p.dim() - 1)
        if not self.momentum:
            shift = None if terms.shift is None else terms.shift[j]
            if terms.scale is not None:
                scale = terms.scale.view(shape)
                if shift is not None:
                    torch.addcmul(shift, p, scale, out=p)
                else:
                    p.mul_(scale)
            else:
                if self.wd:
                    p.mul_(1 - self.lr * self.wd)
                if shift is not None:
                    p.add_(shift)
            if g is None:
                p.baddbmm_(a, b, alpha=-self.lr)
            else:
                p.add_(g, alpha=-self.lr)
            return
        m = self.buffers["momentum"][j][lo:hi]
        if g is None:
            m.baddbmm_(a, b, beta=self.momentum)
        else:
            m.mul_(self.momentum).add_(g)
        if terms.c is not None:
            m.addcmul_(p, terms.c.view(shape))
        if self.wd:
            m.add_(p, alpha=self.wd)
        if terms.d is not None:
            m.add_(terms.d[j])
        p.add_(m, alpha=-self.lr)

    def state_of(self, k: int) -> dict:
        """Set k's state (own storage)."""
        out = {key: [b[k].clone() for b in bufs] for key, bufs in self.buffers.items()}
        if self.name == "adam":
            out["step"] = self.steps[k].clone()
        return out
