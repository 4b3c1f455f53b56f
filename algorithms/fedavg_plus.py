"""FedAvg+ — FedAvg followed by a local update of the global model before evaluation.

Jiang et al., "Improving Federated Learning Personalization via Model Agnostic Meta Learning"
(2019), as used as a baseline by Marfoq et al. 2021 (Table 2, "FedAvg+"): training is plain
FedAvg; to evaluate, each client copies the global model, trains it on its train split and is
scored on its test split. It is FedAvg with the shared local update (``eval.finetune``, see
``base.py``) on by default: when ``eval.finetune.epochs`` is null it tunes 1 epoch (FedEM's
official FedAvg+ tunes ``local_steps`` epochs, 1 in all its experiments), with the base ``lr``
and the training's batch size and optimizer, as FedEM's code in effect does (its tuned copy
has its own scheduler, stepped once per evaluation, so it never reaches a milestone); any
``eval.finetune`` option given applies, ``epochs: 0`` makes it plain FedAvg. ``accuracy`` and
``lu_*`` are the tuned model's, ``global_*`` the untuned global model's. With a topology (D-SGD)
each client tunes its own copy.

``tune_epochs``: deprecated alias of ``eval.finetune.epochs`` (which wins when both are given).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class FedAvgPlusHyper(FedAvgHyper):
    tune_epochs: int | None = field(
        default=None,
        metadata={"min": 1, "help": "deprecated: use eval.finetune.epochs (local-update epochs; default 1 here)"},
    )


class FedAvgPlus(FedAvg):
    name = "fedavg+"
    summary = "FedAvg+ (Jiang et al. 2019): FedAvg with eval.finetune on (one local epoch at the base lr)"
    paper = "Jiang et al., arXiv 2019"
    family = "personalized"
    personal = "nothing (each evaluation tunes a copy of the global model)"
    sends = "its model, weighted by n_k"
    Hyper = FedAvgPlusHyper

    def default_finetune_epochs(self) -> int:
        return self.hp.tune_epochs or 1
