"""Scenario files: load, override, validate.

A scenario is one YAML mapping. Every key is checked against a dataclass schema; an algorithm's,
dataset's, model's and partitioner's own options load into that component's own dataclass, so
its defaults come from one place. Every problem is reported as ONE line
``FILE: KEY.PATH: what is wrong; what is allowed`` through ScenarioError.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from raysim import plugins, rng
from raysim.scenario.schema import SEED, Ctx, ScenarioError, check_range, coerce, component, load_dataclass
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

TOP_KEYS = (
    "name",
    "seed",
    "rounds",
    "data",
    "model",
    "algorithm",
    "sampling",
    "eval",
    "resources",
    "tracking",
    "checkpoint",
    "topology",
    "server",
    "systems",
    "privacy",
    "communication",
)


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
        )


def named(ctx: Ctx, path: str, mapping, key: str, builtins: dict, lookup, params_of, default=None):
    """``component`` for a section whose name may also be a plugin's (``raysim.plugins``): a
    name that is not built in resolves through ``lookup`` (``module:Name`` or an entry point),
    and its failure is the key's one-line error."""
    name = mapping if isinstance(mapping, str) else mapping.get(key, default) if isinstance(mapping, dict) else None
    registry = builtins
    if isinstance(name, str) and name not in builtins:
        try:
            registry = {name: lookup(name)}
        except plugins.PluginError as e:
            ctx.fail(f"{path}.{key}", str(e))
    return component(ctx, path, mapping, key, registry, params_of, default=default)


