"""pFedHN — Shamsian, Navon, Fetaya & Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021.

The server holds a hypernetwork h(·; φ) and one embedding v_k per training client. h is an MLP
trunk (``Linear(d, H)``, then ``n_hidden`` × (ReLU, ``Linear(H, H)``)) followed by one linear
output head per tensor of the target model, so the hypernetwork grows with the target: a head
``Linear(H, numel(θ_j))`` per parameter tensor θ_j. A round:

1. each sampled client k receives its own model θ_k = h(v_k; φ) (the message's part for the
   group k: every client is its own group, as in MOCHA);
2. it trains θ_k on its train split with the one loop (local SGD) to θ̃_k and sends
   Δθ_k = θ̃_k − θ_k, keyed by its id (``PerClient``);
3. the server recomputes θ_k = h(v_k; φ) and backpropagates −Δθ_k through it (a
   vector-Jacobian product: the paper's ∇_φ = (∇_φ θ_k)ᵀ Δθ_k with the sign of a descent
   direction, as the official code's ``torch.autograd.grad(θ, φ, grad_outputs=θ − θ̃)``):

       g_φ = (1/|S|) Σ_{k∈S} (∂θ_k/∂φ)ᵀ (θ_k − θ̃_k),   g_V likewise (row k only from client k),

   clips ‖(g_φ, g_V)‖ to ``clip_norm`` and takes one step of SGD with momentum and weight decay
   on (φ, V) (torch's SGD: d = g + λ p, b ← μ b + d, p ← p − η b; ``embed_lr`` for V).

Several clients per round: the paper (Algorithm 1) samples one client per step and updates
after each; raysim's round trains the sampled clients in parallel from the same φ, so their
VJPs are **averaged** into one server step (a mini-batch of clients; with one client per round
it is the paper's step exactly). Averaging rather than summing keeps the step size independent
of the sampling fraction. ``combine: sum`` sums them instead: to first order in the step size
the paper's |S| sequential steps, one per client, so the server lr keeps the paper's meaning
per client (with 10 clients a round, the mean at lr 1e-2 moves φ ten times less per client
than the paper: on digits it learns as the mean at lr 0.1 does).

Defaults and their source (the official code, github.com/AvivSham/pFedHN,
``experiments/pfedhn/trainer.py``, checked against it: its argparse defaults and optimizer set-up):

- server optimizer SGD, ``server_lr`` 1e-2, ``server_momentum`` 0.9, ``server_weight_decay``
  1e-3 (on φ and V alike, as the code's one optimizer over ``hnet.parameters()``), ``embed_lr``
  = ``server_lr`` (the code's ``--embed-lr`` default None); gradient clipping at norm 50;
- ``embed_dim`` 0: the code's default ``int(1 + N/4)`` for N clients; ``hidden_dim`` 100
  (``--hyper-hid``); ``n_hidden`` 3;
- initialization: embeddings N(0, 1) (``nn.Embedding``), every Linear as torch's default
  (U(±1/√fan_in) weight and bias), drawn from the run's seed;
- local training: ``lr`` 5e-3 (``--inner-lr``), ``momentum`` 0.9, ``weight_decay`` 5e-5
  (``--inner-wd``), ``batch_size`` 64. The paper and code take K = 50 inner *steps*; raysim
  trains epochs, and ``local_epochs`` 3 is about 50 batches of 64 on the paper's CIFAR-10
  clients (≈1000 samples each with 50 clients). The official inner loop also clips the inner
  gradient at norm 50; the one loop here does not (no such option).

Model: the target model must have no running statistics (batch norm: ``groups.stats``); the
hypernetwork emits every parameter tensor and there is no meaningful Δ for a running mean. A
model with them is refused when the algorithm is built (``ValueError``).

Unseen clients (the paper's §5.4 generalization to novel clients): ``personalize`` freezes φ and
trains only a new embedding v on the client's train split through h (the objective
``EmbeddingOnly``: the task loss of h(v; φ), trainable v alone), ``unseen_epochs`` epochs
(default ``local_epochs``) of the local optimizer. The new embedding starts at the mean of the
trained embeddings (the official pFedHN trainer has no novel-client step, so this is raysim's
choice: the mean is the neutral start). The client's personalized model h(v; φ) is its state.

pFedHN-PC (a personalized classifier kept on the client beside the hypernetwork's feature
extractor) is not implemented.

Metrics: ``accuracy`` scores each client's θ_k = h(v_k; φ); there is no global model
(no ``global_*``, no ``eval.finetune``). Communication: down θ_k, up Δθ_k (the model's size each
way, like FedAvg); the hypernetwork never leaves the server (except, for unseen clients, to
adapt their embedding).

Decentralized: no. The hypernetwork and the embedding table are a server's objects (φ is
typically much larger than the target model); a gossip variant would replicate φ on every node,
a different method.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import Algorithm, LocalTraining, Message, PerClient, StatsRequest, Supervised, params_of, training_field


@dataclass(frozen=True)
class PFedHNHyper(LocalTraining):
    lr: float = training_field("lr", 5e-3)
    local_epochs: int = training_field("local_epochs", 3)
    batch_size: int = training_field("batch_size", 64)
    momentum: float = training_field("momentum", 0.9)
    weight_decay: float = training_field("weight_decay", 5e-5)
    embed_dim: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": ("d, the client embeddings' size (0: the official code's 1 + N/4 for N training clients)"),
        },
    )
    hidden_dim: int = field(default=100, metadata={"min": 1, "help": "H, the hypernetwork's hidden width"})
    n_hidden: int = field(
        default=3,
        metadata={
            "min": 0,
            "help": ("hidden Linear(H, H) layers of the hypernetwork's trunk after its first Linear(d, H)"),
        },
    )
    server_lr: float = field(default=1e-2, metadata={"gt": 0.0, "help": "the hypernetwork's SGD learning rate"})
    embed_lr: float | None = field(
        default=None, metadata={"gt": 0.0, "help": ("the embeddings' SGD learning rate (default: server_lr)")}
    )
    server_momentum: float = field(
        default=0.9, metadata={"min": 0.0, "lt": 1.0, "help": ("the server SGD's momentum (φ and the embeddings)")}
    )
    server_weight_decay: float = field(
        default=1e-3, metadata={"min": 0.0, "help": ("the server SGD's weight decay (φ and the embeddings)")}
    )
    clip_norm: float = field(
        default=50.0,
        metadata={
            "min": 0.0,
            "help": ("clip the norm of the server's averaged gradient (φ and embeddings together) to this (0: off)"),
        },
    )
    combine: str = field(
        default="mean",
        metadata={
            "choices": ("mean", "sum"),
            "help": (
                "the round's clients' VJPs in one server step: their mean, or their sum (to first order "
                "the paper's one step per client, in sequence)"
            ),
        },
    )
    unseen_epochs: int | None = field(
        default=None,
        metadata={
            "min": 1,
            "help": ("epochs an unseen client trains its new embedding with φ frozen (default: local_epochs)"),
        },
    )


@dataclass
class PFedHNServer:
    phi: list[torch.Tensor]  # the hypernetwork: trunk (W, b)…, then a head (W, b) per target tensor
    embeddings: torch.Tensor  # V: (N, d), row i for the client ids[i]
    ids: torch.Tensor  # the training clients' ids (empty until counted)
    phi_buf: list[torch.Tensor]  # the server SGD's momentum buffers
    embed_buf: torch.Tensor
    seed: int = 0  # the hypernetwork's initialization draws


@dataclass
class PFedHNState:
    model: list[torch.Tensor]  # an unseen client's personalized model h(v; φ)


@dataclass
class Generator:
    """What an unseen client receives: the hypernetwork and the start of its new embedding."""

    phi: list[torch.Tensor]
    embedding: torch.Tensor


UNSEEN = -2  # the message's group of the hypernetwork (unseen clients)


def hyper(
    phi: list[torch.Tensor], v: torch.Tensor, shapes: list[tuple[int, ...]], n_layers: int, stacked: bool = False
) -> list[torch.Tensor]:
    """h(v; φ): the target's tensors for embeddings v (B, d) → each (B, *shape). ``stacked``:
    φ's tensors carry a leading job dimension K matching v's (K, d), as in the one loop."""

    def linear(x, w, b):
        return (torch.einsum("ki,koi->ko", x, w) if stacked else x @ w.mT) + b

    x = v
    for i in range(n_layers):
        if i:
            x = torch.relu(x)
        x = linear(x, phi[2 * i], phi[2 * i + 1])
    heads = phi[2 * n_layers :]
    return [linear(x, heads[2 * j], heads[2 * j + 1]).reshape(x.shape[0], *s) for j, s in enumerate(shapes)]


class EmbeddingOnly(Supervised):
    """The task loss of the model h(v; φ) with the job's parameters [v, *φ]: only v trains."""

    def __init__(self, task, shapes, n_layers, n_phi):
        super().__init__(task, trainable=(True,) + (False,) * n_phi)
        self.shapes, self.n_layers = shapes, n_layers

    def model_params(self, params, draws):
        return hyper(params[1:], params[0], self.shapes, self.n_layers, stacked=True)


