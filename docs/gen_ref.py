"""MkDocs hook (``hooks:`` in mkdocs.yml): the generated reference pages.

At every build, ``on_files`` writes three pages from the code itself, so they cannot drift
from it, and the architecture page's two figures (``docs/gen_figures.py``); none of them is
committed:

- ``reference/scenario.md``: every scenario key, from the section dataclasses
  (``raysim.scenario.sections``, which re-exports ``federation_sections``') and the components'
  own options dataclasses (the algorithms' ``Hyper``, the models', datasets' and partitioners'
  ``Params``): type, default, allowed
  values (field metadata ``choices``/``min``/``max``/``gt``/``lt`` and the class-level
  ``CHOICES``/``POSITIVE``/``NONNEGATIVE``, as ``raysim.scenario.schema.load_dataclass`` applies them)
  and help;
- ``reference/cli.md``: ``raysim.cli.build_parser()``'s subcommands and arguments, and the exit
  codes (``raysim.cli``'s docstring, checked against ``raysim.errors``' constants);
- ``reference/methods.md``: the registries: the methods catalogue (a row per algorithm from its
  class attributes: paper, family, what a client keeps and sends, decentralized, unseen
  clients, head/body split), each algorithm's summary, docstrings and options, and the
  datasets, models and partitioners.

A key the code adds without a description here (a new top-level section, a new exit code)
stops the build with an error naming it, rather than leaving a page that silently misses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import re
import sys
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("mkdocs.hooks.gen_ref")  # under "mkdocs": --strict counts its warnings

SCENARIO, CLI, METHODS = "reference/scenario.md", "reference/cli.md", "reference/methods.md"


# ----------------------------------------------------------------------------- MkDocs events
def on_files(files, config):
    """Add the generated pages (replacing any file of the same name in docs/)."""
    from mkdocs.structure.files import File

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for uri, make in ((SCENARIO, scenario_page), (CLI, cli_page), (METHODS, methods_page)):
        old = files.get_file_from_path(uri)
        if old is not None:
            log.warning(
                f"docs/{uri} is generated at build time from the code (docs/gen_ref.py); "
                f"delete the file, it is not used"
            )
            files.remove(old)
        files.append(File.generated(config, uri, content=make()))
    figures = _figures()
    for uri, make in figures.FIGURES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


def _figures():
    """docs/gen_figures.py (the architecture page's figures), loaded by path: docs/ is no package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_figures", ROOT / "docs" / "gen_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_serve(server, config, builder):
    """``mkdocs serve``: rebuild when the code the pages come from changes."""
    for folder in ("raysim", "algorithms"):
        server.watch(str(ROOT / folder))
    return server


# ----------------------------------------------------------------------------- Markdown helpers
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _escape_plain(s: str, markup: bool) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if not markup:  # help strings are plain text: no emphasis or links
        s = re.sub(r"([\\`*_\[\]])", r"\\\1", s)
    # no attribute lists ({...}) and no table cells split at a pipe
    return s.replace("{", "&#123;").replace("}", "&#125;").replace("|", "\\|")


def text(s: str, markup: bool = False) -> str:
    """Text as Markdown: HTML's special characters (and, unless ``markup``, Markdown's)
    escaped outside code spans; code spans kept as written."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(s):
        out.append(_escape_plain(s[pos : m.start()], markup))
        out.append(m.group(0))
        pos = m.end()
    out.append(_escape_plain(s[pos:], markup))
    return "".join(out)


def code(s: str) -> str:
    """An inline code span holding ``s`` (backticks inside are fenced by longer runs)."""
    s = str(s)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+")


def docstring(doc: str | None) -> str:
    """A docstring (plain text with light Markdown: lists, ``code``, **bold**) as Markdown.

    Line breaks the author laid out are kept: a line indented deeper than its paragraph (or
    than its list item's text), such as an equation on a line of its own, starts a new line;
    a list right after a paragraph line gets the blank line Markdown needs."""
    if not doc:
        return ""
    out: list[str] = []
    base: int | None = None  # the current paragraph's indent
    item: int | None = None  # the current list item's text column
    laid_out = False  # the previous line was laid out on its own
    for raw in inspect.cleandoc(doc).splitlines():
        if not raw.strip():
            out.append("")
            base = item = None
            laid_out = False
            continue
        indent = len(raw) - len(raw.lstrip())
        body = text(raw.strip(), markup=True)
        m = _ITEM.match(raw)
        if m and (item is None or indent < item) and (base is None or indent <= base):
            if out and out[-1] and item is None:
                out.append("")  # a list needs a blank line before it
            out.append(raw[: m.end()].strip() + " " + text(raw[m.end() :].strip(), markup=True))
            base, item, laid_out = indent, m.end(), False
            continue
        expected = item if item is not None else base
        if expected is None:  # a paragraph's first line
            out.append(body)
            base = indent
        elif indent > expected and out:  # a line laid out on its own
            out[-1] += "<br>&emsp;" + body
            laid_out = True
        elif laid_out:  # the text goes on below such lines
            out[-1] += "<br>" + body
            laid_out = False
        else:
            out.append(("    " if item is not None else "") + body)
    return "\n".join(out).strip() + "\n"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("\n", " ") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def first_line(doc: str | None) -> str:
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else ""


def anchor(prefix: str, name: str) -> str:
    """A heading id: ``fedavg+`` and ``fedavg`` must not share one."""
    return f"{prefix}-" + re.sub(r"[^a-z0-9]+", "-", name.lower().replace("+", "-plus")).strip("-")


def own_doc(cls) -> str | None:
    """A class's own docstring; None for a dataclass's generated ``Name(field: type, ...)``."""
    doc = cls.__dict__.get("__doc__")
    if not doc or (dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "(")):
        return None
    return doc


# ----------------------------------------------------------------------------- schema as rows
def type_name(t) -> str:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in typing.get_args(t)]
        return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]
    if origin is tuple:
        return f"list of {type_name(typing.get_args(t)[0])}s"
    if dataclasses.is_dataclass(t):
        return "mapping"
    return {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}.get(
        t, getattr(t, "__name__", str(t))
    )


def yaml_value(v) -> str:
    """A value as it is written in a scenario file."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v and re.fullmatch(r"[\w.+/:-]+", v) and v not in ("null", "true", "false") else repr(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    return repr(v)


def field_meta(cls, f) -> dict:
    """The field's effective metadata, with the class-level CHOICES/POSITIVE/NONNEGATIVE
    merged in as ``raysim.scenario.schema.load_dataclass`` does."""
    meta = dict(f.metadata)
    choices = getattr(cls, "CHOICES", {})
    if f.name in choices:
        meta["choices"] = choices[f.name]
    if f.name in getattr(cls, "POSITIVE", ()):
        meta.setdefault("gt", 0)
    if f.name in getattr(cls, "NONNEGATIVE", ()):
        meta.setdefault("min", 0)
    return meta


def allowed(meta: dict) -> str:
    parts = []
    if "choices" in meta:
        parts.append(" \\| ".join(code(yaml_value(c)) for c in meta["choices"]))
    for key, op in (("min", "≥"), ("gt", ">"), ("max", "≤"), ("lt", "<")):
        if key in meta:
            parts.append(f"{op} {yaml_value(meta[key])}".replace("<", "&lt;").replace(">", "&gt;"))
    return ", ".join(parts)


def default_of(f) -> str:
    if f.default is not dataclasses.MISSING:
        return code(yaml_value(f.default))
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "see below" if dataclasses.is_dataclass(value) else code(yaml_value(value))
    return "required"


def key_rows(cls, prefix: str) -> list[list[str]]:
    """[key, type, default, allowed, help] for every field of ``cls``, nested dataclasses as
    dotted keys (the nested key's own row first)."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, t = f"{prefix}{f.name}", hints[f.name]
        meta = field_meta(cls, f)
        rows.append([code(key), type_name(t), default_of(f), allowed(meta), text(meta.get("help", ""))])
        if dataclasses.is_dataclass(t):
            rows += key_rows(t, key + ".")
    return rows


KEY_HEADER = ["Key", "Type", "Default", "Allowed", "Description"]


# ----------------------------------------------------------------------------- scenario page
# The keys raysim.scenario.config.validate reads itself, outside any dataclass: (type, default, allowed,
# help). A top-level section is described by its dataclass (the Scenario field's type).
def _scalars() -> dict[str, tuple[str, str, str, str]]:
    from raysim.scenario.schema import SEED
    from raysim.scenario.sections import DataCfg

    data_help = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(DataCfg)}
    return {
        "name": (
            "string",
            "the file's name without .yaml",
            "",
            "the run's name (MLflow's run name); a sweep variant's is NAME-VARIANT",
        ),
        "seed": (
            "integer",
            code("0"),
            allowed(SEED),
            "the seed every random draw derives from (partition, model init, sampling, batches)",
        ),
        "rounds": ("integer", "required", "≥ 1", "communication rounds"),
        "seeds": (
            "list of integers",
            "none",
            "distinct, each as seed",
            f"{code('raysim run')} runs every variant once per seed, nested under one parent run "
            f"(the command line's {code('--seeds')} wins)",
        ),
        "sweep": (
            "mapping",
            "none",
            "",
            f"variants {code('{NAME: {dotted.key: value, ...}}')}, each applied to the rest of the file "
            f"(run them with {code('raysim run')}; one with {code('--variant NAME')})",
        ),
        "grid": (
            "mapping",
            "none",
            "each list non-empty, its values distinct",
            f"{code('{dotted.key: [value, ...], ...}')}: one variant per combination of values (the cartesian "
            f"product), named by them ({code('lr=0.01,mu=0.1')}); with {code('sweep')}, every variant at "
            f"every combination ({code('fedprox,lr=0.01')})",
        ),
        "data.dataset": ("string", "required", "a dataset below", "the dataset; its own options sit beside it in data"),
        "data.clients": ("integer", "required", "≥ 1", text(data_help["clients"] or "number of clients")),
        "data.partition.kind": (
            "string",
            "the dataset's first (iid for a pooled dataset)",
            "a partitioner below",
            f"how a pooled dataset is split among the clients; {code('partition: NAME')} "
            f"is short for {code('partition: {kind: NAME}')}; its options sit beside kind",
        ),
        "model.name": (
            "string",
            "required",
            "a model below",
            f"the model; {code('model: NAME')} is short for {code('model: {name: NAME}')}",
        ),
        "algorithm.name": (
            "string",
            "required",
            "an algorithm below",
            f"the method; {code('algorithm: NAME')} is short for {code('algorithm: {name: NAME}')}",
        ),
    }


SECTION_NOTES = {
    "sampling": "Give either `fraction` or `count`, not both; neither: every training client, every round. "
    "Leave it out with a topology (every client takes part in every gossip round).",
    "topology": "Absent or null: the clients train with a server (a star). Present: decentralized, each "
    "client gossips with its neighbours (only methods with a decentralized form).",
    "resources": "`hosts` defaults to the number of clients when there are fewer clients than 2.",
}


def _scalar_row(key: str, spec) -> list[str]:
    typ, default, allow, help_ = spec
    return [code(key), typ, default, allow, help_]


def _section_class(name: str):
    """The dataclass of a top-level section (``Scenario``'s field's type, Optional unwrapped)."""
    from raysim.scenario.sections import Scenario

    t = typing.get_type_hints(Scenario).get(name)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t


def _component_sections(
    title: str,
    intro: str,
    registry: dict,
    params_of,
    prefix: str,
    id_prefix: str,
    extra=None,
    summary_of=lambda spec: spec.summary,
    plugins: bool = True,
) -> list[str]:
    more = (
        f" Besides the built-in ones listed here, a name may be {code('module:Name')} or an installed "
        "plugin's ([Plugins](../how-to/plugins.md))."
        if plugins
        else ""
    )
    out = [f"## {title} {{ #{id_prefix}s }}\n", intro + more + "\n"]
    for name, spec in registry.items():
        out.append(f"### {name} {{ #{anchor(id_prefix, name)} }}\n")
        out.append(text(summary_of(spec)) + "\n")
        if extra:
            out.append(extra(name, spec) + "\n")
        params = params_of(spec)
        rows = key_rows(params, prefix)
        out.append(table(KEY_HEADER, rows) if rows else "No options of its own.\n")
    return out


def scenario_page() -> str:
    import raysim.algorithms as algorithms
    from raysim.data import DATASETS, PARTITIONERS, partitions_of
    from raysim.models import MODELS
    from raysim.scenario.config import TOP_KEYS
    from raysim.scenario.schema import Component
    from raysim.scenario.sections import DataCfg, Scenario

    scalars = _scalars()
    fields = set(typing.get_type_hints(Scenario))
    missing = [k for k in TOP_KEYS if k not in scalars and k not in fields]
    if missing:
        raise RuntimeError(f"docs/gen_ref.py: scenario key {missing[0]!r} has no description; add it to _scalars()")

    out = [
        "# Scenario keys\n",
        "A scenario is one YAML file. This page lists every key it may hold, generated from the "
        "dataclasses that validate it, so it always matches the code. A key is written nested in "
        f"the file or dotted on the command line ({code('--set algorithm.lr=0.01')}); a sweep variant "
        "sets dotted keys too.\n",
        "**Types.** An integer must fit int64 and a number float32 (what the models compute in); "
        "a number may be written as a string of digits (YAML 1.1 reads `1e-3` as a string). "
        "**Allowed** bounds are inclusive for ≥ and ≤, strict for > and <. A key not listed "
        "here is an error, and so is a value out of range: the message names the file and the key.\n",
        "## Top level { #top-level }\n",
    ]
    rows = []
    for key in (*TOP_KEYS[:3], "seeds", "sweep", "grid", *TOP_KEYS[3:]):
        if key in scalars:
            rows.append(_scalar_row(key, scalars[key]))
        else:
            default = {
                "data": "required",
                "model": "required",
                "algorithm": "required",
                "topology": "none (a server)",
            }.get(key, "every key's default")
            rows.append([code(key), "mapping", default, "", f"[the {key} section](#{key})"])
    out.append(table(KEY_HEADER, rows))

    # data: the dataset, clients, the partition, the splits
    out.append("## data { #data }\n")
    out.append(
        f"The data: a dataset (its options beside {code('dataset')}: see [Datasets](#datasets)), "
        f"the number of clients, the partition of a pooled dataset (its options beside "
        f"{code('kind')}: see [Partitioners](#partitions)) and every client's train/validation/test "
        f"split (the three sum to 1).\n"
    )
    rows = [
        _scalar_row("data.dataset", scalars["data.dataset"]),
        _scalar_row("data.clients", scalars["data.clients"]),
        _scalar_row("data.partition.kind", scalars["data.partition.kind"]),
    ]
    hints = typing.get_type_hints(DataCfg)
    for f in dataclasses.fields(DataCfg):
        t = hints[f.name]
        if dataclasses.is_dataclass(t) and t is not Component:
            rows.append(
                [
                    code(f"data.{f.name}"),
                    "mapping",
                    "see below",
                    "",
                    text(f.metadata.get("help") or first_line(own_doc(t)) or "the keys below"),
                ]
            )
            rows += key_rows(t, f"data.{f.name}.")
    out.append(table(KEY_HEADER, rows))

    for key in ("model", "algorithm"):
        out.append(f"## {key} {{ #{key} }}\n")
        link = "#models" if key == "model" else "#algorithms"
        out.append(
            f"The {key} by name; its own options sit beside {code('name')}: see [{key.capitalize()}s]({link}).\n"
        )
        out.append(table(KEY_HEADER, [_scalar_row(f"{key}.name", scalars[f"{key}.name"])]))

    for key in TOP_KEYS:
        if key in scalars or key in ("data", "model", "algorithm"):
            continue
        cls = _section_class(key)
        out.append(f"## {key} {{ #{key} }}\n")
        doc = own_doc(cls)
        if doc:
            out.append(docstring(doc))
        if key in SECTION_NOTES:
            out.append(text(SECTION_NOTES[key]) + "\n")
        out.append(table(KEY_HEADER, key_rows(cls, f"{key}.")))

    def dataset_extra(name, spec):
        parts = partitions_of(name)
        if not parts:
            return "Its own client split: no partition."
        return (
            "Partition: "
            + ", ".join(f"[{p}](#{anchor('partition', p)})" for p in parts)
            + f" (default {code(parts[0])})."
        )

    def algorithm_extra(name, cls):
        return f"Described in [Methods](methods.md#{anchor('algorithm', name)})."

    out += _component_sections(
        "Datasets",
        f"Options of each dataset, written in {code('data')} beside {code('dataset: NAME')}.",
        DATASETS,
        lambda s: s.Params,
        "data.",
        "dataset",
        dataset_extra,
    )
    out += _component_sections(
        "Partitioners",
        f"Options of each partitioner, written in {code('data.partition')} beside {code('kind: NAME')}.",
        PARTITIONERS,
        lambda s: s.Params,
        "data.partition.",
        "partition",
    )
    out += _component_sections(
        "Models",
        f"Options of each model, written in {code('model')} beside {code('name: NAME')}.",
        MODELS,
        lambda s: s.Params,
        "model.",
        "model",
    )
    out += _component_sections(
        "Algorithms",
        f"Options of each algorithm, written in {code('algorithm')} "
        f"beside {code('name: NAME')}. Defaults are the method's paper's or its "
        f"official code's ([Methods](methods.md) says which).",
        algorithms.REGISTRY,
        lambda a: a.Hyper,
        "algorithm.",
        "algorithm",
        algorithm_extra,
    )
    from raysim.federation.robust import DEFENCES, GOSSIP_RULES, PREAGGREGATORS
    from raysim.scenario.adversary_sections import attack_registry, is_data_attack

    def attack_summary(spec):
        kind = "Data poisoning" if is_data_attack(spec.name) else "Model poisoning"
        doc = (getattr(spec, "craft", None) and spec.craft.__doc__) or ""
        return f"{kind} ({spec.paper}). " + " ".join(doc.split("\n\n")[0].split())

    out += _component_sections(
        "Attacks",
        f"Options of each attack, written in {code('adversary.attack')} beside {code('name: NAME')} "
        "([Byzantine clients](../how-to/byzantine.md) says what each does).",
        attack_registry(),
        lambda s: s.Params,
        "adversary.attack.",
        "attack",
        summary_of=attack_summary,
        plugins=False,
    )
    out += _component_sections(
        "Defences",
        f"Options of each robust rule, written in {code('defence')} beside {code('rule: NAME')}.",
        DEFENCES,
        lambda s: s.params,
        "defence.",
        "defence",
        summary_of=lambda s: s.cite + ("; it needs f, the Byzantine clients it assumes." if s.needs_f else "."),
        plugins=False,
    )
    out += _component_sections(
        "Pre-aggregators",
        f"Options of each pre-aggregation step, written in {code('defence.preaggregate')} beside "
        f"{code('kind: NAME')}; the rule then runs on its outputs.",
        PREAGGREGATORS,
        lambda s: s.params,
        "defence.preaggregate.",
        "preaggregate",
        summary_of=lambda s: s.cite + ".",
        plugins=False,
    )
    out += _component_sections(
        "Gossip rules",
        f"With a {code('topology')}, {code('defence.rule')} is one of these mixing rules, applied by every "
        f"node to its own row of W; its options sit beside {code('rule: NAME')}.",
        GOSSIP_RULES,
        lambda s: s.params,
        "defence.",
        "gossip",
        summary_of=lambda s: (
            s.cite + ("; b, the values trimmed from each end, is defence.f (default 1)." if s.needs_f else ".")
        ),
        plugins=False,
    )
    return "\n".join(out)


# ----------------------------------------------------------------------------- CLI page
def _exit_codes() -> list[tuple[int, str, str]]:
    """(code, constant, meaning): the meanings from raysim.cli's docstring, every one checked
    against raysim.errors' EXIT_* constants."""
    import raysim.cli as cli
    import raysim.errors as errors

    names = {v: k for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    doc = " ".join(cli.__doc__.split())
    m = re.search(r"Exit codes:(.*?)(?:\.\s|\.$)", doc)
    if not m:
        raise RuntimeError("docs/gen_ref.py: raysim/cli.py's docstring no longer lists 'Exit codes:'")
    found = {}
    for part in m.group(1).split(";"):
        num, _, meaning = part.strip().partition(" ")
        found[int(num)] = meaning.strip()
    if set(found) != set(names):
        raise RuntimeError(
            f"docs/gen_ref.py: exit codes in raysim/cli.py's docstring {sorted(found)} "
            f"differ from raysim/errors.py's {sorted(names)}"
        )
    return [(c, names[c], found[c]) for c in sorted(found)]


def _usage(parser: argparse.ArgumentParser) -> str:
    fmt = argparse.HelpFormatter(parser.prog, width=76)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _arg_key(a: argparse.Action) -> str:
    return a.option_strings[0] if a.option_strings else (a.metavar or a.dest)


def _arg_rows(parser: argparse.ArgumentParser, helped: dict[str, tuple[str, ...]]) -> list[list[str]]:
    """One row per argument; one without help of its own points to the first subcommand whose
    same argument has help (``helped``: argument -> that subcommand's words)."""
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            shown = a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper())
            metavar = "" if a.nargs == 0 else " " + shown
            if a.nargs == "?":
                metavar = f" [{metavar.strip()}]"
            names = ", ".join(code(o + metavar) for o in a.option_strings)
        else:
            name = a.metavar or a.dest
            names = code(f"{name} ..." if a.nargs in ("+", "*") else name)
        notes = []
        if isinstance(a, argparse._AppendAction):
            notes.append("repeatable")
        if a.nargs == "+":
            notes.append("one or more")
        elif a.nargs == "*":
            notes.append("any number")
        if a.choices:
            notes.append("one of " + ", ".join(code(c) for c in a.choices))
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            default = "off"
        elif a.default in (None, []) or a.default is argparse.SUPPRESS:
            default = "required" if a.required and a.nargs not in ("*", "?") else "none"
        else:
            default = code(a.default)
        help_ = text(a.help or "")
        if not help_ and _arg_key(a) in helped:
            words = helped[_arg_key(a)]
            help_ = f"as in [{code('raysim ' + ' '.join(words))}](#{anchor('raysim', '-'.join(words))})"
        if notes:
            help_ = (help_ + " " if help_ else "") + "(" + "; ".join(notes) + ")"
        rows.append([names, default, help_])
    return rows


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser, help) for every subcommand, depth first, in the parser's order."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                yield (*path, name), sub, helps.get(name, "")
                yield from _commands(sub, (*path, name))


def cli_page() -> str:
    import raysim.cli as cli

    parser = cli.build_parser()
    commands = list(_commands(parser))
    out = [
        "# Command line\n",
        f"{text(parser.description or '')} Generated from the command's own argument parser; "
        f"{code('raysim COMMAND --help')} prints the same.\n",
        "```text\n" + _usage(parser) + "\n```\n",
        table(
            ["Command", "What it does"],
            [
                [f"[{code('raysim ' + ' '.join(w))}](#{anchor('raysim', '-'.join(w))})", text(h or "")]
                for w, _, h in commands
            ],
        ),
        "## Exit codes { #exit-codes }\n",
        table(["Code", "Name", "Meaning"], [[code(c), code(n), text(m)] for c, n, m in _exit_codes()]),
    ]
    helped: dict[str, tuple[str, ...]] = {}
    for words, sub, _ in commands:
        for a in sub._actions:
            if a.help and a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction):
                helped.setdefault(_arg_key(a), words)
    for words, sub, help_ in commands:
        title = "raysim " + " ".join(words)
        out.append(f"## {title} {{ #{anchor('raysim', '-'.join(words))} }}\n")
        if help_:
            out.append(text(help_[0].upper() + help_[1:]) + ".\n")
        out.append("```text\n" + _usage(sub) + "\n```\n")
        rows = _arg_rows(sub, helped)
        nested = [w for w, _, _ in commands if len(w) == len(words) + 1 and w[: len(words)] == words]
        if nested:
            out.append(
                "Subcommands: "
                + ", ".join(f"[{code('raysim ' + ' '.join(w))}](#{anchor('raysim', '-'.join(w))})" for w in nested)
                + ".\n"
            )
        if rows:
            out.append(table(["Argument", "Default", "Description"], rows))
        elif not nested:
            out.append("No arguments.\n")
    return "\n".join(out)


