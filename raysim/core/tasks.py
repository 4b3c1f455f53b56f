"""Tasks: what a model's outputs are scored against.

A task gives the per-sample training loss and the per-client scores reported at evaluation.
Outputs may carry leading dimensions (K copies trained at once: (K, B, outputs)); the loss
keeps them: (K, B).

- ``classification``: cross-entropy on logits (or log-probabilities: a mixture's log p(y|x)
  gives the same value); scores ``accuracy``, ``top5_accuracy`` (more than 5 classes),
  ``ece`` (expected calibration error, ``ECE_BINS`` equal-width bins of the softmax confidence,
  as SuPerFed) and ``test_loss``; and ``ece_bins`` (``Bins``), from which the engine reports
  the ECE of the union of the clients' test splits, ``ece_union``.
- ``regression``: squared error averaged over output dimensions (MSE); scores ``mse``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

ECE_BINS = 15  # SuPerFed's (and Guo et al. 2017's) equal-width confidence bins
TOP_K = 5  # top-5 accuracy, scored where there are more than 5 classes


class Task:
    name = ""
    metric = ""  # the primary score (a key of ``scores``)

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
        out = out.detach()
        top, pred = out.max(-1)
        target = out.gather(-1, y[:, None]).squeeze(-1)
        lse = torch.logsumexp(out, -1)
        correct = pred == y
        many = out.shape[-1] > TOP_K
        # one tensor, read back at once (one device sync); sums in float64
        f64 = torch.float64
        gaps = _ece_gaps(top - lse, correct)
        sums = torch.cat(
            [
                torch.stack(
                    [
                        correct.sum(dtype=f64),
                        # the label is among the top 5: fewer than 5 classes score higher
                        ((out > target[:, None]).sum(-1) < TOP_K).sum(dtype=f64)
                        if many
                        else lse.new_zeros((), dtype=f64),
                        gaps.abs().sum(),
                        (lse - target).sum(dtype=f64),  # cross-entropy
                    ]
                ),
                gaps,
            ]
        ).tolist()
        scores = {f"{prefix}accuracy": sums[0] / n}
        if many:
            scores[f"{prefix}top{TOP_K}_accuracy"] = sums[1] / n
        scores[f"{prefix}ece"] = sums[2] / n
        scores[f"{prefix}test_loss"] = sums[3] / n
        scores[f"{prefix}ece{Bins.SUFFIX}"] = Bins(g / n for g in sums[4:])
        return scores


class Bins(tuple):
    """A client's share of a metric of the union of the test splits: ECE's per-bin gaps
    Σ_{i∈B_b} (correct_i − conf_i) / n. Averaged over clients weighted by test size they are the
    union's gaps (Σ over all samples / N), and Σ_b |·| is the ECE of the union: for a global
    model, its ECE on the union of the test splits. ``driver.summarize`` reports it as
    ``<name>_union`` (``ece_bins`` -> ``ece_union``), never as a per-client mean."""

    SUFFIX = "_bins"
    UNION = "_union"

    @staticmethod
    def union(shares: list, weights: list) -> float:
        """Σ_b |Σ_c w_c share_cb / Σ_c w_c|, summed in float64 in the given order."""
        s = np.asarray(shares, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        return float(np.abs((s * w[:, None]).sum(0) / w.sum()).sum())


def _ece_gaps(log_conf: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """Per bin Σ_{i∈B_b} (correct_i − conf_i) in float64: the confidences exp(``log_conf``)
    binned into ``bins`` equal-width bins (lo, hi] of [0, 1] (bin ⌈conf · bins⌉ − 1). n · ECE is
    the sum of their absolute values."""
    conf = log_conf.to(torch.float64).exp_()
    # a NaN confidence (outputs that overflowed) goes to bin 0 and makes its gap, and the ECE, NaN
    idx = (conf.nan_to_num(0.0) * bins).ceil_().clamp_(1, bins).long() - 1
    gaps = conf.neg_().add_(correct)
    if idx.device.type == "cpu":
        return torch.bincount(idx, weights=gaps, minlength=bins)
    # CUDA's weighted bincount adds with atomics, in no fixed order; the CPU's, in sample order
    return torch.bincount(idx.cpu(), weights=gaps.cpu(), minlength=bins).to(idx.device)


def ece(out: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of outputs ``out`` (n, classes; logits or log-probabilities)
    whose predictions (argmax) are ``correct`` (n,): the confidence (the largest softmax
    probability, exp(max − logsumexp)) falls in one of ``bins`` equal-width bins of [0, 1], and
    ECE = Σ_b |B_b|/n · |acc(B_b) − conf(B_b)| = Σ_b |Σ_{i∈B_b} (correct_i − conf_i)| / n
    (SuPerFed's, after Guo et al. 2017). ``Classification.scores`` reports it as ``ece``."""
    out = out.detach()
    return float(_ece_gaps(out.amax(-1) - torch.logsumexp(out, -1), correct, bins).abs().sum()) / int(correct.shape[0])


class Regression(Task):
    name = "regression"
    metric = "mse"

    def per_sample(self, out, y):
        if y.dim() == out.dim() - 1:  # scalar targets, one output
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
LOWER_IS_BETTER = ("loss", "mse", "ece", "hours", "seconds")  # times: time-to-accuracy


def lower_is_better(metric: str) -> bool:
    return any(word in LOWER_IS_BETTER for word in metric.split("_"))


VAL = "val_"  # the validation metrics' prefix


def val_name(metric: str) -> str:
    """The name of a test metric's validation counterpart: ``val_`` before it and the word
    ``test`` left out (accuracy -> val_accuracy, test_loss -> val_loss, global_test_loss ->
    val_global_loss, bottom_decile_accuracy -> val_bottom_decile_accuracy, unseen_accuracy ->
    val_unseen_accuracy, ece_union -> val_ece_union)."""
    return VAL + "_".join(w for w in metric.split("_") if w != "test")


def mean_std(values, weights) -> tuple[float, float]:
    """Mean and std of the clients' scores ``values``, each weighted by its test size
    ``weights``, in float64 in the given (client-id) order: Σ w v / Σ w and
    sqrt(Σ w (v − mean)² / Σ w), the population std (SuPerFed's ``std(unbiased=False)``;
    with equal test sizes, the unweighted one)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    mean = float((v * w).sum() / w.sum())
    return mean, float(np.sqrt((w * (v - mean) ** 2).sum() / w.sum()))
