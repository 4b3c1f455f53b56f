"""FedEM — Marfoq, Neglia, Bellet, Kameni & Vidal, "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021 (Alg. 1 and 2).

M shared components θ_1..θ_M; client k keeps mixture weights π_k (its state, on its host).
Each round, at each sampled client, with the components just received:
  E-step   q[m, i] = softmax_m( log π_m − ℓ(θ_m; x_i, y_i) )   over the whole local train set
  M-step   π_m = mean_i q[m, i]
  then every component takes local SGD steps on the loss weighted per sample by q[m, i]
  (batch loss = mean_i q[m, i]·ℓ_i, as the official code's ``fit_batch``).
Server: each component becomes the average of the clients' components weighted by n_k.
Prediction: p(y|x) = Σ_m π_m · softmax(θ_m(x)).
Unseen clients (Table 3) personalize π from uniform with the components frozen: E-step + π
update (``unseen_em_steps`` times on the same losses).

Defaults follow the official code: SGD momentum .9, weight decay 5e-4, batch 128, 1 local epoch,
lr ×0.1 at R/2 and 3R/4, M = 3. The momentum buffer is fresh every round (the paper's local
SGD); the official clients keep one SGD object per learner across rounds, so their momentum
carries over: ``keep_momentum: true`` does that (measured on the synthetic data: +2 to 3 points).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import (Algorithm, ClientData, Context, EvalResult, LocalTraining, Weighted, consensus_terms,
                   weighted_rows, weighted_sum)
from . import stacked
from .local_sgd import get_params, load_params, local_sgd, predict_logits


@dataclass(frozen=True)
class FedEMHyper(LocalTraining):
    lr: float = 0.05
    batch_size: int = 128
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "step"
    components: int = field(default=3, metadata={"min": 1, "help": "mixture components M"})
    unseen_em_steps: int = field(default=1, metadata={"min": 1,
                                 "help": "E-step + pi updates for unseen clients (components frozen)"})
    stack_components: str = stacked.stack_mode_field("the M components (and a host's clients)")
    keep_momentum: bool = field(default=False, metadata={
        "help": "each client keeps its SGD momentum buffer per component from round to round, as the "
                "official code's per-client optimizers do; false: a fresh buffer every round"})


@dataclass
class FedEMState:
    pi: torch.Tensor            # (M,) mixture weights of this client
    # D-FedEM only: the client's own copy of the M components (in FedEM they live on the server)
    components: list[list[torch.Tensor]] | None = None
    # keep_momentum only: the client's SGD momentum buffers, per component
    momentum: list[list[torch.Tensor]] | None = None


def e_step(log_pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """q[m, i] = softmax over m of (log π_m − losses[m, i]); ``losses`` is (M, n)."""
    return torch.softmax(log_pi[:, None] - losses, dim=0)


def em_step(pi: torch.Tensor, losses: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(negative log-likelihood of the mixture before the update — the round's training loss —,
    q) for mixture weights pi and per-sample losses (M, n); the new pi is q.mean(dim=1)."""
    log_pi = torch.log(pi)
    nll = float(-torch.logsumexp(log_pi[:, None] - losses, dim=0).mean())
    return nll, e_step(log_pi, losses)