def validate(raw: dict, file: str, check_data: bool = True) -> Scenario:
    import raysim.algorithms as algorithms
    from raysim import data as datasets
    from raysim import models
    from raysim.data import DATASETS, PARTITIONERS, partitions_of
    from raysim.data.mixture import problem as mixture_problem
    from raysim.models import MODELS

    ctx = Ctx(file)
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        ctx.fail(str(unknown[0]), f"unknown section; allowed: {', '.join(TOP_KEYS)}")
    for required in ("rounds", "data", "model", "algorithm"):
        if required not in raw:
            ctx.fail(required, "missing required section")
    name = coerce(ctx, "name", str, raw.get("name", Path(file).stem))
    seed = coerce(ctx, "seed", int, raw.get("seed", 0))
    check_range(ctx, "seed", SEED, seed)
    rounds = coerce(ctx, "rounds", int, raw["rounds"])
    check_range(ctx, "rounds", {"min": 1}, rounds)

    d = raw["data"]
    if not isinstance(d, dict):
        ctx.fail("data", f"expected a mapping, got {type(d).__name__}")
    data_keys = ("dataset", "clients", "partition", "splits")
    dataset = named(
        ctx,
        "data",
        {k: v for k, v in d.items() if k not in data_keys[1:]},
        "dataset",
        DATASETS,
        datasets.dataset,
        lambda s: s.Params,
    )
    if "clients" not in d:
        ctx.fail("data.clients", "missing; give the number of clients (an integer >= 1)")
    clients = coerce(ctx, "data.clients", int, d["clients"])
    check_range(ctx, "data.clients", {"min": 1}, clients)
    allowed = partitions_of(dataset.name)
    partition = None
    if datasets.dataset(dataset.name).pooled:  # any partitioner, a plugin's too
        partition = named(
            ctx,
            "data.partition",
            d.get("partition"),
            "kind",
            PARTITIONERS,
            datasets.partitioner,
            lambda s: s.Params,
            default=allowed[0],
        )
    elif allowed:
        try:
            choices = {k: datasets.partitioner(k) for k in allowed}
        except plugins.PluginError as e:
            ctx.fail("data.partition.kind", f"dataset '{dataset.name}' takes {', '.join(allowed)}: {e}")
        partition = component(
            ctx, "data.partition", d.get("partition"), "kind", choices, lambda s: s.Params, default=allowed[0]
        )
    if partition is not None and partition.name == "mixture":
        bad = mixture_problem(partition.params)
        if bad is not None:
            ctx.fail(f"data.partition.{bad[0]}", bad[1])
    if partition is None and d.get("partition") is not None:
        ctx.fail(
            "data.partition",
            f"dataset '{dataset.name}' has its own client split; "
            f"partition applies only to {', '.join(n for n in DATASETS if partitions_of(n))}",
        )
    splits = load_dataclass(ctx, "data.splits", SplitsCfg, d.get("splits"))
    if abs(splits.train + splits.val + splits.test - 1.0) > 1e-6:
        ctx.fail("data.splits", f"train + val + test = {splits.train + splits.val + splits.test:g}; they must sum to 1")

    model = named(ctx, "model", raw["model"], "name", MODELS, models.spec, lambda s: s.Params)
    algorithm = named(
        ctx, "algorithm", raw["algorithm"], "name", algorithms.REGISTRY, algorithms.resolve, lambda a: a.Hyper
    )
    method = algorithms.resolve(algorithm.name)
    sampling = load_dataclass(ctx, "sampling", SamplingCfg, raw.get("sampling"))
    if sampling.fraction is not None and sampling.count is not None:
        ctx.fail("sampling", "give either fraction or count, not both")
    if sampling.fraction is None and sampling.count is None:
        sampling = SamplingCfg(fraction=1.0)
    ev_raw = raw.get("eval")
    nested = isinstance(ev_raw, dict)
    ev = load_dataclass(
        ctx, "eval", EvalCfg, {k: v for k, v in ev_raw.items() if k != "finetune"} if nested else ev_raw
    )
    ev = replace(
        ev, finetune=load_dataclass(ctx, "eval.finetune", FinetuneCfg, ev_raw.get("finetune") if nested else None)
    )
    if ev.finetune.epochs and not method.has_global_model():
        with_global = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.has_global_model())
        ctx.fail(
            "eval.finetune",
            f"'{algorithm.name}' has no global model to update locally; leave "
            f"eval.finetune out (or epochs: 0), or choose one of {with_global}",
        )
    if ev.validation is True and splits.val <= 0:
        ctx.fail(
            "eval.validation",
            "true, but data.splits.val is 0: there is no validation split to score; "
            "carve one, e.g. data.splits: {train: 0.7, val: 0.1, test: 0.2}, or use auto",
        )
    train_clients = clients - int(round(ev.unseen_fraction * clients))
    if train_clients < 1:
        ctx.fail("eval.unseen_fraction", f"{ev.unseen_fraction} leaves no training client out of {clients}")
    if sampling.count is not None and sampling.count > train_clients:
        ctx.fail("sampling.count", f"{sampling.count} is more than the {train_clients} training clients")
    resources = load_dataclass(ctx, "resources", ResourcesCfg, raw.get("resources"))
    if resources.hosts > clients and "hosts" not in (raw.get("resources") or {}):
        resources = replace(resources, hosts=clients)  # the default on fewer clients
    if resources.hosts > clients:
        ctx.fail(
            "resources.hosts",
            f"{resources.hosts} hosts for {clients} clients; give at most {clients} (a host holds one client or more)",
        )
    tracking = load_dataclass(ctx, "tracking", TrackingCfg, raw.get("tracking"))
    if not tracking.experiment.strip():
        ctx.fail("tracking.experiment", "empty; give the MLflow experiment's name, e.g. raysim")
    if tracking.uri:
        from raysim.scenario.stores import unknown_store

        if unknown := unknown_store(tracking.uri):
            ctx.fail("tracking.uri", unknown)
    checkpoint = load_dataclass(ctx, "checkpoint", CheckpointCfg, raw.get("checkpoint"))
    if ev.clients is not None and ev.clients > 1 and ev.clients != int(ev.clients):
        ctx.fail("eval.clients", f"{ev.clients:g}: a count (above 1) must be a whole number; a fraction is at most 1")
    topology = None
    if raw.get("topology") is not None:
        topology = load_dataclass(ctx, "topology", TopologyCfg, raw["topology"])
        gossip = [n for n, a in algorithms.REGISTRY.items() if a.decentralized]
        if not method.decentralized:
            why = f" ({method.no_gossip})" if method.no_gossip else ""
            ctx.fail(
                "algorithm.name",
                f"'{algorithm.name}' has no decentralized form{why}; with a topology choose one of {', '.join(gossip)}",
            )
        if (topology.link_failure or topology.node_failure) and topology.mixing != "metropolis":
            ctx.fail(
                "topology.mixing",
                f"'{topology.mixing}' is solved once for a fixed graph; with link or node "
                "failures W is rebuilt every round: use metropolis",
            )
        if topology.kind == "edges" and not topology.edges:
            ctx.fail("topology.edges", "kind 'edges' needs the path of an edge-list file")
        if topology.edges and not Path(topology.edges).is_file():
            ctx.fail("topology.edges", f"no such file {topology.edges}")
        if ev.unseen_fraction > 0:
            ctx.fail("eval.unseen_fraction", "unseen clients are not part of a gossip graph; use 0 with a topology")
        if sampling.count is not None or sampling.fraction != 1.0:
            ctx.fail("sampling", "every client takes part in every gossip round; leave sampling out with a topology")

    server = load_dataclass(ctx, "server", ServerCfg, raw.get("server"))
    if server.optimizer != "none":
        if not method.has_server_params():
            stepped = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.has_server_params())
            ctx.fail(
                "server.optimizer",
                f"'{algorithm.name}' has no global model for a server optimizer to step; use none, or one of {stepped}",
            )
        if topology is not None:
            ctx.fail("server.optimizer", "a server optimizer needs a server; use none with a topology")

    problem = method.check(algorithm.params, topology is not None)
    if problem is not None:
        ctx.fail(f"algorithm.{problem[0]}", problem[1])
    systems = None
    if raw.get("systems") is not None:
        systems = _systems(ctx, raw["systems"], topology is not None, clients)
        if systems.aggregation != "sync":
            if not method.has_async():
                stepped = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.has_async())
                why = method.not_asynchronous or "it has no global model"
                ctx.fail(
                    "systems.aggregation",
                    f"{systems.aggregation} steps a global model with each reply; "
                    f"'{algorithm.name}' cannot run so ({why}); use sync, or one of {stepped}",
                )
            for key, neutral in (("deadline_s", None), ("over_selection", 1.0)):
                if getattr(systems, key) != neutral:
                    ctx.fail(
                        f"systems.{key}",
                        f"a synchronous round's; {systems.aggregation} has no rounds to wait for (leave it out)",
                    )
            if server.optimizer != "none":
                ctx.fail("server.optimizer", f"{systems.aggregation} steps the model itself; use none with it")
            concurrency = (
                sampling.count if sampling.count is not None else max(1, int(round(sampling.fraction * train_clients)))
            )
            if systems.aggregation == "fedbuff" and systems.buffer > concurrency:
                ctx.fail(
                    "systems.buffer",
                    f"{systems.buffer} replies a step, but only {concurrency} clients train at "
                    f"once (the sampling section's count or fraction); give at most {concurrency}",
                )

    privacy = None
    if raw.get("privacy") is not None:
        k = sampling.count if sampling.count is not None else max(1, int(round(sampling.fraction * train_clients)))
        privacy = _privacy(ctx, raw["privacy"], method, algorithm, topology, systems, k, ev)
    communication = None
    if raw.get("communication") is not None:
        communication = _communication(ctx, raw["communication"], method, algorithm, topology, systems, privacy)

    dataset, checkpoint, tracking, topology = _absolute_paths(dataset, checkpoint, tracking, topology)
    model = _absolute_model_paths(model)
    sc = Scenario(
        file,
        name,
        seed,
        rounds,
        DataCfg(dataset, clients, partition, splits),
        model,
        algorithm,
        sampling,
        ev,
        resources,
        tracking,
        checkpoint,
        topology,
        raw,
        server,
        systems,
        privacy,
        communication,
    )
    if systems is not None and systems.availability == "trace":
        _someone_online(ctx, sc)
    if check_data:
        _check_data_and_model(ctx, sc)
    return sc


