"""pFedMe — Dinh, Tran & Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020 (Algorithm 1).

Each selected client starts the round with w_loc = θ = w (the global model). For every
mini-batch (a "local round" of the paper; ``local_epochs`` passes over the train split):

1. K (``inner_steps``) steps on the batch of θ ← θ − η_p·(∇f(θ) + λ(θ − w_loc)), approximately
   solving the Moreau-envelope problem min_θ f(θ) + (λ/2)‖θ − w_loc‖² (η_p = ``personal_lr``);
2. w_loc ← w_loc − η·λ(w_loc − θ) (η = ``lr``).

Here step 1 runs inside the objective, which sets θ, and step 2 is the loop's optimizer step on
the loss (λ/2)‖w_loc − θ‖² (its gradient is λ(w_loc − θ)); keep ``momentum`` and
``weight_decay`` at 0 for the paper's update. The server sets
w ← (1 − β)·w + β·Σ_k n_k w_loc,k / Σ_k n_k over the selected clients (β = 1: FedAvg).

The personalized model is θ (the client's state; the paper's θ̂_i(w)): ``accuracy`` scores it,
``global_*`` the global model. A client that never trained scores the global model.

Departures from the official code, deliberately: only the selected clients train (the
official server trains every client every round and then samples whom to average); a local
round is a mini-batch of a pass over the data (the official code draws ``local_epochs``
batches); no extra 0.001·θ decay in the inner step; the official evaluation scores w_loc (its
"personalized" list aliases the model), here θ is scored, as the paper defines. Defaults:
λ = 15, K = 5, η_p = 0.01 (0.09 for MNIST in the paper), η = 0.005, batch 20, β = 1.

Decentralized (a ``topology``; the paper has a server): each client is its own server, so its
copy of w takes the β step towards its own w_loc, w ← (1 − β)·w + β·w_loc, and is then mixed
with its neighbours'; θ stays on the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Algorithm, LocalTraining, Objective, training_field
from .fedavg import FedAvg


@dataclass(frozen=True)
class PFedMeHyper(LocalTraining):
    lr: float = training_field(
        "lr",
        0.005,
        help=(
            "η, the local model's step towards θ once per mini-batch: w_loc ← w_loc − η·λ(w_loc − θ) "
            "(lr_schedule scales it by round)"
        ),
    )
    batch_size: int = training_field("batch_size", 20)
    lam: float = field(default=15.0, metadata={"gt": 0.0, "help": "λ of the Moreau envelope"})
    inner_steps: int = field(default=5, metadata={"min": 1, "help": "K: steps on θ per mini-batch"})
    personal_lr: float = field(default=0.01, metadata={"gt": 0.0, "help": "η_p, the inner steps' learning rate"})
    beta: float = field(default=1.0, metadata={"gt": 0.0, "help": "β of the server update (1: plain average)"})


@dataclass
class PFedMeState:
    theta: list[torch.Tensor]  # the personalized model


class PFedMeObjective(Objective):
    """Parameters θ (n, set here) and w_loc (n, trained): K inner steps on θ, then the loss
    (λ/2)‖w_loc − θ‖²; the data loss reported is f(θ) before the inner steps. Given as
    gradients (``Objective.gradients``): the inner steps' ∇f(θ) come from the loop."""

    def __init__(self, task, n: int, lam: float, steps: int, lr: float):
        self.task, self.n, self.lam, self.steps, self.lr = task, n, lam, steps, lr
        self.trainable = (False,) * n + (True,) * n

    def gradients(self, grad, params, batch, consts, draws):
        n, lam, lr = self.n, self.lam, self.lr
        theta, w_loc = params[:n], params[n:]
        seen = None
        for _ in range(self.steps):  # θ ← θ − η_p (∇f(θ) + λ(θ − w_loc))
            data_sum, g = grad(theta)
            if seen is None:
                seen = data_sum
            theta = [t if gi is None else t - lr * (gi + lam * (t - a)) for t, gi, a in zip(theta, g, w_loc)]
        # ∇ of (λ/2)‖w_loc − θ‖² in w_loc (θ held): λ(w_loc − θ)
        out = [None] * n + [None if gi is None else lam * (w - t) for w, t, gi in zip(w_loc, theta, g)]
        return seen, out, dict(enumerate(theta))


class PFedMe(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "pfedme"
    summary = "pFedMe (Dinh et al. 2020): Moreau-envelope personalization, θ solved per batch around w_loc"
    paper = "Dinh, Tran & Nguyen, NeurIPS 2020"
    family = "personalized"
    personal = "its personalized model θ"
    sends = "its local model w_loc, weighted by n_k"
    Hyper = PFedMeHyper
    ClientState = PFedMeState
    decentralized = True
    personalized_is_global = False  # a personal model beside the global one

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        n = sum(1 for _ in model_fn().parameters())
        self.inner = PFedMeObjective(task, n, hyper.lam, hyper.inner_steps, hyper.personal_lr)

    def aggregate(self, server, reduced, round_):
        mean, b = super().aggregate(server, reduced, round_), self.hp.beta  # FedAvg's average
        if b == 1.0:
            return mean
        return [(1 - b) * w + b * m for w, m in zip(server, mean)]

    def train(self, state, received, data, ctx):
        glob = received.shared
        n = len(glob)
        (fit,) = yield [self.job(glob + glob, data, ctx, objective=self.inner)]
        return PFedMeState(fit.params[:n]), self.reply(fit.params[n:], glob, data.num_train), fit.loss

    def evaluate(self, state, received, data, ctx):
        glob = received.shared
        theta = glob if state is None else state.theta
        personal, out_g = self.outputs([theta, glob], data.test_x, ctx.device)
        return {**self.task.scores(personal, data.test_y), **self.task.scores(out_g, data.test_y, "global_")}

    personalize = Algorithm.personalize_by_training
