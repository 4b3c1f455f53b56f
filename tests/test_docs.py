"""The documentation site: ``mkdocs build --strict`` succeeds (a broken link or anchor, a
missing page or a docstring mkdocstrings cannot render is an error), the generated reference
pages hold every scenario key, method and subcommand the code has (read from the code here, so
a new key or method keeps these tests true without editing them) with its real default and
allowed values, and nothing in the repository points outside it.

The site is built once for the module (about 10 to 20 s on 2 cores).
"""

from __future__ import annotations

import ast
import dataclasses
import html
import json
import os
import re
import subprocess
import sys
import typing
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the built site
@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return proc, out


@pytest.fixture(scope="module")
def site(build):
    proc, out = build
    if proc.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return out


def test_site_builds_strict(build):
    proc, out = build
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    for page in ("reference/scenario", "reference/cli", "reference/methods", "reference/python-api"):
        assert (out / page / "index.html").is_file(), f"{page} was not built"


class Page(HTMLParser):
    """A built page's article: its headings (with ids) and the rows of the tables under each,
    each cell as its text."""

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.sections: list[dict] = []  # {level, id, title, rows, text}
        self.ids: set[str] = set()
        self._heading: dict | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._skip = 0  # inside a heading's permalink
        source = path.read_text(encoding="utf-8")
        start = source.index("<article")
        self.feed(source[start : source.index("</article>", start)])

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = {"level": int(tag[1]), "id": a.get("id"), "title": "", "rows": [], "text": []}
            self.sections.append(self._heading)
        elif tag == "a" and "headerlink" in (a.get("class") or ""):
            self._skip += 1
        elif tag == "tr":
            self._row = []
            if self.sections:
                self.sections[-1]["rows"].append(self._row)
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = None
        elif tag == "a" and self._skip:
            self._skip -= 1
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._skip:
            return
        if self._heading is not None:
            self._heading["title"] += data
        if self._cell is not None:
            self._cell.append(data)
        if self.sections:
            self.sections[-1]["text"].append(data)

    def section(self, title: str) -> list[dict]:
        return [s for s in self.sections if s["title"].strip() == title]

    def text(self) -> str:
        return " ".join(" ".join("".join(s["text"]) for s in self.sections).split())


def page(site: Path, name: str) -> Page:
    return Page(site / name / "index.html")


def table_rows(sections) -> dict[str, list[str]]:
    """First cell -> row, over the tables of ``sections``."""
    return {row[0]: row for s in sections for row in s["rows"] if row}


# ----------------------------------------------------------------------------- scenario keys
def dataclass_fields(cls, prefix: str):
    """(dotted key, owning class, field) for every field, nested dataclasses' fields too."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield prefix + f.name, cls, f
        if dataclasses.is_dataclass(hints[f.name]):
            yield from dataclass_fields(hints[f.name], prefix + f.name + ".")


def effective_meta(cls, f) -> dict:
    """Field metadata with the class-level CHOICES/POSITIVE/NONNEGATIVE (what the loader applies)."""
    meta = dict(f.metadata)
    if f.name in getattr(cls, "CHOICES", {}):
        meta["choices"] = cls.CHOICES[f.name]
    if f.name in getattr(cls, "POSITIVE", ()):
        meta.setdefault("gt", 0)
    if f.name in getattr(cls, "NONNEGATIVE", ()):
        meta.setdefault("min", 0)
    return meta


def check_row(row: list[str], key: str, cls, f) -> list[str]:
    """The row of ``key`` states the field's real default and allowed values."""
    problems = []
    _, typ, default, allowed, *_ = row
    value = f.default
    if value is dataclasses.MISSING:
        return problems
    if isinstance(value, bool):
        if default != ("true" if value else "false"):
            problems.append(f"{key}: default {default!r}, the code's is {value}")
    elif isinstance(value, (int, float)):
        try:
            ok = float(default) == float(value)
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"{key}: default {default!r}, the code's is {value!r}")
    elif isinstance(value, str) and value:
        if value not in default:
            problems.append(f"{key}: default {default!r}, the code's is {value!r}")
    elif value is None and default != "null":
        problems.append(f"{key}: default {default!r}, the code's is null")
    meta = effective_meta(cls, f)
    shown = set(re.split(r"[\s|,]+", allowed))
    for choice in meta.get("choices", ()):
        written = ("true" if choice else "false") if isinstance(choice, bool) else str(choice)  # as in YAML
        if written not in shown:
            problems.append(f"{key}: allowed {allowed!r} lacks the choice {choice!r}")
    for k in ("min", "max", "gt", "lt"):
        if k in meta and not any(_same_number(meta[k], w) for w in shown):
            problems.append(f"{key}: allowed {allowed!r} lacks the bound {k} {meta[k]!r}")
    if "help" in meta and " ".join(meta["help"].split())[:30] not in row[-1]:
        problems.append(f"{key}: description {row[-1]!r} is not its help {meta['help']!r}")
    return problems