def _someone_online(ctx: Ctx, sc: Scenario) -> None:
    """The availability trace read (a bad row stops the run before it starts), and some
    training client given a window in it: without one, no round would train anyone."""
    from raysim.federation import fleet

    cfg = sc.systems
    try:
        trace = fleet.read_windows(cfg.availability_trace, sc.data.clients, cfg.period_s if cfg.trace_repeats else None)
    except fleet.TraceError as e:
        ctx.fail("systems.availability_trace", str(e))
    train, _ = split_unseen(sc)
    opens = trace.openings()
    if not any(opens[c] for c in train.tolist()):
        unseen = " (the unseen clients do not train)" if len(train) < sc.data.clients else ""
        ctx.fail(
            "systems.availability_trace",
            f"{cfg.availability_trace} gives none of the {len(train)} training "
            f"clients of ids 0 to {sc.data.clients - 1} a window that opens{unseen}: no round could train anyone",
        )


def _upload_section(ctx: Ctx, key: str, cls, mapping, method, algorithm, what: str):
    """A section that transforms what each client uploads (``privacy``, ``communication``): its
    options, and the one kind of method it applies to, whose reply is the one model the server
    averages (``Algorithm.averages_one_model``)."""
    import raysim.algorithms as algorithms

    if not isinstance(mapping, dict):
        ctx.fail(key, f"expected a mapping of options, got {type(mapping).__name__}")
    cfg = load_dataclass(ctx, key, cls, mapping)
    if not method.averages_one_model():
        fits = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.averages_one_model())
        ctx.fail(
            "algorithm.name",
            f"'{algorithm.name}' does not reply with the one model the server averages, "
            f"which {what} apply to; with {key} use one of {fits}",
        )
    if getattr(algorithm.params, "track_variance", False):
        ctx.fail(
            "algorithm.track_variance",
            f"measures the clients' raw updates, which {key} changes before the server sees them; leave it false",
        )
    return cfg


