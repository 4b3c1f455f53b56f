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

This module is the loop's front door: every name of it is imported from here (``from
raysim.core.loop import Job, Trainer, ...``); it holds ``drive`` and re-exports the rest from
the modules that hold them, in the order a step reads them:

- jobs.py: ``Settings``, ``Job``, ``Fitted``, ``make_job``; ``Rows``, ``make_rows``;
- batches.py: the sample orders (``draw_orders``, ``draw_poisson``), the pooled data
  (``pool``) and the batch schedule every step reads its batch from (``gather``);
- trainer.py: ``Trainer``, which groups the jobs, stacks them and prepares a run;
- passes.py: a run's passes and their steps;
- steps.py: one step's gradients (by hand, at points, by autograd); dpsgd.py: DP-SGD's;
- chain.py (hand-written gradients), optim.py (the optimizer), widths.py (pass widths).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# the loop's names, from the modules that hold them (see above); ``_pool`` and ``_schedule``
# under the names the docs give them
from .batches import POISSON_TAIL, draw_orders, draw_poisson, gather, poisson_width, pool  # noqa: F401
from .batches import epoch_batches as _schedule  # noqa: F401
from .jobs import Fitted, Job, Rows, Settings, make_job, make_rows  # noqa: F401
from .objectives import Batch, Objective, Supervised  # noqa: F401 - the contract, re-exported here
from .trainer import Trainer, _pool  # noqa: F401


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
