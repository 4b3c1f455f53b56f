"""The sections that change how a client's update reaches the server, checked against the method
and the rest of the scenario: ``systems`` (the virtual clock: devices, availability, deadlines,
asynchronous aggregation; raysim.federation.fleet), ``privacy`` (DP-FedAvg's clipping and noise, or
DP-SGD's; raysim.federation.privacy) and ``communication`` (compressed uploads, or CHOCO-gossip's
compressed exchanges; raysim.federation.compression). ``validation.validate`` calls them in that
order, after the topology and the server.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import replace
from pathlib import Path

from raysim.scenario.federation_sections import CommunicationCfg, DistCfg, PrivacyCfg, SystemsCfg
from raysim.scenario.schema import Ctx, load_dataclass

DISTS = ("speed", "down", "up", "latency")  # the systems options drawn per client (DistCfg mappings)


def systems_section(ctx: Ctx, mapping, decentralized: bool, clients: int) -> SystemsCfg | None:
    """The ``systems`` section (None when left out): its distributions (nested mappings) and files
    checked."""
    if mapping is None:
        return None
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


def asynchronous_aggregation(ctx: Ctx, systems, method, algorithm, server, per_round: int) -> None:
    """``systems.aggregation`` fedbuff or fedasync, the server stepping its model as replies come:
    a method that can run so, none of a synchronous round's options, no server optimizer, and
    fedbuff's buffer no larger than the ``per_round`` clients training at once."""
    if systems is None or systems.aggregation == "sync":
        return
    import raysim.algorithms as algorithms

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
    if systems.aggregation == "fedbuff" and systems.buffer > per_round:
        ctx.fail(
            "systems.buffer",
            f"{systems.buffer} replies a step, but only {per_round} clients train at "
            f"once (the sampling section's count or fraction); give at most {per_round}",
        )


def privacy_section(ctx: Ctx, mapping, method, algorithm, topology, systems, k: int, ev) -> PrivacyCfg | None:
    """The ``privacy`` section, and the runs it applies to: a server averaging one model from
    uniformly sampled clients; None when left out. ``k``: the clients a round."""
    if mapping is None:
        return None
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


def communication_section(ctx: Ctx, mapping, method, algorithm, topology, systems, privacy) -> CommunicationCfg | None:
    """The ``communication`` section, and the runs it applies to: a server averaging one model
    from its clients' uploads, in synchronous rounds; None when left out."""
    if mapping is None:
        return None
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