def _privacy(ctx: Ctx, mapping, method, algorithm, topology, systems, k: int, ev) -> PrivacyCfg:
    """The ``privacy`` section, and the runs it applies to: a server averaging one model from
    uniformly sampled clients."""
    from raysim.federation import privacy

    if isinstance(mapping, dict) and mapping.get("level") == "sample":
        return _sample_privacy(ctx, mapping, method, algorithm, topology, systems, ev)
    cfg = _upload_section(ctx, "privacy", PrivacyCfg, mapping, method, algorithm, "DP-FedAvg's clipping and noise")
    _check_noise(ctx, cfg)
    cfg = dataclasses.replace(cfg, accounting=cfg.accounting or "sampled")
    if cfg.batches is not None:
        ctx.fail("privacy.batches", "is how DP-SGD forms its batches (level sample); leave it out with level client")
    if topology is not None:
        ctx.fail(
            "privacy",
            "client-level DP here bounds what a server learns from its clients' updates; leave the topology out",
        )
    if systems is not None:
        ctx.fail(
            "privacy",
            "the accountant assumes clients sampled uniformly at random each round, which "
            "availability, dropouts, deadlines and asynchrony change; leave systems out",
        )
    try:
        privacy.update_multiplier(cfg, k)
    except ValueError as e:
        key, _, why = str(e).partition(": ")
        ctx.fail(key, f"{why} (K = {k} clients a round{', σ_b = K/20' if cfg.count_noise is None else ''})")
    return cfg


def _outside_dp_sgd(ctx: Ctx, method, algorithm, ev) -> None:
    """Training on a client's data that the sample-level accountant would not count is refused:
    the local update before evaluation (``eval.finetune``, fedavg+'s by default) trains without
    DP-SGD, and an unseen client that personalizes by training runs steps no round counts."""
    from raysim.algorithms import Algorithm

    probe = method.__new__(method)  # the method's default local update, from its options
    probe.hp = algorithm.params
    epochs = ev.finetune.epochs if ev.finetune.epochs is not None else probe.default_finetune_epochs()
    if epochs:
        ctx.fail(
            "eval.finetune",
            f"the local update before evaluation trains on each client's data outside "
            f"DP-SGD ({epochs} epoch{'s' * (epochs > 1)}), which privacy.level sample does not count; "
            f"set eval.finetune.epochs: 0, or use fedavg, fedprox or ditto",
        )
    if ev.unseen_fraction > 0 and method.personalize is not Algorithm.personalize:
        ctx.fail(
            "eval.unseen_fraction",
            f"'{algorithm.name}' personalizes unseen clients by training on their data, "
            f"which privacy.level sample does not count; leave eval.unseen_fraction at 0",
        )


