"""FedAvg+ — FedAvg followed by local fine-tuning before evaluation.

Jiang et al., "Improving Federated Learning Personalization via Model Agnostic Meta Learning"
(2019), as used as a baseline by Marfoq et al. 2021 (Table 2, "FedAvg+"): training is plain
FedAvg; to evaluate, each client copies the global model, runs ``tune_epochs`` local epochs of
SGD on its train split (client's derived generator, purpose "tune"), and is scored on its test
split. The untuned global model's accuracy is reported as the global accuracy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import ClientData, Context, EvalResult
from .fedavg import FedAvg, FedAvgHyper
from .local_sgd import accuracy_and_loss, load_params, local_sgd, predict_logits


@dataclass(frozen=True)
class FedAvgPlusHyper(FedAvgHyper):
    tune_epochs: int = field(default=1, metadata={"min": 1, "help": "local epochs of tuning before evaluation"})


class FedAvgPlus(FedAvg):
    name = "fedavg+"
    summary = "FedAvg+ (Jiang et al. 2019): FedAvg, then one local epoch of tuning before evaluation"
    Hyper = FedAvgPlusHyper

    def evaluate(self, state, message, data: ClientData, ctx: Context) -> EvalResult:
        global_correct, _ = accuracy_and_loss(
            predict_logits(self.global_model(message, ctx.device), data.test_x), data.test_y)
        model = self.scratch_model(ctx.device)
        load_params(model, message)
        local_sgd(model, data.train_x, data.train_y, self.hp, ctx, epochs=self.hp.tune_epochs)
        correct, loss = accuracy_and_loss(predict_logits(model, data.test_x), data.test_y)
        return EvalResult(correct, data.num_test, loss, global_correct=global_correct)
