"""The one local-training loop, for one parameter set or thousands at once.

A ``Job`` is one parameter set to train on one client's train split: where it starts, the
sample orders (drawn from the client's generator), optional per-sample weights, per-job
constants its objective reads (e.g. a proximal anchor), and optimizer state to continue from.
An ``Objective`` (objectives.py) says, for K jobs at once, what the loss is: parameters
(stacked (K, ...)) -> per-job loss on a batch. The loop owns everything else: batching, epochs, the optimizer (SGD
with momentum and weight decay, or Adam), devices and the reported loss.

``Trainer.fit`` runs a list of jobs:
- across clients (conv-free models, ``stack_across``): jobs stacked into passes, a pass taking
  its jobs through all their steps, step t of every job that has one as one stacked product;
  batches are padded to the batch size (padding weighs 0), so each job's shapes, hence its
  numbers, do not depend on the other jobs; how many jobs a pass holds is measured
  (``Widths``);
- within a client (``stack_within``): a client's jobs (e.g. FedEM's M components) stacked, batch
  sizes exact;
- otherwise one job at a time. One job alone is the same loop with K = 1.

A step's gradients come from autograd, or, for chains of linear layers trained on the task's
loss (most pFL models), from ``chain.py``'s hand-written backward pass, which is 2-3x faster at
batch 10; the optimizer step is ``optim.Stacked`` either way. Objectives that are the task's
loss at points of parameter space (``Objective.gradients``: APFL, SuPerFed, pFedMe, SosicFL,
Per-FedAvg) get the same hand-written pass at each point.

With ``Settings.dp_clip`` (``privacy.level: sample``) every step is DP-SGD's: per-sample
gradients clipped on the chain path (``Chain.private_step``), Gaussian noise from the job's own
seed added to their sum, divided by the batch size, then the objective's terms and the
optimizer's step.

``drive`` runs client steps written as generators: a step yields the jobs it wants trained,
gets ``Fitted`` back, and returns its result; ``drive`` trains the jobs every client of a host
yielded in one ``fit`` call, so a method written for one client is batched over all of them.
"""

from __future__ import annotations

import bisect
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import chain as chn
from . import forward as fwd
from . import optim
from .data import ClientData, Context
from .objectives import Batch, Objective, Supervised  # noqa: F401 - the contract, re-exported here
from .widths import Widths


@dataclass(frozen=True)
class Settings:
    """What the jobs of one pass share: the optimizer and the batching."""

    lr: float
    epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    dp_clip: float = 0.0  # DP-SGD (privacy.level: sample): each sample's gradient clipped to
    dp_noise: float = 0.0  # this L2 norm, Gaussian noise of std dp_noise·dp_clip on their sum
    poisson: bool = False  # DP-SGD's batches Poisson-sampled: each sample joins each step with
    #                                 probability B/n (``draw_poisson``), the sum divided by B all the same


@dataclass
class Job:
    params: list[torch.Tensor]  # the starting point (not modified)
    x: torch.Tensor  # the client's train inputs and targets
    y: torch.Tensor
    orders: torch.Tensor  # (epochs, n): sample order of each epoch; Poisson batches
    #                                     (``Settings.poisson``): (steps, W), each step's samples, -1 after them
    settings: Settings
    objective: Objective
    weights: torch.Tensor | None = None  # (n,) per-sample loss weights
    consts: dict = field(default_factory=dict)  # tensors or lists of tensors, per job
    opt_state: dict | None = None  # optimizer state to continue from (None: fresh)
    keep_state: bool = False  # return the final optimizer state
    draws: torch.Tensor | None = None  # (steps, ...) the objective's per-step draws
    cid: int = -1
    max_steps: int | None = None  # stop after this many steps (a straggler's partial work)
    noise_seed: int | None = None  # DP-SGD: the seed of this job's noise (from the client's generator)


@dataclass
class Fitted:
    params: list[torch.Tensor]  # own storage
    loss: float  # mean data loss over the samples seen
    opt_state: dict | None = None  # with keep_state
    steps: int = 0  # the local steps taken


