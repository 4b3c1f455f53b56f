"""A run of the loop: its jobs trained pass by pass, step by step.

``Trainer._train`` prepares a run (the batch schedule, the optimizer, the way to a step's
gradients) and hands it to ``Run``. A pass trains jobs c0..c1-1 through all their steps, so its
parameters stay in cache from step to step; its width is measured (``Widths``), the numbers
are the same whatever it is (each job's products are its own). Step t of a pass is one stacked
step of the jobs that have a step t (jobs are longest first, so they are a prefix): gather
their batch from the pass's rows of the schedule, get the data loss and gradients
(steps.py, dpsgd.py), add the loss to each job's sum, take the optimizer's step and store what
the objective sets.

With a fixed width (``stacking: padded``: on a GPU a product's kernel follows its shapes)
every step of every pass has that many jobs: the last pass is filled with copies of the last
job (``pad_jobs``), and a job whose steps are done goes on computing, its results as they
stood put back at the end of the pass (``_snapshot``, ``_restore``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import optim
from .batches import Schedule, gather
from .widths import Widths


@dataclass
class Run:
    """One call of the loop on K jobs (longest first): their stacked parameters ``P`` (trained
    in place) and the trained ones among them, the pooled data and its ``decode``, the jobs'
    stacked constants, their ``Schedule``, the optimizer, the way to a step's gradients
    (``step``: steps.py), the trained mask, the chain's ``terms`` (by hand, made once per
    pass), and the pass widths: measured by ``measure`` under the key ``tune`` (None: not
    stacked across clients), at most ``cap`` jobs a pass, or ``fixed`` jobs in every one."""

    P: list[torch.Tensor]
    trained: list[torch.Tensor]
    X: torch.Tensor
    Y: torch.Tensor
    decode: Callable[[torch.Tensor], torch.Tensor]
    consts: dict
    sched: Schedule
    opt: optim.Stacked
    step: Callable
    train_mask: tuple[bool, ...]
    terms: Callable | None
    measure: Widths | None
    tune: tuple
    cap: int
    fixed: int

    def train(self) -> torch.Tensor:
        """Every pass, in order; returns each job's data loss summed over its steps (K,)."""
        k_all = len(self.sched.steps)
        self.loss_sums = torch.zeros(k_all, dtype=torch.float64, device=self.X.device)
        c0 = 0
        while c0 < k_all:
            c0 = self.one_pass(c0)
        return self.loss_sums

    def one_pass(self, c0: int) -> int:
        """The pass that starts at job c0, as wide as measured, fixed or capped; returns the
        first job of the next one."""
        k_all, fixed, measure = len(self.sched.steps), self.fixed, self.measure
        width_p = fixed or min(self.cap, measure.pick(self.tune, k_all - c0) if measure is not None else k_all)
        c1 = min(k_all, c0 + width_p)
        t0 = time.perf_counter()
        for lo, snap in self.steps(c0, c1):
            _restore(self.P, self.opt, lo, snap)
        if measure is not None and not fixed:
            measure.record(self.tune, c1 - c0, time.perf_counter() - t0, sum(self.sched.steps[c0:c1]), k_all)
        return c1

    def steps(self, c0: int, c1: int) -> list:
        """Jobs c0..c1-1 through all their steps, step t of those that have one (c0..b-1) as one
        stacked step; returns (first job, snapshot) of the jobs a fixed width carried past
        their last step (jobs live..b-1 of step t, whose losses are no longer counted)."""
        P, opt, step, train_mask, fixed = self.P, self.opt, self.step, self.train_mask, self.fixed
        X, Y, decode, loss_sums = self.X, self.Y, self.decode, self.loss_sums
        active, widths = self.sched.active, self.sched.widths
        cs = {key: [v[c0:c1] for v in val] if isinstance(val, list) else val[c0:c1] for key, val in self.consts.items()}
        sub_P = [p[c0:c1] for p in P]
        sub_trained = [p[c0:c1] for p in self.trained]
        terms = opt.prepare(self.terms(cs, train_mask)) if self.terms is not None else None
        t_pass = self.sched.steps[c0]
        rows_p, wt_p, val_p = self.sched.rows_of(c0, c1, t_pass)  # the pass's batches at once
        b = live = c1
        done = []  # (first job, snapshot) of jobs done early
        for t in range(t_pass):
            if fixed and active[t] < live:  # jobs live..: their results as they stand
                done.append((max(c0, active[t]), _snapshot(P, opt, max(c0, active[t]), live)))
                live = max(c0, active[t])
            elif active[t] < b:  # jobs c0..b-1 have a step t
                b = live = max(c0, active[t])
                cs, sub_P, sub_trained, terms = _heads(b - c0, cs, sub_P, sub_trained, terms)
            width = widths[t]
            rows = rows_p[: b - c0, t, :width]
            xr, yr = decode(gather(X, rows)), gather(Y, rows)
            data_sum, grads, assign = step(sub_P, sub_trained, cs, terms, xr, yr, wt_p, val_p, t, width, c0, b)
            loss_sums[c0:live] += data_sum.detach()[: live - c0].to(torch.float64)
            if grads is not None:
                opt.step(sub_trained, grads, c0, b)
            for i, value in (assign[0] if assign else {}).items():
                if train_mask[i]:
                    raise ValueError(f"the objective sets parameter {i}, which the optimizer trains")
                P[i][c0:b] = value.detach()
        return done


