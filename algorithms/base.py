"""The algorithm contract.

An algorithm is a small object built from a frozen hyperparameter dataclass (defaults from its
paper), the run's model factory, the number of rounds and the task. The engine calls its server
side in the server (or, decentralized, once per client) and its client side inside host
actors; it never reads an algorithm's fields. Everything here is tensor math on top of
``raysim.core``: no Ray, no MLflow, no files.

A round, as the engine runs it:

1. ``stats_request`` (optional): before selection, ask all (or the sampled) clients for
   statistics; each answers with ``client_stats``; the replies are summed (or, as
   ``PerClient``, collected) and ``absorb_stats`` updates the server state.
2. ``select``: which clients train and in which group (default: the scenario's sampling, all
   in group 0).
3. ``message``: a shared part and per-group parts; a host receives the shared part and the
   parts of its clients' groups, and each client sees ``Received(shared, part)`` and its group
   in ``ctx.group``.
4. ``train`` per selected client: new client state, a summable reply, the training loss. It
   yields the ``Job``s it wants trained (``self.job``) and gets them back trained, so one
   method written for one client is batched over a host's clients by the one loop.
5. ``aggregate``: the server state from the sum of the replies.

Evaluation: ``evaluate`` returns a client's metrics as a dict (personalized, global, per
cluster, ...), normally ``task.scores`` of some outputs (the one place where accuracy, top-5,
ECE and test loss are computed); the engine reports, for each, the mean weighted by test size,
the std over clients and the bottom decile. The engine calls it through ``evaluation``, which
adds the "local update" (``eval.finetune``, FedAvg-LU, FedProx-LU, SCAFFOLD-LU, ``fedavg+``):
a method with a global model names it for a client (``global_model``); each client trains a copy
of it on its train split (one job of the one loop, ``finetune_settings``, the client's "eval"
generator) and scores it: ``lu_accuracy``, ``lu_top5_accuracy``, ``lu_ece``, ``lu_test_loss``
(``lu_mse``). Where the personalized model IS the global model (``personalized_is_global``:
FedAvg, FedProx, SCAFFOLD) the unprefixed metrics become the tuned model's too — what
"FedAvg-LU's accuracy" means — while ``global_*`` stay the untuned global model's. A clustered method also names its cluster models (``centers``), which the engine scores
on every source's held-out set when the data are a mixture of sources, and each client's
estimated weights of them (``importance``). Unseen clients (``eval.unseen_fraction``) first ``personalize`` with the shared parts
frozen. ``train``, ``evaluate`` and ``personalize`` may each yield jobs. Where the clients have a
validation split (``eval.validation``) the engine calls ``evaluations``, which also runs
``evaluate`` on the shard with the validation split in the test split's place: the ``val_*``
metrics, with no code in the method.

Decentralized (``decentralized = True``; a ``topology`` in the scenario): every client keeps its
own copy of the server state and acts as its own server: its message comes from its copy,
``aggregate`` folds its own reply in, and the core mixes the shared parameters the algorithm
declares (``shared`` / ``with_shared``) with its graph neighbours. A method whose client holds
no state and whose server state is its model (D-SGD, decentralized FedProx) may also give the
step for all of a host's clients at once (``train_rows``): their models as arrays, one stacked
job, no Python object per client; the host then keeps its clients' models as one matrix. It
must give the numbers ``train`` then ``aggregate`` give, client by client (tests hold it to
them bit for bit); a subclass that overrides any of the per-client steps loses it.

This module holds the contract: ``Algorithm``, what the server sends (``Message``,
``Received``, ``StatsRequest``) and the catalogue's ``FAMILIES``. Beside it, and importable
from here too: ``hyper.py``, the local-training hyperparameters every method has
(``LocalTraining``, ``training_field``); ``helpers.py``, tensor helpers several methods share
(``UpdateStats``, ``Tracked``, ``head_index``, ``interpolate``, ``set_dot``, ``means_by_key``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from raysim.core.data import Block, ClientData, Context
from raysim.core.forward import params_of
from raysim.core.groups import Groups, groups_of
from raysim.core.loop import Batch, Fitted, Job, Objective, Rows, Settings, Supervised, Trainer, make_job, make_rows
from raysim.core.mixing import flatten, unflatten
from raysim.core.replies import ByKey, PerClient, Weighted
from raysim.core.tasks import Task, lower_is_better, mean_std

from .helpers import Tracked, UpdateStats, head_index, interpolate, means_by_key, set_dot  # noqa: F401 - re-exported
from .hyper import LocalTraining, training_field  # noqa: F401 - re-exported


@dataclass
class Message:
    """What the server sends: a part every selected client receives and parts per group."""

    shared: Any = None
    groups: dict[int, Any] = field(default_factory=dict)


@dataclass
class Received:
    """What one client receives: the shared part and its group's part (or None)."""

    shared: Any = None
    part: Any = None


