"""SuPerFed — Hahn, Jeong & Lee, "Connecting Low-Loss Subspace for Personalized Federated
Learning", KDD 2022 (Algorithms 1–2).

Every client holds a **federated** model w^f (its copy of the global model w^g) and a **local**
model w^l of the same architecture; its personalized model is the weight-space mix
W(λ) = (1 − λ)·w^f + λ·w^l of every parameter.

- **Rounds r ≤ ⌊L·R⌋** (``start`` = L, a fraction of the rounds, rounds counted from 1 as the
  official code): λ = 0 and only w^f trains, on CE + μ·prox(w^f, w^g) — FedProx at μ' = 2μ
  (with the squared prox, it is trained as FedProx's objective, the loop's own), or with μ = 0
  exactly FedAvg (same batches, same optimizer: tests check the weights bit for bit).
- **Later rounds**: w^f and w^l train in one optimizer on
  CE(W(λ)) + μ·prox(w^f, w^g) + ν·cos²(w^f, w^l), with λ ~ U(0, 1) drawn for **every
  mini-batch** from the client's generator: one λ for the whole model (``superfed-mm``, model
  mixing) or one per module (``superfed-lm``, layer mixing: a module's weight and bias share
  theirs). cos² is one cosine over the concatenation of every parameter,
  (Σ w^f·w^l)² / (‖w^f‖²‖w^l‖²) (the official code's scope; ε only guards a zero
  denominator, where the official code adds 1e-6 per element to the numerator).
- **prox** (``prox_form``): ``squared`` ‖w^f − w^g‖² (the paper's, the default) or
  ``unsquared_sum`` Σ_layers ‖w^f_l − w^g_l‖₂ (the official code's, against which the paper's
  μ = 0.01 was tuned). Skipped when μ = 0.
- **Upload**: only w^f; the server averages by training-set size. w^l never leaves the client
  (its state, on its host); unsampled clients keep theirs.
- **Local-model init** (``local_init``): ``random_per_client`` (default) — an independent
  initialization seeded by the client id (the run's model init with variant 1 + id), what the
  official code that produced the paper's tables does; ``copy_global`` — the KDD text's
  Algorithm 1: w^l ← w^g at the client's first update (whatever its phase).
- **Optimizer** (defaults): SGD, momentum 0.9, weight decay 1e-4 on w^f and w^l alike, fresh
  every round; lr₀·0.999^r (``lr_schedule: exponential``, r counted from 0); 10 epochs of
  batch 10; μ = 0.01; ν = 1 (MM) / 2 (LM); L = 0.4 (MM) / 0.6 (LM), the paper's settings for
  100 clients.

**Evaluation** over the λ grid {0, 1/(G−1), …, 1} (``lambdas`` = G = 11 points), with the
current global model as w^f and the client's own w^l, the same λ for every layer (as the
official code, MM and LM alike):

- ``lambda_<λ>_<metric>`` — the client's score at each λ; the run's report holds the curve
  (``lambda_curve``: mean over clients weighted by test size; ``lambda_curve_std``; the
  bottom decile per λ is a per-round metric);
- ``accuracy`` (the task's metric) — the personalized model, λ chosen per client on its
  **validation** split (highest score, ties to the lowest validation loss, then the smallest
  λ; on its training split when it has no validation split), scored on the test split: honest,
  the default headline;
- ``accuracy_test_chosen`` — the paper's protocol: each client's best score over the grid on the
  test split itself (optimistic; labelled as such);
- ``global_*`` (λ = 0) and ``local_*`` (λ = 1); ``lambda_chosen``, the chosen λ.

Unseen clients (``eval.unseen_fraction``) run one local update (both models, as in the current
phase) from the global model and keep their w^l.

Decentralized (a ``topology``; the paper has a server): each client trains its copy of w^f with
its w^l as above, mixes w^f with its neighbours and keeps w^l; the λ grid is scored against its
own mixed copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import (
    Algorithm,
    Objective,
    Supervised,
    interpolate,
    lower_is_better,
    mean_std,
    params_of,
    set_dot,
    training_field,
)
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class SuPerFedHyper(FedAvgHyper):
    lr: float = training_field("lr", 0.01)
    local_epochs: int = training_field("local_epochs", 10)
    batch_size: int = training_field("batch_size", 10)
    momentum: float = training_field("momentum", 0.9)
    weight_decay: float = training_field("weight_decay", 1e-4)
    lr_schedule: str = training_field("lr_schedule", "exponential")
    mu: float = field(default=0.01, metadata={"min": 0.0, "help": "μ of the proximal term to the round's global model"})
    nu: float = field(default=1.0, metadata={"min": 0.0, "help": "ν of the cos²(w^f, w^l) term"})
    start: float = field(
        default=0.4,
        metadata={
            "min": 0.0,
            "max": 1.0,
            "help": "L: mixing starts after round ⌊L·rounds⌋ (0: from round 1; 1: never)",
        },
    )
    prox_form: str = field(
        default="squared",
        metadata={
            "choices": ("squared", "unsquared_sum"),
            "help": "squared: μ‖w^f − w^g‖² (the paper); unsquared_sum: μ Σ_layers ‖·‖₂ (the official code)",
        },
    )
    local_init: str = field(
        default="random_per_client",
        metadata={
            "choices": ("random_per_client", "copy_global"),
            "help": "random_per_client: own init seeded by the client id (official code); "
            "copy_global: w^l ← w^g at the first update (KDD Algorithm 1)",
        },
    )
    lambdas: int = field(default=11, metadata={"min": 2, "help": "points of the evaluation grid over λ ∈ [0, 1]"})


@dataclass(frozen=True)
class SuPerFedLMHyper(SuPerFedHyper):
    nu: float = field(default=2.0, metadata={"min": 0.0, "help": "ν of the cos²(w^f, w^l) term"})
    start: float = field(
        default=0.6,
        metadata={
            "min": 0.0,
            "max": 1.0,
            "help": "L: mixing starts after round ⌊L·rounds⌋ (0: from round 1; 1: never)",
        },
    )


@dataclass
class SuPerFedState:
    local: list[torch.Tensor]  # w^l, never sent


def cos2(a: list[torch.Tensor], b: list[torch.Tensor], eps: float = 1e-12) -> torch.Tensor:
    """Squared cosine similarity of two stacked parameter sets (K, ...), each flattened and
    concatenated over all its floating-point tensors: (K,)."""
    a, b = _floats(a), _floats(b)
    dot = sum((x * y).flatten(1).sum(1) for x, y in zip(a, b))
    na = sum((x * x).flatten(1).sum(1) for x in a)
    nb = sum((y * y).flatten(1).sum(1) for y in b)
    return dot * dot / (na * nb).clamp_min(eps)


def add_cos2_grad(
    a: list[torch.Tensor],
    b: list[torch.Tensor],
    out_a: list[torch.Tensor | None],
    out_b: list[torch.Tensor | None],
    scale: float,
    eps: float = 1e-12,
) -> None:
    """Adds scale times the gradients of ``cos2`` in a and in b to ``out_a`` and ``out_b`` (in
    place; None entries and tensors that are not floating-point skipped). With D = ⟨a, b⟩,
    A = ‖a‖², B = ‖b‖²: ∂/∂a = (2D/AB)·(b − (D/A)·a) and ∂/∂b = (2D/AB)·(a − (D/B)·b);
    where AB is below ε (``cos2``'s clamp), only the numerator varies: (2D/ε)·b and (2D/ε)·a.
    Two passes over each output tensor (``addcmul``), no temporaries."""
    fa, fb = _floats(a), _floats(b)
    d, na, nb = set_dot(fa, fb), set_dot(fa, fa), set_dot(fb, fb)
    den = na * nb
    on = den >= eps
    c = scale * 2 * d / den.clamp_min(eps)
    ca = torch.where(on, -c * d / na, torch.zeros_like(c))
    cb = torch.where(on, -c * d / nb, torch.zeros_like(c))
    for x, y, ga, gb in zip(a, b, out_a, out_b):
        if not x.is_floating_point():
            continue
        s = (-1,) + (1,) * (x.dim() - 1)
        if ga is not None:
            ga.addcmul_(y, c.view(s)).addcmul_(x, ca.view(s))
        if gb is not None:
            gb.addcmul_(x, c.view(s)).addcmul_(y, cb.view(s))


def _floats(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t for t in ts if t.is_floating_point()]


def prox(w: list[torch.Tensor], anchor: list[torch.Tensor], form: str) -> torch.Tensor:
    """‖w − anchor‖² (``squared``) or Σ_tensors ‖w_l − anchor_l‖₂ (``unsquared_sum``), per set (K,)."""
    if form == "squared":
        return sum(((x - a) ** 2).flatten(1).sum(1) for x, a in zip(w, anchor))
    return sum(torch.linalg.vector_norm((x - a).flatten(1), dim=1) for x, a in zip(w, anchor))


def add_prox_grad(
    w: list[torch.Tensor], anchor: list[torch.Tensor], form: str, out: list[torch.Tensor | None], scale: float
) -> None:
    """Adds scale times the gradient of ``prox`` in w to ``out`` (in place; None entries
    skipped): 2(w − anchor) (``squared``), or (w_l − anchor_l)/‖w_l − anchor_l‖ per tensor
    (``unsquared_sum``; 0 where the difference is 0, as autograd's norm)."""
    keep = [i for i, g in enumerate(out) if g is not None]
    diffs = torch._foreach_sub([w[i] for i in keep], [anchor[i] for i in keep])
    targets = [out[i] for i in keep]
    if form == "squared":
        torch._foreach_add_(targets, diffs, alpha=2.0 * scale)
        return
    for g, x in zip(targets, diffs):
        norm = torch.linalg.vector_norm(x.flatten(1), dim=1)
        inv = torch.where(norm > 0, scale / norm, torch.zeros_like(norm))
        g.addcmul_(x, inv.view(-1, *[1] * (x.dim() - 1)))


class SuPerFedObjective(Objective):
    """Phase I (``modules`` None): the job's parameters are w^f; loss CE + μ·prox. Phase II:
    they are w^f then w^l; λ drawn per step, one (MM) or one per module (LM, ``modules`` =
    each parameter's module index); loss CE(W(λ)) + μ·prox + ν·cos²."""

    def __init__(self, task, mu: float, nu: float, prox_form: str, modules: list[int] | None):
        self.task, self.mu, self.nu, self.form = task, mu, nu, prox_form
        self.modules = modules

    def draws(self, generator, steps):
        if self.modules is None:
            return None
        return torch.rand(steps, max(self.modules) + 1, generator=generator)

    def gradients(self, grad, params, batch, consts, draws):
        """CE's gradient g at W(λ) (from the loop: by hand for chains of linear layers) gives
        (1 − λ)·g to w^f and λ·g to w^l; μ·prox and ν·cos² add their gradients (``add_prox_grad``,
        ``add_cos2_grad``: closed forms, tests hold them to autograd's)."""
        if self.modules is None:
            wf, wl = params, None
            seen, grads = grad(wf)
            grads = list(grads)
        else:
            n = len(self.modules)
            wf, wl = params[:n], params[n:]
            ts = [draws[:, m] for m in self.modules]
            seen, g = grad(interpolate(wf, wl, ts))
            shape = [(-1,) + (1,) * (p.dim() - 1) for p in wf]
            to_local = [None if gi is None else gi * t.view(s) for gi, t, s in zip(g, ts, shape)]
            grads = [None if gi is None else gi.mul_((1 - t).view(s)) for gi, t, s in zip(g, ts, shape)] + to_local
        if "anchor" in consts:  # μ·prox(w^f, w^g)
            add_prox_grad(wf, consts["anchor"], self.form, grads[: len(wf)], self.mu)
        if wl is not None and self.nu > 0:  # ν·cos²(w^f, w^l)
            n = len(wf)
            add_cos2_grad(wf, wl, grads[:n], grads[n:], self.nu)
        return seen, grads, {}


class SuPerFedMM(FedAvg):
    """Server side: FedAvg's (the global model, the n_k-weighted mean of the w^f sent)."""

    dp_sgd = False  # an objective of its own

    name = "superfed-mm"
    summary = "SuPerFed-MM (Hahn et al. 2022): global and local models mixed in weight space, one λ per batch"
    paper = "Hahn, Jeong & Lee, KDD 2022"
    family = "personalized"
    personal = "its local model w^l"
    sends = "its federated model w^f, weighted by n_k"
    Hyper = SuPerFedHyper
    ClientState = SuPerFedState
    decentralized = True
    personalized_is_global = False  # a personal model beside the global one
    layerwise = False

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        names = [n for n, _ in model_fn().named_parameters()]
        owners = [n.rpartition(".")[0] for n in names]
        order = list(dict.fromkeys(owners))
        modules = [order.index(o) for o in owners] if self.layerwise else [0] * len(names)
        hp = self.hp
        # phase I with the paper's prox μ‖w − w^g‖² is FedProx's (μ'/2)‖w − w^g‖² at μ' = 2μ:
        # the loop's own objective (fused by hand for chains); the official code's form is not
        self.squared_prox = hp.prox_form == "squared"
        self.phase1 = (
            Supervised(task) if self.squared_prox else SuPerFedObjective(task, hp.mu, hp.nu, hp.prox_form, None)
        )
        self.phase2 = SuPerFedObjective(task, hp.mu, hp.nu, hp.prox_form, modules)
        self.grid = np.linspace(0.0, 1.0, hp.lambdas)

    def mixing(self, round_: int) -> bool:
        """Phase II: round r = round_ + 1 > ⌊L·R⌋."""
        return round_ + 1 > int(self.hp.start * self.rounds)

    def _local(self, state, cid: int, glob: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """w^l: the client's, or its initial one (None: copy_global before the first update)."""
        if state is not None:
            return state.local
        if self.hp.local_init == "random_per_client":
            return [p.to(glob[0].device) for p in params_of(self.model_fn(1 + cid))]
        return None

    def train(self, state, received, data, ctx):
        glob = received.shared
        local = self._local(state, ctx.cid, glob)
        if local is None:  # copy_global: the first update
            local = [p.clone() for p in glob]
            state = SuPerFedState(local)
        consts = {"anchor": glob} if self.hp.mu > 0 else {}
        if self.mixing(ctx.round):
            (fit,) = yield [self.job(glob + local, data, ctx, objective=self.phase2, consts=consts)]
            n = len(glob)
            wf, state = fit.params[:n], SuPerFedState(fit.params[n:])
        else:
            if consts and self.squared_prox:
                consts["mu"] = 2.0 * self.hp.mu
            (fit,) = yield [self.job(glob, data, ctx, objective=self.phase1, consts=consts)]
            wf = fit.params
        return state, self.reply(wf, glob, data.num_train), fit.loss

    def evaluate(self, state, received, data, ctx):
        glob = received.shared
        local = self._local(state, ctx.cid, glob)
        if local is None:
            local = glob
        task, metric = self.task, self.task.metric
        sets = [interpolate(glob, local, float(t)) for t in self.grid]
        test = [task.scores(o, data.test_y) for o in self.outputs(sets, data.test_x, ctx.device)]
        if not test[0]:
            return {}
        vx, vy = (data.val_x, data.val_y) if data.num_val else (data.train_x, data.train_y)
        val = [task.scores(o, vy) for o in self.outputs(sets, vx, ctx.device)]
        sign = 1.0 if lower_is_better(metric) else -1.0
        pick = min(range(len(self.grid)), key=lambda i: (sign * val[i][metric], val[i].get("test_loss", 0.0), i))
        best_test = (min if sign > 0 else max)(s[metric] for s in test)
        out = dict(test[pick])
        out.update({f"global_{k}": v for k, v in test[0].items()})
        out.update({f"local_{k}": v for k, v in test[-1].items()})
        out[f"{metric}_test_chosen"] = best_test
        out["lambda_chosen"] = float(self.grid[pick])
        out.update({f"lambda_{t:g}_{metric}": s[metric] for t, s in zip(self.grid, test)})
        return out

    def report(self, results, server):
        metric = self.task.metric
        mean, std = {}, {}
        for t in self.grid:
            key = f"lambda_{t:g}_{metric}"
            vals = [(m[key], n) for c, (m, n) in sorted(results.items()) if n > 0 and key in m]
            if not vals:
                return {}
            mean[f"{t:g}"], std[f"{t:g}"] = mean_std([a for a, _ in vals], [b for _, b in vals])
        return {"lambda_curve": mean, "lambda_curve_std": std}

    personalize = Algorithm.personalize_by_training


class SuPerFedLM(SuPerFedMM):
    name = "superfed-lm"
    summary = "SuPerFed-LM (Hahn et al. 2022): as SuPerFed-MM with one λ per layer"
    paper = "Hahn, Jeong & Lee, KDD 2022"
    family = "personalized"
    personal = "its local model w^l"
    sends = "its federated model w^f, weighted by n_k"
    Hyper = SuPerFedLMHyper
    layerwise = True
