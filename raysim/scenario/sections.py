"""The scenario's sections as dataclasses: every key a scenario file may hold outside the
components (whose options are the dataset's, model's, algorithm's and partitioner's own
dataclasses), with its type, range and help. ``raysim.scenario.config`` loads and validates files
against them.

Here: the run's own sections (sampling, eval, resources, tracking, checkpoint, the data's
splits) and ``Scenario``, the whole file; the sections that change how an update reaches the
server (topology, server, privacy, communication, systems) are ``federation_sections``', and are
re-exported here, so every section dataclass can be imported from this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raysim.core import OPTIMIZERS
from raysim.scenario.adversary_sections import AdversaryCfg, DefenceCfg  # noqa: F401 - re-exported
from raysim.scenario.federation_sections import (  # noqa: F401 - DistCfg re-exported
    CommunicationCfg,
    DistCfg,
    PrivacyCfg,
    ServerCfg,
    SystemsCfg,
    TopologyCfg,
)
from raysim.scenario.schema import Component

TIMEOUT_MAX = 1e6  # seconds (11.6 days); Ray's waits overflow on vast timeouts


@dataclass(frozen=True)
class SamplingCfg:
    fraction: float | None = field(
        default=None, metadata={"gt": 0.0, "max": 1.0, "help": "share of training clients sampled per round"}
    )
    count: int | None = field(default=None, metadata={"min": 1, "help": "clients sampled per round"})


@dataclass(frozen=True)
class FinetuneCfg:
    """The "local update" (FedAvg-LU, FedProx-LU, SCAFFOLD-LU; ``fedavg+``): at each evaluation
    every client trains a copy of the global model on its train split and is also scored with
    it (``lu_*``; for FedAvg, FedProx and SCAFFOLD the unprefixed metrics too, ``global_*`` staying
    the untuned model's). A null option is the algorithm's own. Defaults follow FedEM's official
    FedAvg+ (its tuned copy trains ``local_steps`` epochs with the training's optimizer and batch
    size at, in effect, the base lr); ``lr_source: schedule`` is SuPerFed's code, whose
    locally updated models are the round's local training at its decayed lr."""

    epochs: int | None = field(
        default=None,
        metadata={
            "min": 0,
            "help": (
                "local-update epochs; 0: off; null: the method's default (off; fedavg+: 1; perfedavg: personal_epochs)"
            ),
        },
    )
    lr: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": (
                "its learning rate; null: the algorithm's base lr (perfedavg: α; never the round's "
                "scheduled lr, unless lr_source: schedule)"
            ),
        },
    )
    lr_source: str = field(
        default="base",
        metadata={
            "choices": ("base", "schedule"),
            "help": (
                "base: lr as given, constant over the run (FedEM's FedAvg+); schedule: lr times the "
                "training schedule's factor at the evaluated round (SuPerFed's local update; with "
                "lr_schedule: step it is lr x0.01 at the end)"
            ),
        },
    )
    batch_size: int | None = field(default=None, metadata={"min": 1, "help": "null: the algorithm's batch_size"})
    optimizer: str | None = field(
        default=None, metadata={"choices": OPTIMIZERS, "help": "null: the algorithm's optimizer"}
    )
    momentum: float | None = field(default=None, metadata={"min": 0.0, "help": "null: the algorithm's momentum"})
    weight_decay: float | None = field(
        default=None, metadata={"min": 0.0, "help": "null: the algorithm's weight_decay"}
    )


@dataclass(frozen=True)
class EvalCfg:
    every: int = field(default=1, metadata={"min": 1, "help": "evaluate every N rounds (and after the last)"})
    unseen_fraction: float = field(
        default=0.0,
        metadata={"min": 0.0, "lt": 1.0, "help": "share of clients that never train and are evaluated as unseen"},
    )
    clients: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": (
                "training clients evaluated: all (null), a fraction (≤ 1) or a count (> 1), one seeded sample "
                "kept for the whole run so the curves compare"
            ),
        },
    )
    target: float | None = field(
        default=None,
        metadata={
            "min": 0.0,
            "help": (
                "time-to-accuracy: the summary's target_round and target_seconds are the first round (and "
                "the rounds' seconds up to it) whose mean accuracy reaches it (mse: falls to it)"
            ),
        },
    )
    finetune: FinetuneCfg = field(
        default_factory=FinetuneCfg,
        metadata={
            "help": (
                "local update of the global model before scoring: {epochs, lr, lr_source, batch_size, optimizer, "
                "momentum, weight_decay}; lu_* metrics"
            )
        },
    )
    validation: bool | str = field(
        default="auto",
        metadata={
            "choices": ("auto", True, False),
            "help": (
                "also score every evaluated client on its validation split (data.splits.val) with the same models, "
                "logged as val_* (val_accuracy, val_loss, ...) and reduced as the test metrics; the summary adds "
                "val_best_round and test_at_val_best_*. auto: on when data.splits.val > 0 (costs a forward pass over "
                "the validation samples; the local update is not repeated); true: the same, refused without a "
                "validation split; false: off"
            ),
        },
    )


