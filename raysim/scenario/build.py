"""Turn a validated Scenario into its parts: model factory and algorithm (the data source is
``config.make_source``).

Called in the driver and again inside every host process, so each builds only what it needs.
"""

from __future__ import annotations

import torch

import raysim.algorithms as algorithms
from raysim import models, plugins, rng
from raysim.core.tasks import TASKS
from raysim.federation import privacy
from raysim.scenario.config import Scenario, ScenarioError


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
    cls = algorithms.resolve(sc.algorithm.name)  # built-in or plugin, here and in every host
    algo = cls(sc.algorithm.params, make_model_fn(sc, source), sc.rounds, TASKS[source.task])
    algo.finetune = sc.eval.finetune  # the local update's options (eval.finetune)
    algo.decode = getattr(source, "pixels", None)  # an image source's uint8 pixels -> inputs
    dp = sc.privacy
    if dp is not None and dp.level == "sample":  # DP-SGD in every job (raysim/core/loop.py)
        why = privacy.per_sample_problem(algo.model_fn())  # (validation also tries it on the data)
        if why:
            raise ScenarioError(
                f"{sc.path}: privacy.level: sample needs each sample's own gradient, and model "
                f"'{sc.model.name}' {why} (use group or layer norm and no dropout, or another model)"
            )
        algo.dp_sgd_settings = (dp.clip, dp.noise_multiplier, dp.batches == "poisson")
    return algo


def describe_registries() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(section, [(name, source, one-line summary)]) for `raysim list`: every built-in
    ("built-in") and every plugin installed as an entry point (its distribution and version)."""
    from raysim import data

    kinds = (
        ("algorithms", algorithms.PLUGINS),
        ("datasets", data.DATASET_PLUGINS),
        ("models", models.PLUGINS),
        ("partitioners", data.PARTITIONER_PLUGINS),
    )
    return [(section, [(n, where, obj.summary) for n, where, obj in plugins.listing(kind)]) for section, kind in kinds]
