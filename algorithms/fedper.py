"""FedPer — Arivazhagan, Aggarwal, Singh & Choudhary, "Federated Learning with Personalization
Layers", arXiv:1912.00818, 2019.

The model is split into **base layers** W_B (the body, shared) and **personalization layers**
W_P (the head: ``model.head``, by default the model's last layer). Every client j keeps its own
W_P,j (its state, persistent on its host; a client that never trained holds the initial model's
head). A round:

1. the server sends the base layers W_B to the sampled clients S;
2. client j trains the whole model (W_B, W_P,j) on its data with local SGD, E epochs, and keeps
   the new W_P,j;
3. it replies with its base layers only, weighted by its number of samples n_j;
4. the server: W_B ← Σ_{j∈S} n_j W_B,j / Σ_{j∈S} n_j (FedAvg on the base layers).

Only the body travels, both ways: the head never leaves the client (that is the communication
saving; ``bytes_up`` and ``bytes_down`` show it).

Defaults and choices:

- ``lr`` 0.01, ``momentum`` 0.5, ``batch_size`` 10, ``weight_decay`` 1e-4: the local optimizer
  of the FedPer implementation in FedRep's official code (lgcollins/FedRep, ``LocalUpdate``, the
  FedPer the FedRep paper compares with; FedPer's authors published no code). That code decays
  weights only, not biases; the loop here decays every trained tensor (1e-4: a negligible
  difference). ``local_epochs`` 1: that code's baseline scripts (``--local_ep 1``).
- ``weighting: samples`` (default): FedAvg's n_j weights, as the paper aggregates the base
  layers by FedAvg. ``uniform``: 1/|S|, what FedRep's code computes for CIFAR and MNIST (it
  weighs every client 1 there, by its sample count only for FEMNIST and Sent140).
- Where the head ends and the body begins is the model's ``model.head`` (a number of trailing
  layers or names; the paper varies the personalization layers K_P from 1 to 4). A model that
  is all head (``model: linear``) is refused at validation (``split``).

Metrics: ``accuracy`` etc. score the client's personalized model, the received body with its own
head. There are no ``global_*`` metrics: the method has no global model (the server holds a body
and no head fits every client).

Unseen clients (``eval.unseen_fraction``): a new client has no head of its own; it trains the
initial model's head on the received body, the body frozen, for ``unseen_epochs`` (default
``local_epochs``), and is scored with it (the usual way to personalize a shared representation;
the paper does not treat new clients).

Decentralized (a ``topology``): each client is its own server. It trains its copy of the
body with its own head, as above, keeps the new head and mixes the new body with its
neighbours' (``shared``: the body alone); the heads never travel. This is the decentralized
form of a shared representation with personal heads (the model of decentralized partial
personalization); the FedPer paper itself has a server.

``SplitMethod`` is the machinery FedPer, FedRep, LG-FedAvg and FedBN share (gossip included): a
group each client keeps (``keeps``) and a group the server averages (``shares``), selected by
name (``self.groups``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .base import Algorithm, LocalTraining, Message, Supervised, Weighted, params_of, training_field


@dataclass
class SplitMessage:
    """What the server sends: its copy of the shared group, and where a client without a local
    part of its own starts it (None: the run's initial model, which every host builds alike)."""

    shared: list[torch.Tensor]
    local: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class FedPerHyper(LocalTraining):
    lr: float = training_field("lr", 0.01)
    batch_size: int = training_field("batch_size", 10)
    momentum: float = training_field("momentum", 0.5)
    weight_decay: float = training_field("weight_decay", 1e-4)
    weighting: str = field(
        default="samples",
        metadata={
            "choices": ("samples", "uniform"),
            "help": "the server's average of the shared layers: samples (n_k weights, FedAvg's) or uniform (1/|S|)",
        },
    )
    unseen_epochs: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "epochs an unseen client trains its own part, the shared part frozen (default: local_epochs)",
        },
    )


@dataclass
class FedPerState:
    head: list[torch.Tensor]  # the client's personalization layers W_P,j


