"""Floco — "Federated Learning over Connected Modes", NeurIPS 2024 (following the authors'
code: the paper's body was not available to us). It shares
SosicFL's simplex head, samplers and simplex-learning phase (``sosicfl.py``); what differs is
where each client sits on the simplex.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from . import simplex
from .base import Message, PerClient, StatsRequest
from .simplex_personal import Personal, lam_field, personal_field
from .sosicfl import SimplexHyper, SosicFL


@dataclass(frozen=True)
class FlocoHyper(SimplexHyper):
    endpoints: int = field(default=10, metadata={"min": 2, "help": "simplex vertices (M + 1)"})
    tau: int = field(
        default=250,
        metadata={
            "min": 1,
            "help": "τ: before this round (1-based) every client is placed on the simplex; α ~ U(Δ) until then",
        },
    )
    rho: float = field(default=0.1, metadata={"gt": 0.0, "help": "ρ: L1 radius of each client's subregion"})


@dataclass(frozen=True)
class FlocoPlusHyper(FlocoHyper):
    lam: float = lam_field()
    personal: str = personal_field("all")
    personal_pool: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "α draws a round for the personal copy (0: a fresh one every mini-batch, as Floco+)",
        },
    )


class Floco(SosicFL):
    """Floco ("Federated Learning over Connected Modes", NeurIPS 2024; the authors' code, as
    the fact sheet reads it: the paper's body was not available).

    The same simplex head (``endpoints`` = M + 1 vertices) and simplex learning with α ~ U(Δ)
    per mini-batch until round τ. Before round τ every training client trains once from the
    current global model (E epochs, α ~ U(Δ)); the server takes their trained classifier
    endpoints (concatenated), reduces them with PCA to ``endpoints`` dimensions, projects each
    onto the scaled simplex {β ≥ 0, Σβ = z} and renormalizes, for z in linspace(1e-4, 1, 1000),
    and keeps the z whose points have the lowest log Riesz 2-energy (the most evenly spread):
    β_k is client k's own centre. From round τ on, client k draws α uniformly from
    {α ∈ Δ : ‖α − β_k‖₁ ≤ ρ} (``sampler: exact``) or by the official formula (``floco_code``),
    and its personalized model is w at β_k; the global model is w at the centroid. No labels,
    no clusters. Defaults: the official configs (10 endpoints, ρ 0.1, τ 250 of 500 rounds,
    SGD lr 0.02, momentum 0.5, weight decay 5e-4, batch 50, 5 epochs)."""

    no_gossip = "the server assigns each client its region of the solution simplex"
    name = "floco"
    summary = (
        "Floco (NeurIPS 2024): a simplex head, each client placed on it from its trained classifier (PCA, Riesz energy)"
    )
    paper = "Grinwald, Wiesner & Nakajima, NeurIPS 2024"
    family = "personalized"
    personal = "nothing (the server keeps its place β_k on the simplex)"
    sends = (
        "the shared parameters and the simplex endpoints, weighted by n_k; once, before round τ, its "
        "trained classifier endpoints"
    )
    Hyper = FlocoHyper

    @staticmethod
    def endpoint_count(hp) -> int:
        return hp.endpoints

    def stats_request(self, server, round_):
        if not server.prepared and round_ >= self.hp.tau - 1:
            return StatsRequest("all", server.params)
        return None

    def client_stats(self, state, received, data, ctx):
        (fit,) = yield [self.job(received.shared, data, ctx, draws=self._draws(None, 0))]
        s = self.simplex.index(self.head())
        return state, PerClient({ctx.cid: torch.cat([t.flatten() for t in self.endpoints_of(fit.params, s)])})

    def absorb_stats(self, server, reduced, round_):
        ids = sorted(reduced)
        server.ids = torch.tensor(ids, dtype=torch.long)
        server.alpha = torch.from_numpy(
            place_on_simplex(torch.stack([reduced[c] for c in ids]).double().numpy(), self.ends)
        )
        server.z = server.ids.clone()
        server.eta, server.prepared = float(self.hp.rho), True
        return server

    def _prepared(self, server, round_):
        return server

    def cluster_of(self, server):
        return {int(c): int(c) for c in server.ids} if server.prepared else {}

    def message(self, server, round_):
        if not server.prepared:
            return Message(server.params)
        rho = torch.tensor([server.eta], dtype=torch.float64)
        return Message(server.params, {int(c): torch.cat([b, rho, b]) for c, b in zip(server.ids, server.alpha)})

    def centers(self, server):
        return None

    def report(self, results, server):
        if not server.prepared:
            return {}
        return {
            "simplex": {
                "alpha": {int(c): [float(v) for v in b] for c, b in zip(server.ids, server.alpha)},
                "eta": server.eta,
            }
        }


class FlocoPlus(Personal, Floco):
    name = "floco+"
    summary = "Floco+ (NeurIPS 2024): Floco with Ditto on top (a personal copy per client)"
    paper = "Grinwald, Wiesner & Nakajima, NeurIPS 2024"
    family = "personalized"
    personal = "a personal copy of every parameter (personal: endpoints, of the simplex endpoints)"
    sends = (
        "the shared parameters and the simplex endpoints, weighted by n_k; once, before round τ, its "
        "trained classifier endpoints"
    )
    Hyper = FlocoPlusHyper


def place_on_simplex(weights: np.ndarray, endpoints: int, steps: int = 1000) -> np.ndarray:
    """Floco's placement: PCA of the clients' classifier weights (K, D) to ``endpoints``
    dimensions, projected onto the scaled simplex Σβ = z and renormalized, z from 1e-4 to 1 in
    ``steps``, keeping the z with the lowest log Riesz 2-energy: (K, endpoints) on the simplex.
    As in the official code the PCA coordinates are not rescaled, so the scan spreads clients
    whose coordinates are of magnitude ≲ 1 (classifier weights are); far larger ones all
    project onto vertices."""
    from sklearn.decomposition import PCA

    k = min(endpoints, *weights.shape)
    kappa = PCA(n_components=k, svd_solver="full").fit_transform(weights)
    if k < endpoints:
        kappa = np.concatenate([kappa, np.zeros((len(kappa), endpoints - k))], 1)
    best, best_e = None, np.inf
    for z in np.linspace(1e-4, 1.0, steps):
        beta = simplex.project_simplex(kappa, z) / z
        e = simplex.riesz_energy(beta)
        if e < best_e:
            best, best_e = beta, e
    return best
