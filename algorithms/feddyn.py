"""FedDyn — Acar, Zhao, Navarro, Mattina, Whatmough & Saligrama, "Federated Learning Based on
Dynamic Regularization", ICLR 2021 (Algorithm 1).

The server holds the global model θ and h; every client k holds h_k, its estimate of
∇L_k at its last local model (its state, on its host; 0 until it first trains). A round t with
participants P_t among the m training clients:

1. the server sends θ^{t−1} to P_t;
2. client k solves (here: the loop's local epochs of SGD on)
       θ_k^t = argmin_θ  L_k(θ) − ⟨h_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖²,
   h_k = ∇L_k(θ_k^{t−1}) being the linear term's gradient: the loop's ``Supervised`` with the
   constants ``linear`` = −h_k, ``anchor`` = θ^{t−1}, ``mu`` = α (no objective of its own);
3. it keeps h_k ← h_k − α(θ_k^t − θ^{t−1}) (the first-order condition of step 2:
   ∇L_k(θ_k^t) = h_k − α(θ_k^t − θ^{t−1})) and sends θ_k^t (weight 1);
4. the server: h^t = h^{t−1} − (α/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1}) — divided by ALL m clients,
   not |P_t|, so h = (1/m) Σ_k h_k over every client — and
       θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − (1/α) h^t.

Signs, as in the paper's Algorithm 1: the linear term enters with a minus (the client objective
subtracts ⟨∇L_k(θ_k^{t−1}), θ⟩), both h updates subtract α times the drift θ_k^t − θ^{t−1},
and the server subtracts h^t/α from the participants' plain mean. m is counted once, by a
statistics request to every training client before the first round (as SCAFFOLD's N).

Defaults and choices:

- ``alpha`` α = 0.01: the paper's most common setting (it tunes α ∈ {0.1, 0.01, 0.001} per
  dataset and reports 0.01 for most of its experiments).
- The participants' mean is uniform (1/|P_t|, the paper and the authors' code). The authors'
  code (github.com/alpemreacar/FedDyn, ``utils_methods.py``, ``train_FedDyn``) divides α by the
  client's relative sample count, α_k = α / (n_k m / Σ_j n_j), and keeps Σ_t (θ_k^t − θ^{t−1})
  per client in place of h_k = −α_k times it, its server adding the mean over all m clients of
  those sums to the participants' mean (the same θ^t as here when every n_k is equal). The
  default ``alpha_scaling: uniform`` is the paper's Algorithm 1, one α for every client;
  ``alpha_scaling: by_size`` is the authors' code: the statistics phase also sums Σ_j n_j, the
  message carries the mean train size Σ_j n_j / m, and client k trains and updates h_k with
  α_k. The server step is unchanged: h^t/α is −(1/m) Σ_k Σ_t (θ_k^t − θ^{t−1}) either way,
  exactly the authors' correction.
- Running statistics (batch norm, the ``stats`` group) are not trained: h and h_k stay 0 there
  and θ^t is their plain mean.
- The paper's analysis assumes the exact argmin; with few local steps the h_k are only
  estimates (as in every implementation).

Metrics: ``accuracy`` and ``global_*`` score θ^t (the corrected model); unseen clients score θ^t
too. With ``eval.finetune`` the unprefixed metrics are the locally tuned θ^t's.

Decentralized: no. h is the network mean of the h_k and θ^t a server step on it; a gossip form
would need every client to track that mean (a different algorithm, as for SCAFFOLD), so a
scenario with a ``topology`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import Algorithm, LocalTraining, Message, StatsRequest, Weighted, params_of


@dataclass(frozen=True)
class FedDynHyper(LocalTraining):
    alpha: float = field(
        default=0.01, metadata={"gt": 0.0, "help": "α, the dynamic regularizer's coefficient (the paper's common 0.01)"}
    )
    alpha_scaling: str = field(
        default="uniform",
        metadata={
            "choices": ("uniform", "by_size"),
            "help": "uniform: one α for every client (the paper's Algorithm 1); by_size: the authors' code, "
            "α_k = α / (n_k m / Σ_j n_j), a client with more data pulled less towards θ",
        },
    )


@dataclass
class FedDynServer:
    theta: list[torch.Tensor]  # θ^t, the global model
    h: list[torch.Tensor]  # h^t = −(α/m) Σ_k Σ_t (θ_k^t − θ^{t−1}) (uniform: (1/m) Σ_k h_k)
    clients: float = 0.0  # m: every training client (0: not counted yet)
    samples: float = 0.0  # Σ_j n_j over them (alpha_scaling: by_size)


@dataclass
class FedDynState:
    h: list[torch.Tensor]  # h_k, the client's gradient estimate ∇L_k(θ_k^{t−1})


class FedDyn(Algorithm):
    name = "feddyn"
    summary = (
        "FedDyn (Acar et al. 2021): local loss with a linear term h_k and (α/2)‖θ − θ_global‖², server correction −h/α"
    )
    paper = "Acar et al., ICLR 2021"
    family = "global model"
    personal = "h_k, its gradient estimate (one tensor per parameter)"
    sends = "its model θ_k"
    Hyper = FedDynHyper
    ClientState = FedDynState
    decentralized = False
    no_gossip = "h and its server step are the network's, not a client's"
    personalized_is_global = True

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        theta = params_of(self.model_fn())
        return FedDynServer(theta, [torch.zeros_like(p) for p in theta])

    def stats_request(self, server, round_):
        return StatsRequest("all") if server.clients == 0 else None

    def client_stats(self, state, received, data, ctx):
        return state, torch.tensor([1.0, float(data.num_train)], dtype=torch.float64)

    def absorb_stats(self, server, reduced, round_):
        return FedDynServer(server.theta, server.h, float(reduced[0]), float(reduced[1]))

    def message(self, server, round_):
        # the clients' mean train size Σ_j n_j / m, for by_size's α_k (group 0: every trainer's)
        mean_n = server.samples / server.clients if server.clients else 0.0
        return Message(server.theta, {0: mean_n} if self.hp.alpha_scaling == "by_size" else {})

    def client_alpha(self, received, n_k: int) -> float:
        """α for this client: α (uniform), or α / (n_k / mean n) (by_size, the authors' code)."""
        if self.hp.alpha_scaling == "uniform" or not received.part or not n_k:
            return self.hp.alpha
        return self.hp.alpha * float(received.part) / n_k

    def aggregate(self, server, reduced, round_):
        if reduced is None or reduced.weight == 0:
            return server
        a, count = self.hp.alpha, float(reduced.weight)
        m = max(server.clients, count)
        stats = set(self.groups.stats)
        theta, h = [], []
        for i, (t0, h0, s) in enumerate(zip(server.theta, server.h, reduced.values)):
            mean = s / count
            if i in stats:
                theta.append(mean.to(t0.dtype))
                h.append(h0)
                continue
            drift = s - count * t0.double()  # Σ_{k∈P_t} (θ_k^t − θ^{t−1})
            hn = h0.double() - (a / m) * drift
            h.append(hn.to(h0.dtype))
            theta.append((mean - hn / a).to(t0.dtype))
        return FedDynServer(theta, h, server.clients, server.samples)

    # -- client ----------------------------------------------------------------------------
    def train(self, state, received, data, ctx):
        theta = received.shared
        hk = [torch.zeros_like(p) for p in theta] if state is None else state.h
        a = self.client_alpha(received, data.num_train)
        (fit,) = yield [self.job(theta, data, ctx, consts={"linear": [-h for h in hk], "anchor": theta, "mu": a})]
        stats = set(self.groups.stats)
        new = [h if i in stats else h - a * (p1 - p0) for i, (h, p0, p1) in enumerate(zip(hk, theta, fit.params))]
        return FedDynState(new), Weighted(fit.params, 1.0), fit.loss

    def global_model(self, state, received):
        return received.shared

    def evaluate(self, state, received, data, ctx):
        out = self.outputs([received.shared], data.test_x, ctx.device)[0]
        return {**self.task.scores(out, data.test_y), **self.task.scores(out, data.test_y, "global_")}
