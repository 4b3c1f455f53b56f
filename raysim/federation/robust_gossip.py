"""Byzantine nodes and robust mixing in gossip (a scenario with a ``topology`` and an
``adversary`` or a ``defence``).

A malicious node trains as its method says (on poisoned data for a data attack) and then sends its
neighbours, in place of its parameters x' = x + Δ (x what it held before the round's local step,
Δ its update), the crafted x + Δ̃ (``sent``):

- ``gaussian``: Δ̃ ~ N(μ, σ²I), the update replaced by noise;
- ``sign_flip``: Δ̃ = −s·Δ;
- a data attack: Δ̃ = γ·Δ, γ the attack's ``gamma``; left out, 1 (no boost: the server-side
  default n/(m·η) has no server learning rate to divide by here).

The same crafted parameters go to every neighbour, on whichever host it is. Attacks that read the
honest updates (ALIE, IPM, Min-Max, ...) are refused with a topology: a gossip node sees only its
neighbours' models, and which of them an omniscient attacker would read is a threat model of its
own that raysim does not simulate yet. The malicious node keeps its honest x' for itself (its own
term of its mixing), so that it does not drift away by its own crafting; its scores are left out
of the honest metrics anyway.

Robust mixing (``robust_mix``): each hosted node i takes its row of W, its own x_i (honest) with
weight W_ii and the n_i neighbours' sent parameters X with weights w_ij, and applies the rule
(``raysim.federation.robust.GOSSIP_RULES``: ``clipped_gossip``, ``bridge_trimmed_mean`` with b
trimmed from each end) in float64; with no rule (an adversary against plain gossip) the plain
row W_ii x_i + Σ_j w_ij x_j. Every row depends only on its own neighbourhood, so the result is
the same whichever host holds which node. A node where the rule cannot run (BRIDGE with
n_i < 2b + 1 neighbours, after link failures) mixes plainly; ``fallbacks`` counts such rows (the
scheduler reports ``defence_fallbacks`` from W itself). Rows are mixed one at a time: O(n_i·d)
per node, as the rules need.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core.mixing import Rows
from raysim.federation import attacks, poisoning, robust


def sent(sc: Any, round_: int, cid: int, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """What malicious node ``cid`` sends in round ``round_``: ``before`` + its crafted update,
    ``after`` being its honestly trained parameters (both flat, the shared parameters)."""
    a = sc.adversary.attack
    x0 = before.to(torch.float64)
    delta = after.to(torch.float64) - x0
    if a.name in poisoning.DATA_ATTACKS:
        gamma = getattr(a.params, "gamma", None)
        out = x0 + (1.0 if gamma is None else gamma) * delta
    else:
        g = rng.torch_generator(sc.seed, "attack", round_, cid)
        out = x0 + attacks.ATTACKS[a.name](None, delta.unsqueeze(0), a.params, g).updates[0].to(x0)
    return out.to(after.dtype)


def bridge_b(sc: Any) -> int:
    """BRIDGE's b: ``defence.f``, or 1 (one Byzantine neighbour screened) when left out."""
    f = sc.defence.f if sc.defence is not None else None
    return 1 if f is None else int(f)


def fallback_rows(sc: Any, degrees: np.ndarray) -> int:
    """The nodes of the given neighbour counts where the scenario's gossip rule cannot run."""
    dfc = sc.defence
    if dfc is None:
        return 0
    rule = robust.GOSSIP_RULES[dfc.rule.name]
    b = bridge_b(sc)
    return int(sum(1 for n in degrees.tolist() if rule.check(int(n), b, dfc.rule.params)))


def robust_mix(sc: Any, rows: Rows, sources: dict[int, torch.Tensor], own: dict[int, torch.Tensor]) -> torch.Tensor:
    """(rows, d): each of ``rows``' nodes mixed by the scenario's gossip rule (or plainly without
    one). ``sources``: every parameter vector the rows read, as sent (crafted for malicious
    senders); ``own``: the hosted nodes' own parameters (honest)."""
    if not rows.cids:
        return torch.zeros(0)
    dfc = sc.defence
    rule = None if dfc is None else robust.GOSSIP_RULES[dfc.rule.name]
    b = bridge_b(sc)
    chunk = None if dfc is None else dfc.chunk
    M = rows.matrix
    first = own[rows.cids[0]]
    out = []
    for k, i in enumerate(rows.cids):
        lo, hi = int(M.indptr[k]), int(M.indptr[k + 1])
        js = [rows.sources[c] for c in M.indices[lo:hi].tolist()]
        ws = M.data[lo:hi].tolist()
        w_self = sum(w for j, w in zip(js, ws) if j == i)
        nb = [(j, w) for j, w in zip(js, ws) if j != i]
        x = own[i].to(torch.float64)
        if not nb:
            out.append(w_self * x)
            continue
        X = torch.stack([sources[j].to(torch.float64) for j, _ in nb])
        w = torch.tensor([w for _, w in nb], dtype=torch.float64)
        if rule is None or rule.check(len(nb), b, dfc.rule.params):
            out.append(w_self * x + w @ X)
        else:
            out.append(rule.mix(x, X, w, w_self, b, dfc.rule.params, chunk))
    return torch.stack(out).to(first.dtype).to(first.device)
