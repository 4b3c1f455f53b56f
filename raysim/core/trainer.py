"""The Trainer: runs jobs on one model architecture, as many at once as the model allows.

``Trainer.fit`` runs a list of jobs (jobs.py):
- across clients (conv-free models, ``stack_across``): jobs stacked into passes, a pass taking
  its jobs through all their steps, step t of every job that has one as one stacked product;
  batches are padded to the batch size (padding weighs 0), so each job's shapes, hence its
  numbers, do not depend on the other jobs; how many jobs a pass holds is measured
  (``Widths``);
- within a client (``stack_within``): a client's jobs (e.g. FedEM's M components) stacked, batch
  sizes exact;
- otherwise one job at a time. One job alone is the same loop with K = 1.

Jobs that can share a pass (one objective, settings and constants' names) are stacked (K, ...)
and trained by ``_train``: it lays out their batches (``batches.schedule``), makes the
optimizer (``optim.Stacked``), picks the way to a step's gradients (``_gradients``: the chain's
hand-written pass, the objective's gradients at points, autograd, or DP-SGD's) and runs the
passes (passes.py). ``Trainer`` also evaluates stacked parameter sets (``outputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from . import chain as chn
from . import dpsgd, optim
from . import forward as fwd
from .batches import pool, schedule, to_device
from .jobs import Fitted, Job, Rows, Settings, pad_steps
from .objectives import Batch, Objective, Supervised
from .passes import Run, pad_jobs
from .steps import Steps
from .widths import Widths


class Trainer:
    """Runs jobs on one model architecture (a host's scratch model), vectorized as the
    ``stacking`` mode and the model allow (forward.py)."""

    def __init__(
        self,
        model: nn.Module,
        mode: str = "auto",
        budget: int = 1 << 26,
        gradients: str = "auto",
        decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.model = model
        # stored inputs -> model inputs (an image source's uint8 pixels: ``data.Pixels``), applied
        # to each batch as it is gathered and to each block evaluated
        self.decode = decode or _as_is
        self.forward = fwd.make_forward(model)
        self.trainable = tuple(p.requires_grad for p in model.parameters())  # not running statistics
        device = next(iter(model.parameters()), torch.empty(0)).device
        self.across = fwd.stack_across(mode, model, device)
        self.within = fwd.stack_within(mode, model)
        # passes of exactly this many jobs, padded (0: measured widths, ``Widths``)
        self.fixed = fwd.fixed_width(mode, model)
        # gradients by hand where the model is a chain of linear layers (``gradients: autograd``: never)
        self.chain = chn.make(model) if gradients == "auto" else None
        self.widths = Widths(mode)
        self.budget = budget
        self._stack_key = None
        self._stack_val = None

    def _mask(self, count: int) -> tuple[bool, ...]:
        """The model's trainable mask for a job of ``count`` parameters: a job may carry several
        copies of the model (SuPerFed's global and local models, pFedMe's θ and w) and extra
        tensors after them (APFL's α), each copy following the model's mask, the extras trained."""
        n = len(self.trainable)
        return (self.trainable * (count // n) + (True,) * (count % n))[:count]

    # -- training -------------------------------------------------------------------------------
    def fit(self, jobs: list[Job]) -> list[Fitted]:
        out: list[Fitted | None] = [None] * len(jobs)
        if self.across:
            units = [list(range(len(jobs)))]
        elif self.within:  # consecutive jobs of one client
            units = []
            for i, j in enumerate(jobs):
                if units and jobs[units[-1][0]].cid == j.cid:
                    units[-1].append(i)
                else:
                    units.append([i])
        else:
            units = [[i] for i in range(len(jobs))]
        for unit in units:
            groups: dict[tuple, list[int]] = {}
            for i in unit:
                j = jobs[i]
                key = (
                    id(j.objective),
                    j.settings,
                    tuple(sorted(j.consts)),
                    j.opt_state is not None,
                    j.draws is not None,
                )
                groups.setdefault(key, []).append(i)
            for idx in groups.values():
                for i, res in zip(idx, self._fit([jobs[i] for i in idx], exact=not self.across)):
                    out[i] = res
        return out

    def _fit(self, jobs: list[Job], exact: bool) -> list[Fitted]:
        s, obj = jobs[0].settings, jobs[0].objective
        bs, epochs = s.batch_size, s.epochs
        X, Y, offsets = _pool(jobs)
        ns = [int(j.y.shape[0]) for j in jobs]
        steps = [_capped(epochs * -(-n // bs), j.max_steps) for n, j in zip(ns, jobs)]
        order = sorted(range(len(jobs)), key=lambda k: -steps[k])  # longest first: active jobs are a prefix
        if steps[order[0]] == 0:
            return [Fitted([p.clone() for p in j.params], 0.0, _state_copy(j) if j.keep_state else None) for j in jobs]
        if exact and len(set(steps)) != 1:
            raise ValueError("exact batches need jobs of one client (equal sizes and steps)")
        draws = None
        if jobs[0].draws is not None:
            t_max = steps[order[0]]
            draws = torch.stack([pad_steps(jobs[k].draws, t_max) for k in order]).to(X.device)
        P = [torch.stack(ts) for ts in zip(*(jobs[k].params for k in order))]
        consts = {key: _stack_const([jobs[k].consts[key] for k in order], X.device) for key in jobs[0].consts}
        weights = [jobs[k].weights for k in order] if any(j.weights is not None for j in jobs) else None
        P, mean, opt = self._train(
            P,
            X,
            Y,
            [offsets[id(jobs[k].x)] for k in order],
            [ns[k] for k in order],
            [jobs[k].orders for k in order],
            s,
            obj,
            consts,
            weights,
            draws,
            [jobs[k].opt_state for k in order],
            exact,
            [steps[k] for k in order],
            [jobs[k].noise_seed for k in order],
        )
        results: list[Fitted | None] = [None] * len(jobs)
        own = [p.clone().unbind(0) for p in P]  # one copy per parameter, a view per job
        for i, k in enumerate(order):
            results[k] = Fitted([p[i] for p in own], mean[i], opt.state_of(i) if jobs[k].keep_state else None, steps[k])
        return results

    def fit_rows(self, job: Rows) -> tuple[list[torch.Tensor], list[float]]:
        """Train a host's jobs given as arrays (``Rows``: parameters stacked (K, ...), the clients'
        rows of one pooled data tensor): the same passes as ``fit`` on the K jobs one by one, so
        the same numbers, without a ``Job`` per client. Returns the trained parameters stacked
        (K, ...) in the jobs' order and each job's mean loss."""
        s, obj = job.settings, job.objective
        if not self.across:
            raise ValueError("fit_rows needs a model stacked across clients (no convolutions)")
        if s.dp_clip > 0:
            raise ValueError("fit_rows has no DP-SGD (its jobs draw no noise seeds)")
        k_all = len(job.ns)
        bs, epochs = s.batch_size, s.epochs
        steps = [epochs * -(-n // bs) for n in job.ns]
        order = sorted(range(k_all), key=lambda k: -steps[k])
        if k_all == 0 or steps[order[0]] == 0:
            return [p.clone() for p in job.params], [0.0] * k_all
        same = order == list(range(k_all))
        pick = None if same else torch.tensor(order, device=job.x.device)

        def arrange(t: torch.Tensor) -> torch.Tensor:
            return t.contiguous().clone() if same else t.index_select(0, pick).contiguous()

        P = [arrange(p) for p in job.params]
        consts = {
            key: [arrange(v) for v in val] if isinstance(val, (list, tuple)) else arrange(val)
            for key, val in job.consts.items()
        }
        draws = None if job.draws is None else arrange(job.draws)
        orders = job.orders
        if not same:
            ends = torch.tensor([epochs * n for n in job.ns]).cumsum(0).tolist()
            orders = torch.cat([job.orders[e - epochs * job.ns[k] : e] for k, e in ((k, ends[k]) for k in order)])
        P, mean, _ = self._train(
            P,
            job.x,
            job.y,
            [job.starts[k] for k in order],
            [job.ns[k] for k in order],
            orders,
            s,
            obj,
            consts,
            None,
            draws,
            [None] * k_all,
            False,
        )
        if not same:
            back = torch.empty_like(pick)
            back[pick] = torch.arange(k_all, device=pick.device)
            P = [p.index_select(0, back) for p in P]
            mean = [mean[i] for i in back.tolist()]
        return P, mean

    def _train(
        self,
        P: list[torch.Tensor],
        X: torch.Tensor,
        Y: torch.Tensor,
        starts: list[int],
        ns: list[int],
        orders: list[torch.Tensor],
        s: Settings,
        obj: Objective,
        consts: dict,
        weights,
        draws,
        opt_states: list,
        exact: bool,
        caps: list[int] | None = None,
        noise_seeds: list | None = None,
    ):
        """The loop proper: K jobs, longest first (``caps``: the steps each takes, where fewer
        than its epochs' batches), their parameters stacked in ``P`` (trained in place), their
        data at rows ``starts`` of ``X``/``Y``; returns (P, mean loss per job, the optimizer)."""
        k_real = len(ns)
        cap = max(1, self.budget // max(1, 3 * sum(p[0].numel() for p in P) + s.batch_size * X[0].numel()))
        fixed = min(cap, self.fixed) if self.across and self.fixed else 0
        if fixed and k_real % fixed:  # fill the last pass with copies of the last job
            P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds = pad_jobs(
                -k_real % fixed, P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds, s.epochs
            )
        sched = schedule(orders, weights, starts, ns, s, caps, exact, X.device)
        train_mask = self._train_mask(obj, len(P))
        trained = [p for p, t in zip(P, train_mask) if t]
        opt = optim.Stacked(s.optimizer, s.lr, s.momentum, s.weight_decay, s.betas, s.eps, trained, opt_states)
        step, by_hand = self._gradients(
            obj, P, s, consts, weights, draws, train_mask, trained, opt, noise_seeds, X.device
        )
        run = Run(
            P=P,
            trained=trained,
            X=X,
            Y=Y,
            decode=self.decode,
            consts=consts,
            sched=sched,
            opt=opt,
            step=step,
            train_mask=train_mask,
            terms=self.chain.terms if by_hand else None,
            measure=self.widths if self.across else None,
            tune=_pass_kind(s, P, train_mask, by_hand, obj, consts),
            cap=cap,
            fixed=fixed,
        )
        self._mode(True)
        mean = (run.train() / sched.seen.clamp_min(1)).tolist()
        if len(ns) > k_real:
            P, mean = [p[:k_real] for p in P], mean[:k_real]
        return P, mean, opt

    def _train_mask(self, obj: Objective, count: int) -> tuple[bool, ...]:
        """Which of a job's ``count`` parameters the optimizer trains: the model's trainable ones
        (``_mask``), less those the objective leaves alone (``Objective.trainable``)."""
        mask = self._mask(count)
        return mask if obj.trainable is None else tuple(a and b for a, b in zip(obj.trainable, mask))

    def _gradients(self, obj, P, s, consts, weights, draws, train_mask, trained, opt, noise_seeds, device):
        """The way to a run's step gradients (steps.py), and whether it is the chain's fused step:
        DP-SGD's (per-sample clipping by the chain's norms where it would go by hand, else by
        torch.func; noise per job), by hand for ``Supervised``'s loss on a chain, the
        objective's gradients at points (on a chain where it needs one), else autograd."""
        by_hand = (
            self.chain is not None
            and type(obj) is Supervised  # not a subclass's own loss
            and self.chain.supports(obj.task, len(P), consts)
        )
        if s.dp_clip > 0:
            dpsgd.check(obj, weights, draws, consts)
            clipped = self.chain.private_step if by_hand else partial(dpsgd.clipped_sums, self.model)
            return dpsgd.Private(obj.task, clipped, s, train_mask, trained, noise_seeds, device).step, False
        steps = Steps(obj, train_mask, opt, draws, self.chain, self.forward, self.point_grad)
        if by_hand:
            return steps.by_hand, True
        by_points = obj.by_points() and (
            not obj.needs_chain or (self.chain is not None and self.chain.supports(obj.task, len(self.trainable), {}))
        )
        return (steps.at_points if by_points else steps.by_autograd), False

    def _private_step(self, task, params, x, y, valid, clip: float, train_mask: tuple[bool, ...]):
        """``Chain.private_step`` for any model ``privacy.level: sample`` accepts, by torch.func:
        ``dpsgd.clipped_sums`` of this trainer's model (which a run calls directly)."""
        return dpsgd.clipped_sums(self.model, task, params, x, y, valid, clip, train_mask)

    def point_grad(self, task, batch: Batch) -> Callable:
        """``grad(point, weight=None, offset=None, train=None, outputs=False)`` for an
        objective's ``gradients`` on this step's batch: the data loss summed over valid rows
        (K,) and the gradient of Σ_rows weight·ℓ at the point (``weight``: the batch's row
        weights, or other ones (K, B), e.g. Per-FedAvg's parts of the batch), one tensor per
        model tensor (None where it does not train). ``offset``: a constant added to the
        model's outputs before the loss (FedRoD's log prior, or another model's detached
        logits); ``train``: a mask over the model's tensors, the only ones differentiated
        (no gradient flows below the lowest); ``outputs``: the model's outputs at the point
        (K, B, out), before the offset, come back third. By hand for a chain, else by autograd
        (the same graph as ``Supervised.loss``'s without its terms). By hand only: ``hidden``
        (``chain.Chain.step``), a loss on a layer's input, for an objective that sets
        ``needs_chain``."""
        base = self.trainable

        def masked(train) -> tuple[bool, ...]:
            return base if train is None else tuple(a and b for a, b in zip(base, train))

        if self.chain is not None and self.chain.supports(task, len(base), {}):

            def by_hand(point, weight=None, offset=None, train=None, outputs=False, hidden=None):
                mask = masked(train)
                data_sum, grads, *out = self.chain.step(
                    task,
                    point,
                    batch.x,
                    batch.y,
                    batch.weight if weight is None else weight,
                    batch.valid,
                    chn.Terms(),
                    mask,
                    offset=offset,
                    outputs=outputs,
                    hidden=hidden,
                )
                it = iter(grads)
                return (data_sum, [next(it) if m else None for m in mask], *out)

            return by_hand

        def by_autograd(point, weight=None, offset=None, train=None, outputs=False):
            mask = masked(train)
            with torch.enable_grad():
                leaves = [p.detach().requires_grad_(m) for p, m in zip(point, mask)]
                out = self.forward(leaves, batch.x)
                per = task.per_sample(out if offset is None else out + offset, batch.y)
                loss = (per * (batch.weight if weight is None else weight)).sum(1)
                it = iter(torch.autograd.grad(loss.sum(), [p for p, m in zip(leaves, mask) if m]))
            got = [next(it) if m else None for m in mask]
            return ((per.detach() * batch.valid).sum(1), got, *((out.detach(),) if outputs else ()))

        return by_autograd

    def _mode(self, training: bool) -> None:
        if self.model.training != training:  # Module.train() walks every submodule: only on a change
            self.model.train(training)

    # -- evaluation -----------------------------------------------------------------------------
    def stacked(self, sets: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        """The sets stacked (K, ...), cached while the same set objects are asked for again (a
        message's components are stacked once, not once per client)."""
        key = [id(s) for s in sets]
        if self._stack_key is None or self._stack_key[0] != key:
            self._stack_val = fwd.stack(sets)
            self._stack_key = (key, list(sets))  # references keep the identity check sound
        return self._stack_val

    @torch.no_grad()
    def outputs(self, sets: list[list[torch.Tensor]], x: torch.Tensor, block: int = 4096) -> torch.Tensor:
        """Outputs of every set on shared inputs ``x``: (K, n, outputs)."""
        self._mode(False)
        P = self.stacked(sets)
        k = P[0].shape[0]
        out = []
        for i in range(0, max(int(x.shape[0]), 1), block):
            xb = self.decode(x[i : i + block])
            if self.within:
                out.append(self.forward(P, xb.unsqueeze(0).expand(k, *xb.shape)))
            else:
                out.append(torch.cat([self.forward([p[j : j + 1] for p in P], xb.unsqueeze(0)) for j in range(k)]))
        return out[0] if len(out) == 1 else torch.cat(out, dim=1)


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x


def _pass_kind(s: Settings, P: list[torch.Tensor], train_mask, by_hand: bool, obj, consts: dict) -> tuple:
    """What the time of a pass's job-step depends on, the key its widths are measured under
    (``Widths``): the batch, the parameters' shapes, what trains, by hand or not, the objective
    and its constants."""
    return (s.batch_size, tuple(tuple(p.shape[1:]) for p in P), train_mask, by_hand, id(obj), tuple(sorted(consts)))


def _pool(jobs: list[Job]) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
    """The jobs' data pooled (``pool``), with each job's data's first row in them (by ``id``;
    a client's jobs share its data)."""
    xs, ys = {}, {}
    for j in jobs:
        xs.setdefault(id(j.x), j.x)
        ys.setdefault(id(j.x), j.y)
    X, Y, starts = pool(list(xs.values()), list(ys.values()))
    return X, Y, dict(zip(xs, starts))


def _capped(steps: int, cap: int | None) -> int:
    return steps if cap is None else min(steps, cap)


def _stack_const(values: list, device: torch.device) -> Any:
    """The jobs' constants stacked (K, ...) on the jobs' ``device``. A tensor every job holds as
    the same object (the round's received model as everyone's proximal anchor) is one row seen
    K times (stride 0), not K copies."""
    if isinstance(values[0], (list, tuple)):
        return [_same_or_stacked(ts) for ts in zip(*values)]
    return to_device(torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in values]), device)


def _same_or_stacked(ts) -> torch.Tensor:
    if all(t is ts[0] for t in ts):
        return ts[0].unsqueeze(0).expand(len(ts), *ts[0].shape)
    return torch.stack(ts)


def _state_copy(job: Job) -> dict | None:
    if job.opt_state is None:
        return None
    return {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone()) for k, v in job.opt_state.items()}
