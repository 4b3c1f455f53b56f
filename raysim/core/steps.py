"""One step's gradients, the ways the loop has to them.

A pass of the loop (passes.py) takes step t of its jobs lo..hi-1 as one stacked step: it
gathers their batch, asks one of these for the data loss and the gradients, and applies the
optimizer. Which one a run uses is decided once (``Trainer._gradients``), from the objective and
the model:

- ``by_hand``: ``Supervised``'s loss on a chain of linear layers (chain.py): the forward pass and
  the gradients written out, each parameter's step fused into the backward pass where the
  optimizer allows (then no gradients come back);
- ``at_points``: an objective that gives its gradients (``Objective.gradients``) from the task
  loss's gradients at points of parameter space (``Trainer.point_grad``: by hand or autograd);
- ``by_autograd``: autograd of the objective's loss;
- DP-SGD's clipped and noised step (``dpsgd.Private.step``), with ``privacy.level: sample``.

Every one has the same form, ``(P, trained, cs, terms, xr, yr, wt_p, val_p, t, width, lo, hi)``
-> (data loss summed over each job's valid rows (K,), the trained parameters' gradients or None,
``[{parameter index: new values}]`` or nothing): the jobs' parameters and trained parameters,
constants and chain terms (sliced to jobs lo..hi-1), the batch's inputs and targets, and the
pass's loss weights and validity rows (``Schedule.rows_of``), of which step t's first ``width``
slots are the batch's. Each slices what it reads, so a step does no work it does not need.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .objectives import Batch


class Steps:
    """The ways to a step's gradients for one run of the loop: its objective, the mask of the
    parameters the optimizer trains, the optimizer (``by_hand`` fuses its step), the jobs' draws
    (K, steps, ...) or None, the chain (``by_hand``), the stacked forward (``by_autograd``) and
    ``point_grad`` (``at_points``)."""

    def __init__(self, obj, train_mask, opt, draws, chain, forward: Callable, point_grad: Callable):
        self.obj, self.train_mask, self.opt, self.draws = obj, train_mask, opt, draws
        self.chain, self.forward, self.point_grad = chain, forward, point_grad

    def by_hand(self, P, trained, cs, terms, xr, yr, wt_p, val_p, t, width, lo, hi):
        """The chain's step: the optimizer's step fused into it where it can (grads None)."""
        data_sum, grads = self.chain.step(
            self.obj.task,
            P,
            xr,
            yr,
            wt_p[: hi - lo, t, :width],
            val_p[: hi - lo, t, :width],
            terms,
            self.train_mask,
            self.opt,
            lo,
            hi,
        )
        return data_sum, grads, ()

    def at_points(self, P, trained, cs, terms, xr, yr, wt_p, val_p, t, width, lo, hi):
        """The objective's gradients from the task loss's at its points."""
        obj, draws = self.obj, self.draws
        batch = Batch(xr, yr, wt_p[: hi - lo, t, :width], val_p[: hi - lo, t, :width])
        data_sum, every, *assign = obj.gradients(
            self.point_grad(obj.task, batch), P, batch, cs, None if draws is None else draws[lo:hi, t]
        )
        grads = [g for g, m in zip(every, self.train_mask) if m]
        if any(g is None for g in grads):
            raise ValueError("the objective gave no gradient for a parameter the optimizer trains")
        return data_sum, grads, assign

    def by_autograd(self, P, trained, cs, terms, xr, yr, wt_p, val_p, t, width, lo, hi):
        """Autograd of the objective's loss, summed over the jobs (each job's gradient its own)."""
        obj, draws, train_mask = self.obj, self.draws, self.train_mask
        sub = [p.detach().requires_grad_(m) for p, m in zip(P, train_mask)]
        batch = Batch(xr, yr, wt_p[: hi - lo, t, :width], val_p[: hi - lo, t, :width])
        loss, data_sum, *assign = obj.loss(self.forward, sub, batch, cs, None if draws is None else draws[lo:hi, t])
        grads = list(torch.autograd.grad(loss.sum(), [p for p, m in zip(sub, train_mask) if m]))
        return data_sum, grads, assign
