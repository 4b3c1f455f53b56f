"""FedBABU — Oh, Kim & Yun, "FedBABU: Towards Enhanced Representation for Federated Image
Classification", ICLR 2022 (Algorithm 1).

FedAvg on the body alone (Federated Averaging with Body Aggregation and Body Update). The model
is a body θ_ext (the feature extractor) and a head θ_cls (``model.head``, by default the last
layer). The head is drawn once at initialization, the same for every client (every host builds
the run's initial model alike), and never trained or averaged. A round t:

1. the server sends θ_ext^t (with the fixed head θ_cls^0) to the sampled clients S;
2. client k trains the body alone, the head frozen at θ_cls^0, with local SGD, E epochs;
3. it replies with its body only, weighted by n_k;
4. the server: θ_ext^{t+1} = Σ_{k∈S} n_k θ_ext,k / Σ_{k∈S} n_k; the head stays θ_cls^0 bit for bit.

Evaluation is personalization by fine-tuning: each client copies the global model (θ_ext^t,
θ_cls^0), fine-tunes all of it on its train split for τ epochs and is scored on its test split.
That is the shared local update (``eval.finetune``, ``Algorithm.with_local_update``), on by
default here: ``accuracy`` (and ``lu_*``) are the fine-tuned model's, ``global_*`` the global
model's before fine-tuning (the paper's "initial" accuracy).

Defaults and choices. The official code is jhoon-oh/FedBABU; the points below marked
"checked" were read in a copy of it (``main_fed.py``, ``models/Update.py``,
``scripts/run_abla.sh``):

- τ = 5 fine-tuning epochs of the whole model (``eval.finetune.epochs`` when null; the paper's
  main tables fine-tune 5 epochs, and it finds fine-tuning the whole model better than the head
  or the body alone). The fine-tuning uses the training's lr, batch size and optimizer (the
  official code fine-tunes with the training's optimizer settings, as recalled: its fine-tuning
  script was not in the copy read); any ``eval.finetune`` option given applies, and
  ``epochs: 0`` turns it off.
- ``lr`` 0.1, ``momentum`` 0.9, ``batch_size`` 50, ``local_epochs`` 1: the official scripts'
  (checked: ``--lr 0.1 --momentum 0.90 --local_bs 50 --wd 0.0``, E among 1, 4 and 10). The
  official code gives the head a learning rate of 0 in one SGD optimizer with the body rather
  than freezing it; SGD moves a parameter by lr times its step, so an lr of 0 leaves the head
  unchanged whatever the momentum and weight decay, as freezing does (checked).
- ``lr_schedule: constant`` (default). The official code multiplies the lr by 0.1 after rounds
  R/2 and 3R/4 (checked), which is ``lr_schedule: step``. Constant is the default because that
  schedule ties the lr of a round to the run's total rounds, and a benchmark sets one schedule
  for every method (``scenarios/pfl_benchmark.yaml``).
- ``weighting: samples`` (default): the body averaged with n_k weights, FedAvg's rule, which the
  paper builds on. The official code divides the sum of the sampled clients' models by their
  number (checked); its balanced splits give every client the same n_k, where the two coincide.
  ``weighting: uniform`` is that 1/|S| average (the code's, also in its unbalanced runs).
- Only the body travels up (the head never changes, so the server keeps its own copy and
  ``bytes_up`` counts the body alone); the message carries the whole model, head included, so a
  client needs nothing but the message.

Unseen clients (``eval.unseen_fraction``): as FedAvg's: the global model, fine-tuned by the
local update like every client's, which is how the paper personalizes any client.

Decentralized: gossip FedBABU makes sense and is cheap: every client trains its body on the
fixed head and mixes its body with its neighbours (``shared``: the body); the head, identical
everywhere, is never mixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import LocalTraining, Supervised, Weighted, params_of, training_field
from .fedavg import FedAvg


@dataclass(frozen=True)
class FedBABUHyper(LocalTraining):
    lr: float = training_field("lr", 0.1)
    momentum: float = training_field("momentum", 0.9)
    batch_size: int = training_field("batch_size", 50)
    weighting: str = field(
        default="samples",
        metadata={
            "choices": ("samples", "uniform"),
            "help": "the server's average of the bodies: samples (n_k weights) or uniform (1/|S|, the official code's)",
        },
    )


class FedBABU(FedAvg):
    dp_sgd = False  # an objective of its own
    name = "fedbabu"
    summary = "FedBABU (Oh et al. 2022): FedAvg on the body, the head fixed at its random init; fine-tuned to evaluate"
    paper = "Oh, Kim & Yun, ICLR 2022"
    family = "personalized"
    personal = "nothing"
    sends = "the body (the head is never updated)"
    Hyper = FedBABUHyper
    split = True
    decentralized = True
    personalized_is_global = True  # the unprefixed metrics are the fine-tuned global model's

    def __init__(self, hyper, model_fn, rounds, task):
        super().__init__(hyper, model_fn, rounds, task)
        self.objective = Supervised(task, trainable=self.groups.mask("body"))  # the head frozen

    @classmethod
    def check(cls, hp, decentralized):
        return None

    def default_finetune_epochs(self) -> int:
        return 5

    def init_server(self, rng):
        return params_of(self.model_fn())

    def reply(self, params, received, n: int):
        return Weighted(self.groups.pick(params, "body"), float(n) if self.hp.weighting == "samples" else 1.0)

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.weight == 0:
            return server
        return self.groups.merge(server, "body", reduced.mean(server[0].dtype))

    def shared(self, server):
        return [self.groups.pick(server, "body")]

    def with_shared(self, server, groups):
        return self.groups.merge(server, "body", groups[0])
