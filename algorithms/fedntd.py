"""FedNTD — Lee, Jeong, Shin, Sohn & Yun, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022.

FedAvg whose clients add to their cross-entropy a distillation from the global model they
received, on the classes other than each sample's own ("not-true" logits), so that local
training on skewed labels forgets less of what the global model knows about the classes a
client does not see:

    ℓ(x, y) = CE(z(x), y) + β·τ²·KL(q̃_g ‖ q̃),   q̃ = softmax(z̃/τ), q̃_g = softmax(z̃_g/τ),

z̃ and z̃_g the local and the (frozen) global model's logits with the true class's column removed,
the softmax over the remaining C − 1 classes at temperature τ. The server averages as FedAvg
(n_k weights).

Choices, from the official code (Lee-Gihun/FedNTD: ``algorithms/fedntd/criterion.py``,
``config/fedntd.json``, read at be00ee5) and PFLlib's port (``clientntd.py``):

- β = 1, τ = 1: the official config's (its loss class's own defaults are τ = 3, β = 1; PFLlib's
  command line defaults to β = 0, which turns the distillation off);
- the τ² factor: the official code's current loss and PFLlib's have it, its earlier version
  did not; with τ = 1 it changes nothing. ``tau_squared: false`` drops it;
- KL(global ‖ local) summed over the not-true classes and averaged over the batch (``batchmean``),
  the teacher's probabilities computed without gradient.

Classification only. Trained by autograd (the distillation's gradient is not the task loss's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from raysim.core.objectives import Objective, not_true

from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class FedNTDHyper(FedAvgHyper):
    beta: float = field(default=1.0, metadata={"min": 0.0, "help": "β, the distillation's weight"})
    tau: float = field(default=1.0, metadata={"gt": 0.0, "help": "τ, the softmax temperature of the not-true logits"})
    tau_squared: bool = field(
        default=True, metadata={"help": "multiply the distillation by τ² (the official code's current loss)"}
    )


class NotTrueDistillation(Objective):
    """CE + β·s·KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)) per sample, z̃ the not-true logits, s = τ² or 1;
    the constant ``glob``: the global model's parameters (frozen)."""

    def __init__(self, task, beta: float, tau: float, tau_squared: bool):
        self.task, self.beta, self.tau = task, beta, tau
        self.scale = beta * (tau * tau if tau_squared else 1.0)

    def distillation(self, out: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """KL(q̃_g ‖ q̃) per sample, summed over the not-true classes: (K, B)."""
        log_q = F.log_softmax(not_true(out, y) / self.tau, dim=-1)
        log_p = F.log_softmax(not_true(teacher, y) / self.tau, dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1)

    def loss(self, forward, params, batch, consts, draws):
        out = forward(params, batch.x)
        per = self.task.per_sample(out, batch.y)
        loss = (per * batch.weight).sum(1)
        if self.scale:
            with torch.no_grad():
                teacher = forward(consts["glob"], batch.x)
            loss = loss + self.scale * (self.distillation(out, teacher, batch.y) * batch.weight).sum(1)
        return loss, (per.detach() * batch.valid).sum(1)


class FedNTD(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "fedntd"
    summary = "FedNTD (Lee et al. 2022): FedAvg plus a distillation from the global model on the not-true classes"
    paper = "Lee et al., NeurIPS 2022"
    family = "global model"
    personal = "nothing"
    sends = "its model, weighted by n_k"
    Hyper = FedNTDHyper
    decentralized = False
    no_gossip = "its teacher is the server's global model, which a gossip network does not have"

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        self.ntd = NotTrueDistillation(task, hyper.beta, hyper.tau, hyper.tau_squared)

    def train(self, state, received, data, ctx):
        glob = received.shared
        (fit,) = yield [self.job(glob, data, ctx, objective=self.ntd, consts={"glob": [t.detach() for t in glob]})]
        return state, self.reply(fit.params, glob, data.num_train), fit.loss
