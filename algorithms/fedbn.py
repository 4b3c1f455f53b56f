"""FedBN — Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021 (Algorithm 1).

FedAvg in which the batch-normalization layers never leave the clients. The model's parameters
split into the normalization group (``norm`` in ``raysim.core.groups``: each batch-norm layer's
affine weight γ and bias β and its running mean and variance) and the rest w. A round t:

1. the server sends w^t to the sampled clients S;
2. client k trains the whole model (w^t, its own γ_k, β_k, running statistics) with local SGD,
   E epochs, and keeps its new normalization group;
3. it replies with w_k only, weighted by n_k;
4. the server: w^{t+1} = Σ_{k∈S} n_k w_k / Σ_{k∈S} n_k (FedAvg on everything but batch norm).

The aim is feature shift: clients whose inputs differ in style (scanner, scale, colour, rotation)
but share a labelling; each client's own normalization absorbs its feature distribution while
the rest is learnt by all. The client keeps the normalization group as its state (persistent on
its host); one that never trained holds the initial model's (γ = 1, β = 0, mean 0, variance 1).
Only w travels, both ways (``bytes_up`` and ``bytes_down`` show it).

Defaults and choices:

- ``lr`` 0.01, ``batch_size`` 32, ``local_epochs`` 1, plain SGD (no momentum or weight decay):
  the official code's digits experiments (med-air/FedBN, ``federated/fed_digits.py``: ``--lr``
  1e-2, ``--batch`` 32, ``--wk_iters`` 1, ``optim.SGD(params, lr)`` made anew each round),
  checked against that file. It trains all five clients every round.
- ``weighting: samples`` (default): n_k weights, FedAvg's rule that Algorithm 1 builds on.
  The paper's Algorithm 1 and the official code average with 1/K (``client_weights = 1 /
  client_num``); their experiments give every client the same number of samples, where the two
  coincide. ``weighting: uniform`` is the 1/|S| average.
- Which parameters stay local: every parameter of a normalization layer (``norm``), found by
  module type (batch norm, and also group, layer and instance norm where a model has them),
  not by a "bn" in its name as the official code does. A model without normalization layers is
  refused (FedBN would be FedAvg): use ``norm: batch`` (``mlp``, ``resnet9``, ``vgg9``, ...).
  With ``norm: group`` FedBN keeps the GroupNorm layers local (not the paper's setting).

Metrics: ``accuracy`` etc. score each client's model: the received w with its own normalization.
There are no ``global_*`` metrics (the method has no global model: no normalization fits every
client), hence no ``eval.finetune``.

Unseen clients (``eval.unseen_fraction``): the paper treats none. raysim gives a new client the
received w and the initial model's normalization layers, and trains the normalization group
alone (w frozen) on its train split for ``unseen_epochs`` (default ``local_epochs``), which also
fits its running statistics to its features; it is scored with that. (The alternative, a
normalization averaged over the training clients, is no part of FedBN: the server never sees one.)

Decentralized (a ``topology``): each client trains its copy of w with its own normalization
layers, keeps them and mixes w with its neighbours (``SplitMethod``'s gossip): the batch-norm
layers, weights and running statistics, never travel, as at the star. The paper has a server;
the gossip form keeps its one rule, normalization stays local.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import LocalTraining, Supervised, training_field
from .fedper import SplitMethod


@dataclass(frozen=True)
class FedBNHyper(LocalTraining):
    lr: float = training_field("lr", 0.01)
    weighting: str = field(default="samples", metadata={
        "choices": ("samples", "uniform"),
        "help": "the server's average of the non-normalization parameters: samples (n_k weights) or "
                "uniform (1/|S|, the paper's Algorithm 1 and official code, equal-sized clients there)"})
    unseen_epochs: int | None = field(default=None, metadata={
        "min": 1, "help": "epochs an unseen client trains its own normalization layers, the rest frozen "
                          "(default: local_epochs)"})


@dataclass
class FedBNState:
    norm: list[torch.Tensor]          # the client's normalization layers: γ, β, running mean and variance


class FedBN(SplitMethod):
    name = "fedbn"
    summary = "FedBN (Li et al. 2021): FedAvg on everything but batch norm, which each client keeps"
    paper = "Li et al., ICLR 2021"
    family = "personalized"
    personal = "its batch-norm layers: weights, biases and running statistics"
    sends = "every parameter but the batch-norm layers'"
    Hyper = FedBNHyper
    ClientState = FedBNState
    keeps = "norm"
    shares = "~norm"
    split = False                     # no head/body needed: the split is the normalization layers

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        if not self.groups.norm:
            raise ValueError("fedbn keeps the model's batch-norm layers local, and this model has no "
                             "normalization layer; use a model with norm: batch (e.g. mlp, resnet9, vgg9)")
        self.norm_only = Supervised(task, trainable=self.groups.mask("norm"))

    def own(self, group: str):
        return self.norm_only if group == "norm" else super().own(group)