def _same_number(bound, word: str) -> bool:
    try:
        return float(word) == float(bound)
    except ValueError:
        return False


def section_keys() -> list[tuple[str, type, object]]:
    """Every key of every scenario section dataclass (``Scenario``'s fields named in TOP_KEYS;
    components, whose options are their own dataclasses, apart)."""
    from raysim.scenario.config import TOP_KEYS
    from raysim.scenario.schema import Component
    from raysim.scenario.sections import Scenario

    found = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            args = [a for a in typing.get_args(t) if a is not type(None)] or [t]
            inner = args[0] if len(args) == 1 else t
            if inner is Component:
                continue
            found.append((prefix + f.name, cls, f))
            if dataclasses.is_dataclass(inner):
                walk(inner, prefix + f.name + ".")

    hints = typing.get_type_hints(Scenario)
    for key in TOP_KEYS:
        t = hints.get(key)
        args = [a for a in typing.get_args(t) if a is not type(None)] or [t]
        if args and dataclasses.is_dataclass(args[0]) and args[0] is not Component:
            walk(args[0], key + ".")
    return found


def components():
    """(registry label, key prefix, {name: options dataclass}) for every component kind."""
    import raysim.algorithms as algorithms
    from raysim.data import DATASETS, PARTITIONERS
    from raysim.models import MODELS

    return [
        ("algorithm", "algorithm.", {n: a.Hyper for n, a in algorithms.REGISTRY.items()}),
        ("dataset", "data.", {n: s.Params for n, s in DATASETS.items()}),
        ("partitioner", "data.partition.", {n: s.Params for n, s in PARTITIONERS.items()}),
        ("model", "model.", {n: s.Params for n, s in MODELS.items()}),
    ]


def test_scenario_page_lists_every_section_key_with_its_default_and_range(site):
    from raysim.scenario.config import TOP_KEYS

    p = page(site, "reference/scenario")
    rows = table_rows(p.sections)
    missing = [k for k in TOP_KEYS if k not in rows]
    assert not missing, f"top-level keys missing from the scenario page: {missing}"
    keys = section_keys()
    assert len(keys) > 30  # the sections' dataclasses were found
    problems = []
    for key, cls, f in keys:
        if key not in rows:
            problems.append(f"{key}: not on the page")
        else:
            problems += check_row(rows[key], key, cls, f)
    # the keys validate() reads itself: each component's name
    for key in ("data.dataset", "data.clients", "data.partition.kind", "model.name", "algorithm.name"):
        if key not in rows:
            problems.append(f"{key}: not on the page")
    assert not problems, "\n".join(problems)


def test_scenario_page_lists_every_components_options_under_its_name(site):
    p = page(site, "reference/scenario")
    problems = []
    for kind, prefix, registry in components():
        for name, params in registry.items():
            # the section titled with the component's name whose rows are this kind's options
            candidates = [table_rows([s]) for s in p.section(name)]
            fields = list(dataclass_fields(params, prefix))
            best = max(candidates, key=lambda r: sum(k in r for k, _, _ in fields), default=None)
            if best is None:
                problems.append(f"{kind} {name}: no section titled {name!r}")
                continue
            if not fields and "No options of its own." not in " ".join("".join(s["text"]) for s in p.section(name)):
                problems.append(f"{kind} {name}: has no options, and the page does not say so")
            for key, cls, f in fields:
                if key not in best:
                    problems.append(f"{kind} {name}: option {key} missing")
                else:
                    problems += [f"{kind} {name}: {x}" for x in check_row(best[key], key, cls, f)]
    assert not problems, "\n".join(problems)