def _check_noise(ctx: Ctx, cfg: PrivacyCfg) -> None:
    """z is 0 (clipping alone) or at least ``privacy.MIN_NOISE``: the accountant has no finite
    answer much below it, and what it gives there is no guarantee."""
    from raysim.federation.privacy import MIN_NOISE

    if 0 < cfg.noise_multiplier < MIN_NOISE:
        ctx.fail(
            "privacy.noise_multiplier",
            f"{cfg.noise_multiplier:g} is 0 (clipping only) or at least {MIN_NOISE:g} "
            f"(below it ε exceeds 10^5 and the accountant overflows)",
        )


def _sample_privacy(ctx: Ctx, mapping, method, algorithm, topology, systems, ev) -> PrivacyCfg:
    """``privacy`` with ``level: sample``: DP-SGD in every local step of a method whose only use
    of a client's training data that leaves it is that training (``trains_with_dp_sgd``)."""
    import raysim.algorithms as algorithms

    cfg = load_dataclass(ctx, "privacy", PrivacyCfg, mapping)
    _check_noise(ctx, cfg)
    if not method.trains_with_dp_sgd():
        fits = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.trains_with_dp_sgd())
        ctx.fail(
            "algorithm.name",
            f"'{algorithm.name}' uses its clients' data beyond DP-SGD's steps on the task's "
            f"loss (its own objective, or what it sends); with privacy.level sample use one of {fits}",
        )
    _outside_dp_sgd(ctx, method, algorithm, ev)
    if topology is not None:
        ctx.fail(
            "privacy.level",
            "sample-level DP here runs on the star (its accountant counts a client's local "
            "steps); leave the topology out",
        )
    if systems is not None and systems.aggregation != "sync":
        ctx.fail(
            "privacy.level",
            f"sample-level DP counts the rounds each client trains in, in synchronous rounds; "
            f"use systems.aggregation: sync (not {systems.aggregation})",
        )
    for key in ("target_quantile", "count_noise"):
        if getattr(cfg, key) is not None:
            ctx.fail(
                f"privacy.{key}",
                "is adaptive clipping of client updates (level client); leave it out with level sample",
            )
    if cfg.clip_lr != PrivacyCfg.__dataclass_fields__["clip_lr"].default:
        ctx.fail(
            "privacy.clip_lr", "is adaptive clipping of client updates (level client); leave it out with level sample"
        )
    if cfg.accounting == "sampled":
        ctx.fail(
            "privacy.accounting",
            "level sample counts each batch as Poisson-sampled (poisson, or leave it out); "
            "sampled is the clients' sampling of level client",
        )
    return dataclasses.replace(cfg, accounting="poisson", batches=cfg.batches or "shuffle")


def _communication(ctx: Ctx, mapping, method, algorithm, topology, systems, privacy) -> CommunicationCfg:
    """The ``communication`` section, and the runs it applies to: a server averaging one model
    from its clients' uploads, in synchronous rounds."""
    if topology is not None:
        return _gossip_communication(ctx, mapping)
    cfg = _upload_section(ctx, "communication", CommunicationCfg, mapping, method, algorithm, "compressors")
    if cfg.gossip_step is not None:
        ctx.fail(
            "communication.gossip_step",
            "is CHOCO-gossip's consensus step, for decentralized runs (a topology); leave it out here",
        )
    if systems is not None and systems.aggregation != "sync":
        ctx.fail(
            "communication",
            f"compressed uploads are averaged in synchronous rounds; use systems.aggregation: "
            f"sync (not {systems.aggregation})",
        )
    if privacy is not None and privacy.level == "client":
        ctx.fail(
            "communication",
            "a compressed update may be longer than privacy.clip (randk scales it up, "
            "error feedback adds earlier rounds), which would void the guarantee; use one of the two sections",
        )
    if cfg.error_feedback and cfg.compress not in ("topk", "randk"):
        ctx.fail(
            "communication.error_feedback",
            f"is for the sparsifiers topk and randk; {cfg.compress} sends "
            f"{'the update whole' if cfg.compress == 'none' else 'an unbiased quantization'}: leave it false",
        )
    return cfg


