"""Turn a validated Scenario into its parts: model factory and algorithm (the data source is
``config.make_source``).

Called in the driver and again inside every host process, so each builds only what it needs.
"""
from __future__ import annotations

import torch

import raysim.algorithms as algorithms
from raysim import rng
from raysim.config import Scenario
from raysim.core.tasks import TASKS
from raysim.data import DATASETS
from raysim import models
from raysim.models import MODELS


def make_model_fn(sc: Scenario, source):
    """A factory giving the run's initial model: weights drawn from (seed, "model_init"),
    without touching the global torch RNG."""
    seed = int(rng.generator(sc.seed, "model_init").integers(2**62))

    def model_fn(variant: int = 0) -> torch.nn.Module:
        """``variant`` k > 0 gives another independent initialization (mixture components)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + variant)
            return models.build(sc.model.name, sc.model.params, source)
    return model_fn


def make_algorithm(sc: Scenario, source) -> algorithms.Algorithm:
    cls = algorithms.get(sc.algorithm.name)
    algo = cls(sc.algorithm.params, make_model_fn(sc, source), sc.rounds, TASKS[source.task])
    algo.finetune = sc.eval.finetune          # the local update's options (eval.finetune)
    return algo


def describe_registries() -> list[tuple[str, list[tuple[str, str]]]]:
    """(section, [(name, one-line summary)]) for `raysim list`."""
    from raysim.data import PARTITIONERS
    return [
        ("algorithms", [(n, a.summary) for n, a in algorithms.REGISTRY.items()]),
        ("datasets", [(n, s.summary) for n, s in DATASETS.items()]),
        ("models", [(n, s.summary) for n, s in MODELS.items()]),
        ("partitioners", [(n, s.summary) for n, s in PARTITIONERS.items()]),
    ]
