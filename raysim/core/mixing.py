"""Gossip mixing and consensus (decentralized training is generic).

An algorithm declares its shared parameters as groups of tensors (FedEM: one group per
component). The core flattens a client's groups into one float32 vector, mixes
θ_i ← Σ_j W_ij θ_j over its neighbourhood and measures the consensus distance
mean_k ‖θ_k − θ̄‖² per group.
"""

from __future__ import annotations

import numpy as np
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


class Rows:
    """A host's rows of W, {i: [(j, W_ij), ...]} in ascending j, as one sparse matrix over the
    sources they read (ascending ids): built once while W stays the same."""

    def __init__(self, rows):
        """``rows``: {i: [(j, W_ij), ...]} in ascending j, or the same as arrays (client ids,
        indptr, indices, weights): row k of the CSR rows is client ids[k]'s, its indices in
        ascending order (the gossip scheduler's plan). No rows (a star run's hosts, a gossip
        host before its first plan): no matrix, and SciPy is not imported."""
        if isinstance(rows, dict) and not rows:
            self.cids, self.sources, self.matrix = [], [], None
            return
        import scipy.sparse as sp

        if isinstance(rows, (tuple, list)):
            ids, ptr, idx, val = (np.asarray(a) for a in rows)
            self.cids = [int(c) for c in ids.tolist()]
            sources = np.unique(idx)
            self.sources = sources.tolist()
            self.matrix = sp.csr_matrix(
                (val.astype(np.float64), np.searchsorted(sources, idx).astype(np.int64), ptr.astype(np.int64)),
                shape=(len(self.cids), len(self.sources)),
            )
            self.matrix.has_sorted_indices = True
            return
        self.cids = sorted(rows)
        self.sources = sorted({j for row in rows.values() for j, _ in row})
        col = {j: k for k, j in enumerate(self.sources)}
        ptr, idx, val = [0], [], []
        for i in self.cids:
            for j, w in rows[i]:
                idx.append(col[j])
                val.append(float(w))
            ptr.append(len(idx))
        self.matrix = sp.csr_matrix(
            (np.asarray(val, dtype=np.float64), np.asarray(idx, dtype=np.int64), np.asarray(ptr, dtype=np.int64)),
            shape=(len(self.cids), len(self.sources)),
        )
        self.matrix.has_sorted_indices = True

    def mix(self, sources: dict[int, torch.Tensor]) -> torch.Tensor:
        """(rows, d): row i is Σ_j W_ij·sources[j] summed in float64 in ascending j (each row on
        its own: its numbers depend only on its neighbourhood, whichever host holds which
        client), cast back to the sources' dtype."""
        if not self.cids:
            return torch.zeros(0)
        first = sources[self.sources[0]]
        flat = torch.stack([sources[j] for j in self.sources]).cpu().to(torch.float64).numpy()
        return torch.from_numpy(self.matrix @ flat).to(first.dtype).to(first.device)

    def mix_arrays(self, ids: np.ndarray, matrix: torch.Tensor) -> torch.Tensor:
        """``mix`` with the sources as rows of one matrix, row k being client ``ids[k]``'s
        parameters (a host's own rows and the rows other hosts sent it): the same sums."""
        if not self.cids:
            return torch.zeros(0)
        where = {int(j): k for k, j in enumerate(ids.tolist())}
        pick = torch.tensor([where[j] for j in self.sources], dtype=torch.long, device=matrix.device)
        flat = matrix.index_select(0, pick).cpu().to(torch.float64).numpy()
        return torch.from_numpy(self.matrix @ flat).to(matrix.dtype).to(matrix.device)


def mix_rows(sources: dict[int, torch.Tensor], rows: list[list[tuple[int, float]]]) -> list[torch.Tensor]:
    """For each row [(j, w_j), ...] (ascending j): Σ_j w_j·sources[j] in float64, cast back to
    the sources' dtype (``Rows.mix`` for one list of rows)."""
    if not rows:
        return []
    return list(Rows(dict(enumerate(rows))).mix(sources).unbind(0))


def squared_distances(flat: torch.Tensor, mean: torch.Tensor, sizes: list[int]) -> list[float]:
    """‖θ − θ̄‖² per group, in float64 from the float32 values (computed directly: no
    cancellation near consensus)."""
    return squared_distances_rows(flat.unsqueeze(0), mean, sizes)[0].tolist()


def squared_distances_rows(flats: torch.Tensor, mean: torch.Tensor, sizes: list[int]) -> np.ndarray:
    """``squared_distances`` of every row of ``flats`` (n, d), as an array (n, groups): each row
    summed on its own (numpy's pairwise sum along the row), so its numbers do not depend on the
    other rows."""
    d = (flats.detach().cpu().to(torch.float64) - mean.cpu().to(torch.float64).reshape(1, -1)).numpy()
    d = d * d
    bounds = np.cumsum([0] + list(sizes))
    return np.stack([d[:, a:b].sum(axis=1) for a, b in zip(bounds[:-1], bounds[1:])], axis=1)