class PFedHN(Algorithm):
    name = "pfedhn"
    summary = "pFedHN (Shamsian et al. 2021): a server hypernetwork emits each client's model from its embedding"
    paper = "Shamsian et al., ICML 2021"
    family = "personalized"
    personal = "nothing (an unseen client: its model from a new embedding)"
    sends = "Δθ_k, its model's update, per client"
    Hyper = PFedHNHyper
    ClientState = PFedHNState
    decentralized = False
    no_gossip = "the hypernetwork and the embeddings live on the server"

    def __init__(self, hyper_, model_fn, rounds, task):
        super().__init__(hyper_, model_fn, rounds, task)
        if self.groups.stats:
            raise ValueError(
                "pfedhn: the target model has running statistics (batch norm), which a "
                "hypernetwork does not generate; use a model without them"
            )
        self.shapes = [tuple(p.shape) for p in params_of(model_fn())]
        self.n_layers = 1 + self.hp.n_hidden
        self.n_phi = 2 * self.n_layers + 2 * len(self.shapes)
        self.embedding_only = EmbeddingOnly(task, self.shapes, self.n_layers, self.n_phi)

    # -- server ----------------------------------------------------------------------------
    def init_server(self, rng):
        e = torch.zeros(0)
        return PFedHNServer([], torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), [], e, int(rng.integers(2**31)))

    def stats_request(self, server, round_):
        return StatsRequest("all") if len(server.ids) == 0 else None  # the N clients, once

    def client_stats(self, state, received, data, ctx):
        return state, PerClient({ctx.cid: 1.0})

    def build(self, n: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """φ and V for n clients, drawn from ``seed`` (torch's default Linear and Embedding init)."""
        g = torch.Generator().manual_seed(seed)
        d = self.hp.embed_dim or int(1 + n / 4)
        h = self.hp.hidden_dim
        sizes = [(d, h)] + [(h, h)] * self.hp.n_hidden + [(h, int(np.prod(s))) for s in self.shapes]
        phi = []
        for fan_in, out in sizes:
            bound = 1.0 / fan_in**0.5
            phi.append((torch.rand(out, fan_in, generator=g) * 2 - 1) * bound)
            phi.append((torch.rand(out, generator=g) * 2 - 1) * bound)
        return phi, torch.randn(n, d, generator=g)

    def absorb_stats(self, server, reduced, round_):
        ids = sorted(int(c) for c in reduced)
        phi, v = self.build(len(ids), server.seed)
        return PFedHNServer(
            phi,
            v,
            torch.tensor(ids, dtype=torch.long),
            [torch.zeros_like(p) for p in phi],
            torch.zeros_like(v),
            server.seed,
        )

    def models(self, server) -> list[list[torch.Tensor]]:
        """θ_k = h(v_k; φ) for every training client, in ``ids`` order."""
        with torch.no_grad():
            out = hyper(server.phi, server.embeddings, self.shapes, self.n_layers)
        return [[t[k] for t in out] for k in range(len(server.ids))]

    def select(self, server, round_, sampled, candidates, rng):
        return {int(c): int(c) for c in sampled}  # each client is its own group: its θ_k

    def eval_groups(self, server, cids):
        known = {int(c) for c in server.ids}
        return {int(c): int(c) if int(c) in known else UNSEEN for c in cids}

    def message(self, server, round_):
        parts: dict = {}
        if len(server.ids):
            parts = dict(zip(server.ids.tolist(), self.models(server)))
            parts[UNSEEN] = Generator(server.phi, server.embeddings.mean(0))
        return Message(None, parts)

    def gradients(self, server, deltas: dict) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(g_φ, g_V): the mean (``combine: sum``: the sum) over the clients of ``deltas``
        ({cid: Δθ_k}) of the VJP of θ_k − θ̃_k = −Δθ_k through h, before clipping."""
        index = {c: k for k, c in enumerate(server.ids.tolist())}
        rows = torch.tensor([index[int(c)] for c in deltas], dtype=torch.long)
        phi = [p.detach().clone().requires_grad_(True) for p in server.phi]
        v = server.embeddings.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            thetas = hyper(phi, v[rows], self.shapes, self.n_layers)
            dot = sum(
                (t * torch.stack([-d[j].to(t.dtype) for d in deltas.values()])).sum() for j, t in enumerate(thetas)
            )
            grads = torch.autograd.grad(dot / (len(deltas) if self.hp.combine == "mean" else 1), phi + [v])
        return list(grads[:-1]), grads[-1]

    def aggregate(self, server, reduced, round_):
        if not reduced or len(server.ids) == 0:
            return server
        deltas = {int(c): reduced[c] for c in sorted(reduced)}
        g_phi, g_v = self.gradients(server, deltas)
        hp = self.hp
        if hp.clip_norm > 0:
            norm = torch.sqrt(sum((g * g).sum() for g in g_phi) + (g_v * g_v).sum())
            scale = min(1.0, hp.clip_norm / (float(norm) + 1e-6))  # torch's clip_grad_norm_
            g_phi, g_v = [g * scale for g in g_phi], g_v * scale

        def sgd(p, g, buf, lr):
            d = g + hp.server_weight_decay * p
            buf = hp.server_momentum * buf + d
            return p - lr * buf, buf

        phi, bufs = zip(*(sgd(p, g, b, hp.server_lr) for p, g, b in zip(server.phi, g_phi, server.phi_buf)))
        v, vbuf = sgd(server.embeddings, g_v, server.embed_buf, hp.server_lr if hp.embed_lr is None else hp.embed_lr)
        return PFedHNServer(list(phi), v, server.ids, list(bufs), vbuf, server.seed)

    # -- client ----------------------------------------------------------------------------
    def train(self, state, received, data, ctx):
        theta = received.part
        if not isinstance(theta, list):
            raise ValueError(f"pfedhn: client {ctx.cid} has no model (not among the counted training clients)")
        (fit,) = yield [self.job(theta, data, ctx)]
        return state, PerClient({ctx.cid: [a - b for a, b in zip(fit.params, theta)]}), fit.loss

    def personalize(self, received, data, ctx):
        gen = received.part
        params = [gen.embedding] + list(gen.phi)
        (fit,) = yield [self.job(params, data, ctx, objective=self.embedding_only, epochs=self.hp.unseen_epochs)]
        with torch.no_grad():
            model = hyper(list(gen.phi), fit.params[0][None], self.shapes, self.n_layers)
        return PFedHNState([t[0] for t in model])

    def evaluate(self, state, received, data, ctx):
        theta = state.model if state is not None else received.part
        out = self.outputs([theta], data.test_x, ctx.device)[0]
        return self.task.scores(out, data.test_y)