@dataclass(frozen=True)
class ResourcesCfg:
    hosts: int = field(default=2, metadata={"min": 1, "help": "host actors; each hosts many clients"})
    cpus_per_host: float = field(
        default=1.0,
        metadata={
            "gt": 0.0,
            "help": (
                "CPUs Ray reserves for each host actor (a fraction allowed); the host's torch threads are its "
                "whole part, at least 1 (the serial engine's too)"
            ),
        },
    )
    gpus_per_host: float = field(
        default=0.0,
        metadata={
            "min": 0.0,
            "help": (
                "GPUs Ray reserves for each host actor (a fraction shares one GPU among hosts); above 0 the host "
                "trains on CUDA where a GPU is visible; 0: on the CPU"
            ),
        },
    )
    host_timeout_s: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "max": TIMEOUT_MAX,
            "help": "a host call not answered within this many seconds counts as a lost host (null: wait)",
        },
    )
    max_host_losses: int = field(
        default=3,
        metadata={
            "min": 0,
            "help": "lost hosts a run survives (each rolls back to the last checkpoint); then it fails",
        },
    )
    placement: str = field(
        default="samples",
        metadata={
            "choices": ("samples", "round_robin"),
            "help": "clients over hosts: samples (balance the hosts' samples, deterministic) or round_robin (c mod hosts)",
        },
    )
    driver_host: bool | str = field(
        default="auto",
        metadata={
            "choices": ("auto", True, False),
            "help": (
                "Ray engine: host 0 runs in the driver's process instead of an actor of its own (one PyTorch process "
                "fewer: about 300-400 MB and a few CPU-seconds of start-up); the driver waits on the other hosts "
                "anyway. auto: on with a local Ray this command started, CPU hosts and outside a Tune trial; "
                "true: also on a cluster (the driver's node then does host 0's work); false: every host an actor"
            ),
        },
    )
    placement_timeout_s: float = field(
        default=900.0,
        metadata={
            "gt": 0.0,
            "max": TIMEOUT_MAX,
            "help": "on a cluster (--address), how long to wait for the hosts to be "
            "placed (an autoscaling cluster adds nodes meanwhile)",
        },
    )

    @staticmethod
    def host_in_driver(want: bool | str, local: bool, gpus: float, trial: bool) -> bool:
        """The ``driver_host`` rule: whether host 0 runs in the driver's process, for the value
        ``want``, a Ray this process started (``local``), the GPUs per host, and whether the run is
        a Tune trial's (whose hosts are all actors in the trial's placement group)."""
        if trial:
            return False
        return (local and not gpus) if want == "auto" else bool(want)


@dataclass(frozen=True)
class TrackingCfg:
    uri: str | None = field(
        default=None,
        metadata={
            "help": (
                "MLflow tracking URI (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db): a file path, or a URI of a "
                "scheme MLflow has a store for (file, sqlite, postgresql, mysql, mssql, http, https, databricks, or an "
                "installed MLflow store plugin's); any other scheme is refused before the run"
            )
        },
    )
    experiment: str = field(
        default="raysim",
        metadata={"help": "MLflow experiment the runs are logged under (created when missing; not empty)"},
    )


@dataclass(frozen=True)
class CheckpointCfg:
    every: int = field(default=0, metadata={"min": 0, "help": "write a checkpoint every N rounds (0: only at the end)"})
    dir: str = field(
        default="checkpoints",
        metadata={
            "help": (
                "folder of the checkpoints, one subfolder per MLflow run id (relative: to the folder raysim "
                "runs in; on a cluster, best on a file system every node mounts)"
            )
        },
    )


@dataclass(frozen=True)
class SplitsCfg:
    train: float = field(
        default=0.8,
        metadata={
            "gt": 0.0,
            "max": 1.0,
            "help": (
                "share of each client's samples it trains on (its count rounded half up; at least 1 where the client "
                "has 2 samples or more)"
            ),
        },
    )
    val: float = field(
        default=0.0,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": (
                "share held out for validation (0: none), scored as val_* by eval.validation; LEAF with leaf_split: "
                "true takes it out of LEAF's train part"
            ),
        },
    )
    test: float = field(
        default=0.2,
        metadata={
            "gt": 0.0,
            "lt": 1.0,
            "help": (
                "share held out for testing, which accuracy, test_loss and the other unprefixed metrics score: the "
                "samples left after train and val"
            ),
        },
    )


@dataclass(frozen=True)
class DataCfg:
    dataset: Component
    clients: int = field(
        metadata={
            "help": (
                "number of clients (N): a pooled dataset is partitioned among them, a dataset of users (LEAF, "
                "shakespeare) takes its first N users, a synthetic one draws N"
            )
        }
    )
    partition: Component | None
    splits: SplitsCfg = field(
        metadata={"help": ("each client's train/validation/test shares {train, val, test}, which sum to 1")}
    )


@dataclass(frozen=True)
class Scenario:
    path: str
    name: str
    seed: int
    rounds: int
    data: DataCfg
    model: Component
    algorithm: Component
    sampling: SamplingCfg
    eval: EvalCfg
    resources: ResourcesCfg
    tracking: TrackingCfg
    checkpoint: CheckpointCfg
    topology: TopologyCfg | None
    raw: dict  # the validated mapping after overrides (logged as params/artifact)
    server: ServerCfg = field(default_factory=ServerCfg)
    systems: SystemsCfg | None = None
    privacy: PrivacyCfg | None = None
    communication: CommunicationCfg | None = None
    adversary: AdversaryCfg | None = None
    defence: DefenceCfg | None = None
