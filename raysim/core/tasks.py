"""Tasks: what a model's outputs are scored against (DESIGN.md §3).

A task gives the per-sample training loss and the per-client scores reported at evaluation.
Outputs may carry leading dimensions (K copies trained at once: (K, B, outputs)); the loss
keeps them: (K, B).

- ``classification``: cross-entropy on logits (or log-probabilities: a mixture's log p(y|x)
  gives the same value); scores ``accuracy`` and ``test_loss``.
- ``regression``: squared error averaged over output dimensions (MSE); scores ``mse``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Task:
    name = ""
    metric = ""          # the primary score (a key of ``scores``)

    def per_sample(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scores(self, out: torch.Tensor, y: torch.Tensor, prefix: str = "") -> dict[str, float]:
        """Per-client metrics of outputs ``out`` (n, outputs) against targets ``y``."""
        raise NotImplementedError


class Classification(Task):
    name = "classification"
    metric = "accuracy"

    def per_sample(self, out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none").view(y.shape)

    @torch.no_grad()
    def scores(self, out, y, prefix=""):
        n = int(y.shape[0])
        if n == 0:
            return {}
        return {f"{prefix}accuracy": float((out.argmax(-1) == y).sum()) / n,
                f"{prefix}test_loss": float(F.cross_entropy(out, y, reduction="sum")) / n}


class Regression(Task):
    name = "regression"
    metric = "mse"

    def per_sample(self, out, y):
        if y.dim() == out.dim() - 1:        # scalar targets, one output
            out = out.squeeze(-1)
            return (out - y) ** 2
        return ((out - y) ** 2).mean(-1)

    @torch.no_grad()
    def scores(self, out, y, prefix=""):
        if int(y.shape[0]) == 0:
            return {}
        return {f"{prefix}mse": float(self.per_sample(out, y).mean())}


TASKS: dict[str, Task] = {t.name: t for t in (Classification(), Regression())}

# metrics where lower is better: their "bottom decile" is the worst 10 % of clients, the 90th
# percentile (the one place this rule lives). A metric is one where an underscore-separated word
# of its name is one of these (test_loss, bottom_decile_mse, mse_test_chosen, ...).
LOWER_IS_BETTER = ("loss", "mse")


def lower_is_better(metric: str) -> bool:
    return any(word in LOWER_IS_BETTER for word in metric.split("_"))
