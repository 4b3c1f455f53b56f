"""raysim: a federated-learning simulator on Ray.

The Python API (``raysim.api``): ``raysim.run`` runs a scenario and returns its results,
``raysim.load`` reads a finished run back from MLflow. They are imported on first use, so
``import raysim`` (and the ``raysim`` command's start) imports neither torch, Ray nor MLflow.

The package, floor by floor (each wing's ``__init__`` says what it holds and what it may import;
``tests/test_layering.py`` holds the rules):

- foundation modules: ``errors`` (exit codes, the bad-input error), ``rng`` (every random
  stream from the seed), ``plugins`` (names to objects through entry points), ``signals``
  (Ctrl-C and SIGTERM), ``cachedir``;
- ``core`` (the training loop, the reduction, the math every method shares) and
  ``algorithms`` (one file a method, on the contract in ``algorithms.base``);
- ``data``, ``models`` and ``federation`` (the fleet, privacy, compression, topology);
- ``scenario``: a YAML file read, checked and built into its parts;
- ``engine`` (hosts, rounds, gossip; every Ray call in its ``ray_*`` modules) and ``results``
  (MLflow, compare, report);
- ``experiment``: one run, sweeps, the checks before Ray starts;
- ``api`` and ``cli`` on top.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.2.0"

_API = ("run", "load", "shutdown", "Result", "SweepResult", "ScenarioError")
__all__ = [*_API, "__version__"]

# Modules that moved in 0.2.0 (CHANGELOG.md): the old paths import the new modules, with a
# DeprecationWarning, until 0.3.0.
MOVED = {
    "raysim.config": "raysim.scenario.config",
    "raysim.schema": "raysim.scenario.schema",
    "raysim.sections": "raysim.scenario.sections",
    "raysim.setup": "raysim.scenario.build",
    "raysim.stores": "raysim.scenario.stores",
    "raysim.runner": "raysim.experiment.runner",
    "raysim.sweep": "raysim.experiment.sweep",
    "raysim.preflight": "raysim.experiment.preflight",
    "raysim.tracking": "raysim.results.tracking",
    "raysim.tracker_process": "raysim.results.tracker_process",
    "raysim.compare": "raysim.results.compare",
    "raysim.report": "raysim.results.report",
    "raysim.systems": "raysim.federation.fleet",
    "raysim.traces": "raysim.federation.traces",
    "raysim.privacy": "raysim.federation.privacy",
    "raysim.compression": "raysim.federation.compression",
    "raysim.topology": "raysim.federation.topology",
    "raysim.vision_models": "raysim.models.vision",
    "raysim.testing": "raysim.engine.faults",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as its new module (the same module object, so a patch through
    either name patches both)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]} in raysim 0.2.0; the old path goes in 0.3.0",
            DeprecationWarning,
            stacklevel=3,
        )
        module = importlib.import_module(MOVED[spec.name])
        self.specs = {**getattr(self, "specs", {}), spec.name: module.__spec__}
        return module

    def exec_module(self, module):
        module.__spec__ = self.specs[module.__spec__.name]  # the import gave it the old name's spec


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())


def __getattr__(name: str):
    if name in _API:
        from raysim import api

        return getattr(api, name)
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
