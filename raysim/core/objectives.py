"""Objectives: what the one loop (``loop.py``) minimizes, for K jobs at once.

``Objective`` is the contract: a loss of the jobs' stacked parameters on a batch, or the
step's gradients from the task loss's gradients at points of parameter space (``gradients``).
``Supervised`` is the task's loss with the proximal and linear terms most methods need; a
method's own objective lives in its file (``algorithms/``). ``loop`` re-exports all three.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Step t of K jobs: inputs (K, B, ...), targets (K, B, ...), per-row loss weights (K, B)
    (per-sample weight / rows in the batch; 0 on padding) and the validity mask (K, B)."""

    x: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    valid: torch.Tensor


class Objective:
    """Parameters -> loss on a batch, for K jobs at once.

    ``loss`` gets the jobs' parameters stacked (K, ...) in model order, the batch, the jobs'
    constants stacked (K, ...) and this step's draws (K, ...) or None; it returns the loss to
    minimize per job (K,) and the data loss summed over each job's valid rows (K,), which the
    loop reports. Jobs share no parameter, so the gradient of the summed loss is each job's own.
    ``trainable``: which parameters are trained (None: all; a model's running statistics are
    never trained, whatever it says). ``draws``: per-step random draws of one job, taken from
    its client's generator when the job is made (None: none).

    Objectives are compared by identity: the loop trains jobs together (one stacked pass, or
    one group of a host's jobs) only when they hold the same objective object, the same
    settings and the same constants' names. Create an algorithm's objectives once (in
    ``__init__``: e.g. FedRep's head-only and body-only ``Supervised(task, trainable=...)``),
    never per call: an objective made per call still trains correctly, but every client alone.

    A parameter that is not trainable may instead be *set* by the objective each step (an inner
    solution such as pFedMe's θ, a projected scalar such as APFL's α): ``loss`` then returns a
    third value ``{parameter index: new values (K, ...)}``, which the loop stores after the
    optimizer's step; the others stay constant.

    An objective whose loss is the task's loss taken at one or more points of parameter space
    (each point a function of the job's parameters: APFL's v̄, SuPerFed's W(λ), pFedMe's inner
    θ) plus terms of the parameters alone may define ``gradients`` in place of ``loss``. It gets
    ``grad``: ``grad(point)`` for a model parameter set stacked (K, ...) returns the data loss
    summed over each job's valid rows (K,) and the gradient at ``point`` of the weighted task
    loss Σ_rows weight·ℓ, one tensor per model tensor (None where the model's tensor does not
    train); ``grad(point, weight)`` weighs the rows by ``weight`` (K, B) instead; ``offset``,
    ``train`` and ``outputs`` add a constant to the outputs before the loss, restrict the
    tensors differentiated and return the outputs (``Trainer.point_grad``). The loop
    computes it by hand where the model is a chain of linear layers (chain.py, 2 to 3 times
    faster than autograd at batch 10), else by autograd, so the objective writes its own math
    once, as the paper's gradient steps. ``gradients`` returns the data loss to report (K,),
    one gradient per job parameter (None for those it does not train) and the
    ``{index: new values}`` that ``loss`` may return as a third value. Such an objective has a
    ``task`` (tasks.py): the loss ``grad`` differentiates.
    """

    trainable: tuple[bool, ...] | None = None
    # an objective whose ``gradients`` use what only the chain's gradient offers (``hidden``):
    # on other models the loop differentiates its ``loss``
    needs_chain: bool = False

    def draws(self, generator: torch.Generator, steps: int) -> torch.Tensor | None:
        return None

    def loss(
        self, forward: Callable, params: list[torch.Tensor], batch: Batch, consts: dict, draws: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def gradients(
        self, grad: Callable, params: list[torch.Tensor], batch: Batch, consts: dict, draws: torch.Tensor | None
    ) -> tuple[torch.Tensor, list[torch.Tensor | None], dict]:
        raise NotImplementedError

    @classmethod
    def by_points(cls) -> bool:
        """Whether this objective gives its step's gradients (``gradients``) rather than a loss."""
        return cls.gradients is not Objective.gradients


class Supervised(Objective):
    """The task's loss, weighted per sample (1 by default), plus (mu/2)·‖w − anchor‖² where a
    job has the constants ``mu`` and ``anchor`` (FedProx, Ditto's personal model, ...), plus
    ⟨linear, w⟩ where it has the constant ``linear`` (one tensor per parameter): a gradient
    correction, since it adds ``linear`` to every step's gradient (SCAFFOLD's c − c_i).
    ``model_params``: the model's parameters the job's parameters stand for this step (by
    default themselves; SosicFL's: the simplex point Σ α_m θ_m of the step's draw α)."""

    def __init__(self, task, trainable: tuple[bool, ...] | None = None):
        self.task = task
        self.trainable = trainable

    def model_params(self, params: list[torch.Tensor], draws: torch.Tensor | None) -> list[torch.Tensor]:
        return params

    def loss(self, forward, params, batch, consts, draws):
        per = self.task.per_sample(forward(self.model_params(params, draws), batch.x), batch.y)
        loss = (per * batch.weight).sum(1)
        if "mu" in consts:
            sq = sum(((p - a) ** 2).flatten(1).sum(1) for p, a in zip(params, consts["anchor"]))
            loss = loss + 0.5 * consts["mu"] * sq
        if "linear" in consts:
            loss = loss + sum((p * l).flatten(1).sum(1) for p, l in zip(params, consts["linear"]))
        return loss, (per.detach() * batch.valid).sum(1)

    @classmethod
    def by_points(cls) -> bool:
        """A subclass whose ``model_params`` composes the model from the job's parameters
        (SosicFL's simplex point, pFedHN's hypernetwork) gives gradients (``gradients``); plain
        ``Supervised`` gives its loss (or, for chains, the loop's fused path)."""
        return cls.gradients is not Supervised.gradients or cls.model_params is not Supervised.model_params

    def gradients(self, grad, params, batch, consts, draws):
        """The task loss's gradient at the model's parameters ``model_params`` (from the loop: by
        hand for chains of linear layers), taken back to the job's parameters through
        ``model_params`` by autograd (parameters only, no data: SosicFL's endpoint m gets α_m
        times it), or by the subclass's ``pull_back(params, draws, g)`` where it has one (the
        map's adjoint in closed form), plus the gradients of ``loss``'s other terms
        (``add_terms_grad``)."""
        pull_back = getattr(self, "pull_back", None)
        if pull_back is not None:
            seen, g = grad(self.model_params(params, draws))
            grads = pull_back(params, draws, g)
            self.add_terms_grad(params, consts, grads)
            return seen, grads, {}
        with torch.enable_grad():
            leaves = [p.detach().requires_grad_(p.is_floating_point()) for p in params]
            point = self.model_params(leaves, draws)
            seen, g = grad([q.detach() for q in point])
            pairs = [(q, gi) for q, gi in zip(point, g) if gi is not None and q.requires_grad]
            wanted = [i for i, p in enumerate(leaves) if p.requires_grad]
            got = torch.autograd.grad(
                [q for q, _ in pairs],
                [leaves[i] for i in wanted],
                grad_outputs=[gi for _, gi in pairs],
                allow_unused=True,
            )
        grads: list = [None] * len(params)
        for i, gi in zip(wanted, got):
            grads[i] = None if gi is None else gi.clone() if 0 in gi.stride() else gi
        self.add_terms_grad(params, consts, grads)
        return seen, grads, {}

    @staticmethod
    def add_terms_grad(params: list[torch.Tensor], consts: dict, grads: list[torch.Tensor | None]) -> None:
        """Adds the gradients of ``loss``'s terms beside the data's to ``grads`` (in place; None
        entries skipped), for a subclass that gives ``gradients``: μ·(w − anchor) and ``linear``."""
        keep = [i for i, g in enumerate(grads) if g is not None]
        if "mu" in consts and keep:
            mu = torch.as_tensor(consts["mu"]).reshape(-1)
            diffs = torch._foreach_sub([params[i] for i in keep], [consts["anchor"][i] for i in keep])
            if bool((mu == mu[0]).all()):  # one μ for every set: one foreach call
                torch._foreach_add_([grads[i] for i in keep], diffs, alpha=float(mu[0]))
            else:
                for i, d in zip(keep, diffs):
                    grads[i].addcmul_(d, mu.to(d.dtype).view(-1, *[1] * (d.dim() - 1)))
        if "linear" in consts:
            torch._foreach_add_([grads[i] for i in keep], [consts["linear"][i] for i in keep])


class LogitAdjusted(Objective):
    """Logit adjustment: the task's loss on the outputs plus a per-job constant per class,
    ℓ(z + o, y) with o the job's constant ``logit_offset`` (K, C) (FedLC's calibration
    −τ·n_c^(−1/4); a balanced softmax's log prior is the same with o = log π). The data loss
    reported is the plain ℓ(z, y). Its gradient is the task loss's at the model with the outputs
    offset (``grad(params, offset=...)``), so chains of linear layers take the loop's by-hand
    path. Classification: o has one entry per class logit."""

    def __init__(self, task, trainable: tuple[bool, ...] | None = None):
        self.task = task
        self.trainable = trainable

    def adjusted_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The per-sample loss of the offset outputs (K, B, C)."""
        return self.task.per_sample(out, y)

    def loss(self, forward, params, batch, consts, draws):
        out = forward(params, batch.x)
        per = self.adjusted_loss(out + consts["logit_offset"].unsqueeze(1), batch.y)
        plain = self.task.per_sample(out.detach(), batch.y)
        return (per * batch.weight).sum(1), (plain * batch.valid).sum(1)

    def gradients(self, grad, params, batch, consts, draws):
        _, g, out = grad(params, offset=consts["logit_offset"].unsqueeze(1), outputs=True)
        return (self.task.per_sample(out, batch.y) * batch.valid).sum(1), g, {}


class LogitAdjustedNotTrue(LogitAdjusted):
    """``LogitAdjusted`` whose softmax leaves the sample's own class out of the denominator:
    −z̃_y + log Σ_{j≠y} e^(z̃_j), z̃ = z + o (FedLC's loss as its paper prints it; unbounded
    below, so it needs few local steps). Differentiated by autograd from ``loss``."""

    gradients = Objective.gradients  # not the task loss at a point: the loop differentiates ``loss``

    def adjusted_loss(self, out, y):
        true = out.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        return torch.logsumexp(not_true(out, y), dim=-1) - true


def not_true(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits of the classes other than each sample's own: (..., C) outputs and (...) class
    ids -> (..., C − 1), the remaining classes in their order (FedLC's printed denominator,
    FedNTD's not-true distillation)."""
    keep = torch.ones_like(out, dtype=torch.bool).scatter(-1, y.unsqueeze(-1), False)
    return out[keep].reshape(*out.shape[:-1], out.shape[-1] - 1)