def _gossip_communication(ctx: Ctx, mapping) -> CommunicationCfg:
    """``communication`` with a topology: CHOCO-gossip (raysim/federation/compression.py), the neighbours
    exchanging compressed differences to public copies of the models."""
    if not isinstance(mapping, dict):
        ctx.fail("communication", f"expected a mapping of options, got {type(mapping).__name__}")
    cfg = load_dataclass(ctx, "communication", CommunicationCfg, mapping)
    if cfg.gossip_step is None:
        ctx.fail(
            "communication.gossip_step",
            "CHOCO-gossip's consensus step γ is needed with a topology: 1 with "
            "compress none is plain gossip; the paper tunes it per compressor (e.g. 0.1 to 0.5 for topk 10%)",
        )
    if cfg.error_feedback:
        ctx.fail(
            "communication.error_feedback",
            "is for uploads to a server; CHOCO-gossip's public copies keep what a compressor drops: leave it false",
        )
    return cfg


DISTS = ("speed", "down", "up", "latency")


def _systems(ctx: Ctx, mapping, decentralized: bool, clients: int) -> SystemsCfg:
    """The ``systems`` section: its distributions (nested mappings) and files checked."""
    if not isinstance(mapping, dict):
        ctx.fail("systems", f"expected a mapping of options, got {type(mapping).__name__}")
    if decentralized:
        ctx.fail(
            "systems",
            "the virtual clock drives a server's rounds; it is not simulated with a topology yet "
            "(leave systems out, or the topology)",
        )
    cfg = load_dataclass(ctx, "systems", SystemsCfg, {k: v for k, v in mapping.items() if k not in DISTS}, skip=DISTS)
    dists = {}
    for key in DISTS:
        if key not in mapping:
            continue
        given = mapping[key]
        if isinstance(given, dict):  # over the section's default for this key (speed: 100, ...)
            given = {**dataclasses.asdict(getattr(SystemsCfg(), key)), **given}
        d = load_dataclass(ctx, f"systems.{key}", DistCfg, given)
        if d.dist == "uniform" and not d.low < d.high:
            ctx.fail(f"systems.{key}", f"uniform needs low < high (got low {d.low:g}, high {d.high:g})")
        positive = d.low if d.dist == "uniform" else d.value
        if key != "latency" and positive <= 0:
            what = "low" if d.dist == "uniform" else "value"
            ctx.fail(f"systems.{key}.{what}", f"{positive:g}: a {key} must be above 0")
        dists[key] = d
    cfg = replace(cfg, **dists)
    for key in ("device_trace", "availability_trace"):
        path = getattr(cfg, key)
        if path is not None:
            if not Path(path).is_file():
                ctx.fail(f"systems.{key}", f"no such file {path}")
            cfg = replace(cfg, **{key: os.path.abspath(path)})
            if key == "device_trace":  # the file read now, so a bad row stops the run before it starts
                from raysim.federation import fleet  # (the availability trace: with the training clients, below)

                try:
                    fleet.read_devices(path, clients)
                except fleet.TraceError as e:
                    ctx.fail(f"systems.{key}", str(e))
    if cfg.availability == "trace" and cfg.availability_trace is None:
        ctx.fail("systems.availability_trace", "availability: trace needs the path of a CSV of client,start_s,end_s")
    return cfg


def _absolute_model_paths(model):
    """A model's weights file made absolute at the driver (hosts build the model elsewhere)."""
    import dataclasses

    p = model.params
    if dataclasses.is_dataclass(p) and isinstance(getattr(p, "weights", None), str) and p.weights:
        return dataclasses.replace(model, params=dataclasses.replace(p, weights=os.path.abspath(p.weights)))
    return model


def _absolute_paths(dataset, checkpoint, tracking, topology):
    """Relative paths made absolute here, at the driver: host actors may run on
    other nodes, in other working directories (``raw``, the user's text, is unchanged)."""
    import dataclasses

    params = dataset.params
    if dataclasses.is_dataclass(params) and isinstance(getattr(params, "root", None), str) and params.root:
        params = dataclasses.replace(params, root=os.path.abspath(params.root))
        dataset = dataclasses.replace(dataset, params=params)
    checkpoint = dataclasses.replace(checkpoint, dir=os.path.abspath(checkpoint.dir))
    if tracking.uri:
        tracking = dataclasses.replace(tracking, uri=absolute_uri(tracking.uri))
    if topology is not None and topology.edges:
        topology = dataclasses.replace(topology, edges=os.path.abspath(topology.edges))
    return dataset, checkpoint, tracking, topology


