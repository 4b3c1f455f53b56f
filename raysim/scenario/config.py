"""Scenario files: load, override, validate.

A scenario is one YAML mapping. Every key is checked against a dataclass schema; an algorithm's,
dataset's, model's and partitioner's own options load into that component's own dataclass, so
its defaults come from one place. Every problem is reported as ONE line
``FILE: KEY.PATH: what is wrong; what is allowed`` through ScenarioError.

This module reads the files: the YAML, the command line's ``--set`` overrides, a sweep's
variants and grid, the seeds; and the scenario back as plain values (``resolved``, ``RunSpec``).
The checks themselves are ``validation.validate``'s (with ``federation_checks`` and ``probe``);
their names are re-exported here, the one place callers import the scenario's API from.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import yaml

from raysim.scenario.probe import make_source, split_unseen  # noqa: F401 - re-exported
from raysim.scenario.schema import (  # noqa: F401 - component and load_dataclass re-exported
    SEED,
    Ctx,
    ScenarioError,
    check_range,
    coerce,
    component,
    load_dataclass,
)
from raysim.scenario.sections import (  # noqa: F401
    TIMEOUT_MAX,
    CheckpointCfg,
    CommunicationCfg,
    DataCfg,
    DistCfg,
    EvalCfg,
    FinetuneCfg,
    PrivacyCfg,
    ResourcesCfg,
    SamplingCfg,
    Scenario,
    ServerCfg,
    SplitsCfg,
    SystemsCfg,
    TopologyCfg,
    TrackingCfg,
)
from raysim.scenario.validation import TOP_KEYS, absolute_uri, named, validate  # noqa: F401 - re-exported


# ----------------------------------------------------------------------------- overrides
def apply_override(raw: dict, item: str, file: str) -> None:
    """Apply ``a.b.c=value`` (value parsed as YAML) to the nested mapping ``raw`` in place."""
    if "=" not in item:
        raise ScenarioError(f"{file}: --set {item!r}: expected KEY=VALUE with a dotted key, e.g. algorithm.lr=0.01")
    key, _, text = item.partition("=")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    set_key(raw, key.strip(), value, file)


def set_key(raw: dict, key: str, value, file: str) -> None:
    """Set the dotted ``key`` of the nested mapping ``raw`` (creating mappings on the way)."""
    parts = key.split(".")
    if not all(parts):
        raise ScenarioError(f"{file}: {key!r}: empty key segment")
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        elif isinstance(nxt, str) and part in ("model", "algorithm"):
            nxt = node[part] = {"name": nxt}
        if not isinstance(nxt, dict):
            raise ScenarioError(f"{file}: {'.'.join(parts[: i + 1])}: is not a mapping, cannot set {key}")
        node = nxt
    node[parts[-1]] = value


# ----------------------------------------------------------------------------- loading
def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"{path}: no such file")
    if p.is_dir():
        raise ScenarioError(f"{path}: is a directory, expected a scenario YAML file")
    data = p.read_bytes()
    if b"\x00" in data:
        raise ScenarioError(f"{path}: not a text file (binary content); expected a YAML mapping")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text; expected a YAML mapping") from None
    if not text.strip():
        raise ScenarioError(f"{path}: empty file; expected a YAML mapping with {', '.join(TOP_KEYS[:4])}, ...")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ScenarioError(f"{path}: invalid YAML{where}: {problem}") from None
    if doc is None:
        raise ScenarioError(
            f"{path}: empty file (only comments); expected a YAML mapping with {', '.join(TOP_KEYS[:4])}, ..."
        )
    if not isinstance(doc, dict):
        raise ScenarioError(f"{path}: the document is {type(doc).__name__}, expected a YAML mapping of sections")
    return doc


def seeds_of(path: str | Path, cli: str | None = None) -> list[int] | None:
    """The seeds a command runs each variant with: ``--seeds 0,1,2`` (the command line wins),
    else the file's ``seeds: [0, 1, 2]``; None when neither is given."""
    where = "--seeds" if cli is not None else f"{path}: seeds"
    value = cli if cli is not None else read_yaml(path).get("seeds")
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    ctx = Ctx(where)
    try:
        seeds = [
            coerce(ctx, "", int, v.strip() if isinstance(v, str) else v)
            for v in (items if isinstance(items, list) else [items])
        ]
    except ScenarioError:
        raise ScenarioError(f"{where}: {value!r} is not a list of integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ScenarioError(f"{where}: {value!r}: give distinct integers >= 0, e.g. 0,1,2")
    for s in seeds:
        check_range(ctx, "", SEED, s)
    return seeds


def load(path: str | Path, overrides: list[str] = (), check_data: bool = True) -> Scenario:
    """Read, override and validate a scenario; raise ScenarioError on any problem. A file's
    ``seeds`` list is for ``raysim run`` (one run per seed); here the scenario's ``seed`` holds."""
    raw = read_yaml(path)
    raw.pop("seeds", None)
    for key in ("sweep", "grid"):
        if key in raw:
            raise ScenarioError(
                f"{path}: {key}: this file is a sweep; run it with `raysim run`, or pick one "
                f"variant with --variant NAME"
            )
    for item in overrides:
        apply_override(raw, item, str(path))
    return validate(raw, str(path), check_data=check_data)


GRID_EXAMPLE = "e.g. {algorithm.lr: [0.01, 0.1], algorithm.mu: [0.1, 1.0]}"
NOT_GRID = {
    "seed": "list the seeds in seeds: [0, 1, 2] (or --seeds 0,1,2): every variant runs once per seed",
    "name": "a grid variant's runs are named NAME-VARIANT already",
}


def grid_value(value) -> str:
    """A grid value as it reads in a variant's name: numbers as Python writes them (0.01,
    1e-05), true/false, null, text as it is, a list or mapping as compact JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        import json

        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def expand_grid(path: str | Path, sweep: dict | None, grid) -> dict[str, dict]:
    """``grid: {dotted.key: [values], ...}`` as ordinary sweep variants: one per combination
    (the cartesian product, the last key varying fastest), named by its values (``lr=0.01,mu=0.1``:
    each key by its last part, or whole where two keys share it). With a ``sweep`` section, every
    one of its variants at every combination (``fedprox,lr=0.01``): its own changes, then the
    grid's."""
    import itertools

    where = f"{path}: grid"
    if not isinstance(grid, dict) or not grid:
        raise ScenarioError(f"{where}: expected a mapping of dotted keys to lists of values, {GRID_EXAMPLE}")
    keys = [str(k) for k in grid]
    for key, values in zip(keys, grid.values()):
        if key in NOT_GRID:
            raise ScenarioError(f"{where}.{key}: not a grid key; {NOT_GRID[key]}")
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"{where}.{key}: expected a non-empty list of values, e.g. [0.01, 0.1]; got {values!r}")
        shown = [grid_value(v) for v in values]
        twice = next((v for i, v in enumerate(shown) if v in shown[:i]), None)
        if twice is not None:
            raise ScenarioError(f"{where}.{key}: {twice} is listed twice; list each value once")
        set_key({}, key, None, where)  # a well-formed dotted key
    last = [k.rsplit(".", 1)[-1] for k in keys]
    short = [part if last.count(part) == 1 else k for k, part in zip(keys, last)]
    points = [
        (",".join(f"{n}={grid_value(v)}" for n, v in zip(short, combo)), dict(zip(keys, combo)))
        for combo in itertools.product(*grid.values())
    ]
    if not sweep:
        return dict(points)
    out = {}
    for name, changes in sweep.items():
        both = [k for k in changes if str(k) in keys]
        if both:
            raise ScenarioError(f"{path}: sweep.{name}: sets {both[0]}, which grid also sets; set it in one place")
        for point, values in points:
            out[f"{name},{point}"] = {**changes, **values}
    return out