def make_job(
    params: list[torch.Tensor],
    data: ClientData,
    ctx: Context,
    settings: Settings,
    objective: Objective,
    *,
    weights=None,
    consts=None,
    opt_state=None,
    keep_state=False,
    orders: torch.Tensor | None = None,
    draws: Callable | None = None,
) -> Job:
    """A job on the client's train split; its orders (one permutation per epoch) and draws come
    from the client's generator now, in the order jobs are made. A context with ``work`` below 1
    (a straggler with part of the time it needs) stops the job after that share of its steps,
    at least one, the draws taken as in full. ``draws``: this job's own
    ``(generator, steps) -> draws`` in place of the objective's (e.g. SosicFL's α from the
    client's subregion)."""
    n = data.num_train
    g = ctx.generator
    steps = settings.epochs * -(-n // settings.batch_size)
    if orders is None:
        orders = (
            draw_poisson(g, n, steps, settings.batch_size) if settings.poisson else draw_orders(g, n, settings.epochs)
        )
    draws = (draws or objective.draws)(g, steps) if steps else None
    cap = None if ctx.work >= 1.0 else max(1, int(ctx.work * steps))  # a straggler's share, at least a step
    noise_seed = int(torch.randint(2**62, (1,), generator=g)) if settings.dp_clip > 0 else None
    return Job(
        params,
        data.train_x,
        data.train_y,
        orders,
        settings,
        objective,
        weights,
        consts or {},
        opt_state,
        keep_state,
        draws,
        ctx.cid,
        cap,
        noise_seed,
    )


@dataclass
class Rows:
    """A host's K jobs as arrays (``Trainer.fit_rows``): each parameter stacked (K, ...), the
    clients' train data as row blocks of one tensor (job k's at rows starts[k] .. starts[k] +
    ns[k]), each job's sample orders, and constants already stacked (a number stands for every
    job; a tensor or list of tensors has K rows)."""

    params: list[torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    starts: list[int]
    ns: list[int]
    orders: torch.Tensor  # every job's (epochs, n_k) orders flattened, job after job
    settings: Settings
    objective: Objective
    consts: dict = field(default_factory=dict)
    draws: torch.Tensor | None = None


def make_rows(
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    starts: list[int],
    ns: list[int],
    seeds: list[int],
    settings: Settings,
    objective: Objective,
    consts: dict | None = None,
) -> Rows:
    """K jobs as ``Rows``: job k's orders and draws come from a generator seeded with
    ``seeds[k]`` (``rng.torch_seeds``), drawn as ``make_job`` draws them from the client's
    context, so a job has the same batches on either path."""
    k = len(ns)
    epochs = settings.epochs
    steps = [epochs * -(-n // settings.batch_size) for n in ns]
    orders = torch.empty(epochs * sum(ns), dtype=torch.long)  # job after job, epoch after epoch
    draws = []
    g = torch.Generator()
    at = 0
    for seed, n, t in zip(seeds, ns, steps):
        g.manual_seed(seed)
        for _ in range(epochs):  # draw_orders' permutations, written in place
            torch.randperm(n, generator=g, out=orders[at : at + n])
            at += n
        draws.append(objective.draws(g, t) if t else None)
    stacked = None
    if any(d is not None for d in draws):
        t_max = max(steps)
        stacked = torch.stack([_pad_steps(d, t_max) for d in draws]).to(x.device)
    rows_consts = {}
    for key, val in (consts or {}).items():
        if isinstance(val, (list, tuple)):
            rows_consts[key] = list(val)
        elif isinstance(val, torch.Tensor) and val.dim() > 0:
            rows_consts[key] = val
        else:
            rows_consts[key] = torch.full((k,), float(val), device=x.device)
    return Rows(params, x, y, starts, ns, orders, settings, objective, rows_consts, stacked)


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x


def draw_orders(generator: torch.Generator, n: int, epochs: int) -> torch.Tensor:
    if n == 0:
        return torch.zeros(epochs, 0, dtype=torch.long)
    return torch.stack([torch.randperm(n, generator=generator) for _ in range(epochs)])


# the chance that one step's Poisson batch overflows ``poisson_width`` slots: never seen in practice
POISSON_TAIL = 1e-12


def poisson_width(batch: int) -> int:
    """Slots of a Poisson batch of expected size B, the same for every client and job (so a job's
    shapes, hence its numbers, do not depend on the others): the smallest w with
    P(Poisson(B) > w) ≤ ``POISSON_TAIL``, which bounds Binomial(n, B/n) for any n. A step that
    draws more (probability below that) widens its jobs' rows: still exact, only then its numbers
    may depend on which jobs share its pass."""
    from scipy.stats import poisson

    return max(batch, int(poisson.isf(POISSON_TAIL, batch)) + 1)


def draw_poisson(generator: torch.Generator, n: int, steps: int, batch: int) -> torch.Tensor:
    """Poisson-sampled batches (DP-SGD's, Abadi et al.): for each of ``steps`` steps every one of
    the n samples joins with probability q = min(1, B/n), independently; (steps, W): each step's
    samples in ascending order, then -1 (W: ``poisson_width``, or the largest batch drawn)."""
    width = poisson_width(batch)
    if steps == 0 or n == 0:
        return torch.full((steps, width), -1, dtype=torch.long)
    joined = torch.rand(steps, n, generator=generator) < min(1.0, batch / n)
    width = max(width, int(joined.sum(1).max()))
    # each step's samples first, in index order, the others after them as -1, in W columns
    keys = torch.where(joined, torch.arange(n), n + torch.arange(n)).sort(dim=1).values
    picked = torch.full((steps, width), -1, dtype=torch.long)
    picked[:, : min(n, width)] = torch.where(keys < n, keys, -1)[:, :width]
    return picked


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
            draws = torch.stack([_pad_steps(jobs[k].draws, t_max) for k in order]).to(X.device)
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
        bs, epochs = s.batch_size, s.epochs
        device = X.device
        k_real = len(ns)
        cap = max(1, self.budget // max(1, 3 * sum(p[0].numel() for p in P) + bs * X[0].numel()))
        fixed = min(cap, self.fixed) if self.across and self.fixed else 0
        if fixed and k_real % fixed:  # fill the last pass with copies of the last job
            P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds = _pad_jobs(
                -k_real % fixed, P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds, epochs
            )
        k_all = len(ns)
        rows = [epochs * -(-n // bs) for n in ns]  # each job's batches in the schedule
        steps = rows if caps is None else caps
        t_max = steps[0]
        if s.poisson:  # each step's own samples, in rows of W slots
            IDX, WT, VAL, val_cpu = _poisson_schedule(orders, weights, starts, device)
        else:
            IDX, WT, VAL, val_cpu = _schedule(orders, weights, starts, ns, epochs, bs, device)
        slots = IDX.shape[1]  # a row's entries: B, or a Poisson batch's W
        neg = [-n for n in steps]  # ascending: jobs with a step t are a prefix
        active = [bisect.bisect_left(neg, -t) for t in range(t_max)]
        # every job's batches one after another (no padding to the longest job): job i of the
        # sorted order has its step t at row first[i] + t
        first_cpu = torch.tensor([0] + rows[:-1]).cumsum(0)
        first = _to(first_cpu, device)
        if (caps is None or caps == rows) and not s.poisson:
            seen = torch.tensor([float(epochs * n) for n in ns], dtype=torch.float64)
        else:  # the samples of the steps each job takes
            seen = torch.stack([val_cpu[f : f + c].sum() for f, c in zip(first_cpu.tolist(), steps)]).to(torch.float64)
        seen = _to(seen, device)
        loss_sums = torch.zeros(k_all, dtype=torch.float64, device=device)
        train_mask = (
            self._mask(len(P))
            if obj.trainable is None
            else tuple(a and b for a, b in zip(obj.trainable, self._mask(len(P))))
        )
        trained = [p for p, t in zip(P, train_mask) if t]
        opt = optim.Stacked(s.optimizer, s.lr, s.momentum, s.weight_decay, s.betas, s.eps, trained, opt_states)
        widths = val_cpu[:t_max].sum(dim=1).long().tolist() if exact else [slots] * t_max
        private = s.dp_clip > 0
        by_hand = (
            self.chain is not None
            and type(obj) is Supervised  # not a subclass's own loss
            and self.chain.supports(obj.task, len(P), consts)
        )
        if private:  # DP-SGD: per-sample clipping (the chain's norms or torch.func's), noise per job
            if (
                type(obj) is not Supervised
                or weights is not None
                or draws is not None
                or not set(consts) <= {"mu", "anchor"}
            ):
                raise ValueError(
                    "DP-SGD (privacy.level: sample) needs the task's loss (a proximal pull at most), "
                    "without sample weights"
                )
            chain_norms, by_hand = by_hand, False
            gens = [torch.Generator(device=device).manual_seed(seed) for seed in noise_seeds]
            sizes = [p[0].numel() for p in trained]
        by_points = (
            not by_hand
            and obj.by_points()
            and (
                not obj.needs_chain
                or (self.chain is not None and self.chain.supports(obj.task, len(self.trainable), {}))
            )
        )
        tune = (bs, tuple(tuple(p.shape[1:]) for p in P), train_mask, by_hand, id(obj), tuple(sorted(consts)))
        self._mode(True)
        # pass by pass: a pass trains jobs c0..c1-1 through all their steps, so its parameters
        # stay in cache from step to step; its width is measured (Widths), the numbers are the
        # same whatever it is (each job's products are its own). With a fixed width (``padded``:
        # on a GPU a product's kernel follows its shapes) every step of every pass has that many
        # jobs: a job whose steps are done goes on computing, its results put back at the end
        c0 = 0
        last_row = IDX.shape[0] - 1
        while c0 < k_all:
            width_p = fixed or min(cap, self.widths.pick(tune, k_all - c0) if self.across else k_all)
            c1 = min(k_all, c0 + width_p)
            t0 = time.perf_counter()
            cs = {key: [v[c0:c1] for v in val] if isinstance(val, list) else val[c0:c1] for key, val in consts.items()}
            sub_P = [p[c0:c1] for p in P]
            sub_trained = [p[c0:c1] for p in trained]
            terms = opt.prepare(self.chain.terms(cs, train_mask)) if by_hand else None
            t_pass = steps[c0]
            # the pass's batches at once: row of job i's step t (past a job's last step, any row)
            at = (first[c0:c1, None] + torch.arange(t_pass, device=device)).clamp_(max=last_row)
            rows_p, wt_p, val_p = gather(IDX, at), gather(WT, at), gather(VAL, at)
            b = live = c1
            done = []  # (first job, snapshot) of jobs done early
            for t in range(t_pass):
                if fixed and active[t] < live:  # jobs live..: their results as they stand
                    done.append((max(c0, active[t]), _snapshot(P, opt, max(c0, active[t]), live)))
                    live = max(c0, active[t])
                elif active[t] < b:  # jobs c0..b-1 have a step t
                    b = live = max(c0, active[t])
                    part = b - c0
                    cs = {
                        key: [v[:part] for v in val] if isinstance(val, list) else val[:part] for key, val in cs.items()
                    }
                    sub_P = [p[:part] for p in sub_P]
                    sub_trained = [p[:part] for p in sub_trained]
                    if terms is not None:
                        terms = terms.head(part)
                width = widths[t]
                rows = rows_p[: b - c0, t, :width]
                xr, yr = self.decode(gather(X, rows)), gather(Y, rows)
                assign = ()
                if private:
                    step = self.chain.private_step if chain_norms else self._private_step
                    data_sum, sums, _ = step(obj.task, sub_P, xr, yr, val_p[: b - c0, t, :width], s.dp_clip, train_mask)
                    noise = torch.stack(
                        [torch.randn(sum(sizes), generator=gens[i], device=device) for i in range(c0, b)]
                    ).split(sizes, dim=1)
                    # (Σ clipped + N(0, σ²C²)) / B, then a proximal pull μ(w − anchor)
                    grads = [(g + n.view(g.shape) * (s.dp_noise * s.dp_clip)).div_(bs) for g, n in zip(sums, noise)]
                    if "mu" in cs:
                        mu = cs["mu"].to(grads[0].dtype)
                        anchors = [a for a, m in zip(cs["anchor"], train_mask) if m]
                        torch._foreach_add_(
                            grads, [(p - a) * mu.view(-1, *([1] * (p.dim() - 1))) for p, a in zip(sub_trained, anchors)]
                        )
                elif by_hand:
                    data_sum, grads = self.chain.step(
                        obj.task,
                        sub_P,
                        xr,
                        yr,
                        wt_p[: b - c0, t, :width],
                        val_p[: b - c0, t, :width],
                        terms,
                        train_mask,
                        opt,
                        c0,
                        b,
                    )
                elif by_points:
                    batch = Batch(xr, yr, wt_p[: b - c0, t, :width], val_p[: b - c0, t, :width])
                    data_sum, every, *assign = obj.gradients(
                        self.point_grad(obj.task, batch), sub_P, batch, cs, None if draws is None else draws[c0:b, t]
                    )
                    grads = [g for g, m in zip(every, train_mask) if m]
                    if any(g is None for g in grads):
                        raise ValueError("the objective gave no gradient for a parameter the optimizer trains")
                else:
                    sub = [p.detach().requires_grad_(m) for p, m in zip(sub_P, train_mask)]
                    batch = Batch(xr, yr, wt_p[: b - c0, t, :width], val_p[: b - c0, t, :width])
                    loss, data_sum, *assign = obj.loss(
                        self.forward, sub, batch, cs, None if draws is None else draws[c0:b, t]
                    )
                    grads = list(torch.autograd.grad(loss.sum(), [p for p, m in zip(sub, train_mask) if m]))
                loss_sums[c0:live] += data_sum.detach()[: live - c0].to(torch.float64)
                if grads is not None:
                    opt.step(sub_trained, grads, c0, b)
                for i, value in (assign[0] if assign else {}).items():
                    if train_mask[i]:
                        raise ValueError(f"the objective sets parameter {i}, which the optimizer trains")
                    P[i][c0:b] = value.detach()
            for lo, snap in done:
                _restore(P, opt, lo, snap)
            if self.across and not fixed:
                self.widths.record(tune, c1 - c0, time.perf_counter() - t0, sum(steps[c0:c1]), k_all)
            c0 = c1
        mean = (loss_sums / seen.clamp_min(1)).tolist()
        if k_all > k_real:
            P, mean = [p[:k_real] for p in P], mean[:k_real]
        return P, mean, opt

    def _private_step(
        self,
        task,
        params: list[torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        valid: torch.Tensor,
        clip: float,
        train_mask: tuple[bool, ...],
    ):
        """``Chain.private_step`` for any model without buffers, batch norm, dropout or recurrent
        layers (what ``privacy.level: sample`` accepts, raysim/scenario/build.py): each
        sample's gradient from ``torch.func`` (``vmap`` of ``grad`` over the batch, one set at a
        time), clipped to L2 norm ``clip`` over the trained parameters and summed over valid rows;
        (data loss summed (K,), the clipped sums of the trained parameters, clipped rows (K,))."""
        from torch.func import functional_call, grad_and_value, vmap

        names = [n for n, _ in self.model.named_parameters()]
        idx = [i for i, m in enumerate(train_mask) if m]

        def loss_of(trained, every, xr, yr):
            full = list(every)
            for i, t in zip(idx, trained):
                full[i] = t
            out = functional_call(self.model, dict(zip(names, full)), (xr.unsqueeze(0),))
            return task.per_sample(out, yr.unsqueeze(0)).sum()

        per_sample = vmap(grad_and_value(loss_of), in_dims=(None, None, 0, 0))
        data_sum, sums, clipped = [], [[] for _ in idx], []
        for k in range(x.shape[0]):
            ps = [p[k].detach() for p in params]
            g, loss = per_sample([ps[i] for i in idx], ps, x[k], y[k])
            # one read of each per-sample gradient for its norms, one for the clipped sum (a product)
            norm = torch.sqrt(sum(torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1) ** 2 for t in g))
            scale = (clip / norm.clamp_min(1e-12)).clamp(max=1.0) * valid[k]
            for j, t in enumerate(g):
                sums[j].append((scale.to(t.dtype) @ t.reshape(t.shape[0], -1)).view(t.shape[1:]))
            data_sum.append((loss.detach() * valid[k]).sum())
            clipped.append(((norm > clip) & (valid[k] > 0)).sum())
        return torch.stack(data_sum), [torch.stack(s) for s in sums], torch.stack(clipped)

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


def gather(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t[rows]`` for an integer tensor ``rows`` of any shape, by ``index_select`` on a flat
    index: the same rows, but a tenth of advanced indexing's time for a step's batch (about
    20 against 170 µs for 160 Fashion-MNIST images on one core)."""
    return t.index_select(0, rows.reshape(-1)).view(*rows.shape, *t.shape[1:])


def _pool(jobs: list[Job]) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
    """The jobs' data pooled (``pool``), with each job's data's first row in them (by ``id``;
    a client's jobs share its data)."""
    xs, ys = {}, {}
    for j in jobs:
        xs.setdefault(id(j.x), j.x)
        ys.setdefault(id(j.x), j.y)
    X, Y, starts = pool(list(xs.values()), list(ys.values()))
    return X, Y, dict(zip(xs, starts))


def pool(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Several clients' inputs and targets as one tensor of inputs and one of targets, with each
    client's first row in them. Where the data are row blocks of one storage (a host's packed
    shards, ``data.pack``), that storage is used as it is; otherwise they are concatenated."""
    whole = _whole(xs), _whole(ys)
    if whole[0] is not None and whole[1] is not None:
        (X, xo), (Y, yo) = whole
        if xo == yo:
            return X, Y, xo
    starts, total = [], 0
    for y in ys:
        starts.append(total)
        total += int(y.shape[0])
    X = torch.cat(xs) if len(xs) > 1 else xs[0]
    Y = torch.cat(ys) if len(ys) > 1 else ys[0]
    return X, Y, starts


def _whole(ts: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """(the storage's rows as one tensor, each tensor's first row) where every tensor is a
    contiguous block of rows of one storage of that row shape; else None."""
    if len(ts) == 1:
        return ts[0], [0]
    t0 = ts[0]
    row = 1
    for d in t0.shape[1:]:
        row *= d
    ptr = t0.untyped_storage().data_ptr()
    if row == 0 or any(
        t.untyped_storage().data_ptr() != ptr
        or not t.is_contiguous()
        or t.shape[1:] != t0.shape[1:]
        or t.dtype != t0.dtype
        or t.storage_offset() % row
        for t in ts
    ):
        return None
    storage = t0.untyped_storage()
    rows = storage.nbytes() // (row * t0.element_size())
    X = t0.new_empty(0).set_(storage, 0, (rows, *t0.shape[1:]))
    return X, [t.storage_offset() // row for t in ts]


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor built on the CPU, on ``device``: on a GPU through pinned memory without waiting
    (a copy from ordinary memory would wait for the GPU's queue to empty first)."""
    if device.type == "cpu" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _schedule(
    orders: list[torch.Tensor] | torch.Tensor,
    weights: list | None,
    offsets: list[int],
    ns: list[int],
    epochs: int,
    bs: int,
    device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every job's batches as rows of ``bs`` entries, job after job: (row indices into the
    pooled data, loss weights = sample weight / rows in the batch, validity, the validity on the
    CPU); epoch e of job k fills ceil(n_k / bs) rows, its last one padded (index 0, weight 0).
    One pass of tensor ops for all jobs, on the CPU from the sizes and the orders (which stay
    there), copied to ``device`` at the end: on a GPU nothing is read back and nothing waits.
    Sample weights (on ``device``) are gathered there."""
    ns_t = torch.tensor(ns)
    nb = -(-ns_t // bs)  # batches per epoch
    width = nb * bs  # padded samples per epoch
    base = torch.cumsum(torch.cat([ns_t.new_zeros(1), epochs * width]), 0)[:-1]
    counts = epochs * ns_t
    job = torch.repeat_interleave(torch.arange(len(ns)), counts)
    within = torch.arange(epochs * sum(ns)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    n_of = ns_t[job]
    pos = base[job] + (within // n_of) * width[job] + within % n_of
    if isinstance(orders, list):  # else already flat, job after job
        orders = torch.cat([o.reshape(-1) for o in orders])
    orders = orders.cpu()
    total = sum(epochs * -(-n // bs) * bs for n in ns)
    idx = torch.zeros(total, dtype=torch.long)
    idx[pos] = orders + torch.tensor(offsets)[job]
    valid = torch.zeros(total)
    valid[pos] = 1.0
    valid = valid.view(-1, bs)
    per_row = valid.sum(dim=1, keepdim=True).clamp_min(1)
    if weights is None:
        weight = _to(valid / per_row, device)
    else:
        ws = torch.cat([w if w is not None else torch.ones(n, device=device) for w, n in zip(weights, ns)])
        pick = orders + (torch.cumsum(ns_t, 0) - ns_t)[job]
        pos_d, pick_d = _to(pos, device), _to(pick, device)
        weight = torch.zeros(total, device=device)
        weight[pos_d] = ws[pick_d].to(weight.dtype)
        weight = weight.view(-1, bs) / _to(per_row, device)
    return _to(idx, device).view(-1, bs), weight, _to(valid, device), valid


def _poisson_schedule(
    orders: list[torch.Tensor], weights: list | None, offsets: list[int], device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_schedule`` for Poisson batches (``draw_poisson``): job after job, one row per step of W
    slots (the widest job's), its samples first (validity 1, loss weight 1 / the batch's size)
    and padding after them (index 0, weight 0)."""
    if weights is not None and any(w is not None for w in weights):
        raise ValueError("Poisson batches (DP-SGD) take no sample weights")
    width = max(int(o.shape[1]) for o in orders)
    picked = torch.cat([torch.nn.functional.pad(o.cpu(), (0, width - o.shape[1]), value=-1) for o in orders])
    base = torch.repeat_interleave(torch.tensor(offsets), torch.tensor([int(o.shape[0]) for o in orders]))
    valid = (picked >= 0).to(torch.float32)
    idx = torch.where(picked >= 0, picked + base[:, None], torch.zeros_like(picked))
    weight = valid / valid.sum(dim=1, keepdim=True).clamp_min(1)
    return _to(idx, device), _to(weight, device), _to(valid, device), valid


def _pad_jobs(pad: int, P, starts, ns, orders, weights, opt_states, caps, consts, draws, noise_seeds, epochs: int):
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
    params, bufs, steps = snap
    for p, v in zip(P, params):
        p[lo : lo + v.shape[0]] = v
    for key, bs in bufs.items():
        for b, v in zip(opt.buffers[key], bs):
            b[lo : lo + v.shape[0]] = v
    if steps is not None:
        opt.steps[lo : lo + steps.shape[0]] = steps


def _capped(steps: int, cap: int | None) -> int:
    return steps if cap is None else min(steps, cap)


def _pad_steps(d: torch.Tensor, t: int) -> torch.Tensor:
    if d.shape[0] == t:
        return d
    return torch.cat([d, d.new_zeros(t - d.shape[0], *d.shape[1:])])


def _stack_const(values: list, device: torch.device) -> Any:
    """The jobs' constants stacked (K, ...) on the jobs' ``device``. A tensor every job holds as
    the same object (the round's received model as everyone's proximal anchor) is one row seen
    K times (stride 0), not K copies."""
    if isinstance(values[0], (list, tuple)):
        return [_same_or_stacked(ts) for ts in zip(*values)]
    return _to(torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in values]), device)


def _same_or_stacked(ts) -> torch.Tensor:
    if all(t is ts[0] for t in ts):
        return ts[0].unsqueeze(0).expand(len(ts), *ts[0].shape)
    return torch.stack(ts)


def _state_copy(job: Job) -> dict | None:
    if job.opt_state is None:
        return None
    return {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone()) for k, v in job.opt_state.items()}


def drive(calls: list[Any], fit: Callable[[list[Job]], list[Fitted]]) -> list[Any]:
    """Results of client steps: a generator step yields lists of jobs and receives them
    trained; every pending step's jobs (in call order) go into one ``fit``. Plain values pass
    through."""
    results: list[Any] = [None] * len(calls)
    pending: list[tuple[int, Any, list[Job]]] = []
    for i, call in enumerate(calls):
        if inspect.isgenerator(call):
            _advance(pending, results, i, call, None)
        else:
            results[i] = call
    while pending:
        fitted = fit([j for _, _, jobs in pending for j in jobs])
        nxt: list = []
        start = 0
        for i, gen, jobs in pending:
            _advance(nxt, results, i, gen, fitted[start : start + len(jobs)])
            start += len(jobs)
        pending = nxt
    return results


def _advance(pending: list, results: list, i: int, gen, value) -> None:
    try:
        jobs = next(gen) if value is None else gen.send(value)
    except StopIteration as stop:
        results[i] = stop.value
        return
    pending.append((i, gen, list(jobs)))