# ----------------------------------------------------------------------------- methods page
CATALOGUE_HEADER = ["Method", "Paper", "Family", "Keeps", "Sends", "Gossip", "Async", "Unseen", "Split"]


def by_family(reg: dict) -> list[tuple[str, type]]:
    """The registry's (name, class) pairs grouped by family in ``FAMILIES``' order (registry
    order within a family; a family outside ``FAMILIES`` last): the catalogue's and the
    sections' order."""
    from raysim.algorithms.base import FAMILIES

    return sorted(
        reg.items(), key=lambda item: FAMILIES.index(item[1].family) if item[1].family in FAMILIES else len(FAMILIES)
    )


def catalogue(reg: dict) -> list[str]:
    """The catalogue: one row per registered algorithm, from its class attributes (``paper``,
    ``family``, ``personal``, ``sends``, ``decentralized``, ``unseen``, ``split``), grouped by
    family in ``FAMILIES``' order (registry order within one). An algorithm without them (or
    with a family outside ``FAMILIES``) is a warning, which ``mkdocs build --strict`` makes an
    error naming its class."""
    from raysim.algorithms.base import FAMILIES

    for name, cls in reg.items():
        missing = [a for a in ("paper", "family", "personal", "sends") if not getattr(cls, a, "")]
        if missing:
            log.warning(
                f"algorithm {name!r} ({cls.__module__}.{cls.__qualname__}) sets no {', '.join(missing)}: "
                f"the methods catalogue needs them (algorithms/base.py)"
            )
        elif cls.family not in FAMILIES:
            log.warning(
                f"algorithm {name!r} ({cls.__module__}.{cls.__qualname__}): family {cls.family!r} "
                f"is not one of {FAMILIES}"
            )

    yn = lambda b: "yes" if b else "no"  # noqa: E731
    rows = [
        [
            f"[{code(n)}](#{anchor('algorithm', n)})",
            text(a.paper or "(not set)"),
            text(a.family or "(not set)"),
            text(a.personal or "(not set)"),
            text(a.sends or "(not set)"),
            yn(a.decentralized),
            yn(a.has_async()),
            yn(a.unseen),
            yn(a.split),
        ]
        for n, a in by_family(reg)
    ]
    counts = ", ".join(f"{sum(a.family == f for a in reg.values())} {f}" for f in FAMILIES)
    return [
        f"{len(reg)} methods ({counts}). **Keeps**: what a client holds between rounds (its state, "
        f'on its host; "nothing": stateless). **Sends**: what a trained client uploads each round. '
        f"**Gossip**: has a decentralized form (a {code('topology')} in the scenario). **Async**: runs "
        f"with an asynchronous server ({code('systems.aggregation')}: fedbuff, fedasync): every method "
        f"with a global model and no other server state. **Unseen**: scores "
        f"clients that never trained ({code('eval.unseen_fraction')}). **Split**: needs a model with a "
        f"body and a head ({code('model.head')}). A name links to the method's section below: its "
        f"update, its defaults and their source, its options.\n",
        # md_in_html: a class for the catalogue's tighter cells (docs/assets/extra.css)
        '<div class="catalogue" markdown>\n\n' + table(CATALOGUE_HEADER, rows) + "\n</div>\n",
    ]