def load_variants(
    path: str | Path,
    overrides: list[str] = (),
    only: str | None = None,
    check_data: bool = True,
    seeds: list[int] | None = None,
) -> list[tuple[str | None, Scenario]]:
    """A scenario, or each variant of a sweep file: ``sweep: {NAME: {dotted.key: value, ...}}``
    applies each variant's overrides (then the command line's) to the same base scenario;
    ``grid: {dotted.key: [values], ...}`` adds one variant per combination of values
    (``expand_grid``: ordinary variants, crossed with the sweep's when there are both). With
    ``seeds``, every variant once per seed (variant-major order)."""
    raw = read_yaml(path)
    raw.pop("seeds", None)
    sweep = raw.pop("sweep", None)
    grid = raw.pop("grid", None)
    if sweep is not None:
        _check_sweep(path, sweep)
    if grid is not None:
        sweep = expand_grid(path, sweep, grid)
    if sweep is None:
        if only is not None:
            raise ScenarioError(f"{path}: --variant {only}: the file has no sweep section")
        for item in overrides:
            apply_override(raw, item, str(path))
        out = []
        for s in seeds or [None]:
            one = copy.deepcopy(raw)
            if s is not None:
                one["seed"] = s
            out.append((None, validate(one, str(path), check_data=check_data and not out)))
        return out
    chosen = None if only is None else pick_variants(path, only, list(sweep))
    out = []
    for name, changes in sweep.items():
        if chosen is not None and name not in chosen:
            continue
        variant = copy.deepcopy(raw)
        for key, value in changes.items():
            set_key(variant, str(key), value, f"{path}: sweep.{name}")
        for item in overrides:
            apply_override(variant, item, str(path))
        variant["name"] = f"{variant.get('name', Path(path).stem)}-{name}"
        for i, s in enumerate(seeds or [None]):
            one = copy.deepcopy(variant)
            if s is not None:
                one["seed"] = s
            try:
                out.append((str(name), validate(one, str(path), check_data=check_data and i == 0)))
            except ScenarioError as e:
                raise ScenarioError(f"{e} (in sweep variant '{name}')") from None
    return out


