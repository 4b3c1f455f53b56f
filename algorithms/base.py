"""The algorithm contract (DESIGN.md §3).

An algorithm is a small object built from a frozen hyperparameter dataclass. The engine calls
its client side inside host actors and its server side in the server; it never reads an
algorithm's fields. Everything here is pure tensor math: no Ray, no MLflow, no files.

Client side:  init_client, train, evaluate (and personalize for unseen clients).
Server side:  init_server, broadcast, aggregate.

A client's reply is a dataclass of tensors and numbers whose fields are *summed* across clients
(weighted parameter sums, sample counts, sufficient statistics), so hosts pre-sum their clients'
replies and the server adds the host sums. A field of type ``PerClient`` is concatenated
(a dict keyed by client id) instead of summed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn


class PerClient(dict):
    """A reply field keyed by client id; reduction takes the union (associative)."""


@dataclass
class Weighted:
    """A weighted term of a sum: the reduction adds ``weight * v`` for each tensor and ``weight``.

    After reduction ``values`` hold the float64 sums Σ_k w_k·v_k and ``weight`` holds Σ_k w_k.
    Products of float32 tensors with integer weights are exact in float64, and the sums are
    accumulated in float64 in client-id order, so the result does not depend on how clients
    are grouped into hosts (up to float64 rounding, far below float32 resolution).
    """

    values: list[torch.Tensor]
    weight: float

    def mean(self, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Σ w·v / Σ w, cast back to ``dtype``."""
        return [(v / self.weight).to(dtype) for v in self.values]


@dataclass(frozen=True)
class LocalTraining:
    """Local-SGD settings shared by every algorithm (the paper's defaults live in subclasses)."""

    lr: float = 0.05
    local_epochs: int = 1
    batch_size: int = 32
    momentum: float = 0.0
    weight_decay: float = 0.0
    # "constant" or "step": lr x0.1 at R/2 and again at 3R/4 (FedEM's official schedule).
    lr_schedule: str = "constant"

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"lr_schedule": ("constant", "step")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("lr", "local_epochs", "batch_size")
    NONNEGATIVE: ClassVar[tuple[str, ...]] = ("momentum", "weight_decay")

    def lr_at(self, round_: int, rounds: int) -> float:
        if self.lr_schedule == "step":
            if round_ >= (3 * rounds) // 4:
                return self.lr * 0.01
            if round_ >= rounds // 2:
                return self.lr * 0.1
        return self.lr


@dataclass
class Context:
    """What a client step may know besides its state, the message and its data."""

    round: int            # 0-based round index
    rounds: int           # total rounds of the run
    cid: int              # client id
    generator: torch.Generator   # derived from (seed, round, cid, purpose)
    device: torch.device = torch.device("cpu")


@dataclass
class ClientData:
    """One client's shard: tensors already on the host's device."""

    cid: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])

    def to(self, device: torch.device) -> "ClientData":
        if device.type == "cpu":
            return self
        return ClientData(self.cid, *(t.to(device) for t in (
            self.train_x, self.train_y, self.val_x, self.val_y, self.test_x, self.test_y)))


@dataclass
class EvalResult:
    """Per-client evaluation on its local test split (counts, so means can be weighted)."""

    correct: float
    total: int
    loss_sum: float
    # accuracy of the global model on this client's test split, where a method has one
    global_correct: float | None = None
    # per-client scalars the method reports (e.g. FedEM's entropy of pi); averaged over clients
    extras: dict[str, float] = field(default_factory=dict)


