"""The local-training hyperparameters every algorithm has: ``LocalTraining`` (the base of each
method's ``Hyper`` dataclass: learning rate and its schedule, epochs, batch size, optimizer,
stacking, gradients) and ``training_field``, with which a method sets its paper's defaults for
them. Importable from ``raysim.algorithms.base`` too, beside the contract that uses them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from raysim.core import forward as fwd
from raysim.core.loop import Settings
from raysim.core.optim import OPTIMIZERS


@dataclass(frozen=True)
class LocalTraining:
    """Local-training settings every algorithm has (a method's paper defaults live in its
    subclass, each set with ``training_field`` so that it keeps the field's metadata)."""

    lr: float = field(
        default=0.05,
        metadata={"help": ("η, the local optimizer's learning rate (the base rate; lr_schedule scales it by round)")},
    )
    local_epochs: int = field(
        default=1,
        metadata={
            "help": (
                "E, passes over the client's train split per round, each in a fresh shuffled order "
                "(⌈n / batch_size⌉ steps)"
            )
        },
    )
    batch_size: int = field(
        default=32, metadata={"help": ("B, samples per local mini-batch (an epoch's last batch holds the remainder)")}
    )
    optimizer: str = field(
        default="sgd",
        metadata={
            "choices": OPTIMIZERS,
            "help": (
                "the local optimizer: sgd (with momentum) or adam (β₁ 0.9, β₂ 0.999, ε 1e-8); its state "
                "starts afresh every round unless the method keeps it"
            ),
        },
    )
    momentum: float = field(
        default=0.0,
        metadata={
            "help": ("SGD's momentum coefficient (heavy ball, no dampening or Nesterov; 0: plain SGD; adam ignores it)")
        },
    )
    weight_decay: float = field(
        default=0.0,
        metadata={
            "help": ("L2 coefficient added to every gradient (coupled weight decay, sgd and adam alike; 0: none)")
        },
    )
    lr_schedule: str = field(
        default="constant",
        metadata={
            "choices": ("constant", "step", "exponential"),
            "help": "the lr over rounds t = 0..R−1: constant; step: ×0.1 from t = ⌊R/2⌋ and ×0.01 from "
            "⌊3R/4⌋ (FedEM's official schedule); exponential: ×lr_decay^t (SuPerFed's)",
        },
    )
    lr_decay: float = field(
        default=0.999,
        metadata={
            "gt": 0.0,
            "max": 1.0,
            "help": ("γ, the exponential schedule's factor per round: lr·γ^t at round t (other schedules ignore it)"),
        },
    )
    stacking: str = fwd.stacking_field()
    gradients: str = field(
        default="auto",
        metadata={
            "choices": ("auto", "autograd"),
            "help": "how a step's gradients are computed: auto: by hand for chains of linear layers trained on the "
            "task's loss (raysim/core/chain.py; 2-3x faster at small batches, SGD fused into the update), "
            "autograd elsewhere; autograd: always autograd (equal to auto up to float32 rounding)",
        },
    )

    POSITIVE: ClassVar[tuple[str, ...]] = ("lr", "local_epochs", "batch_size")
    NONNEGATIVE: ClassVar[tuple[str, ...]] = ("momentum", "weight_decay")

    def lr_factor(self, round_: int, rounds: int) -> float:
        """The schedule's factor at ``round_``: ``lr_at`` is ``lr`` times it."""
        if self.lr_schedule == "step":
            if round_ >= (3 * rounds) // 4:
                return 0.01
            if round_ >= rounds // 2:
                return 0.1
        if self.lr_schedule == "exponential":
            return self.lr_decay**round_
        return 1.0

    def lr_at(self, round_: int, rounds: int) -> float:
        return self.lr * self.lr_factor(round_, rounds)

    def settings(self, round_: int, rounds: int, epochs: int | None = None) -> Settings:
        return Settings(
            self.lr_at(round_, rounds),
            self.local_epochs if epochs is None else epochs,
            self.batch_size,
            self.optimizer,
            self.momentum,
            self.weight_decay,
        )


def training_field(name: str, default, help: str | None = None):
    """A subclass's own default for one of ``LocalTraining``'s fields (a method's paper value),
    keeping that field's metadata: choices, bounds and help; ``help`` replaces the help where
    the field means more in the method (pFedMe's ``lr``, FedRep's ``local_epochs``)."""
    meta = dict(LocalTraining.__dataclass_fields__[name].metadata)
    if help is not None:
        meta["help"] = help
    return field(default=default, metadata=meta)
