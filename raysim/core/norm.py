"""Batch normalization whose running statistics are client state.

``torch.nn.BatchNorm*`` keeps its running mean and variance in buffers, which live on the
module: in a simulator that trains thousands of clients on one host's scratch model they would
be shared by every client, and silently lost from what is sent, averaged and checkpointed.
These layers keep them as parameters with ``requires_grad=False`` instead: they travel with the
trainable parameters in every parameter list (``params_of``, the loop's jobs, replies,
checkpoints), the optimizer never steps them (the loop trains only parameters that require a
gradient), and the forward pass in training mode updates the job's own copy in place
(momentum 0.1, as PyTorch's default). An algorithm then averages them (FedAvg averages the whole
state, as most FL code averages ``state_dict``) or keeps them local (group ``stats``, FedBN's
rule) like any other group.
"""

from __future__ import annotations

import torch
from torch import nn


class _StatsAsParameters:
    def _stats_to_parameters(self) -> None:
        mean, var = self.running_mean, self.running_var
        del self.running_mean, self.running_var, self.num_batches_tracked
        self.running_mean = nn.Parameter(mean, requires_grad=False)
        self.running_var = nn.Parameter(var, requires_grad=False)
        self.num_batches_tracked = None  # momentum is a number: the count is never needed


class BatchNorm2d(_StatsAsParameters, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (affine, momentum 0.1) with its running statistics as parameters."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(channels, eps=eps, momentum=momentum)
        self._stats_to_parameters()


class BatchNorm1d(_StatsAsParameters, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` with its running statistics as parameters.

    A training batch of one sample (a client's last batch when its train split leaves one over,
    common under a Dirichlet split) has no batch statistics: PyTorch refuses it ("Expected more
    than 1 value per channel when training"). Here it is normalized by the running statistics,
    as in evaluation, which it leaves as they are; the affine parameters still train on it."""

    def __init__(self, features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(features, eps=eps, momentum=momentum)
        self._stats_to_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.dim() == 2 and x.shape[0] == 1:
            return nn.functional.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        return super().forward(x)


def trainable_mask(model: nn.Module) -> tuple[bool, ...]:
    """Which of the model's parameters the optimizer trains (not the running statistics)."""
    return tuple(p.requires_grad for p in model.parameters())


__all__ = ["BatchNorm1d", "BatchNorm2d", "trainable_mask"]
