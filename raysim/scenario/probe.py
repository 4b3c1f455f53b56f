"""What a validated scenario names, opened once at the driver so that a problem stops the run
before it starts: the topology's first graph, the data source (files present and well-formed),
the model, the method built with them, the availability trace.

Also the two helpers the engine shares with these checks: ``make_source`` (the run's federated
data source) and ``split_unseen`` (which clients train and which are held out unseen).
"""

from __future__ import annotations

import numpy as np

from raysim import rng
from raysim.scenario.schema import Ctx
from raysim.scenario.sections import Scenario


def make_source(sc: Scenario):
    """The scenario's federated data source (cheap: files are read on first use)."""
    from raysim.data import PartitionCfg, Splits, build_source

    d = sc.data
    part = PartitionCfg(d.partition.name, d.partition.params) if d.partition is not None else None
    splits = Splits(d.splits.train, d.splits.val, d.splits.test)
    source = build_source(d.dataset.name, d.dataset.params, d.clients, part, splits, sc.seed)
    dfc = getattr(sc, "defence", None)
    if dfc is not None and dfc.rule is not None and dfc.rule.name == "fltrust":  # the server's root set
        from raysim.data import PooledSource

        assert isinstance(source, PooledSource)  # validation: fltrust needs a pooled dataset
        source.root_size = dfc.rule.params.root_size
    return source


def split_unseen(sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """(training client ids, unseen client ids), the unseen drawn from (seed, "unseen")."""
    n = sc.data.clients
    k = int(round(sc.eval.unseen_fraction * n))
    perm = rng.generator(sc.seed, "unseen").permutation(n)
    return np.sort(perm[: n - k]), np.sort(perm[n - k :])


def someone_online(ctx: Ctx, sc: Scenario) -> None:
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


def check_data_and_model(ctx: Ctx, sc: Scenario) -> None:
    """Open the data source (files present and well-formed), build the model once and, with
    a topology, its first graph; then the method with them."""
    _first_graph(ctx, sc)
    source, first = _open_source(ctx, sc)
    model, groups = _build_model(ctx, sc, source)
    if sc.privacy is not None and sc.privacy.level == "sample":
        _per_sample_gradients(ctx, sc, model, source, first)
    _method_takes(ctx, sc, source, groups)
    _data_attack(ctx, sc, source)


def _first_graph(ctx: Ctx, sc: Scenario) -> None:
    """A topology's first graph, drawn as the run draws it (an edge-list file read), and what
    the run would refuse of it (``topology.check_scenario``: FMMC's size limit)."""
    if sc.topology is not None:
        from raysim.federation import topology  # networkx and scipy: only a decentralized run needs them

        try:
            topology.check_scenario(sc.topology, sc.data.clients, sc.seed)
        except topology.TopologyError as e:
            ctx.fail("topology", str(e))
        _gossip_rule(ctx, sc, topology)


def _gossip_rule(ctx: Ctx, sc: Scenario, topology) -> None:
    """A gossip rule that cannot run at a node of the first graph (BRIDGE's n_i ≥ 2b + 1); with
    failing links or nodes such a round's node mixes plainly instead (``defence_fallbacks``)."""
    t, dfc = sc.topology, sc.defence
    if t is None or dfc is None or dfc.rule is None or t.link_failure or t.node_failure:
        return
    from raysim.federation import robust, robust_gossip

    rule = robust.GOSSIP_RULES[dfc.rule.name]
    b = robust_gossip.bridge_b(sc)
    g = topology.scenario_graph(t, sc.data.clients, sc.seed)
    for node in sorted(g.nodes):
        n = sum(1 for j in g.neighbors(node) if j != node)
        bad = rule.check(n, b, dfc.rule.params)
        if bad:
            ctx.fail("defence.rule", f"{bad} at client {node} of the {t.kind} graph (set defence.f for b)")


def _open_source(ctx: Ctx, sc: Scenario):
    """(the data source, its first client's data): reading one client finds missing or
    malformed files, and sizes beyond the machine's memory."""
    from raysim.data import DataError

    try:
        source = make_source(sc)
        first = source.client(0)
    except DataError as e:
        ctx.fail("data", str(e))
    except MemoryError as e:
        ctx.fail("data", f"more than this machine's memory ({e}); lower the data's sizes")
    return source, first


def _build_model(ctx: Ctx, sc: Scenario, source):
    """(the model built for the source's task, its layer groups: head, body, statistics)."""
    from raysim.core.groups import groups_of
    from raysim.models import build as build_model

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
    return model, groups


def _per_sample_gradients(ctx: Ctx, sc: Scenario, model, source, first) -> None:
    """DP-SGD (privacy.level sample) needs each sample's own gradient: no running statistics, no
    dropout, no sample seeing its batch (``per_sample_problem``, tried on a few of the first
    client's inputs)."""
    from raysim.federation.privacy import per_sample_problem

    decode = getattr(source, "pixels", None) or (lambda x: x)
    why = per_sample_problem(model, decode(first.train_x[:4]) if first.num_train >= 2 else None)
    if why:
        ctx.fail(
            "model.name",
            f"privacy.level sample needs each sample's own gradient, and '{sc.model.name}' {why} "
            f"(use group or layer norm and no dropout, or another model)",
        )


def _method_takes(ctx: Ctx, sc: Scenario, source, groups) -> None:
    """The method with this model and task: a model for unseen clients if there are any, its own
    refusals (its constructor's), and a head and a body if it keeps part of the model local."""
    import raysim.algorithms as algorithms
    from raysim.models import build as build_model

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


def _data_attack(ctx: Ctx, sc: Scenario, source) -> None:
    """A data-poisoning attack the data can take: labels to flip or to target (classification,
    classes within range) and, for a trigger, images it fits in."""
    a = sc.adversary.attack if sc.adversary is not None else None
    if a is None or a.name not in ("label_flip", "backdoor", "dba"):
        return
    if source.task != "classification":
        ctx.fail(
            "adversary.attack.name", f"{a.name} poisons class labels; dataset '{sc.data.dataset.name}' is {source.task}"
        )
    C = source.num_classes
    classes = (a.params.sources + a.params.targets) if a.name == "label_flip" else (a.params.target,)
    key = "targets" if a.name == "label_flip" else "target"
    if any(not 0 <= c < C for c in classes):
        ctx.fail(f"adversary.attack.{key}", f"classes run from 0 to {C - 1} in '{sc.data.dataset.name}'")
    if a.name == "label_flip":
        return
    hw = getattr(source, "image_shape", None)
    if hw is None or source.input_kind != "features":
        ctx.fail("adversary.attack.name", f"{a.name} stamps a trigger on images; '{sc.data.dataset.name}' has none")
    from raysim.federation import poisoning

    try:
        poisoning.triggers(a.params, tuple(hw))
    except ValueError as e:
        ctx.fail("adversary.attack", f"{e} (the images of '{sc.data.dataset.name}')")