class SplitMethod(Algorithm):
    """A model split in a group each client keeps (``keeps``: its state) and one the server
    averages (``shares``: the server state holds the whole model, the shared group averaged,
    the other at its initial values). Replies carry the shared group only."""

    keeps: ClassVar[str] = "head"  # the group each client keeps
    shares: ClassVar[str] = "body"  # the group the server averages
    split = True
    decentralized = True  # gossip mixes the shared group; the kept one stays
    robust_replies = True  # a reply is the trained shared group, from the one sent

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        # created once: the loop batches jobs only when they hold the same objective object
        self.head_only = Supervised(task, trainable=self.groups.mask("head"))
        self.body_only = Supervised(task, trainable=self.groups.mask("body"))
        self._initial: dict[str, list[torch.Tensor]] = {}

    def initial(self, device: torch.device) -> list[torch.Tensor]:
        """The run's initial model on ``device`` (built once per host)."""
        key = str(device)
        if key not in self._initial:
            self._initial[key] = [p.to(device) for p in params_of(self.model_fn())]
        return self._initial[key]

    def own(self, group: str):
        """The objective that trains ``group`` alone (the rest frozen)."""
        return self.head_only if group == "head" else self.body_only

    def keep(self, params: list[torch.Tensor]):
        """The client state holding the local group of ``params``."""
        return self.ClientState(self.groups.pick(params, self.keeps))

    def model(self, state, msg: SplitMessage, device: torch.device) -> list[torch.Tensor]:
        """The client's whole model: the received shared group and its own local group (the
        message's starting point, or the initial model's, while it has none)."""
        if state is not None:
            local = getattr(state, self.keeps)
        elif msg.local is not None:
            local = msg.local
        else:
            local = self.groups.pick(self.initial(device), self.keeps)
        params = self.groups.merge(self.initial(device), self.shares, msg.shared)
        return self.groups.merge(params, self.keeps, local)

    def reply(self, params: list[torch.Tensor], n: int) -> Weighted:
        """The shared group of the trained model, weighted by n_k or 1 (``weighting``)."""
        return Weighted(self.groups.pick(params, self.shares), float(n) if self.hp.weighting == "samples" else 1.0)

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        return params_of(self.model_fn())

    def message(self, server, round_):
        return Message(SplitMessage(self.groups.pick(server, self.shares)))

    def update_origin(self, message):
        return message.shared.shared

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.weight == 0:
            return server
        return self.groups.merge(server, self.shares, reduced.mean(server[0].dtype))

    def shared(self, server):
        """Gossip mixes the shared group alone (the rest of a client's server copy is the initial
        model's, never used: the client's own part comes from its state)."""
        return [self.groups.pick(server, self.shares)]

    def with_shared(self, server, groups):
        return self.groups.merge(server, self.shares, groups[0])

    def server_params(self, server):
        """The shared part (``shares``), stepped by a server optimizer."""
        return self.groups.pick(server, self.global_indices(self.shares))

    def with_server_params(self, server, params):
        return self.groups.merge(server, self.global_indices(self.shares), params)

    # -- client ----------------------------------------------------------------------------
    def train(self, state, received, data, ctx):
        (fit,) = yield [self.job(self.model(state, received.shared, ctx.device), data, ctx)]
        return self.keep(fit.params), self.reply(fit.params, data.num_train), fit.loss

    def evaluate(self, state, received, data, ctx):
        params = self.model(state, received.shared, ctx.device)
        return self.task.scores(self.outputs([params], data.test_x, ctx.device)[0], data.test_y)

    def personalize(self, received, data, ctx):
        epochs = self.hp.unseen_epochs or self.hp.local_epochs
        start = self.model(None, received.shared, ctx.device)
        (fit,) = yield [self.job(start, data, ctx, epochs=epochs, objective=self.own(self.keeps))]
        return self.keep(fit.params)


class FedPer(SplitMethod):
    name = "fedper"
    summary = "FedPer (Arivazhagan et al. 2019): the body averaged by FedAvg, each client keeps its own head"
    Hyper = FedPerHyper
    ClientState = FedPerState
    paper = "Arivazhagan et al., arXiv 2019"
    family = "personalized"
    personal = "its head (personalization layers)"
    sends = "its body (base layers), weighted by n_k"