def _defined_in(cls, name: str) -> str:
    """Where field ``name`` of ``cls`` is written: the first class of its MRO that annotates it
    (a subclass that sets its own default redefines the field, and its metadata with it)."""
    owner = next((c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {})), cls)
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


def test_every_scenario_key_has_help():
    """Every key a scenario may set, the sections' and every built-in component's options, has a
    ``help`` in its field metadata: the Description cell of the reference pages (read from the
    code, so a new key or method is checked without editing this test)."""
    fields = [(key, "scenario", cls, f) for key, cls, f in section_keys()]
    for kind, prefix, registry in components():
        for name, params in registry.items():
            fields += [(key, f"{kind} {name}", cls, f) for key, cls, f in dataclass_fields(params, prefix)]
    assert len(fields) > 300  # the sections and every registry were walked
    missing: dict[str, dict[str, list[str]]] = {}  # class.field -> key -> where it is read
    for key, where, cls, f in fields:
        if not str(f.metadata.get("help", "")).strip():
            missing.setdefault(_defined_in(cls, f.name), {}).setdefault(key, []).append(where)
    assert not missing, (
        f"{len(missing)} fields without metadata={{'help': ...}} (one line: what it is, its unit, what "
        f"null/0 means, the paper's symbol; a LocalTraining option redefined in a subclass keeps its help "
        f"with algorithms.base.training_field):\n"
        + "\n".join(
            f"{owner}: " + "; ".join(f"{key} ({', '.join(w)})" for key, w in keys.items())
            for owner, keys in sorted(missing.items())
        )
    )


def test_every_cli_argument_has_help():
    """Every argument of every subcommand has its own argparse help (the CLI reference page and
    ``raysim COMMAND --help`` print it)."""
    import argparse

    from raysim.cli import build_parser

    missing = []
    for words, sub in _subcommands(build_parser()):
        for a in sub._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (a.help or "").strip() or a.help is argparse.SUPPRESS:
                name = a.option_strings[0] if a.option_strings else (a.metavar or a.dest)
                missing.append(f"raysim {' '.join(words)} {name}")
    assert not missing, "arguments without help= in raysim/cli.py: " + ", ".join(missing)


# ----------------------------------------------------------------------------- methods
def _opening(doc: str | None) -> str:
    """A docstring's first words as they read in HTML (before any ``code`` or **bold**)."""
    import inspect

    first = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    return re.split(r"[`*]", first)[0][:60].strip()


def test_methods_page_has_every_algorithm_with_summary_docstring_and_options(site):
    import raysim.algorithms as algorithms

    p = page(site, "reference/methods")
    text = p.text()
    problems = []
    for name, cls in algorithms.REGISTRY.items():
        sections = p.section(name)
        if not sections:
            problems.append(f"{name}: no section titled {name!r}")
            continue
        body = " ".join(" ".join("".join(s["text"]) for s in sections).split())
        if " ".join(cls.summary.split()) not in body:
            problems.append(f"{name}: its summary is not in its section")
        module_doc = sys.modules[cls.__module__].__doc__
        own = cls.__dict__.get("__doc__")
        for doc in (module_doc, own):
            if doc and _opening(doc) and _opening(doc) not in text:
                problems.append(f"{name}: its docstring ({_opening(doc)!r}) is not on the page")
        rows = table_rows(sections)
        for key, owner, f in dataclass_fields(cls.Hyper, ""):
            if key not in rows:
                problems.append(f"{name}: option {key} missing from its table")
            else:
                problems += [f"{name}: {x}" for x in check_row(rows[key], key, owner, f)]
    assert not problems, "\n".join(problems)


