"""FedAvg+ — FedAvg followed by local fine-tuning before evaluation.

Jiang et al., "Improving Federated Learning Personalization via Model Agnostic Meta Learning"
(2019), as used as a baseline by Marfoq et al. 2021 (Table 2, "FedAvg+"): training is plain
FedAvg; to evaluate, each client copies the global model, runs ``tune_epochs`` local epochs of
SGD on its train split (client's derived generator, purpose "eval"), and is scored on its test
split. The untuned global model's scores are reported as the global ones. With a topology
(D-SGD) each client tunes its own copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .fedavg import FedAvg, FedAvgHyper


@dataclass(frozen=True)
class FedAvgPlusHyper(FedAvgHyper):
    tune_epochs: int = field(default=1, metadata={"min": 1, "help": "local epochs of tuning before evaluation"})


class FedAvgPlus(FedAvg):
    name = "fedavg+"
    summary = "FedAvg+ (Jiang et al. 2019): FedAvg, then one local epoch of tuning before evaluation"
    Hyper = FedAvgPlusHyper

    def evaluate(self, state, received, data, ctx):
        glob = self.outputs([received.shared], data.test_x, ctx.device)[0]
        (tuned,) = yield [self.job(received.shared, data, ctx, epochs=self.hp.tune_epochs)]
        out = self.outputs([tuned.params], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(glob, data.test_y, "global_")}