class Algorithm:
    """Base class: subclasses set ``name``, ``Hyper``, ``ClientState`` and override methods."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Hyper: ClassVar[type] = LocalTraining
    ClientState: ClassVar[type | None] = None
    has_global_model: ClassVar[bool] = True
    communicates: ClassVar[bool] = True
    supports_gossip: ClassVar[bool] = False   # has the decentralized side (gossip_* and mix)

    def __init__(self, hyper: Any, model_fn, rounds: int):
        self.hp = hyper
        self.model_fn = model_fn   # () -> nn.Module with the run's initial weights
        self.rounds = rounds
        self._scratch: nn.Module | None = None

    # -- helpers shared by subclasses ------------------------------------------------------
    def scratch_model(self, device: torch.device) -> nn.Module:
        """A module reused for every client on this host (weights are loaded, never rebuilt)."""
        if self._scratch is None:
            self._scratch = self.model_fn().to(device)
        return self._scratch

    def warm_up(self, input_shape: tuple[int, ...], device: torch.device) -> None:
        """One forward/backward pass on zeros (weights untouched), so one-time setup (oneDNN
        primitives, the autograd engine, a CUDA context) happens when a host starts, not inside
        round 1's timing."""
        model = self.scratch_model(device)
        bs = getattr(self.hp, "batch_size", 1)
        out = model(torch.zeros((bs, *input_shape), device=device))
        nn.functional.cross_entropy(out, torch.zeros(bs, dtype=torch.long, device=device)).backward()
        for p in model.parameters():
            p.grad = None

    # -- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def broadcast(self, server_state: Any, round_: int) -> Any:
        raise NotImplementedError

    def aggregate(self, server_state: Any, reduced: Any, round_: int) -> Any:
        raise NotImplementedError

    # -- client side -----------------------------------------------------------------------
    def init_client(self, cid: int, rng: np.random.Generator) -> Any:
        return None

    def personalize(self, message: Any, data: ClientData, ctx: Context) -> Any:
        """State of a client that never trained (``eval.unseen_fraction``), adapted with the
        shared parts frozen; by default just its initial state."""
        seed = int(torch.randint(2**31, (1,), generator=ctx.generator))   # derived, like every draw
        return self.init_client(ctx.cid, np.random.default_rng(seed))

    def train(self, state: Any, message: Any, data: ClientData, ctx: Context) -> tuple[Any, Any, float]:
        """Return (new client state, reply, mean training loss)."""
        raise NotImplementedError

    def train_many(self, states: list[Any], message: Any, datas: list[ClientData],
                   ctxs: list[Context]) -> list[tuple[Any, Any, float]]:
        """``train`` for several clients of one host (ascending id): the batched path of
        DESIGN.md §3. An algorithm may train them together; it must return, client for client,
        what ``train`` returns up to float rounding, and a client's numbers must not depend on
        which other clients are in the call. By default: one ``train`` after another (so a
        reply must never share memory with a model the algorithm reuses for the next client)."""
        return [self.train(s, message, d, c) for s, d, c in zip(states, datas, ctxs)]

    def evaluate(self, state: Any, message: Any, data: ClientData, ctx: Context) -> EvalResult:
        raise NotImplementedError

    # -- gossip side (decentralized topology, instead of the server side) ---------------------
    def gossip_init(self, cid: int, message: Any) -> Any:
        """A client's state holding its own copy of the shared parameters (from init_server's)."""
        raise NotImplementedError

    def gossip_train(self, state: Any, data: ClientData, ctx: Context) -> tuple[Any, Any, float]:
        """Local step on the client's own parameters: (state, message for neighbours, loss)."""
        raise NotImplementedError

    def gossip_train_many(self, states: list[Any], datas: list[ClientData],
                          ctxs: list[Context]) -> list[tuple[Any, Any, float]]:
        """``gossip_train`` for several clients of one host (the batched path; same rules as
        ``train_many``). By default: one after another."""
        return [self.gossip_train(s, d, c) for s, d, c in zip(states, datas, ctxs)]

    def mix(self, state: Any, neighbours: list[tuple[float, Any]]) -> Any:
        """New state from [(W_ij, message_j)] over j in the neighbourhood (self included)."""
        raise NotImplementedError

    def mix_many(self, states: list[Any], sources: dict[int, Any],
                 rows: list[list[tuple[int, float]]]) -> list[Any]:
        """``mix`` for several clients of one host: rows[i] lists (j, W_ij) in ascending j and
        ``sources[j]`` is client j's message. Must equal ``mix`` client for client."""
        return [self.mix(s, [(w, sources[j]) for j, w in row]) for s, row in zip(states, rows)]

    def consensus_stats(self, state: Any) -> Any:
        """Summable statistics of the shared parameters: a list (one per parameter group, e.g.
        per component) of Weighted([θ, ‖θ‖²], 1); the engine turns their sums into the consensus
        distance mean_k ‖θ_k − θ̄‖² = mean_k ‖θ_k‖² − ‖θ̄‖²."""
        raise NotImplementedError