@dataclass(frozen=True)
class StatsRequest:
    """Ask clients for statistics before selection: ``clients`` "all" (every training client)
    or "sampled" (the scenario's draw for this round); ``message`` is what they receive."""

    clients: str = "all"
    message: Any = None


FAMILIES = ("global model", "personalized", "clustered", "mixture", "local only")


class Algorithm:
    """Base class: subclasses set ``name``, ``summary``, ``Hyper``, ``ClientState`` and
    override the methods they need."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # the methods catalogue (docs' Methods reference, generated from the registry): the paper
    # ("Authors, Venue Year"), the family (one of FAMILIES), what a client keeps between rounds
    # ("nothing" for a method whose clients hold no state) and what it sends the server
    paper: ClassVar[str] = ""
    family: ClassVar[str] = ""
    personal: ClassVar[str] = ""
    sends: ClassVar[str] = ""
    Hyper: ClassVar[type] = LocalTraining
    ClientState: ClassVar[type | None] = None  # a dataclass of tensors (checkpointed)
    decentralized: ClassVar[bool] = False  # has a gossip form (shared / with_shared)
    no_gossip: ClassVar[str] = ""  # why not (a topology's refusal says it)
    split: ClassVar[bool] = False  # needs a model with a body and a head (groups)
    unseen: ClassVar[bool] = True  # can score clients that never trained (personalize)
    # the personalized model is the global model (FedAvg, FedProx, SCAFFOLD): with eval.finetune
    # the unprefixed metrics are the tuned model's (FedAvg-LU), ``global_*`` the untuned one's
    personalized_is_global: ClassVar[bool] = False

    @classmethod
    def check(cls, hp: Any, decentralized: bool) -> tuple[str, str] | None:
        """A setting this algorithm cannot run with: (hyperparameter, why), or None."""
        return None

    def __init__(self, hyper: Any, model_fn, rounds: int, task: Task):
        self.hp = hyper
        self.model_fn = model_fn  # (variant=0) -> nn.Module with the run's initial weights
        self.rounds = rounds
        self.task = task
        self.objective = Supervised(task)
        self._trainer: Trainer | None = None
        self.finetune = None  # eval.finetune's options (raysim.scenario.config.FinetuneCfg), set by setup
        # privacy.level sample's (C, z, Poisson batches), set by setup
        self.dp_sgd_settings: tuple[float, float, bool] | None = None
        # stored inputs -> model inputs (an image source's uint8 pixels: raysim.core.data.Pixels), set by
        # setup; the trainer applies it to every batch and every evaluated block
        self.decode: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._tune_objective = Supervised(task)  # the local update's: the task loss alone

    # -- helpers ---------------------------------------------------------------------------
    def trainer(self, device: torch.device) -> Trainer:
        """The host's trainer: a scratch model (weights never used) and the vectorized loop."""
        if self._trainer is None:
            self._trainer = Trainer(
                self.model_fn().to(device), self.hp.stacking, gradients=self.hp.gradients, decode=self.decode
            )
        return self._trainer

    def job(
        self,
        params: list[torch.Tensor],
        data: ClientData,
        ctx: Context,
        *,
        epochs: int | None = None,
        objective=None,
        **kw,
    ) -> Job:
        """A job training ``params`` on the client's train split with this round's settings
        (see ``raysim.core.loop.make_job`` for weights, consts, opt_state, orders)."""
        settings = self.hp.settings(ctx.round, ctx.rounds, epochs)
        if self.dp_sgd_settings is not None:  # every step DP-SGD's (privacy.level: sample)
            clip, noise, poisson = self.dp_sgd_settings
            settings = dataclasses.replace(settings, dp_clip=clip, dp_noise=noise, poisson=poisson)
        return make_job(params, data, ctx, settings, objective or self.objective, **kw)

    @property
    def groups(self) -> Groups:
        """The model's named parameter groups (head, body, stats, layers; ``model.head`` applied):
        select, train, send and average parameters by group, never by position."""
        if getattr(self, "_groups", None) is None:
            self._groups = groups_of(self.model_fn())
        return self._groups

    def head(self) -> int:
        """Index of the classifier head's weight among the model's parameters (``head_index``)."""
        if getattr(self, "_head", None) is None:
            self._head = head_index(self.model_fn())
        return self._head

    def outputs(self, sets: list[list[torch.Tensor]], x: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Outputs of each parameter set on ``x``: (K, n, outputs)."""
        return self.trainer(device).outputs(sets, x)

    @torch.no_grad()
    def losses(
        self, sets: list[list[torch.Tensor]], x: torch.Tensor, y: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        """Per-sample task losses of each parameter set on (x, y): (K, n)."""
        out = self.outputs(sets, x, device)
        return self.task.per_sample(out, y.expand(out.shape[0], *y.shape))

    def train_loss(self, params: list[torch.Tensor], data: ClientData, ctx: Context) -> float:
        """F_k(w): the mean task loss of ``params`` over the client's whole train split, before it
        trains (q-FFL's, TERM's and AFL's client loss; one pass, no gradient)."""
        if data.num_train == 0:
            return 0.0
        return float(self.losses([params], data.train_x, data.train_y, ctx.device).to(torch.float64).mean())

    def warm_up(self, input_shape: tuple[int, ...], device: torch.device) -> None:
        """One forward/backward pass on zeros, so one-time setup (oneDNN primitives, the
        autograd engine, a CUDA context) happens when a host starts, not in round 1's timing."""
        model = self.trainer(device).model
        out = model(torch.zeros((2, *input_shape), device=device))
        out.sum().backward()
        for p in model.parameters():
            p.grad = None

    # -- server side -----------------------------------------------------------------------
    def init_server(self, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def stats_request(self, server: Any, round_: int) -> StatsRequest | None:
        return None

    def absorb_stats(self, server: Any, reduced: Any, round_: int) -> Any:
        return server

    def select(
        self, server: Any, round_: int, sampled: np.ndarray, candidates: np.ndarray, rng: np.random.Generator
    ) -> dict[int, int]:
        """{client id: group} of this round's trainers; ``sampled`` is the scenario's draw,
        ``candidates`` every training client, ``rng`` derived from (seed, "select", round)."""
        return {int(c): 0 for c in sampled}

    def message(self, server: Any, round_: int) -> Message:
        return Message(server)

    def centers(self, server: Any) -> list[list[torch.Tensor]] | None:
        """The cluster models of a clustered method (centers, cluster models, components), which
        the engine scores on each source's held-out set (the center/source table); None: none."""
        return None

    def eval_groups(self, server: Any, cids: np.ndarray) -> dict[int, int]:
        """{client id: group} whose part each client is evaluated with (absent: group 0; a
        group without a part, e.g. -1: none, and no cluster in the report)."""
        return {}

    def aggregate(self, server: Any, reduced: Any, round_: int) -> Any:
        raise NotImplementedError

    # -- client side -----------------------------------------------------------------------
    def init_client(self, cid: int, rng: np.random.Generator) -> Any:
        return None

    def client_stats(self, state: Any, received: Received, data: ClientData, ctx: Context) -> tuple[Any, Any]:
        """(client state, summable reply) for a ``stats_request``."""
        raise NotImplementedError

    def train(self, state: Any, received: Received, data: ClientData, ctx: Context):
        """(new client state, reply, mean training loss); may yield jobs first."""
        raise NotImplementedError

    def evaluate(self, state: Any, received: Received, data: ClientData, ctx: Context):
        """The client's metrics on its test split, e.g. {"accuracy": .., "test_loss": ..}."""
        raise NotImplementedError

    def report(self, results: dict[int, tuple[dict[str, float], int]], server: Any) -> dict[str, Any]:
        """Entries for the run's report (the summary's ``final``) from every evaluated client's
        (metrics, test size) and the server state, e.g. SuPerFed's accuracy-vs-λ curve,
        SosicFL's simplex; {} by default."""
        return {}

    def round_metrics(self, reduced: Any) -> dict[str, float]:
        """Per-round metrics from the round's summed replies (e.g. the total variance of the
        clients' last-layer updates); {} by default."""
        return {}

    def importance(self, state: Any) -> torch.Tensor | None:
        """The client's estimated weight of each of ``centers`` (soft or 0/1), reported beside
        the true shares of its sources; None: none."""
        return None

    # -- local update (eval.finetune) ----------------------------------------------------------
    def global_model(self, state: Any, received: Received) -> list[torch.Tensor] | None:
        """The global model the client is scored with as ``global_*``, in the model's parameter
        layout: what its local update (``eval.finetune``) starts from. None (the default): the
        method has none (Local, FedPer, LG-FedAvg, clustered methods), and a scenario giving it
        ``eval.finetune`` is refused. A subclass of a method with one whose shared part is not
        the whole model must return None again."""
        return None

    @classmethod
    def has_global_model(cls) -> bool:
        return cls.global_model is not Algorithm.global_model

    # -- the simulated fleet (the scenario's ``systems`` section) -------------------------------
    def client_work(self, n_train: int) -> float:
        """Training samples a client with ``n_train`` of them processes in a round, which its
        device's speed turns into virtual seconds: E·n for one model (a method that trains more
        than one model a round says so)."""
        return float(self.hp.local_epochs * n_train)

    # -- server optimizer (the scenario's ``server`` section) ---------------------------------
    def server_params(self, server: Any) -> list[torch.Tensor] | None:
        """The global model's parameters in the server state that a server optimizer (FedAvgM,
        FedAdam, FedYogi, FedAdagrad: ``raysim.core.server_opt``) steps, in a fixed order, or
        None (the default): the method has none, and a scenario giving it ``server.optimizer``
        is refused. The engine reads them before and after ``aggregate``, steps them with the
        pseudo-gradient (after − before) and writes them back with ``with_server_params``; the
        optimizer's state is the engine's, checkpointed beside the server state. A method's
        aggregate stays as it is: the server optimizer is one hook for every such method.
        Batch-norm running statistics (group "stats") are best left out (``global_indices``)."""
        return None

    def with_server_params(self, server: Any, params: list[torch.Tensor]) -> Any:
        """The server state with ``server_params`` replaced by ``params``."""
        raise NotImplementedError

    @classmethod
    def has_server_params(cls) -> bool:
        return cls.server_params is not Algorithm.server_params

    # why the method cannot run with an asynchronous server (``systems.aggregation``), or None:
    # such a server steps only the global model (``server_params``) with each reply
    not_asynchronous: ClassVar[str | None] = None

    @classmethod
    def has_async(cls) -> bool:
        """Runs with FedBuff or FedAsync: a global model, and no other server state those steps
        would leave behind."""
        return cls.has_server_params() and cls.not_asynchronous is None

    dp_sgd = False  # its local training is the task's loss (a proximal pull at most): DP-SGD's path

    @classmethod
    def trains_with_dp_sgd(cls) -> bool:
        """Whether sample-level DP (``privacy.level: sample``) covers what leaves a client: its
        reply is the one averaged model (``averages_one_model``) and every job it trains is the
        task's loss, with at most a proximal pull (``dp_sgd``), which the loop's DP-SGD takes."""
        return cls.dp_sgd and cls.averages_one_model()

    def private_epochs(self) -> int:
        """The passes over a client's train split that one round's jobs take together, each
        step DP-SGD's under ``privacy.level: sample``, whose accountant counts every one of them:
        the local epochs (a method training a second model on the same data adds its epochs)."""
        return self.hp.local_epochs

    @classmethod
    def averages_one_model(cls) -> bool:
        """Whether each client's reply is its trained copy of the one model the server sent and
        averages (FedAvg's reply, aggregate, selection and message, kept unchanged): what the
        engine's transforms of an upload (privacy's clipping, compression) need."""
        return False

    # -- Byzantine clients and robust aggregation (the scenario's ``adversary`` and ``defence``) --
    # whether each ``Weighted`` of a client's reply is a model it trained from its entry of
    # ``update_origin`` (a top-level one from the whole origin, the i-th of a list from entry i, a
    # ByKey's key k from entry k): what the engine turns into the updates that attacks craft and
    # robust rules combine, one set of updates per entry
    robust_replies: ClassVar[bool] = False

    @classmethod
    def takes_robust(cls) -> bool:
        """Runs with an adversary and a defence: its replies are models trained from what the
        server sent (FedAvg's, or a method that declares ``robust_replies``)."""
        return cls.averages_one_model() or cls.robust_replies

    def update_origin(self, message: Message) -> Any:
        """What each client's reply is an update of: the message's shared part (its list of
        models for a method replying one per component or cluster). None: the replies are
        updates already (CFL's)."""
        return message.shared

    def global_indices(self, group="all") -> tuple[int, ...]:
        """Indices of ``group``'s parameters that a server optimizer steps: all but the
        batch-norm running statistics (averaged, as the method does, not stepped)."""
        stats = set(self.groups.of("stats"))
        return tuple(i for i in self.groups.of(group) if i not in stats)

    def finetune_settings(self, ctx: Context) -> Settings | None:
        """The local update's settings (None: off). Each null option of ``eval.finetune`` is the
        algorithm's own (``lr``, ``batch_size``, ``optimizer``, ``momentum``, ``weight_decay``);
        its lr is the base ``lr`` (``lr_source: base``), not the round's scheduled one, unless
        ``lr_source: schedule`` multiplies it by the training schedule's factor at the evaluated
        round (``ctx.round``, the rounds done)."""
        f, hp = self.finetune, self.hp
        epochs = getattr(f, "epochs", None)
        if epochs is None:
            epochs = self.default_finetune_epochs()
        if not epochs:
            return None

        def opt(name):
            v = getattr(f, name, None)
            return getattr(hp, name) if v is None else v

        lr = opt("lr")
        if getattr(f, "lr_source", "base") == "schedule":
            lr = lr * hp.lr_factor(ctx.round, ctx.rounds)
        return Settings(lr, epochs, opt("batch_size"), opt("optimizer"), opt("momentum"), opt("weight_decay"))

    def default_finetune_epochs(self) -> int:
        """Local-update epochs when ``eval.finetune.epochs`` is null: 0 (off; fedavg+: 1)."""
        return 0

    def evaluation(self, state: Any, received: Received, data: ClientData, ctx: Context):
        """A client's metrics on its test split: ``evaluate``, then the local update."""
        return self.with_local_update(self.evaluate(state, received, data, ctx), state, received, data, ctx)

    def evaluations(self, state: Any, received: Received, data: ClientData, ctx: Context, val: bool = False):
        """What the engine scores a client with: (its test metrics, as ``evaluation``; its
        validation metrics or None). With ``val`` and a non-empty validation split, the same
        ``evaluate`` runs again on the shard with the validation split in the test split's place
        (``ClientData.val_as_test``), drawing from a fork of ``ctx``'s generator taken before
        the test pass (so it scores the same models, and the test metrics and the local update's
        draws are those of a run without it); the local update's tuned model, trained once, is
        scored on both splits. The validation metrics keep ``evaluate``'s names (the engine
        renames them ``val_*``). A subclass overriding ``evaluation`` gets it called once per
        split instead."""
        on_val = data.val_as_test() if val and data.num_val > 0 else None
        vctx = ctx.fork() if on_val is not None else None
        if type(self).evaluation is not Algorithm.evaluation:
            test = yield from _result(self.evaluation(state, received, data, ctx))
            return test, None if on_val is None else (
                yield from _result(self.evaluation(state, received, on_val, vctx))
            )
        test = yield from _result(self.evaluate(state, received, data, ctx))
        valm = None if on_val is None else (yield from _result(self.evaluate(state, received, on_val, vctx)))
        tuned = yield from self._locally_updated(state, received, data, ctx)
        if tuned is not None:
            test = self._with_tuned(test, tuned, data, ctx)
            if valm is not None:
                valm = self._with_tuned(valm, tuned, on_val, ctx)
        return test, valm

    def with_local_update(self, scored, state: Any, received: Received, data: ClientData, ctx: Context):
        """``scored`` (``evaluate``'s result, or its generator), with, when ``eval.finetune`` is
        on and the method has a global model, the scores of the client's copy of it trained by
        one job of the loop on its train split (its orders from ``ctx``'s generator, after
        ``evaluate``'s own draws): ``lu_*``, and the unprefixed ones too where
        ``personalized_is_global``."""
        metrics = yield from _result(scored)
        tuned = yield from self._locally_updated(state, received, data, ctx)
        return metrics if tuned is None else self._with_tuned(metrics, tuned, data, ctx)

    def _locally_updated(self, state: Any, received: Received, data: ClientData, ctx: Context):
        """The local update's tuned copy of the global model (its parameters), or None where
        it is off or the method has no global model."""
        settings = self.finetune_settings(ctx)
        glob = None if settings is None or data.num_test == 0 else self.global_model(state, received)
        if glob is None:
            return None
        (tuned,) = yield [make_job(glob, data, ctx, settings, self._tune_objective)]
        return tuned.params

    def _with_tuned(self, metrics: dict, tuned: list[torch.Tensor], data: ClientData, ctx: Context) -> dict:
        out = self.outputs([tuned], data.test_x, ctx.device)[0]
        metrics = {**metrics, **self.task.scores(out, data.test_y, "lu_")}
        if self.personalized_is_global:
            metrics.update(self.task.scores(out, data.test_y))
        return metrics

    def personalize(self, received: Received, data: ClientData, ctx: Context):
        """State of a client that never trained (``eval.unseen_fraction``), adapted with the
        shared parts frozen; by default its initial state."""
        seed = int(torch.randint(2**31, (1,), generator=ctx.generator))  # derived, like every draw
        return self.init_client(ctx.cid, np.random.default_rng(seed))

    def personalize_by_training(self, received: Received, data: ClientData, ctx: Context):
        """A ``personalize`` for methods whose personal state comes from local training: the
        state one ``train`` step from a fresh client leaves (SuPerFed, APFL, pFedMe use it)."""
        state, _, _ = yield from self.train(None, received, data, ctx)
        return state

    # -- decentralized ---------------------------------------------------------------------
    def shared(self, server: Any) -> list[list[torch.Tensor]]:
        """The parameters gossip mixes, in groups (the consensus distance is reported per
        group). Default: a server state that is a list of tensors, one group."""
        return [list(server)]

    def with_shared(self, server: Any, groups: list[list[torch.Tensor]]) -> Any:
        return list(groups[0])

    # The decentralized step of all of a host's clients at once (optional): ``train_rows(params,
    # block)`` gets their models, each parameter stacked (K, ...) in client-id order, and their
    # train data (``Block``) and returns (the models after the step, stacked alike; each
    # client's training loss). Only for a method whose client has no state and whose server
    # state is the list of its model's parameters, all of them shared.
    train_rows = None
    ROWS_STEPS: ClassVar[tuple[str, ...]] = (
        "train",
        "aggregate",
        "reply",
        "shared",
        "with_shared",
        "message",
        "init_client",
        "init_server",
    )

    @classmethod
    def has_rows(cls) -> bool:
        """Whether ``train_rows`` stands for this class's per-client steps: defined, and none of
        them overridden below the class that defines it."""
        owner = next((c for c in cls.__mro__ if c.__dict__.get("train_rows") is not None), None)
        return (
            owner is not None
            and cls.ClientState is None
            and all(getattr(cls, m) is getattr(owner, m) for m in cls.ROWS_STEPS)
        )

    def rows_job(self, params: list[torch.Tensor], block: Block, *, consts: dict | None = None, objective=None) -> Rows:
        """``job`` for all of a block's clients at once: each client's sample orders from its
        "train" generator of the round, as ``job`` draws them from its context."""
        return make_rows(
            params,
            block.x,
            block.y,
            block.starts,
            block.ns,
            block.seeds,
            self.hp.settings(block.round, block.rounds),
            objective or self.objective,
            consts,
        )


def _result(scored):
    """The value of ``scored``: a generator's (its jobs passed through), or ``scored`` itself."""
    if inspect.isgenerator(scored):
        return (yield from scored)
    return scored


__all__ = [
    "Algorithm",
    "Batch",
    "ByKey",
    "ClientData",
    "Context",
    "Fitted",
    "Groups",
    "Job",
    "LocalTraining",
    "Message",
    "Objective",
    "PerClient",
    "Received",
    "StatsRequest",
    "Supervised",
    "Tracked",
    "UpdateStats",
    "Weighted",
    "flatten",
    "head_index",
    "interpolate",
    "lower_is_better",
    "mean_std",
    "means_by_key",
    "params_of",
    "unflatten",
]
