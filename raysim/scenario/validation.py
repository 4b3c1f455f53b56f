"""Validation: a scenario's raw mapping (its YAML file after the overrides) checked, section by
section, into a frozen ``Scenario``.

``validate`` reads as the order of its steps: the top-level keys, the data, the model and the
algorithm, sampling, eval, resources, tracking, checkpoint, the topology, the server, the
method's own options, then the sections of ``federation_checks`` (systems, privacy,
communication) and last what ``probe`` opens (the availability trace; the data and the model).
The order is part of the behaviour: of several problems, the first step's is the one reported.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from raysim import plugins
from raysim.scenario import adversary_sections, federation_checks, probe
from raysim.scenario.schema import SEED, Component, Ctx, check_range, coerce, component, load_dataclass
from raysim.scenario.sections import (
    CheckpointCfg,
    DataCfg,
    EvalCfg,
    FinetuneCfg,
    ResourcesCfg,
    SamplingCfg,
    Scenario,
    ServerCfg,
    SplitsCfg,
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
    "adversary",
    "defence",
)
DATA_KEYS = ("dataset", "clients", "partition", "splits")  # what else data holds is the dataset's options


def validate(raw: dict, file: str, check_data: bool = True) -> Scenario:
    """The scenario the mapping ``raw`` describes, or ScenarioError with the first problem
    (``file`` names it). ``check_data``: also open the data source and build the model."""
    ctx = Ctx(file)
    name, seed, rounds = _top_level(ctx, raw, file)
    data = _data(ctx, raw["data"])
    model, algorithm, method = _model_and_algorithm(ctx, raw["model"], raw["algorithm"])
    sampling = _sampling(ctx, raw.get("sampling"))
    ev = _eval(ctx, raw.get("eval"), method, algorithm, data.splits)
    train_clients = _training_clients(ctx, ev, sampling, data.clients)
    resources = _resources(ctx, raw.get("resources"), data.clients)
    tracking = _tracking(ctx, raw.get("tracking"))
    checkpoint = load_dataclass(ctx, "checkpoint", CheckpointCfg, raw.get("checkpoint"))
    _eval_clients(ctx, ev)
    topology = _topology(ctx, raw.get("topology"), method, algorithm, ev, sampling)
    server = _server(ctx, raw.get("server"), method, algorithm, topology)
    _method_options(ctx, method, algorithm, topology)
    per_round = _clients_per_round(sampling, train_clients)
    systems = federation_checks.systems_section(ctx, raw.get("systems"), topology is not None, data.clients)
    federation_checks.asynchronous_aggregation(ctx, systems, method, algorithm, server, per_round)
    privacy = federation_checks.privacy_section(
        ctx, raw.get("privacy"), method, algorithm, topology, systems, per_round, ev
    )
    communication = federation_checks.communication_section(
        ctx, raw.get("communication"), method, algorithm, topology, systems, privacy
    )
    robust = (method, algorithm, topology, systems, privacy, communication)
    adversary = adversary_sections.adversary_section(ctx, raw.get("adversary"), *robust, train_clients, data.clients)
    defence = adversary_sections.defence_section(ctx, raw.get("defence"), *robust, data)
    adversary_sections.byzantine_limits(ctx, adversary, defence, per_round, train_clients, topology)
    dataset, checkpoint, tracking, topology = _absolute_paths(data.dataset, checkpoint, tracking, topology)
    sc = Scenario(
        file,
        name,
        seed,
        rounds,
        replace(data, dataset=dataset),
        _absolute_model_paths(model),
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
        adversary,
        defence,
    )
    if systems is not None and systems.availability == "trace":
        probe.someone_online(ctx, sc)
    if check_data:
        probe.check_data_and_model(ctx, sc)
    return sc


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


def _top_level(ctx: Ctx, raw: dict, file: str) -> tuple[str, int, int]:
    """Only known sections, the required ones given; (the run's name, by default the file's
    stem, its seed, its number of rounds)."""
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
    return name, seed, rounds


def _data(ctx: Ctx, d) -> DataCfg:
    """The ``data`` section: the dataset (built in or a plugin's) with its own options, the
    number of clients, their partition and each client's train/val/test splits."""
    from raysim import data as datasets
    from raysim.data import DATASETS

    if not isinstance(d, dict):
        ctx.fail("data", f"expected a mapping, got {type(d).__name__}")
    dataset = named(
        ctx,
        "data",
        {k: v for k, v in d.items() if k not in DATA_KEYS[1:]},
        "dataset",
        DATASETS,
        datasets.dataset,
        lambda s: s.Params,
    )
    if "clients" not in d:
        ctx.fail("data.clients", "missing; give the number of clients (an integer >= 1)")
    clients = coerce(ctx, "data.clients", int, d["clients"])
    check_range(ctx, "data.clients", {"min": 1}, clients)
    partition = _partition(ctx, dataset.name, d.get("partition"))
    splits = load_dataclass(ctx, "data.splits", SplitsCfg, d.get("splits"))
    if abs(splits.train + splits.val + splits.test - 1.0) > 1e-6:
        ctx.fail("data.splits", f"train + val + test = {splits.train + splits.val + splits.test:g}; they must sum to 1")
    return DataCfg(dataset, clients, partition, splits)


def _partition(ctx: Ctx, dataset: str, mapping) -> Component | None:
    """``data.partition``, by the dataset: a pooled one takes any partitioner (a plugin's too),
    another the ones it names (``partitions_of``), one of users none (it has its own split)."""
    from raysim import data as datasets
    from raysim.data import DATASETS, PARTITIONERS, partitions_of
    from raysim.data.mixture import problem as mixture_problem

    allowed = partitions_of(dataset)
    partition = None
    if datasets.dataset(dataset).pooled:  # any partitioner, a plugin's too
        partition = named(
            ctx,
            "data.partition",
            mapping,
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
            ctx.fail("data.partition.kind", f"dataset '{dataset}' takes {', '.join(allowed)}: {e}")
        partition = component(ctx, "data.partition", mapping, "kind", choices, lambda s: s.Params, default=allowed[0])
    if partition is not None and partition.name == "mixture":
        bad = mixture_problem(partition.params)
        if bad is not None:
            ctx.fail(f"data.partition.{bad[0]}", bad[1])
    if partition is None and mapping is not None:
        ctx.fail(
            "data.partition",
            f"dataset '{dataset}' has its own client split; "
            f"partition applies only to {', '.join(n for n in DATASETS if partitions_of(n))}",
        )
    return partition


def _model_and_algorithm(ctx: Ctx, model, algorithm) -> tuple[Component, Component, type]:
    """(the model, the algorithm, the algorithm's class): each built in or a plugin's, with its
    own options; the later sections are checked against the class's capabilities."""
    import raysim.algorithms as algorithms
    from raysim import models
    from raysim.models import MODELS

    model = named(ctx, "model", model, "name", MODELS, models.spec, lambda s: s.Params)
    algorithm = named(ctx, "algorithm", algorithm, "name", algorithms.REGISTRY, algorithms.resolve, lambda a: a.Hyper)
    return model, algorithm, algorithms.resolve(algorithm.name)


def _sampling(ctx: Ctx, mapping) -> SamplingCfg:
    """The clients that train each round: a fraction or a count of them; all by default."""
    sampling = load_dataclass(ctx, "sampling", SamplingCfg, mapping)
    if sampling.fraction is not None and sampling.count is not None:
        ctx.fail("sampling", "give either fraction or count, not both")
    if sampling.fraction is None and sampling.count is None:
        sampling = SamplingCfg(fraction=1.0)
    return sampling


def _eval(ctx: Ctx, mapping, method, algorithm, splits: SplitsCfg) -> EvalCfg:
    """The ``eval`` section with its nested ``finetune``: a local update before evaluation needs
    a global model to update, and ``validation: true`` a validation split to score."""
    import raysim.algorithms as algorithms

    nested = isinstance(mapping, dict)
    ev = load_dataclass(
        ctx, "eval", EvalCfg, {k: v for k, v in mapping.items() if k != "finetune"} if nested else mapping
    )
    ev = replace(
        ev, finetune=load_dataclass(ctx, "eval.finetune", FinetuneCfg, mapping.get("finetune") if nested else None)
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
    return ev


def _training_clients(ctx: Ctx, ev: EvalCfg, sampling: SamplingCfg, clients: int) -> int:
    """The clients that train, those ``eval.unseen_fraction`` leaves: at least one, and at
    least sampling's count."""
    train_clients = clients - int(round(ev.unseen_fraction * clients))
    if train_clients < 1:
        ctx.fail("eval.unseen_fraction", f"{ev.unseen_fraction} leaves no training client out of {clients}")
    if sampling.count is not None and sampling.count > train_clients:
        ctx.fail("sampling.count", f"{sampling.count} is more than the {train_clients} training clients")
    return train_clients


def _clients_per_round(sampling: SamplingCfg, train_clients: int) -> int:
    """K, the clients that train at once: sampling's count, or its fraction of the training clients."""
    return sampling.count if sampling.count is not None else max(1, int(round(sampling.fraction * train_clients)))


def _resources(ctx: Ctx, mapping, clients: int) -> ResourcesCfg:
    """The ``resources`` section: at most one host a client (by default, as many as there are)."""
    resources = load_dataclass(ctx, "resources", ResourcesCfg, mapping)
    if resources.hosts > clients and "hosts" not in (mapping or {}):
        resources = replace(resources, hosts=clients)  # the default on fewer clients
    if resources.hosts > clients:
        ctx.fail(
            "resources.hosts",
            f"{resources.hosts} hosts for {clients} clients; give at most {clients} (a host holds one client or more)",
        )
    return resources


def _tracking(ctx: Ctx, mapping) -> TrackingCfg:
    """The ``tracking`` section: an MLflow experiment's name, and a tracking URI MLflow can open."""
    tracking = load_dataclass(ctx, "tracking", TrackingCfg, mapping)
    if not tracking.experiment.strip():
        ctx.fail("tracking.experiment", "empty; give the MLflow experiment's name, e.g. raysim")
    if tracking.uri:
        from raysim.scenario.stores import unknown_store

        if unknown := unknown_store(tracking.uri):
            ctx.fail("tracking.uri", unknown)
    return tracking


def _eval_clients(ctx: Ctx, ev: EvalCfg) -> None:
    """``eval.clients``, the clients scored: a fraction (at most 1) or a whole count."""
    if ev.clients is not None and ev.clients > 1 and ev.clients != int(ev.clients):
        ctx.fail("eval.clients", f"{ev.clients:g}: a count (above 1) must be a whole number; a fraction is at most 1")


def _topology(ctx: Ctx, mapping, method, algorithm, ev: EvalCfg, sampling: SamplingCfg) -> TopologyCfg | None:
    """The ``topology`` section (None when left out): a decentralized run, neighbours gossiping
    with no server, for a method with a decentralized form, every client in every round."""
    if mapping is None:
        return None
    import raysim.algorithms as algorithms

    topology = load_dataclass(ctx, "topology", TopologyCfg, mapping)
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
    return topology


def _server(ctx: Ctx, mapping, method, algorithm, topology) -> ServerCfg:
    """The ``server`` section: a server optimizer needs a server, and a global model to step."""
    import raysim.algorithms as algorithms

    server = load_dataclass(ctx, "server", ServerCfg, mapping)
    if server.optimizer != "none":
        if not method.has_server_params():
            stepped = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.has_server_params())
            ctx.fail(
                "server.optimizer",
                f"'{algorithm.name}' has no global model for a server optimizer to step; use none, or one of {stepped}",
            )
        if topology is not None:
            ctx.fail("server.optimizer", "a server optimizer needs a server; use none with a topology")
    return server


def _method_options(ctx: Ctx, method, algorithm, topology) -> None:
    """The method's own checks of its options (``Algorithm.check``), knowing whether it gossips."""
    problem = method.check(algorithm.params, topology is not None)
    if problem is not None:
        ctx.fail(f"algorithm.{problem[0]}", problem[1])


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
