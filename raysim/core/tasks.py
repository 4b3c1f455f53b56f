"""Tasks: what a model's outputs are scored against (DESIGN.md §3).

A task gives the per-sample training loss and the per-client scores reported at evaluation.
Outputs may carry leading dimensions (K copies trained at once: (K, B, outputs)); the loss
keeps them: (K, B).

- ``classification``: cross-entropy on logits (or log-probabilities: a mixture's log p(y|x)
  gives the same value); scores ``accuracy``, ``top5_accuracy`` (more than 5 classes),
  ``ece`` (expected calibration error, ``ECE_BINS`` equal-width bins of the softmax confidence,
  as SuPerFed) and ``test_loss``.
- ``regression``: squared error averaged over output dimensions (MSE); scores ``mse``.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

ECE_BINS = 15          # SuPerFed's (and Guo et al. 2017's) equal-width confidence bins
TOP_K = 5              # top-5 accuracy, scored where there are more than 5 classes


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
        pred = out.argmax(-1)
        correct = pred == y
        scores = {f"{prefix}accuracy": float(correct.sum()) / n}
        if out.shape[-1] > TOP_K:
            scores[f"{prefix}top{TOP_K}_accuracy"] = float((out.topk(TOP_K, -1).indices == y[:, None]).any(-1).sum()) / n
        scores[f"{prefix}ece"] = ece(out, correct)
        scores[f"{prefix}test_loss"] = float(F.cross_entropy(out, y, reduction="sum")) / n
        return scores


def ece(out: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of outputs ``out`` (n, classes; logits or log-probabilities)
    whose predictions (argmax) are ``correct`` (n,): the confidence (largest softmax
    probability) falls in one of ``bins`` equal-width bins (lo, hi] of [0, 1], and
    ECE = Σ_b |B_b|/n · |acc(B_b) − conf(B_b)| = Σ_b |Σ_{i∈B_b} (correct_i − conf_i)| / n,
    in float64."""
    n = int(correct.shape[0])
    conf = torch.softmax(out.detach().to(torch.float64), -1).amax(-1)
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64)[1:-1]
    idx = torch.bucketize(conf, edges)                  # bin b holds edges[b-1] < conf <= edges[b]
    gap = torch.zeros(bins, dtype=torch.float64).index_add_(0, idx, correct.to(torch.float64) - conf)
    return float(gap.abs().sum()) / n


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
LOWER_IS_BETTER = ("loss", "mse", "ece")


def lower_is_better(metric: str) -> bool:
    return any(word in LOWER_IS_BETTER for word in metric.split("_"))


def mean_std(values, weights) -> tuple[float, float]:
    """Mean and std of the clients' scores ``values``, each weighted by its test size
    ``weights``, in float64 in the given (client-id) order: Σ w v / Σ w and
    sqrt(Σ w (v − mean)² / Σ w), the population std (SuPerFed's ``std(unbiased=False)``;
    with equal test sizes, the unweighted one)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    mean = float((v * w).sum() / w.sum())
    return mean, float(np.sqrt((w * (v - mean) ** 2).sum() / w.sum()))
