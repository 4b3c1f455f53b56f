"""What the loop trains: a ``Job`` in, a ``Fitted`` out.

A ``Job`` is one parameter set to train on one client's train split: where it starts, the
sample orders (drawn from the client's generator when the job is made, ``make_job``), optional
per-sample weights, per-job constants its objective reads (e.g. a proximal anchor), and
optimizer state to continue from. ``Settings`` are what the jobs of one pass share: the
optimizer and the batching. ``Rows`` are a host's K jobs given as arrays instead
(``Trainer.fit_rows``, ``make_rows``), drawn as ``make_job`` draws them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .batches import draw_orders, draw_poisson
from .data import ClientData, Context
from .objectives import Objective


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
    """One parameter set to train on one client's train split (``make_job`` draws its orders)."""

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
    """A trained job: its parameters, its mean data loss, and what else it asked for."""

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
        stacked = torch.stack([pad_steps(d, t_max) for d in draws]).to(x.device)
    rows_consts = {}
    for key, val in (consts or {}).items():
        if isinstance(val, (list, tuple)):
            rows_consts[key] = list(val)
        elif isinstance(val, torch.Tensor) and val.dim() > 0:
            rows_consts[key] = val
        else:
            rows_consts[key] = torch.full((k,), float(val), device=x.device)
    return Rows(params, x, y, starts, ns, orders, settings, objective, rows_consts, stacked)


def pad_steps(d: torch.Tensor, t: int) -> torch.Tensor:
    """A job's per-step draws (steps, ...) padded with zeros to ``t`` steps (a pass's longest job's)."""
    if d.shape[0] == t:
        return d
    return torch.cat([d, d.new_zeros(t - d.shape[0], *d.shape[1:])])
