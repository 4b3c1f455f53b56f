"""FedRep — Collins, Hassani, Mokhtari & Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021 (Algorithm 1).

The model is a shared representation φ (the body) and a head h_i per client (``model.head``, by
default the last layer; the client's state, persistent on its host; a client that never trained
holds the initial model's head). A round t:

1. the server sends φ^t to the sampled clients I^t (r·n of the n clients);
2. client i first updates its head with the representation fixed, τ_h passes:
       h_i ← GRD(f_i(h_i, φ^t), h_i, α)         (``head_epochs`` epochs, the body frozen)
   then the representation with the new head fixed, τ_φ passes:
       φ_i ← GRD(f_i(h_i^{t+1}, φ_i), φ_i, α)   (``local_epochs`` epochs, the head frozen)
   and keeps h_i^{t+1};
3. it replies with φ_i only;
4. the server: φ^{t+1} = (1/(r n)) Σ_{i∈I^t} φ_i.

Each step is one job of the one loop, with a head-only or a body-only ``Supervised`` objective
created once: a host's clients do their head steps in one pass, then their body steps in another.
After the head step the body is bit for bit the received one, after the body step the head is
the head step's (tests check both); running statistics of normalization layers, if any, follow
both steps' forward passes, as in training mode.

Defaults and choices (the official code is lgcollins/FedRep, ``main_fedrep.py`` and
``LocalUpdate``):

- ``head_epochs`` 10, ``local_epochs`` 1: the official scripts (``--local_ep 11
  --local_rep_ep 1`` for CIFAR-10: the head trains ``local_ep − local_rep_ep`` epochs, then the
  representation ``local_rep_ep``; FEMNIST: 15 and 5, i.e. 10 + 5).
- ``lr`` α 0.01, ``momentum`` 0.5, ``batch_size`` 10, ``weight_decay`` 1e-4: the official
  optimizer, one learning rate for both steps (as the paper's single α). The official code
  decays weights but not biases; the loop decays every trained tensor. The official code keeps
  one SGD optimizer through both steps, but with current PyTorch (``zero_grad`` sets gradients to
  None) the frozen part takes no step and keeps no momentum, as here with a fresh optimizer per
  step.
- ``weighting: uniform`` (default): the paper's 1/(r n). The official code weighs each client's
  φ_i by its number of samples for FEMNIST and Sent140 and by 1 for CIFAR and MNIST;
  ``weighting: samples`` is that n_i-weighted average. Uniform is the default because it is
  Algorithm 1 and the official code's choice for its shard (2 classes per client) experiments,
  the pathological splits the method is meant for.
- Not reproduced: the official code's extra last round, in which every client fine-tunes its
  head for 10 epochs before the final score (an evaluation protocol, not the algorithm), and
  its cap of 500 training samples per client.

Metrics: ``accuracy`` etc. score each client's personalized model φ with its own h_i; no
``global_*`` metrics (the server has no head). Unseen clients (``eval.unseen_fraction``): the
paper's generalization to new clients, a new head learned on the received φ kept fixed: the
head step alone, ``head_epochs`` epochs, from the initial model's head.

Decentralized (a ``topology``): each client runs FedRep's two steps on its copy of φ with its
own head, keeps the head and mixes φ with its neighbours (``SplitMethod``'s gossip).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import LocalTraining, training_field
from .fedper import FedPerState, SplitMethod


@dataclass(frozen=True)
class FedRepHyper(LocalTraining):
    lr: float = training_field(
        "lr", 0.01, help=("α, the learning rate of both the head and the body step (lr_schedule scales it by round)")
    )
    local_epochs: int = training_field(
        "local_epochs", 1, help=("τ_φ, epochs of the body step (the head frozen), after head_epochs of the head step")
    )
    batch_size: int = training_field("batch_size", 10)
    momentum: float = training_field("momentum", 0.5)
    weight_decay: float = training_field("weight_decay", 1e-4)
    head_epochs: int = field(
        default=10,
        metadata={"min": 1, "help": "epochs of the head step (the body frozen) before local_epochs of the body step"},
    )
    weighting: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "samples"),
            "help": "the server's average of the bodies: uniform (1/|S|, the paper) or samples (n_k weights)",
        },
    )


class FedRep(SplitMethod):
    name = "fedrep"
    summary = "FedRep (Collins et al. 2021): per round the head trains on the frozen body, then the body; the body is averaged"
    paper = "Collins et al., ICML 2021"
    family = "personalized"
    personal = "its head h_i"
    sends = "its body φ_i (the representation)"
    Hyper = FedRepHyper
    ClientState = FedPerState

    def train(self, state, received, data, ctx):
        start = self.model(state, received.shared, ctx.device)
        (head,) = yield [self.job(start, data, ctx, epochs=self.hp.head_epochs, objective=self.head_only)]
        (body,) = yield [self.job(head.params, data, ctx, objective=self.body_only)]
        e_h, e_b = self.hp.head_epochs, self.hp.local_epochs
        loss = (e_h * head.loss + e_b * body.loss) / (e_h + e_b)  # the mean over every epoch, as the official code
        return self.keep(body.params), self.reply(body.params, data.num_train), loss

    def personalize(self, received, data, ctx):
        start = self.model(None, received.shared, ctx.device)
        (head,) = yield [self.job(start, data, ctx, epochs=self.hp.head_epochs, objective=self.head_only)]
        return self.keep(head.params)
