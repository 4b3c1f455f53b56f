"""FedLC — Zhang, Li, Li, Xu & Wang, "Federated Learning with Label Distribution Skew via Logits
Calibration", ICML 2022.

FedAvg whose clients train on calibrated logits: before the cross-entropy, every class logit z_c
of client k is lowered by τ·n_{k,c}^(−1/4), n_{k,c} the client's training samples of class c,

    ℓ(x, y) = CE(z(x) − τ·n_k^(−1/4), y),

so a class the client holds few samples of is pushed down less, and the local model's bias
towards its own frequent classes shrinks. The server averages the models as FedAvg does (n_k
weights); prediction is the plain z(x).

Choices (the authors released no code; FL-bench's ``fedlc.py`` and PFLlib's ``clientlc.py`` are
the ports, read at FL-bench 06e658b and PFLlib d832e76):

- the counts are the client's own (the paper's n_{c,y}, FL-bench's); PFLlib uses the counts summed
  over all clients, which needs them at every client (not offered: it would tell every client
  the federation's label distribution);
- a class the client lacks counts as 1 (``absent``: the smallest count a class it holds can have),
  so its logit is lowered by τ, as much as the client's rarest possible class. FL-bench counts it
  as 1e-8, lowering it by 100·τ (PFLlib's global count of 0 gives −inf): the class then takes no
  probability and no gradient, the local softmax runs over the client's own classes only, and
  with two classes per client the averaged model no longer separates the others. Chosen on
  validation accuracy (digits, seed 1, an MLP, 20 clients, 30 rounds, 70/15/15 splits): shards of
  2 classes 0.817 with 1 against 0.532 with 1e-8, Dirichlet(0.1) 0.842 against 0.835;
  ``absent: 1e-8`` is FL-bench's;
- the softmax's denominator holds every class, the true one included (both ports: plain
  cross-entropy on the calibrated logits). The paper prints the denominator without the true
  class; that loss is unbounded below, and FL-bench's author reports training collapsing with it:
  ``denominator: not_true`` offers it;
- τ = 1.0, both ports' default (the paper tunes τ per data set).

Classification only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from raysim.core.objectives import LogitAdjusted, LogitAdjustedNotTrue

from .base import params_of
from .fedavg import FedAvg, FedAvgHyper

ABSENT = 1.0  # the count a class the client lacks stands in with (FL-bench: 1e-8)


@dataclass(frozen=True)
class FedLCHyper(FedAvgHyper):
    tau: float = field(default=1.0, metadata={"min": 0.0, "help": "τ, the calibration's strength"})
    absent: float = field(
        default=ABSENT,
        metadata={"gt": 0.0, "help": "the count a class the client lacks stands in with (FL-bench: 1e-8)"},
    )
    denominator: str = field(
        default="all",
        metadata={
            "choices": ("all", "not_true"),
            "help": "the softmax's denominator: every class (the ports) or all but the true one (the paper's print)",
        },
    )


def calibration(y: torch.Tensor, classes: int, tau: float, absent: float = ABSENT) -> torch.Tensor:
    """−τ·n_c^(−1/4) per class c, n_c the count of c in ``y`` (``absent`` for a class it lacks)."""
    counts = torch.bincount(y.reshape(-1).long(), minlength=classes).to(torch.float64)
    counts = torch.where(counts > 0, counts, torch.full_like(counts, absent))
    return (-tau * counts.pow(-0.25)).to(torch.float32)


class FedLC(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "fedlc"
    summary = "FedLC (Zhang et al. 2022): FedAvg whose clients train on logits lowered by τ·n_c^(-1/4)"
    paper = "Zhang et al., ICML 2022"
    family = "global model"
    personal = "nothing"
    sends = "its model, weighted by n_k"
    Hyper = FedLCHyper
    decentralized = False
    no_gossip = "its paper and ports define it on a server's FedAvg round; no gossip form is published"

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        init = params_of(model_fn())
        self.classes = int(init[self.groups.head[-1]].shape[0])
        kind = LogitAdjustedNotTrue if hyper.denominator == "not_true" else LogitAdjusted
        self.lc = kind(task)

    def train(self, state, received, data, ctx):
        glob = received.shared
        offset = calibration(data.train_y, self.classes, self.hp.tau, self.hp.absent).to(glob[0].device)
        (fit,) = yield [self.job(glob, data, ctx, objective=self.lc, consts={"logit_offset": offset})]
        return state, self.reply(fit.params, glob, data.num_train), fit.loss