def mixture_log_prob(pi: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log Σ_m π_m softmax(logits_m) for logits of shape (M, n, classes) -> (n, classes)."""
    return torch.logsumexp(torch.log(pi)[:, None, None] + F.log_softmax(logits, dim=-1), dim=0)


class FedEM(stacked.Stacking, Algorithm):
    name = "fedem"
    summary = "FedEM (Marfoq et al. 2021): M shared components, per-client mixture weights by EM"
    Hyper = FedEMHyper
    ClientState = FedEMState
    has_global_model = False
    supports_gossip = True
    stack_field = "stack_components"

    def init_server(self, model: nn.Module, rng: np.random.Generator) -> list[list[torch.Tensor]]:
        # component m starts from its own initialization (variant m of the run's seeded init)
        return [get_params(self.model_fn(m)) for m in range(self.hp.components)]

    def broadcast(self, server_state, round_: int):
        return server_state

    def aggregate(self, server_state, reduced: list[Weighted] | None, round_: int):
        if reduced is None:
            return server_state
        return [r.mean(s[0].dtype) if r.weight > 0 else s for r, s in zip(reduced, server_state)]

    def init_client(self, cid: int, rng: np.random.Generator) -> FedEMState:
        m = self.hp.components
        return FedEMState(torch.full((m,), 1.0 / m))

    # -- client ------------------------------------------------------------------------------
    def _stacked(self, components) -> list[torch.Tensor]:
        """The components' parameters stacked (M, ...), computed once per message."""
        if getattr(self, "_stacked_message", None) is not components:
            self._stacked_params = stacked.stack(components)
            self._stacked_message = components      # keep a reference: the identity check stays sound
        return self._stacked_params

    def _component_models(self, message, device) -> list[nn.Module]:
        """One model per component holding the broadcast weights, loaded once per message."""
        if getattr(self, "_models_message", None) is not message:
            if getattr(self, "_models", None) is None:
                self._models = [self.model_fn().to(device) for _ in message]
            for model, params in zip(self._models, message):
                load_params(model, params)
            self._models_message = message      # keep a reference: the identity check stays sound
        return self._models

    @torch.no_grad()
    def losses(self, message, x: torch.Tensor, y: torch.Tensor, device) -> torch.Tensor:
        """Per-sample losses of every component, shape (M, n)."""
        if self._stacking():
            return stacked.per_sample_losses(self.scratch_model(device), self._stacked(message), x, y)
        models = self._component_models(message, device)
        return torch.stack([F.cross_entropy(predict_logits(m, x), y, reduction="none") for m in models])

    def _momentum_in(self, state: FedEMState) -> list | None:
        """The buffers a client continues from (keep_momentum), one list per component."""
        if not (self.hp.keep_momentum and self.hp.momentum):
            return None
        return state.momentum or [None] * self.hp.components

    def train(self, state: FedEMState, message, data: ClientData, ctx: Context):
        if data.num_train == 0:                 # nothing to learn from: pi and components unchanged
            return (FedEMState(state.pi.clone(), None, state.momentum),
                    [Weighted([p.clone() for p in c], 0.0) for c in message], 0.0)
        losses = self.losses(message, data.train_x, data.train_y, ctx.device)
        nll, q = em_step(state.pi.to(ctx.device), losses)
        pi = q.mean(dim=1)
        n = float(data.num_train)
        model = self.scratch_model(ctx.device)
        moms = self._momentum_in(state)
        if self._stacking():
            trained, bufs = stacked.local_sgd(model, message, data.train_x, data.train_y, self.hp, ctx, q,
                                              momentum=moms)
            return FedEMState(pi.cpu(), None, bufs if moms else None), [Weighted(c, n) for c in trained], nll
        replies, bufs = [], []
        for m, params in enumerate(message):
            load_params(model, params)
            buf = None if moms is None else list(moms[m] or [None] * len(params))
            local_sgd(model, data.train_x, data.train_y, self.hp, ctx, sample_weight=q[m], momentum=buf)
            replies.append(Weighted(get_params(model), n))
            bufs.append(buf)
        return FedEMState(pi.cpu(), None, bufs if moms else None), replies, nll

    def train_many(self, states, message, datas, ctxs):
        """All of a host's sampled clients at once (models without convolutions): one blocked
        E-step pass, then every (client, component) copy trains in lockstep."""
        if not self._batching():
            return super().train_many(states, message, datas, ctxs)
        return self._train_many(states, [message] * len(datas), datas, ctxs)

    def _train_many(self, states, components, datas, ctxs):
        """``train`` for each client c from its state (pi, momentum) and components[c] (the
        broadcast in FedEM, the client's own in D-FedEM); returns [(state, replies, nll)]."""
        if not datas:
            return []
        device = ctxs[0].device
        model = self.scratch_model(device)
        m = self.hp.components
        losses = stacked.losses_many(model, [self._stacked(c) for c in components],
                                     [d.train_x for d in datas], [d.train_y for d in datas])
        x = torch.cat([d.train_x for d in datas])
        y = torch.cat([d.train_y for d in datas])
        starts, groups, out, moms = [], [], [], []
        offset = 0
        epochs = self.hp.local_epochs
        for state, comps, data, ctx, loss in zip(states, components, datas, ctxs, losses):
            n = data.num_train
            if n == 0:                          # nothing to learn from: pi and components unchanged
                out.append((FedEMState(state.pi.clone(), None, state.momentum), 0.0, 0))
                continue
            nll, q = em_step(state.pi.to(device), loss)
            out.append((FedEMState(q.mean(dim=1).cpu()), nll, n))
            moms += self._momentum_in(state) or [None] * m
            # the orders local_sgd would draw: component 0's epochs, then component 1's, ...
            orders = torch.stack([torch.randperm(n, generator=ctx.generator) for _ in range(m * epochs)])
            groups.append((offset, orders.view(m, epochs, n).to(device), q))
            starts += comps
            offset += n
        keep = self.hp.keep_momentum and self.hp.momentum
        trained, bufs = iter([]), iter([])
        if starts:
            params, _, new = stacked.local_sgd_many(model, starts, x, y, groups, self.hp,
                                                    self.hp.lr_at(ctxs[0].round, ctxs[0].rounds),
                                                    momentum=moms if keep else None)
            trained, bufs = iter(params), iter(new or [])
        results = []
        for (state, nll, n), comps in zip(out, components):
            if n == 0:
                results.append((state, [Weighted([p.clone() for p in c], 0.0) for c in comps], nll))
                continue
            if keep:
                state.momentum = [next(bufs) for _ in range(m)]
            results.append((state, [Weighted(next(trained), float(n)) for _ in range(m)], nll))
        return results

    def personalize(self, message, data: ClientData, ctx: Context) -> FedEMState:
        pi = self.init_client(ctx.cid, None).pi.to(ctx.device)
        if data.num_train == 0:
            return FedEMState(pi.cpu())
        losses = self.losses(message, data.train_x, data.train_y, ctx.device)
        for _ in range(self.hp.unseen_em_steps):
            pi = e_step(torch.log(pi), losses).mean(dim=1)
        return FedEMState(pi.cpu())

    @torch.no_grad()
    def evaluate(self, state: FedEMState, message, data: ClientData, ctx: Context) -> EvalResult:
        pi = state.pi.to(ctx.device)
        entropy = float(-(pi * torch.log(pi.clamp_min(1e-12))).sum())
        if data.num_test == 0:
            return EvalResult(0.0, 0, 0.0, extras={"pi_entropy": entropy})
        components = state.components if message is None else message     # D-FedEM: its own
        if self._stacking():
            logits = stacked.logits(self.scratch_model(ctx.device), self._stacked(components), data.test_x)
        else:
            logits = torch.stack([predict_logits(m, data.test_x)
                                  for m in self._component_models(components, ctx.device)])
        logp = mixture_log_prob(pi, logits)
        correct = float((logp.argmax(1) == data.test_y).sum())
        loss = float(F.nll_loss(logp, data.test_y, reduction="sum"))
        return EvalResult(correct, data.num_test, loss, extras={"pi_entropy": entropy})

    # D-FedEM (App. D.2): every client runs the FedEM local step on its own components, then
    # each component becomes Σ_j W_ij θ_j,m over its neighbourhood.
    def gossip_init(self, cid: int, message) -> FedEMState:
        return FedEMState(self.init_client(cid, None).pi, [[t.clone() for t in c] for c in message])

    def gossip_train(self, state: FedEMState, data: ClientData, ctx: Context):
        new, replies, nll = self.train(state, state.components, data, ctx)
        components = [r.values for r in replies]
        return FedEMState(new.pi, components, new.momentum), components, nll

    def gossip_train_many(self, states, datas, ctxs):
        if not self._batching():
            return super().gossip_train_many(states, datas, ctxs)
        out = []
        for new, replies, nll in self._train_many(states, [s.components for s in states], datas, ctxs):
            components = [r.values for r in replies]
            out.append((FedEMState(new.pi, components, new.momentum), components, nll))
        return out

    def mix(self, state: FedEMState, neighbours) -> FedEMState:
        return FedEMState(state.pi, weighted_sum(neighbours), state.momentum)

    def mix_many(self, states, sources, rows):
        return [FedEMState(s.pi, c, s.momentum) for s, c in zip(states, weighted_rows(sources, rows))]

    def consensus_stats(self, state: FedEMState):
        return [consensus_terms(c) for c in state.components]