def _heads(part: int, cs: dict, sub_P: list, sub_trained: list, terms) -> tuple:
    """A pass's slices of its first ``part`` jobs (its shorter jobs are done): constants,
    parameters, trained parameters and chain terms."""
    cs = {key: [v[:part] for v in val] if isinstance(val, list) else val[:part] for key, val in cs.items()}
    sub_P = [p[:part] for p in sub_P]
    sub_trained = [p[:part] for p in sub_trained]
    return cs, sub_P, sub_trained, None if terms is None else terms.head(part)


def pad_jobs(pad: int, P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds, epochs: int):
    """``_train``'s inputs with ``pad`` copies of the last job appended (results thrown away):
    the same shapes in every pass of a fixed width."""

    def more(t: torch.Tensor) -> torch.Tensor:  # (K, ...) -> (K + pad, ...); a shared row stays one
        if t.dim() and t.stride(0) == 0:
            return t[:1].expand(t.shape[0] + pad, *t.shape[1:])
        return torch.cat([t, t[-1:].expand(pad, *t.shape[1:])])

    if isinstance(orders, list):
        orders = orders + orders[-1:] * pad
    else:  # flat, job after job: the last job's are last
        orders = torch.cat([orders] + [orders[orders.shape[0] - epochs * ns[-1] :]] * pad)
    consts = {key: [more(v) for v in val] if isinstance(val, list) else more(val) for key, val in consts.items()}
    return (
        [more(p) for p in P],
        starts + starts[-1:] * pad,
        ns + ns[-1:] * pad,
        orders,
        None if weights is None else weights + weights[-1:] * pad,
        opt_states + opt_states[-1:] * pad,
        None if caps is None else caps + caps[-1:] * pad,
        consts,
        None if draws is None else more(draws),
        None if noise_seeds is None else noise_seeds + noise_seeds[-1:] * pad,
    )


def _snapshot(P: list[torch.Tensor], opt, lo: int, hi: int) -> tuple:
    """Jobs lo..hi-1's parameters and optimizer state, copied."""
    bufs = {key: [b[lo:hi].clone() for b in bs] for key, bs in opt.buffers.items()}
    return [p[lo:hi].clone() for p in P], bufs, opt.steps[lo:hi].clone() if opt.name == "adam" else None


def _restore(P: list[torch.Tensor], opt, lo: int, snap: tuple) -> None:
    """Jobs lo..'s parameters and optimizer state put back as ``_snapshot`` took them."""
    params, bufs, steps = snap
    for p, v in zip(P, params):
        p[lo : lo + v.shape[0]] = v
    for key, bs in bufs.items():
        for b, v in zip(opt.buffers[key], bs):
            b[lo : lo + v.shape[0]] = v
    if steps is not None:
        opt.steps[lo : lo + steps.shape[0]] = steps
