"""Plugins: algorithms, datasets, models and partitioners from outside raysim, by name.

Every name a scenario gives (``algorithm.name``, ``data.dataset``, ``model.name``,
``data.partition.kind``) resolves here, in the driver and again in every host process:

1. a built-in name: the registry's entry (``raysim.algorithms.REGISTRY``,
   ``raysim.data.DATASETS``, ``raysim.models.MODELS``, ``raysim.data.PARTITIONERS``);
2. ``module:Name`` (a colon in the name): attribute ``Name`` of the importable module
   ``module`` (``Name`` may be dotted: ``mypkg.zoo:Nets.small``);
3. any other name: the entry point of that name in the group ``raysim.algorithms``,
   ``raysim.datasets``, ``raysim.models`` or ``raysim.partitioners`` of an installed
   distribution (read with ``importlib.metadata``).

What each kind of plugin is (the object the entry point or ``module:Name`` names):

- an algorithm: a subclass of ``raysim.algorithms.base.Algorithm`` (the class; its ``Hyper``
  dataclass holds the scenario's options);
- a dataset: a ``raysim.data.DatasetSpec``; a model: a ``raysim.models.ModelSpec``; a
  partitioner: a ``raysim.data.PartitionerSpec`` (each carries its ``Params`` dataclass and the
  function that builds it).

Entry points are read only when a name is not built in, and by ``raysim list``, so a run of
built-in components never scans the installed distributions. A built-in name always means the
built-in: a plugin that declares one is refused (naming both) whenever the group is read, as is
one name declared by two distributions. Every problem is one line (``PluginError``, a
``ScenarioError``: exit code 2).

This module knows no registry itself: each registry module binds its kind (``Kind``) and looks
names up through ``resolve`` (``raysim.algorithms.resolve``, ``raysim.data.dataset``,
``raysim.models.resolve``...). It imports nothing of raysim's but ``raysim.errors``.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raysim.errors import ScenarioError


class PluginError(ScenarioError):
    """A name that does not resolve: one line, exit code 2."""


@dataclass(frozen=True)
class Kind:
    """One kind of component: its entry-point group, its built-in registry and what a plugin
    of it must be (an instance of ``want``, or with ``subclass`` a class deriving from it)."""

    group: str  # entry-point group, e.g. "raysim.models"
    noun: str  # "model": how a message names one
    builtins: Mapping[str, Any]  # the registry, read at every lookup (tests may patch it)
    want: type  # ModelSpec, DatasetSpec, PartitionerSpec, Algorithm
    where: str  # the registry's path, e.g. "raysim.models.MODELS"
    subclass: bool = False  # algorithms: a class deriving from ``want``

    @property
    def what(self) -> str:
        path = f"{self.want.__module__}.{self.want.__qualname__}"
        return f"an {self.want.__name__} subclass ({path})" if self.subclass else f"a {self.want.__name__} ({path})"

    def fits(self, obj: Any) -> bool:
        if self.subclass:
            return isinstance(obj, type) and issubclass(obj, self.want)
        return isinstance(obj, self.want)


BUILT_IN = "built-in"
_SCANS: dict[str, dict[str, metadata.EntryPoint]] = {}  # group -> {name: entry point}
_FOUND: dict[tuple[str, str], Any] = {}  # (group, name) -> the loaded object


def resolve(kind: Kind, name: str) -> Any:
    """The component ``name`` of ``kind``: built-in, ``module:Name`` or an entry point.
    PluginError (one line) when it does not resolve."""
    if not isinstance(name, str):
        raise PluginError(f"{name!r} is not a name; choose one of {', '.join(kind.builtins)}")
    hit = kind.builtins.get(name)
    if hit is not None:
        return hit
    found = _FOUND.get((kind.group, name))
    if found is not None:
        return found
    obj = _from_module(kind, name) if ":" in name else _from_entry_point(kind, name)
    _FOUND[(kind.group, name)] = obj
    return obj


def source(ep: metadata.EntryPoint) -> str:
    """The distribution that declares ``ep``: "name version"."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"{dist.name} {dist.version}"


