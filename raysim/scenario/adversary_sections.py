"""The Byzantine sections: ``adversary`` (which clients are malicious and what they do) and
``defence`` (the server's robust aggregation), as dataclasses with each key's type, range and help,
and their checks against the method and the rest of the scenario (``adversary_section``,
``defence_section``; ``validation.validate`` calls them after the other federation sections).

The attacks and rules themselves are ``raysim.federation.attacks`` (model poisoning),
``raysim.federation.poisoning`` (data poisoning) and ``raysim.federation.robust`` (the defences);
their options load into their own ``Params`` dataclasses, so their defaults live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from raysim.scenario.schema import Component, Ctx, component, load_dataclass

ADVERSARY_KEYS = ("fraction", "clients", "participation", "attack")
DEFENCE_KEYS = ("f", "preaggregate", "chunk")


@dataclass(frozen=True)
class AdversaryCfg:
    """Malicious clients: who (a share drawn from the seed, or a list), how they take part, what they do."""

    fraction: float | None = field(
        default=0.2,
        metadata={
            "min": 0.0,
            "lt": 1.0,
            "help": "share of the training clients that are malicious, drawn from the seed (0: none, the clean run)",
        },
    )
    clients: tuple[int, ...] | None = field(
        default=None, metadata={"help": "the malicious clients' ids instead of a drawn share"}
    )
    participation: str = field(
        default="sampled",
        metadata={
            "choices": ("sampled", "always"),
            "help": "sampled: drawn each round like the others; always: every malicious client in every round, "
            "the honest ones filling the rest of the round's sample",
        },
    )
    # a model-poisoning attack (raysim.federation.attacks) or a data one (poisoning); set on loading
    attack: Component | None = None


@dataclass(frozen=True)
class DefenceCfg:
    """The server's robust aggregation of each round's updates."""

    f: int | None = field(
        default=None,
        metadata={
            "min": 0,
            "help": "the Byzantine clients the rule assumes in a round; null: the adversary's share of the round's "
            "clients, rounded up (0 without an adversary)",
        },
    )
    chunk: int | None = field(
        default=None,
        metadata={"min": 1, "help": "columns of the K × d updates a rule works on at once (null: all d)"},
    )
    rule: Component | None = None  # raysim.federation.robust.DEFENCES; set on loading
    preaggregate: Component | None = None  # raysim.federation.robust.PREAGGREGATORS


# --------------------------------------------------------------------------- the registry of attacks


def attack_registry() -> dict[str, Any]:
    """Every attack by name: the model-poisoning ones, then the data-poisoning ones."""
    from raysim.federation.attacks import ATTACKS
    from raysim.federation.poisoning import DATA_ATTACKS

    return {**ATTACKS, **DATA_ATTACKS}


def is_data_attack(name: str) -> bool:
    from raysim.federation.poisoning import DATA_ATTACKS

    return name in DATA_ATTACKS


# --------------------------------------------------------------------------- checks


def _robust_method(ctx: Ctx, key: str, method, algorithm, topology, systems, privacy, communication) -> None:
    """A section that needs each client's reply at the server: a method whose replies are models
    trained from what the server sent (``Algorithm.takes_robust``), in synchronous star rounds,
    without another transform of the uploads."""
    import raysim.algorithms as algorithms

    if topology is not None:  # gossip: the nodes' shared parameters, mixed by raysim.federation.robust_gossip
        if communication is not None:
            ctx.fail(key, "compressed gossip (communication) mixes estimates, not the sent models; leave one out")
        return
    if not method.takes_robust():
        fits = ", ".join(n for n, a in algorithms.REGISTRY.items() if a.takes_robust())
        ctx.fail(
            "algorithm.name",
            f"'{algorithm.name}' does not reply with models trained from the ones the server sent, "
            f"which {key} acts on; use one of {fits}",
        )
    if getattr(algorithm.params, "track_variance", False):
        ctx.fail("algorithm.track_variance", f"measures the raw updates, which {key} changes; leave it false")
    if systems is not None and systems.aggregation != "sync":
        ctx.fail(
            key, f"acts on a synchronous round's updates; use systems.aggregation: sync (not {systems.aggregation})"
        )
    for other, cfg in (("privacy", privacy), ("communication", communication)):
        if cfg is not None:
            ctx.fail(key, f"{other} transforms the uploads on the clients; use one of the two sections")


def adversary_section(
    ctx: Ctx, mapping, method, algorithm, topology, systems, privacy, communication, train_clients: int, clients: int
) -> AdversaryCfg | None:
    """The ``adversary`` section (None when left out): its attack and options, its malicious clients."""
    if mapping is None:
        return None
    if not isinstance(mapping, dict):
        ctx.fail("adversary", f"expected a mapping of options, got {type(mapping).__name__}")
    if "attack" not in mapping:
        ctx.fail("adversary.attack", f"missing; choose one of {', '.join(attack_registry())}")
    _robust_method(ctx, "adversary", method, algorithm, topology, systems, privacy, communication)
    attack = component(ctx, "adversary.attack", mapping["attack"], "name", attack_registry(), lambda a: a.Params)
    cfg = load_dataclass(
        ctx, "adversary", AdversaryCfg, {k: v for k, v in mapping.items() if k != "attack"}, skip=("attack",)
    )
    cfg = replace(cfg, attack=attack)
    if cfg.clients is None and cfg.fraction is None:
        ctx.fail("adversary.fraction", "null needs adversary.clients, the list of malicious clients")
    if cfg.clients is not None:
        if mapping.get("fraction") is not None:
            ctx.fail("adversary", "give either fraction or clients, not both")
        bad = [c for c in cfg.clients if not 0 <= c < clients]
        if bad:
            ctx.fail("adversary.clients", f"{bad[0]} is not a client id; ids run from 0 to {clients - 1}")
        if len(set(cfg.clients)) != len(cfg.clients):
            ctx.fail("adversary.clients", "lists a client twice")
        cfg = replace(cfg, fraction=None)  # the list decides: no default share beside it
    if topology is not None and not is_data_attack(attack.name):
        from raysim.federation.attacks import ATTACKS

        if ATTACKS[attack.name].omniscient(attack.params):
            local = [n for n, a in ATTACKS.items() if not a.omniscient(a.Params())]
            ctx.fail(
                "adversary.attack.name",
                f"{attack.name} reads the honest clients' updates, which a gossip node does not see; with a "
                f"topology use {', '.join(local)} or a data attack",
            )
    p = attack.params
    if attack.name == "label_flip" and p.mode == "target" and (not p.sources or len(p.sources) != len(p.targets)):
        ctx.fail(
            "adversary.attack.targets", "mode target needs sources and targets of one length (a target per source)"
        )
    return cfg


def defence_section(
    ctx: Ctx, mapping, method, algorithm, topology, systems, privacy, communication, data=None
) -> DefenceCfg | None:
    """The ``defence`` section (None when left out): the rule with its options, f, a pre-aggregator;
    with a topology, a gossip rule (``robust.GOSSIP_RULES``, f being BRIDGE's b)."""
    from raysim.federation.robust import DEFENCES, GOSSIP_RULES, PREAGGREGATORS

    if mapping is None:
        return None
    if isinstance(mapping, str):
        mapping = {"rule": mapping}
    if not isinstance(mapping, dict):
        ctx.fail("defence", f"expected a mapping with 'rule', got {type(mapping).__name__}")
    _robust_method(ctx, "defence", method, algorithm, topology, systems, privacy, communication)
    rules, others = (GOSSIP_RULES, DEFENCES) if topology is not None else (DEFENCES, GOSSIP_RULES)
    name = mapping.get("rule")
    if isinstance(name, str) and name in others:
        ctx.fail(
            "defence.rule",
            f"{name} is a {'server' if topology is not None else 'gossip'} rule; "
            f"{'with' if topology is not None else 'without'} a topology choose one of {', '.join(rules)}",
        )
    if topology is not None and mapping.get("preaggregate") not in (None, "none"):
        ctx.fail("defence.preaggregate", "pre-aggregation acts on a server's round; leave it out with a topology")
    rule = component(
        ctx,
        "defence",
        {k: v for k, v in mapping.items() if k not in DEFENCE_KEYS},
        "rule",
        rules,
        lambda d: d.params,
    )
    if rule.name == "fltrust":
        _fltrust(ctx, method, data)
    pre = None
    if mapping.get("preaggregate") not in (None, "none"):
        pre = component(
            ctx, "defence.preaggregate", mapping["preaggregate"], "kind", PREAGGREGATORS, lambda s: s.params
        )
    plain = load_dataclass(
        ctx,
        "defence",
        DefenceCfg,
        {k: v for k, v in mapping.items() if k in ("f", "chunk")},
        skip=("rule", "preaggregate"),
    )
    return replace(plain, rule=rule, preaggregate=pre)


def _fltrust(ctx: Ctx, method, data) -> None:
    """FLTrust's root set: carved from a pooled dataset's pool, trained on as FedAvg trains."""
    from raysim.data import dataset

    if not method.averages_one_model():
        ctx.fail(
            "defence.rule",
            "fltrust scores each update against the server's update of the one model; use a method that "
            "averages one model (fedavg, fedprox, ...)",
        )
    if data is not None:
        if not dataset(data.dataset.name).pooled:
            ctx.fail(
                "defence.rule",
                f"fltrust carves its root set from a pooled dataset's pool; {data.dataset.name} is not one",
            )
        if data.partition is not None and data.partition.name == "mixture":
            ctx.fail("defence.rule", "fltrust's root set is not drawn from a mixture partition's sources")


def byzantine_limits(
    ctx: Ctx, adversary: AdversaryCfg | None, defence: DefenceCfg | None, k: int, train_clients: int, topology=None
):
    """A round's limits: the malicious clients an attack needs and tolerates, the rule's limit on f
    (Krum's 2f + 2 < K, Bulyan's 4f + 3 ≤ K, ...) for the K updates it sees. Returns f. (With a
    topology a gossip rule's limits are a node's neighbourhood's, which the scheduler checks.)"""
    if topology is not None:
        return 0 if defence is None or defence.f is None else defence.f
    from raysim.federation.adversary import expected_malicious
    from raysim.federation.robust import DEFENCES, PREAGGREGATORS

    m = expected_malicious(adversary, k, train_clients)
    if adversary is not None:
        if adversary.participation == "always" and adversary.clients is not None and len(adversary.clients) > k:
            ctx.fail(
                "adversary.participation",
                f"always puts all {len(adversary.clients)} malicious clients in rounds of {k}; sample more clients",
            )
        a = adversary.attack
        assert a is not None  # validated sections always carry their attack
        if m and not is_data_attack(a.name):
            from raysim.federation.attacks import ATTACKS

            bad = ATTACKS[a.name].check(a.params, k, m)
            if bad:
                ctx.fail("adversary.attack", f"{bad} (a round of {k} clients, {m} of them malicious)")
    if defence is None:
        return 0
    f = defence.f if defence.f is not None else m
    seen = k
    if defence.preaggregate is not None:
        step = PREAGGREGATORS[defence.preaggregate.name]
        bad = step.check(k, f, defence.preaggregate.params)
        if bad:
            ctx.fail("defence.preaggregate", f"{bad} (a round of {k} clients)")
        seen = step.inputs(k, defence.preaggregate.params)
    rule = defence.rule
    assert rule is not None
    bad = DEFENCES[rule.name].check(seen, f, rule.params)
    if bad:
        where = (
            f"{seen} inputs after {defence.preaggregate.name}"
            if defence.preaggregate is not None
            else f"{k} clients a round"
        )
        why = (
            ""
            if defence.f is not None
            else f"; f is the adversary's {m} of the round's {k} (set defence.f to change it)"
        )
        ctx.fail("defence.rule", f"{bad} ({where}{why})")
    return f
