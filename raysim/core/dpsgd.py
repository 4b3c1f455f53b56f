"""DP-SGD's step (Abadi et al., CCS 2016): clipped per-sample gradients, noise, the mean.

With ``Settings.dp_clip`` (``privacy.level: sample``) every step of the loop is this one: each
sample's gradient clipped to L2 norm C over the trained parameters and summed over the batch
(by the chain's per-sample norms, ``Chain.private_step``, for chains of linear layers, else by
``torch.func``: ``clipped_sums``), Gaussian noise of std σ·C from the job's own generator
(seeded when the job was made) added to the sum, divided by the batch size B (also for
Poisson batches, whose size varies), then a proximal pull μ(w − anchor) where the job has one,
then the optimizer's step (the loop's own).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .objectives import Supervised


def check(obj, weights, draws, consts: dict) -> None:
    """What DP-SGD trains: the task's loss (a proximal pull at most), no sample weights."""
    if type(obj) is not Supervised or weights is not None or draws is not None or not set(consts) <= {"mu", "anchor"}:
        raise ValueError(
            "DP-SGD (privacy.level: sample) needs the task's loss (a proximal pull at most), without sample weights"
        )


class Private:
    """DP-SGD's step for a run's K jobs (longest first): ``step`` has the form of the other ways
    to a step's gradients (steps.py). ``clipped``: the per-sample clipped sums,
    ``Chain.private_step`` or ``clipped_sums`` of the model; ``trained``: the trained stacked
    parameters (their sizes); ``noise_seeds``: each job's."""

    def __init__(self, task, clipped: Callable, s, train_mask, trained, noise_seeds, device):
        self.task, self.clipped, self.train_mask, self.device = task, clipped, train_mask, device
        self.clip, self.bs = s.dp_clip, s.batch_size
        self.std = s.dp_noise * s.dp_clip  # the noise's: σ·C
        self.gens = [torch.Generator(device=device).manual_seed(seed) for seed in noise_seeds]
        self.sizes = [p[0].numel() for p in trained]
        self.total = sum(self.sizes)

    def step(self, P, trained, cs, terms, xr, yr, wt_p, val_p, t, width, lo, hi):
        """Jobs lo..hi-1's step t: (data loss summed (K,), their gradients, nothing set)."""
        data_sum, sums, _ = self.clipped(self.task, P, xr, yr, val_p[: hi - lo, t, :width], self.clip, self.train_mask)
        gens, total, device, std, bs = self.gens, self.total, self.device, self.std, self.bs
        noise = torch.stack([torch.randn(total, generator=gens[i], device=device) for i in range(lo, hi)])
        # (Σ clipped + N(0, σ²C²)) / B, then a proximal pull μ(w − anchor)
        grads = [(g + n.view(g.shape) * std).div_(bs) for g, n in zip(sums, noise.split(self.sizes, dim=1))]
        if "mu" in cs:
            mu = cs["mu"].to(grads[0].dtype)
            anchors = [a for a, m in zip(cs["anchor"], self.train_mask) if m]
            torch._foreach_add_(
                grads, [(p - a) * mu.view(-1, *([1] * (p.dim() - 1))) for p, a in zip(trained, anchors)]
            )
        return data_sum, grads, ()


def clipped_sums(
    model: torch.nn.Module,
    task,
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    valid: torch.Tensor,
    clip: float,
    train_mask: tuple[bool, ...],
):
    """``Chain.private_step`` for any model without buffers, batch norm, dropout or recurrent
    layers (what ``privacy.level: sample`` accepts, raysim/scenario/build.py): each
    sample's gradient from ``torch.func`` (``vmap`` of ``grad`` over the batch, one set at a
    time), clipped to L2 norm ``clip`` over the trained parameters and summed over valid rows;
    (data loss summed (K,), the clipped sums of the trained parameters, clipped rows (K,))."""
    from torch.func import functional_call, grad_and_value, vmap

    names = [n for n, _ in model.named_parameters()]
    idx = [i for i, m in enumerate(train_mask) if m]

    def loss_of(trained, every, xr, yr):
        full = list(every)
        for i, t in zip(idx, trained):
            full[i] = t
        out = functional_call(model, dict(zip(names, full)), (xr.unsqueeze(0),))
        return task.per_sample(out, yr.unsqueeze(0)).sum()

    per_sample = vmap(grad_and_value(loss_of), in_dims=(None, None, 0, 0))
    data_sum, sums, clipped = [], [[] for _ in idx], []
    for k in range(x.shape[0]):
        ps = [p[k].detach() for p in params]
        g, loss = per_sample([ps[i] for i in idx], ps, x[k], y[k])
        # one read of each per-sample gradient for its norms, one for the clipped sum (a product)
        norm = torch.sqrt(sum(torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1) ** 2 for t in g))
        scale = (clip / norm.clamp_min(1e-12)).clamp(max=1.0) * valid[k]
        for j, t in enumerate(g):
            sums[j].append((scale.to(t.dtype) @ t.reshape(t.shape[0], -1)).view(t.shape[1:]))
        data_sum.append((loss.detach() * valid[k]).sum())
        clipped.append(((norm > clip) & (valid[k] > 0)).sum())
    return torch.stack(data_sum), [torch.stack(s) for s in sums], torch.stack(clipped)