def listing(kind: Kind) -> list[tuple[str, str, Any]]:
    """(name, source, object) of every built-in and every entry point of ``kind`` (each
    loaded; one that fails to load is a PluginError): what `raysim list` shows."""
    out = [(n, BUILT_IN, obj) for n, obj in kind.builtins.items()]
    for n, ep in entry_points(kind).items():
        out.append((n, source(ep), resolve(kind, n)))
    return out


def entry_points(kind: Kind) -> dict[str, metadata.EntryPoint]:
    """The entry points of ``kind``'s group, by name, unloaded; PluginError when one takes a
    built-in name or two distributions declare one name."""
    found = _SCANS.get(kind.group)
    if found is not None:
        return found
    found = {}
    for ep in metadata.entry_points(group=kind.group):
        if ep.name in kind.builtins:
            raise PluginError(
                f"plugin {kind.noun} '{ep.name}' ({ep.value}, entry point of distribution "
                f"{source(ep)}) collides with the built-in {kind.noun} '{ep.name}' "
                f"({_origin(kind, ep.name)}); a built-in name always means the "
                f"built-in: rename the entry point in {source(ep).split()[0]}'s [project.entry-points."
                f'"{kind.group}"]'
            )
        other = found.get(ep.name)
        if other is not None and (other.value, source(other)) != (ep.value, source(ep)):
            raise PluginError(
                f"plugin {kind.noun} '{ep.name}' is declared by two distributions: {source(other)} "
                f"({other.value}) and {source(ep)} ({ep.value}); uninstall one or rename its entry point"
            )
        found[ep.name] = ep
    _SCANS[kind.group] = found
    return found


def _origin(kind: Kind, name: str) -> str:
    """Where the built-in ``name`` lives, for a message."""
    obj = kind.builtins[name]
    at = f"{kind.where}[{name!r}]"
    return f"{obj.__module__}.{obj.__qualname__}, {at}" if isinstance(obj, type) else at


def _from_entry_point(kind: Kind, name: str) -> Any:
    eps = entry_points(kind)
    ep = eps.get(name)
    if ep is None:
        choices = [*kind.builtins, *eps]
        raise PluginError(f"{name!r} is not one of the choices; choose one of {', '.join(choices)}")
    try:
        obj = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the plugin's import raises, sys.exit() too
        raise PluginError(
            f"{name!r}: entry point {ep.name} = {ep.value} (group {kind.group}) of distribution "
            f"{source(ep)} fails to load: {_first_line(e)}"
        ) from None
    if not kind.fits(obj):
        raise PluginError(
            f"{name!r}: entry point {ep.name} = {ep.value} (group {kind.group}) of distribution "
            f"{source(ep)} gives {_describe(obj)}, not {kind.what}"
        )
    return obj


def _from_module(kind: Kind, name: str) -> Any:
    module, _, attr = name.partition(":")
    parts = (*module.split("."), *attr.split("."))
    if ":" in attr or not all(p.isidentifier() for p in parts):
        raise PluginError(
            f"{name!r} is not module:Name (an importable module's dotted path, a colon, the name "
            f"of {kind.what} in it), e.g. mypkg.things:Thing"
        )
    try:
        mod = importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the user's module raises, sys.exit() too
        raise PluginError(
            f"{name!r}: module {module} does not import ({_first_line(e)}); it must be importable "
            f"by raysim and, on a cluster, on every node: installed, or on PYTHONPATH"
        ) from None
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            fits = [
                k
                for k, v in sorted(vars(mod).items())  # not the classes it imports
                if not k.startswith("_") and kind.fits(v) and not (isinstance(v, type) and v.__module__ != module)
            ]
            have = f"; {kind.noun}s in it: {', '.join(fits)}" if fits else f"; it has no {kind.what}"
            raise PluginError(
                f"{name!r}: module {module} ({getattr(mod, '__file__', '?')}) has no attribute {attr}{have}"
            )
        obj = getattr(obj, part)
    if not kind.fits(obj):
        raise PluginError(f"{name!r} is {_describe(obj)}, not {kind.what}")
    return obj


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"the function {getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    return f"a {type(obj).__name__}"


def _first_line(e: BaseException) -> str:
    """The exception's type and first line; a SystemExit says it is the plugin's own
    ``sys.exit``, which would otherwise end raysim with the plugin's exit code, having run nothing."""
    if isinstance(e, SystemExit):
        return f"SystemExit: it called sys.exit({e.code!r})"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