def _leaves(msg) -> list[torch.Tensor]:
    if isinstance(msg, torch.Tensor):
        return [msg]
    return [t for part in msg for t in _leaves(part)]


def _rebuild(template, flat: torch.Tensor, start: int = 0):
    """``template``'s nested lists of tensors, filled from the vector ``flat``; returns (value, end)."""
    if isinstance(template, torch.Tensor):
        end = start + template.numel()
        return flat[start:end].view(template.shape).to(template.dtype), end
    out = []
    for part in template:
        value, start = _rebuild(part, flat, start)
        out.append(value)
    return out, start


def _flat64(msg) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in _leaves(msg)]).to(torch.float64)


def weighted_rows(sources: dict[int, Any], rows: list[list[tuple[int, float]]]) -> list[Any]:
    """For each row [(j, w_j), ...]: Σ_j w_j·sources[j] in float64, cast back, with the
    structure (nested lists of tensors) of the messages. Every source is flattened once into a
    matrix; a row is one product of its weights with its neighbours' rows of that matrix, in the
    order given (the engine sorts by client id), so a client's result depends only on its own
    neighbourhood, whichever host holds which client (and equals ``weighted_sum`` bitwise)."""
    if not rows:
        return []
    ids = sorted(sources)
    pos = {j: k for k, j in enumerate(ids)}
    template = sources[ids[0]]
    flat = torch.stack([_flat64(sources[j]) for j in ids])
    out = []
    for row in rows:
        idx = torch.tensor([pos[j] for j, _ in row], device=flat.device)
        w = torch.tensor([float(wj) for _, wj in row], dtype=torch.float64, device=flat.device)
        out.append(_rebuild(template, w @ flat[idx])[0])
    return out


def weighted_sum(neighbours: list[tuple[float, Any]]) -> Any:
    """Σ_j w_j θ_j over [(w_j, θ_j)] (θ nested lists of tensors) in float64, cast back: one
    product of the weights with the stacked, flattened neighbours, as ``weighted_rows``."""
    sources = {k: msg for k, (_, msg) in enumerate(neighbours)}
    return weighted_rows(sources, [[(k, w) for k, (w, _) in enumerate(neighbours)]])[0]


def consensus_terms(params: list[torch.Tensor]) -> Weighted:
    """[θ..., ‖θ‖²] with weight 1, for the consensus distance."""
    sq = sum(float((p.double() ** 2).sum()) for p in params)
    return Weighted([*(p.detach() for p in params), torch.tensor(sq, dtype=torch.float64)], 1.0)


def state_to_tree(state: Any) -> Any:
    """A client state as plain containers of tensors/numbers (loadable with weights_only=True)."""
    if state is None:
        return None
    if dataclasses.is_dataclass(state):
        return {f.name: state_to_tree(getattr(state, f.name)) for f in dataclasses.fields(state)}
    if isinstance(state, (list, tuple)):
        return [state_to_tree(s) for s in state]
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    return state


def tree_to_state(cls: type | None, tree: Any) -> Any:
    if tree is None or cls is None:
        return tree
    return cls(**tree)


__all__ = [
    "Algorithm", "ClientData", "Context", "EvalResult", "LocalTraining", "PerClient", "Weighted",
    "consensus_terms", "weighted_rows", "weighted_sum",
    "field", "state_to_tree", "tree_to_state",
]
