"""Gossip mixing and consensus (decentralized training is generic).

An algorithm declares its shared parameters as groups of tensors (FedEM: one group per
component). The core flattens a client's groups into one float32 vector, mixes
θ_i ← Σ_j W_ij θ_j over its neighbourhood and measures the consensus distance
mean_k ‖θ_k − θ̄‖² per group.
"""
from __future__ import annotations

import torch


def flatten(groups: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for g in groups for t in g])


def unflatten(template: list[list[torch.Tensor]], flat: torch.Tensor) -> list[list[torch.Tensor]]:
    out, start = [], 0
    for g in template:
        part = []
        for t in g:
            end = start + t.numel()
            part.append(flat[start:end].view(t.shape).to(t.dtype))
            start = end
        out.append(part)
    return out


def group_sizes(template: list[list[torch.Tensor]]) -> list[int]:
    return [sum(t.numel() for t in g) for g in template]


def mix_rows(sources: dict[int, torch.Tensor], rows: list[list[tuple[int, float]]]) -> list[torch.Tensor]:
    """For each row [(j, w_j), ...] (ascending j): Σ_j w_j·sources[j] in float64, cast back to
    the sources' dtype. One product of a row's weights with its neighbours' rows of the stacked
    sources, so a client's result depends only on its own neighbourhood, whichever host holds
    which client."""
    if not rows:
        return []
    ids = sorted(sources)
    pos = {j: k for k, j in enumerate(ids)}
    dtype = sources[ids[0]].dtype
    flat = torch.stack([sources[j] for j in ids]).to(torch.float64)
    out = []
    for row in rows:
        idx = torch.tensor([pos[j] for j, _ in row], device=flat.device)
        w = torch.tensor([float(wj) for _, wj in row], dtype=torch.float64, device=flat.device)
        out.append((w @ flat[idx]).to(dtype))
    return out


def squared_distances(flat: torch.Tensor, mean: torch.Tensor, sizes: list[int]) -> list[float]:
    """‖θ − θ̄‖² per group, in float64 from the float32 values (computed directly: no
    cancellation near consensus)."""
    d = (flat.to(torch.float64) - mean.to(torch.float64)) ** 2
    return [float(part.sum()) for part in torch.split(d, sizes)]