def methods_page() -> str:
    import raysim.algorithms as algorithms
    from raysim.data import DATASETS, PARTITIONERS, partitions_of
    from raysim.models import MODELS

    reg = algorithms.REGISTRY
    out = [
        "# Methods\n",
        "The algorithms, datasets, models and partitioners a scenario can name, generated from their "
        f"registries ({code('raysim list')} prints the same names). Each method's text is its source's "
        "docstring: the paper's update, and the choices made where the paper and its official code differ. "
        f"Its options are set in the scenario's {code('algorithm')} section "
        "([Scenario keys](scenario.md#algorithms)).\n",
        "## Algorithms { #algorithms }\n",
        *catalogue(reg),
    ]
    described: dict[str, str] = {}  # module -> the first algorithm that printed its docstring
    for name, cls in by_family(reg):
        out.append(f"### {name} {{ #{anchor('algorithm', name)} }}\n")
        out.append(f"**{text(cls.summary)}**\n")
        out.append(
            f"**Paper:** {text(cls.paper or '(not set)')}. **Family:** {text(cls.family or '(not set)')}. "
            f"**A client keeps:** {text(cls.personal or '(not set)')}. "
            f"**A client sends:** {text(cls.sends or '(not set)')}.\n"
        )
        source = cls.__module__.replace("raysim.algorithms.", "algorithms/") + ".py"
        facts = [
            f"class {code(cls.__name__)} in {code(source)}",
            "decentralized form (with a topology): "
            + ("yes" if cls.decentralized else "no" + (f" ({text(cls.no_gossip)})" if cls.no_gossip else "")),
            "needs a model with a head and a body: " + ("yes" if cls.split else "no"),
            "scores unseen clients: " + ("yes" if cls.unseen else "no"),
            "local update (eval.finetune): " + ("yes" if cls.has_global_model() else "no"),
        ]
        out.append("; ".join(facts) + ".\n")
        module = sys.modules[cls.__module__]
        if cls.__module__ in described:
            first = described[cls.__module__]
            out.append(f"Shares its module's description with [{code(first)}](#{anchor('algorithm', first)}).\n")
        elif module.__doc__:
            described[cls.__module__] = name
            out.append(docstring(module.__doc__))
        doc = own_doc(cls)
        if doc:
            out.append(docstring(doc))
        rows = key_rows(cls.Hyper, "")
        out.append(f"**Options** ({code('algorithm.KEY')}):\n")
        out.append(table(KEY_HEADER, rows) if rows else "None.\n")

    out.append("## Datasets { #datasets }\n")
    out.append(
        table(
            ["Name", "Summary", "Partition"],
            [
                [
                    f"[{code(n)}](scenario.md#{anchor('dataset', n)})",
                    text(s.summary),
                    ", ".join(code(p) for p in partitions_of(n)) or "its own split",
                ]
                for n, s in DATASETS.items()
            ],
        )
    )
    out.append("## Models { #models }\n")
    out.append(
        table(
            ["Name", "Summary", "Input"],
            [
                [f"[{code(n)}](scenario.md#{anchor('model', n)})", text(s.summary), text(str(getattr(s, "inputs", "")))]
                for n, s in MODELS.items()
            ],
        )
    )
    out.append("## Partitioners { #partitioners }\n")
    out.append(
        table(
            ["Name", "Summary"],
            [[f"[{code(n)}](scenario.md#{anchor('partition', n)})", text(s.summary)] for n, s in PARTITIONERS.items()],
        )
    )
    return "\n".join(out)


if __name__ == "__main__":  # print a page: python docs/gen_ref.py scenario|cli|methods
    sys.path.insert(0, str(ROOT))
    print({"scenario": scenario_page, "cli": cli_page, "methods": methods_page}[sys.argv[1]]())