def absolute_uri(uri: str) -> str:
    """A SQLite tracking URI with a relative path made absolute (here, at the driver); any
    other URI as it is."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////") and uri != "sqlite:///:memory:":
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///") :])
    return uri


def make_source(sc: Scenario):
    """The scenario's federated data source (cheap: files are read on first use)."""
    from raysim.data import PartitionCfg, Splits, build_source

    d = sc.data
    part = PartitionCfg(d.partition.name, d.partition.params) if d.partition is not None else None
    splits = Splits(d.splits.train, d.splits.val, d.splits.test)
    return build_source(d.dataset.name, d.dataset.params, d.clients, part, splits, sc.seed)


def _check_data_and_model(ctx: Ctx, sc: Scenario) -> None:
    """Open the data source (files present and well-formed), build the model once and, with
    a topology, its first graph."""
    import raysim.algorithms as algorithms
    from raysim.core.groups import groups_of
    from raysim.data import DataError
    from raysim.models import build as build_model

    if sc.topology is not None:
        from raysim.federation import topology  # networkx and scipy: only a decentralized run needs them

        try:
            topology.check_scenario(sc.topology, sc.data.clients, sc.seed)
        except topology.TopologyError as e:
            ctx.fail("topology", str(e))

    try:
        source = make_source(sc)
        first = source.client(0)
    except DataError as e:
        ctx.fail("data", str(e))
    except MemoryError as e:
        ctx.fail("data", f"more than this machine's memory ({e}); lower the data's sizes")
    try:
        model = build_model(sc.model.name, sc.model.params, source)
    except ValueError as e:
        ctx.fail("model.name", str(e))
    except (RuntimeError, MemoryError) as e:  # torch's allocator refused it
        ctx.fail("model", f"cannot be built ({str(e).splitlines()[0]}); lower its sizes")
    try:
        groups = groups_of(model)
    except ValueError as e:
        ctx.fail("model.head", str(e).removeprefix("model.head: "))
    if sc.privacy is not None and sc.privacy.level == "sample":  # DP-SGD needs per-sample gradients
        from raysim.federation.privacy import per_sample_problem

        decode = getattr(source, "pixels", None) or (lambda x: x)
        why = per_sample_problem(model, decode(first.train_x[:4]) if first.num_train >= 2 else None)
        if why:
            ctx.fail(
                "model.name",
                f"privacy.level sample needs each sample's own gradient, and '{sc.model.name}' {why} "
                f"(use group or layer norm and no dropout, or another model)",
            )
    cls = algorithms.resolve(sc.algorithm.name)
    if sc.eval.unseen_fraction > 0 and not cls.unseen:
        ctx.fail(
            "eval.unseen_fraction",
            f"{sc.algorithm.name} has no model for a client that never trained; use 0 (its default)",
        )
    try:  # a method's own refusals of this model or task (e.g. MOCHA: linear models only)
        from raysim.core.tasks import TASKS

        cls(
            sc.algorithm.params,
            lambda variant=0: build_model(sc.model.name, sc.model.params, source),
            sc.rounds,
            TASKS[source.task],
        )
    except ValueError as e:
        ctx.fail("algorithm.name", str(e).splitlines()[0])
    if cls.split and not (groups.head and any(i not in groups.stats for i in groups.body)):
        ctx.fail(
            "model.head",
            f"{sc.algorithm.name} keeps part of the model local and shares the rest, so the model "
            f"needs a head and a body; {sc.model.name}'s layers with parameters are "
            f"{', '.join(k or '(the model itself)' for k in groups.layers)} and its head is "
            f"{', '.join(groups.names[i] for i in groups.head)} (set model.head or pick a deeper model)",
        )


def split_unseen(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """(training client ids, unseen client ids), the unseen drawn from (seed, "unseen")."""
    n = sc.data.clients
    k = int(round(sc.eval.unseen_fraction * n))
    perm = rng.generator(sc.seed, "unseen").permutation(n)
    return np.sort(perm[: n - k]), np.sort(perm[n - k :])