def pick_variants(path: str | Path, only: str, names: list) -> set:
    """The variants ``--variant`` names: the one of that name, else every one its shell-style
    pattern matches (``'*-shards,lr=0.01'``: ``*``, ``?``, ``[...]``)."""
    import fnmatch

    names = [str(n) for n in names]
    if only in names:
        return {only}
    matched = {n for n in names if fnmatch.fnmatchcase(n, only)}
    if not matched:
        what = "matches no variant" if any(c in only for c in "*?[") else "no such variant"
        raise ScenarioError(f"{path}: --variant {only}: {what}; choose one of {name_list(names)}")
    return matched


def name_list(names) -> str:
    """Variant names in one line: comma-separated, or semicolon-separated where a name holds a
    comma (a grid's ``lr=0.01,mu=0.1``)."""
    names = [str(n) for n in names]
    return ("; " if any("," in n for n in names) else ", ").join(names)


def _check_sweep(path: str | Path, sweep) -> None:
    if not isinstance(sweep, dict) or not sweep or not all(isinstance(v, dict) for v in sweep.values()):
        raise ScenarioError(
            f"{path}: sweep: expected a mapping of variant names to mappings of "
            "dotted keys, e.g. {ring: {topology.kind: ring}}"
        )


def resolved(sc: Scenario) -> dict:
    """The scenario as it runs, every key given: each section's options with their defaults
    filled in, each component's name beside its own options, relative paths made absolute.
    A mapping of plain values (JSON-ready) that ``validate`` turns back into the same scenario;
    a run logs it as ``scenario/resolved.json`` and, flattened, as its MLflow parameters."""

    def plain(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    def named_options(c, key: str) -> dict:
        return {key: c.name, **plain(c.params)}

    d = sc.data
    out = {}
    for key in TOP_KEYS:
        if key == "data":
            out[key] = {
                **named_options(d.dataset, "dataset"),
                "clients": d.clients,
                "partition": named_options(d.partition, "kind") if d.partition is not None else None,
                "splits": plain(d.splits),
            }
        elif key in ("model", "algorithm"):
            out[key] = named_options(getattr(sc, key), "name")
        elif key == "adversary" and sc.adversary is not None:
            a = sc.adversary
            out[key] = {**plain(a), "attack": named_options(a.attack, "name")}
        elif key == "defence" and sc.defence is not None:
            dfc = sc.defence
            pre = dfc.preaggregate
            out[key] = {
                "f": dfc.f,
                "chunk": dfc.chunk,
                **named_options(dfc.rule, "rule"),
                "preaggregate": named_options(pre, "kind") if pre is not None else None,
            }
        else:
            out[key] = plain(getattr(sc, key))
    return out


@dataclasses.dataclass(frozen=True)
class TrackingRef:
    uri: str | None
    experiment: str


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What tracking needs of a scenario, as plain values: a process without the methods'
    modules and PyTorch (``tracker_process``) receives it in place of the scenario."""

    name: str
    algorithm: str
    dataset: str
    model: str
    path: str
    seed: int
    tracking: TrackingRef
    raw: dict
    resolved: dict
    checkpoints: str | None = None  # checkpoint.dir: the run's folder is checkpoints/RUN_ID

    @classmethod
    def of(cls, sc) -> RunSpec:
        return cls(
            sc.name,
            sc.algorithm.name,
            sc.data.dataset.name,
            sc.model.name,
            str(sc.path),
            sc.seed,
            TrackingRef(sc.tracking.uri, sc.tracking.experiment),
            sc.raw,
            resolved(sc),
            str(sc.checkpoint.dir),
        )
