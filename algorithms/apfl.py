"""APFL — Deng, Kamani & Mahdavi, "Adaptive Personalized Federated Learning" (2020), Algorithm 1.

Every client keeps its copy w of the global model, a local model v and a mixing weight α (v and
α are its state, on its host). Each local step, on one mini-batch and from the same point:

- w ← w − η∇f(w);
- v ← v − η∇_v f(v̄), v̄ = α·v + (1 − α)·w (w held fixed in v̄, so the chain rule gives
  α·∇f(v̄));
- with ``adapt_alpha`` (default): α ← clip(α − η·⟨v − w, ∇f(v̄)⟩, 0, 1), the exact derivative
  of f(v̄) in α, every step (the paper; the authors' FedTorch code updates α once per round and
  adds 0.02·α); without it α stays at ``alpha``, the SuPerFed repository's fixed-α baseline.

``mix``: ``weights`` (default, the paper: v̄ is a model in weight space) or ``logits`` (the
authors' code: v̄(x) = α·v(x) + (1 − α)·w(x)). The server averages w by training-set size
(FedAvg), every round. v starts from the global model at the client's first round and α from
``alpha`` (0.5, as FedTorch and FL-bench; 0.25 is the SuPerFed repository's constant).

Evaluation: ``accuracy`` is the personalized v̄ = α·v + (1 − α)·w^g with the current global
model; ``global_*`` is w^g, ``local_*`` is v alone, ``alpha`` the client's α. The optimizer
settings apply to w and v (momentum and weight decay too); α takes plain projected steps.

Decentralized (a ``topology``; the paper has a server): each client's copy of w is mixed with
its neighbours' after the local steps; v and α stay on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Algorithm, Objective, interpolate, set_dot
from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class APFLHyper(FedAvgHyper):
    alpha: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0, "help": "α₀, the local model's initial share"})
    adapt_alpha: bool = field(default=True, metadata={"help": "learn α by projected gradient steps (false: fixed α)"})
    mix: str = field(
        default="weights",
        metadata={
            "choices": ("weights", "logits"),
            "help": "weights: v̄ in weight space (the paper); logits: outputs mixed (authors' code)",
        },
    )


@dataclass
class APFLState:
    v: list[torch.Tensor]
    alpha: torch.Tensor  # (1,)


class APFLObjective(Objective):
    """Parameters w (n), v (n), α (1,) with v̄ = α·v + (1 − α)·w in weight space: the paper's
    two steps as gradients at two points, ∇f(w) for w and ∇_v f(v̄) = α·∇f(v̄) for v (w held
    fixed in v̄), and α set by a projected step with the job's ``lr`` constant along
    ∂f(v̄)/∂α = ⟨v − w, ∇f(v̄)⟩."""

    def __init__(self, task, n: int, adapt: bool):
        self.task, self.n, self.adapt = task, n, adapt
        self.trainable = (True,) * (2 * n) + (False,)

    def gradients(self, grad, params, batch, consts, draws):
        n = self.n
        w, v, alpha = params[:n], params[n : 2 * n], params[2 * n][:, 0]
        seen, g_w = grad(w)
        _, g = grad(interpolate(w, v, alpha))  # ∇f(v̄)
        assign = {}
        if self.adapt:
            pairs = [(x, y, gi) for x, y, gi in zip(w, v, g) if gi is not None]
            slope = set_dot(
                torch._foreach_sub([y for _, y, _ in pairs], [x for x, _, _ in pairs]), [gi for _, _, gi in pairs]
            )
            assign[2 * n] = (alpha - consts["lr"] * slope).clamp(0.0, 1.0).unsqueeze(1)
        for gi in g:  # ∇_v f(v̄) = α·∇f(v̄), in place
            if gi is not None:
                gi.mul_(alpha.view(-1, *[1] * (gi.dim() - 1)))
        return seen, g_w + g + [None], assign


class APFLLogits(Objective):
    """``mix: logits`` (the authors' code): f(w) + f(v̄) with v̄(x) = α·v(x) + (1 − α)·w(x), w's
    outputs held fixed in v̄; α as ``APFLObjective``'s, its slope by autograd."""

    def __init__(self, task, n: int, adapt: bool):
        self.task, self.n, self.adapt = task, n, adapt
        self.trainable = (True,) * (2 * n) + (False,)

    def loss(self, forward, params, batch, consts, draws):
        n = self.n
        w, v = params[:n], params[n : 2 * n]
        alpha = params[2 * n].detach()[:, 0].requires_grad_(self.adapt)
        out_w = forward(w, batch.x)
        a = alpha.view(-1, *[1] * (out_w.dim() - 1))
        out_v = a * forward(v, batch.x) + (1 - a) * out_w.detach()
        per_w = self.task.per_sample(out_w, batch.y)
        loss_v = (self.task.per_sample(out_v, batch.y) * batch.weight).sum(1)
        loss = (per_w * batch.weight).sum(1) + loss_v
        assign = {}
        if self.adapt:
            (g,) = torch.autograd.grad(loss_v.sum(), alpha, retain_graph=True)
            assign[2 * n] = (alpha.detach() - consts["lr"] * g).clamp(0.0, 1.0).unsqueeze(1)
        return loss, (per_w.detach() * batch.valid).sum(1), assign


class APFL(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "apfl"
    summary = "APFL (Deng et al. 2020): global and local models mixed with an adaptive α per client"
    paper = "Deng, Kamani & Mahdavi, arXiv 2020"
    family = "personalized"
    personal = "its local model v and its mixing weight α"
    sends = "its copy of the global model w, weighted by n_k"
    Hyper = APFLHyper
    ClientState = APFLState
    decentralized = True
    personalized_is_global = False  # a personal model beside the global one

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        n = sum(1 for _ in model_fn().parameters())
        self.mixed = (
            APFLObjective(task, n, hyper.adapt_alpha)
            if hyper.mix == "weights"
            else APFLLogits(task, n, hyper.adapt_alpha)
        )

    def _state(self, state, glob) -> APFLState:
        if state is None:
            return APFLState([p.clone() for p in glob], torch.full((1,), self.hp.alpha, device=glob[0].device))
        return state

    def train(self, state, received, data, ctx):
        glob = received.shared
        st = self._state(state, glob)
        n = len(glob)
        lr = torch.tensor(self.hp.lr_at(ctx.round, ctx.rounds))
        (fit,) = yield [self.job(glob + st.v + [st.alpha], data, ctx, objective=self.mixed, consts={"lr": lr})]
        return (
            APFLState(fit.params[n : 2 * n], fit.params[2 * n]),
            self.reply(fit.params[:n], received.shared, data.num_train),
            fit.loss,
        )

    def personalized(self, st: APFLState, glob, x, device) -> torch.Tensor:
        """v̄'s outputs on x."""
        a = float(st.alpha)
        if self.hp.mix == "weights":
            return self.outputs([interpolate(glob, st.v, a)], x, device)[0]
        out_w, out_v = self.outputs([glob, st.v], x, device)
        return a * out_v + (1 - a) * out_w

    def evaluate(self, state, received, data, ctx):
        glob = received.shared
        st = self._state(state, glob)
        out_g, out_v = self.outputs([glob, st.v], data.test_x, ctx.device)
        mixed = self.personalized(st, glob, data.test_x, ctx.device)
        task = self.task
        return {
            **task.scores(mixed, data.test_y),
            **task.scores(out_g, data.test_y, "global_"),
            **task.scores(out_v, data.test_y, "local_"),
            "alpha": float(st.alpha),
        }

    personalize = Algorithm.personalize_by_training
