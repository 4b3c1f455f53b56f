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

Partial participation (the paper and its code train every client every round): a client is
scored with the newest w and the normalization layers it kept from the last round it trained,
which fit the w of that round. ``eval_stats: kept`` (default) is that, Algorithm 1 as written.
``eval_stats: refit`` re-estimates each client's running mean and variance on its train split
under the received w before scoring (one pass, nothing trained; γ and β stay the client's), an
evaluation option like ``eval.finetune``: training is the same either way. On the benchmark's
Dirichlet split with 5 of 50 clients a round the kept statistics cost FedBN 2 to 37 points.

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
from torch.nn.modules.batchnorm import _BatchNorm

from .base import LocalTraining, Supervised, training_field
from .fedper import SplitMethod


@dataclass(frozen=True)
class FedBNHyper(LocalTraining):
    lr: float = training_field("lr", 0.01)
    weighting: str = field(
        default="samples",
        metadata={
            "choices": ("samples", "uniform"),
            "help": "the server's average of the non-normalization parameters: samples (n_k weights) or "
            "uniform (1/|S|, the paper's Algorithm 1 and official code, equal-sized clients there)",
        },
    )
    eval_stats: str = field(
        default="kept",
        metadata={
            "choices": ("kept", "refit"),
            "help": "the running statistics a client is scored with: kept (its own, from the last round it trained: "
            "Algorithm 1) or refit (re-estimated on its train split under the received weights, one pass in "
            "training mode before scoring; training is unchanged)",
        },
    )
    unseen_epochs: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": "epochs an unseen client trains its own normalization layers, the rest frozen "
            "(default: local_epochs)",
        },
    )


@dataclass
class FedBNState:
    norm: list[torch.Tensor]  # the client's normalization layers: γ, β, running mean and variance


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
    split = False  # no head/body needed: the split is the normalization layers
    REFIT_BLOCK = 1024  # rows per pass of eval_stats: refit

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        if not self.groups.norm:
            raise ValueError(
                "fedbn keeps the model's batch-norm layers local, and this model has no "
                "normalization layer; use a model with norm: batch (e.g. mlp, resnet9, vgg9)"
            )
        self.norm_only = Supervised(task, trainable=self.groups.mask("norm"))
        self._refitters: dict[str, tuple[torch.nn.Module, list[torch.nn.Module]]] = {}

    def own(self, group: str):
        return self.norm_only if group == "norm" else super().own(group)

    def evaluate(self, state, received, data, ctx):
        params = self.model(state, received.shared, ctx.device)
        if self.hp.eval_stats == "refit":
            params = self.refit_stats(params, data.train_x, ctx.device)
        return self.task.scores(self.outputs([params], data.test_x, ctx.device)[0], data.test_y)

    @torch.no_grad()
    def refit_stats(self, params: list[torch.Tensor], x: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
        """``params`` with each batch-norm layer's running mean and variance re-estimated on
        ``x`` (the client's train split) under the other parameters: one pass in training mode,
        in blocks of ``REFIT_BLOCK`` rows, block k folded in with momentum 1/k (PyTorch's
        cumulative average): the mean and unbiased variance of x's activations when x fits one
        block, the average of the blocks' otherwise. Only the batch-norm layers are in training
        mode (dropout stays off); nothing trains."""
        key = str(device)
        if key not in self._refitters:
            model = self.model_fn().to(device)
            self._refitters[key] = (model, [m for m in model.modules() if isinstance(m, _BatchNorm)])
        model, norms = self._refitters[key]
        for q, v in zip(model.parameters(), params):
            q.copy_(v)
        model.eval()  # dropout, if any, off; the batch-norm layers alone in training mode
        for m in norms:
            m.train()
        for k, i in enumerate(range(0, len(x), self.REFIT_BLOCK), start=1):
            for m in norms:
                m.momentum = 1.0 / k
            block = x[i : i + self.REFIT_BLOCK]
            model(self.decode(block) if self.decode is not None else block)
        return [p.detach().clone() for p in model.parameters()]