CATALOGUE = ("paper", "family", "personal", "sends")


def test_every_algorithm_sets_its_catalogue_attributes():
    """Each registered algorithm states its paper, family (one of FAMILIES), what a client keeps
    and what it sends; ``paper`` in its own class, so a subclass cannot show its parent's."""
    import raysim.algorithms as algorithms
    from raysim.algorithms.base import FAMILIES

    problems = []
    for name, cls in algorithms.REGISTRY.items():
        where = f"{name} ({cls.__module__}.{cls.__qualname__})"
        empty = [a for a in CATALOGUE if not str(getattr(cls, a, "") or "").strip()]
        if empty:
            problems.append(f"{where}: empty {', '.join(empty)}")
        elif cls.family not in FAMILIES:
            problems.append(f"{where}: family {cls.family!r} is not one of {FAMILIES}")
        elif "paper" not in vars(cls):
            problems.append(f"{where}: paper {cls.paper!r} is inherited; set the class's own")
    assert not problems, "\n".join(problems)


def test_methods_page_catalogue_has_a_row_per_algorithm(site):
    """The catalogue under Algorithms: one row per registered algorithm with its attributes,
    grouped by family in FAMILIES' order, and a link to its section."""
    import raysim.algorithms as algorithms
    from raysim.algorithms.base import FAMILIES

    p = page(site, "reference/methods")
    (section,) = p.section("Algorithms")
    header, *rows = section["rows"]
    assert header == ["Method", "Paper", "Family", "Keeps", "Sends", "Gossip", "Async", "Unseen", "Split"], header
    by_name = {row[0]: row for row in rows}
    assert len(by_name) == len(rows), "a method has two rows"
    assert set(by_name) == set(algorithms.REGISTRY), (
        f"rows {sorted(set(by_name) ^ set(algorithms.REGISTRY))} differ from the registry"
    )
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    problems = []
    for name, cls in algorithms.REGISTRY.items():
        want = [
            name,
            *(" ".join(str(getattr(cls, a)).split()) for a in CATALOGUE),
            yn(cls.decentralized),
            yn(cls.has_async()),
            yn(cls.unseen),
            yn(cls.split),
        ]
        if by_name[name] != want:
            problems.append(f"{name}: row {by_name[name]} is not {want}")
    assert not problems, "\n".join(problems)
    families = [row[2] for row in rows]
    order = [FAMILIES.index(f) if f in FAMILIES else len(FAMILIES) for f in families]
    assert order == sorted(order), f"rows not grouped by family: {families}"
    html_ = (site / "reference/methods/index.html").read_text(encoding="utf-8")
    for name in algorithms.REGISTRY:
        target = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("+", "-plus")).strip("-")
        assert f'href="#algorithm-{target}"' in html_, f"{name}: no link to its section"
        assert f'id="algorithm-{target}"' in html_, f"{name}: no section to link to"


def test_methods_page_sections_state_the_catalogue_attributes(site):
    import raysim.algorithms as algorithms

    p = page(site, "reference/methods")
    problems = []
    for name, cls in algorithms.REGISTRY.items():
        body = " ".join(" ".join("".join(s["text"]) for s in p.section(name)).split())
        for label, attr in (
            ("Paper:", "paper"),
            ("Family:", "family"),
            ("A client keeps:", "personal"),
            ("A client sends:", "sends"),
        ):
            if f"{label} {' '.join(str(getattr(cls, attr)).split())}" not in body:
                problems.append(f"{name}: its section lacks {label} {getattr(cls, attr)!r}")
        gossip = "yes" if cls.decentralized else f"no ({cls.no_gossip})"
        if f"decentralized form (with a topology): {gossip}" not in body:
            problems.append(f"{name}: its section does not say decentralized form: {gossip}")
    assert not problems, "\n".join(problems)


