"""Per-FedAvg — Fallah, Mokhtari & Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (Algorithm 1).

FedAvg on the MAML objective F(w) = (1/n) Σ_k f_k(w − α∇f_k(w)): the global model is the
meta-model from which one local gradient step personalizes. Each local step of a selected client,
on mini-batches D, D′ (and D″) of its train split:

- w̃ = w − α·∇f(w; D)                                  (the inner step, α = ``alpha``)
- FO (``variant: fo``):  w ← w − β·∇f(w̃; D′)          (β = ``lr``)
- HF (``variant: hf``):  w ← w − β·(I − α·∇²f(w; D″))·∇f(w̃; D′)

with w̃ held fixed (no gradient through the inner step, both variants). HF's Hessian-vector
product ``hvp``: ``autograd`` (default: the exact product, the gradient of ⟨∇f(w; D″), v⟩) or
``difference``, the paper's estimate (∇f(w + δv; D″) − ∇f(w − δv; D″)) / (2δ) with δ =
``delta``; on a quadratic both are exact. The server averages the clients' w by n_k (FedAvg).

How the two-batch step runs through the one loop: the job's batch is ``parts`` × B rows (2B for
FO, 3B for HF; B = ``batch_size``), and ``MetaObjective.loss`` splits each job's valid rows, in
the batch's (random) order, into ``parts`` consecutive parts D, D′, D″ (a remainder batch is
split evenly; a part left empty, e.g. a single-row batch, is replaced by the whole batch). It
gives the meta-gradient m as the step's gradient (``Objective.gradients``: ∇f(w; D) for the
inner step, ∇f(w̃; D′), and for HF's difference estimate ∇f(w ± δv; D″), each from the loop, by
hand for chains of linear layers), so the loop's optimizer takes the outer step at lr β
(momentum and weight decay apply to it); HF's exact product (``hvp: autograd``) differentiates
⟨∇f(w; D″), v⟩ with create_graph, as a surrogate loss ⟨w, m⟩ − α⟨∇f(w; D″), v⟩ for autograd.
The reported training loss is f(w) on the whole batch. This is the layout of PFLlib's
Per-FedAvg (a loader of 2B, split in two halves), one epoch being ⌈n / 2B⌉ meta-steps. Batch-norm running statistics, if any, follow
every forward pass of the step.

Evaluation: the personalized model is the global model after the local update, the shared
``eval.finetune`` mechanism (``base.py``), on by default here: 1 epoch (``personal_epochs``) of
SGD at lr α (``eval.finetune.lr`` null means α here, not β) with the training batch size, then
scored: ``accuracy`` etc. are the updated model's (``lu_*`` too), ``global_*`` the global
model's. The paper's evaluation is one gradient step; ``eval.finetune.batch_size`` at least a
client's train size gives exactly that single full-batch step (PFLlib's takes one step on one
batch). ``eval.finetune.epochs: 0`` scores the global model alone.

Defaults: α = 0.01 and β = 0.001, ``variant: fo``, batch 10, 1 epoch. PFLlib (checked at
commit d832e76, ``clientperavg.py``) takes β equal to its local learning rate, so α = β
(0.005 by default; its ``-bt`` flag is not read by Per-FedAvg), with batch 10 in each of D and
D′ and 1 local epoch: ``alpha`` equal to ``lr`` here. The paper's experiments use step sizes of
the order of α = 0.001–0.01 and β = 0.001, and δ = 0.001 for HF (as recalled; its tables were
not re-checked). β = 0.001 is slow on small runs: raise ``lr`` there.

Decentralized (a ``topology``): each client takes its meta-steps on its copy of the meta-model
and mixes it with its neighbours, as D-SGD does with FedAvg's model (the paper has a server).
The evaluation's local step then starts from the client's own copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .base import Objective, make_job, training_field
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class PerFedAvgHyper(FedAvgHyper):
    lr: float = training_field(
        "lr",
        0.001,
        help=("β, the outer (meta) step's learning rate: w ← w − β·(meta-gradient) (lr_schedule scales it by round)"),
    )
    batch_size: int = training_field(
        "batch_size", 10, help=("B, samples in each of D, D′ (and D″): a local step draws 2B (fo) or 3B (hf) samples")
    )
    alpha: float = field(
        default=0.01,
        metadata={
            "gt": 0.0,
            "help": ("α, the inner step's learning rate w̃ = w − α∇f(w; D), and the local update's at evaluation"),
        },
    )
    variant: str = field(
        default="fo",
        metadata={
            "choices": ("fo", "hf"),
            "help": ("fo: the gradient at w̃ applied to w; hf: times (I − α∇²f(w; D″)) (Hessian-free)"),
        },
    )
    hvp: str = field(
        default="autograd",
        metadata={
            "choices": ("autograd", "difference"),
            "help": ("hf's Hessian-vector product: autograd (exact) or difference (central, step delta; the paper's)"),
        },
    )
    delta: float = field(default=0.001, metadata={"gt": 0.0, "help": "δ of hvp: difference"})
    personal_epochs: int = field(
        default=1,
        metadata={
            "min": 0,
            "help": ("epochs of the local update at lr α before scoring when eval.finetune.epochs is null (0: none)"),
        },
    )


def _parts(batch, parts: int) -> list[torch.Tensor]:
    """Loss weights (K, B') of each part: the job's valid rows split in ``parts`` consecutive runs
    (rank·parts // valid), each weighted as a mean over its own rows (per-sample weights kept);
    an empty part is the whole batch."""
    valid = batch.valid
    count = valid.sum(1, keepdim=True)
    rank = valid.cumsum(1) - 1
    which = torch.div(rank * parts, count.clamp_min(1), rounding_mode="floor")
    out = []
    for i in range(parts):
        mask = valid * (which == i).to(valid.dtype)
        size = mask.sum(1, keepdim=True)
        w = torch.where(size > 0, batch.weight * mask * count / size.clamp_min(1), batch.weight)
        out.append(w)
    return out


class MetaObjective(Objective):
    """Per-FedAvg's local step on a batch of ``parts``·B rows (see the module docstring) as
    gradients (``Objective.gradients``): the inner step from ∇f(w; D), the meta-gradient
    ∇f(w̃; D′), and for HF with the difference estimate two more gradients on D″, each from
    the loop (by hand for chains of linear layers)."""

    def __init__(self, task, alpha: float, variant: str, delta: float):
        self.task, self.alpha, self.variant, self.delta = task, alpha, variant, delta
        self.parts = 2 if variant == "fo" else 3

    def gradients(self, grad, params, batch, consts, draws):
        w_d, w_d2, *rest = _parts(batch, self.parts)
        seen, g1 = grad(params, w_d)  # the whole batch's loss is reported
        tilde = [p if g is None else p - self.alpha * g for p, g in zip(params, g1)]
        _, meta = grad(tilde, w_d2)
        if self.variant == "hf":  # − α·(∇f(w + δv) − ∇f(w − δv)) / (2δ) on D″
            _, up = grad([p if v is None else p + self.delta * v for p, v in zip(params, meta)], rest[0])
            _, down = grad([p if v is None else p - self.delta * v for p, v in zip(params, meta)], rest[0])
            meta = [
                None if m is None else m - self.alpha * (a - b) / (2 * self.delta) for m, a, b in zip(meta, up, down)
            ]
        return seen, list(meta), {}


class ExactHVP(Objective):
    """HF with the exact Hessian-vector product (``hvp: autograd``): the inner step inside the
    loss, and a surrogate loss whose gradient is the meta-gradient, the product taken by
    differentiating ⟨∇f(w; D″), v⟩ (create_graph: autograd's, on every model)."""

    parts = 3

    def __init__(self, task, alpha: float):
        self.task, self.alpha = task, alpha

    def _data(self, forward, params, x, y, weight):
        per = self.task.per_sample(forward(params, x), y)
        return per, (per * weight).sum(1)

    def loss(self, forward, params, batch, consts, draws):
        w_d, w_d2, w_d3 = _parts(batch, self.parts)
        live = [i for i, p in enumerate(params) if p.requires_grad]
        per, f_d = self._data(forward, params, batch.x, batch.y, w_d)
        seen = (per.detach() * batch.valid).sum(1)
        g1 = torch.autograd.grad(f_d.sum(), [params[i] for i in live])
        tilde = [p.detach() for p in params]
        for i, g in zip(live, g1):
            tilde[i] = tilde[i] - self.alpha * g
        tilde = [t.requires_grad_(i in live) for i, t in enumerate(tilde)]
        _, f_d2 = self._data(forward, tilde, batch.x, batch.y, w_d2)
        v = [g.detach() for g in torch.autograd.grad(f_d2.sum(), [tilde[i] for i in live])]
        _, f_d3 = self._data(forward, params, batch.x, batch.y, w_d3)
        g3 = torch.autograd.grad(f_d3.sum(), [params[i] for i in live], create_graph=True)
        loss = -self.alpha * sum((g * u).flatten(1).sum(1) for g, u in zip(g3, v))
        loss = loss + sum((params[i] * m).flatten(1).sum(1) for i, m in zip(live, v))
        return loss, seen


class PerFedAvg(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "perfedavg"
    summary = (
        "Per-FedAvg (Fallah et al. 2020): FedAvg on the MAML objective; clients personalize "
        "by a local step at α before scoring"
    )
    paper = "Fallah, Mokhtari & Ozdaglar, NeurIPS 2020"
    family = "personalized"
    personal = "nothing (the personalized model is the global one after a local step at evaluation)"
    sends = "its model, weighted by n_k"
    Hyper = PerFedAvgHyper
    decentralized = True
    personalized_is_global = True  # the personalized model is the locally updated global one

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        self.meta = (
            ExactHVP(task, hyper.alpha)
            if hyper.variant == "hf" and hyper.hvp == "autograd"
            else MetaObjective(task, hyper.alpha, hyper.variant, hyper.delta)
        )

    def train(self, state, received, data, ctx):
        # the job's batch holds D, D′ (and D″): parts × B rows
        s = self.hp.settings(ctx.round, ctx.rounds)
        wide = replace(s, batch_size=self.meta.parts * s.batch_size)
        (fitted,) = yield [make_job(received.shared, data, ctx, wide, self.meta)]
        return state, self.reply(fitted.params, received.shared, data.num_train), fitted.loss

    def default_finetune_epochs(self) -> int:
        return self.hp.personal_epochs

    def finetune_settings(self, ctx):
        s = super().finetune_settings(ctx)
        if s is None or getattr(self.finetune, "lr", None) is not None:
            return s
        lr = self.hp.alpha
        if getattr(self.finetune, "lr_source", "base") == "schedule":
            lr = lr * self.hp.lr_factor(ctx.round, ctx.rounds)
        return replace(s, lr=lr)
