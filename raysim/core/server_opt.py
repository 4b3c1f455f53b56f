"""Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2).

The server treats the round's change of the global model as a pseudo-gradient,
Δ = x̄ − x (x̄ the algorithm's aggregate, x the global model before the round), and steps

- ``sgd`` (FedAvgM; Hsu et al. 2019): v ← βv + Δ;  x ← x + η v
- ``adagrad``: m ← β₁m + (1−β₁)Δ;  v ← v + Δ²
- ``adam``:    m ← β₁m + (1−β₁)Δ;  v ← β₂v + (1−β₂)Δ²
- ``yogi``:    m ← β₁m + (1−β₁)Δ;  v ← v − (1−β₂)Δ² sign(v − Δ²)

and for the adaptive three x ← x + η m / (√v + τ), with m₋₁ = 0, v₋₁ = τ² (the paper's
"v₋₁ ≥ τ²", taken at its bound) and no bias correction (none in Algorithm 2). Pure tensor math:
the state is {"m": [...], "v": [...]} (sgd: its momentum buffer in "m"), one tensor per stepped
parameter, computed in float64 and kept in the parameters' dtype.

Not checked against the authors' code (not public as far as we know; FedML's and Flower's
FedAdam/FedYogi are re-implementations, and some start v at 0): raysim follows the paper's
pseudo-code.
"""

from __future__ import annotations

import torch

NAMES = ("none", "sgd", "adam", "yogi", "adagrad")
# the server lr where ``lr`` is null: sgd 1 (FedAvgM with η = 1, Hsu et al. 2019), adam and yogi
# 10^-2 and adagrad 10^-1 (in the ranges Reddi et al.'s grids select, Appendix D's tables)
DEFAULT_LR = {"sgd": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.1}


def server_lr(cfg) -> float:
    return DEFAULT_LR[cfg.optimizer] if cfg.lr is None else float(cfg.lr)


def init_state(cfg, params: list[torch.Tensor]) -> dict:
    m = [torch.zeros_like(p) for p in params]
    if cfg.optimizer == "sgd":
        return {"m": m, "v": []}
    return {"m": m, "v": [torch.full_like(p, cfg.tau**2) for p in params]}


def step(cfg, state: dict, old: list[torch.Tensor], new: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict]:
    """(the stepped global parameters, the new state) from the parameters before the round
    (``old``) and the algorithm's aggregate (``new``)."""
    lr, b1, b2, tau = server_lr(cfg), cfg.beta1, cfg.beta2, cfg.tau
    out, ms, vs = [], [], []
    for i, (x, xbar) in enumerate(zip(old, new)):
        x64 = x.double()
        d = xbar.double() - x64
        m = state["m"][i].double()
        if cfg.optimizer == "sgd":
            m = cfg.momentum * m + d
            upd = lr * m
        else:
            m = b1 * m + (1 - b1) * d
            v = state["v"][i].double()
            d2 = d * d
            if cfg.optimizer == "adagrad":
                v = v + d2
            elif cfg.optimizer == "adam":
                v = b2 * v + (1 - b2) * d2
            else:  # yogi
                v = v - (1 - b2) * d2 * torch.sign(v - d2)
            vs.append(v.to(x.dtype))
            upd = lr * m / (v.sqrt() + tau)
        ms.append(m.to(x.dtype))
        out.append((x64 + upd).to(x.dtype))
    return out, {"m": ms, "v": vs}