def test_methods_page_lists_datasets_models_and_partitioners(site):
    from raysim.data import DATASETS, PARTITIONERS
    from raysim.models import MODELS

    p = page(site, "reference/methods")
    for title, registry in (("Datasets", DATASETS), ("Models", MODELS), ("Partitioners", PARTITIONERS)):
        rows = table_rows(p.section(title))
        assert set(registry) <= set(rows), f"{title}: missing {sorted(set(registry) - set(rows))}"
        for name, spec in registry.items():
            assert " ".join(spec.summary.split()) in rows[name][1], f"{title} {name}: summary"


# ----------------------------------------------------------------------------- command line
def _subcommands(parser, words=()):
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield (*words, name), sub
                yield from _subcommands(sub, (*words, name))


def test_cli_page_has_every_subcommand_argument_and_exit_code(site):
    import argparse

    import raysim.errors as errors
    from raysim.cli import build_parser

    p = page(site, "reference/cli")
    problems = []
    commands = list(_subcommands(build_parser()))
    assert {words[0] for words, _ in commands} >= {"run", "validate", "list"}
    for words, sub in commands:
        title = "raysim " + " ".join(words)
        sections = p.section(title)
        if not sections:
            problems.append(f"{title}: no section")
            continue
        first_cells = [row[0] for row in table_rows(sections).values()]
        for a in sub._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = a.option_strings[0] if a.option_strings else (a.metavar or a.dest)
            if not any(cell.split(",")[0].split()[0] == name for cell in first_cells if cell):
                problems.append(f"{title}: argument {name} missing")
            if a.help and " ".join(a.help.split())[:30] not in " ".join("".join(s["text"]) for s in sections):
                problems.append(f"{title}: the help of {name} is missing")
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    rows = table_rows(p.section("Exit codes"))
    shown = {int(k) for k in rows if k.isdigit()}
    assert codes == shown, f"exit codes on the page {sorted(shown)}, in raysim/errors.py {sorted(codes)}"
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- Python API
def test_python_api_page_documents_the_public_names(site):
    tree = ast.parse((ROOT / "raysim" / "api.py").read_text(encoding="utf-8"))
    names = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
    if names is None:
        names = [
            n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")
        ]
    assert names
    ids = page(site, "reference/python-api").ids
    missing = [n for n in names if f"raysim.api.{n}" not in ids]
    assert not missing, f"raysim.api names without an entry on the Python API page: {missing}"


# ----------------------------------------------------------------------------- outside pointers
SCANNED = ("docs", "raysim", "algorithms", "tests", "bench", "scenarios", "cluster", "README.md", "mkdocs.yml")
# written in pieces so that this file does not hold them
FORBIDDEN = ("../" + "shared", "DESIGN" + ".md", "shared/" + "papers")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|\bsrc=\"([^\"]+)\"")


def _files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts:
                    yield p


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _markdown_of(path: Path, text: str) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(text).get("cells", [])
        return "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown")
    return text if path.suffix == ".md" else ""


def test_nothing_points_outside_the_repository():
    problems = []
    scanned = 0
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        scanned += 1
        rel = path.relative_to(ROOT)
        for bad in FORBIDDEN:
            if bad in text:
                line = text[: text.index(bad)].count("\n") + 1
                problems.append(f"{rel}:{line}: {bad}")
        for m in LINK.finditer(_markdown_of(path, text)):
            target = html.unescape(m.group(1) or m.group(2)).split("#")[0].split("?")[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # an anchor, http(s):, mailto:, data:
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT):
                problems.append(f"{rel}: links to {target}, outside the repository")
            elif path.name == "README.md" and not resolved.exists():
                problems.append(f"{rel}: links to {target}, which does not exist")
    assert scanned > 50
    assert not problems, "\n".join(problems)


def test_generated_reference_pages_are_not_committed():
    """scenario.md, cli.md and methods.md come from the code at build time (docs/gen_ref.py)."""
    out = subprocess.run(["git", "ls-files", "docs/reference"], cwd=ROOT, capture_output=True, text=True)
    tracked = set(out.stdout.split())
    assert not tracked & {"docs/reference/scenario.md", "docs/reference/cli.md", "docs/reference/methods.md"}
