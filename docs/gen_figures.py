"""The architecture page's two figures, drawn from the code at every docs build (``gen_ref``'s
``on_files`` adds them), so that they cannot drift from it:

- ``explanation/wings.svg``: raysim's wings floor by floor, as ``tests/test_layering.py``'s
  ``FLOORS`` states them, each with its modules (read from the source tree) and the wings it
  actually imports (read from the source's import lines, with the test's own parser);
- ``explanation/round.svg``: the data path of one round, a step to a box, each naming the
  function that does it. Every name is looked up when the figure is drawn, and a name that no
  longer exists stops the build.
"""

from __future__ import annotations

import importlib
import importlib.util
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WINGS_SVG, ROUND_SVG = "explanation/wings.svg", "explanation/round.svg"

# One round of a server-driven run: (where it runs, what happens, the function that does it).
ROUND = [
    ("server", "the round's clients are sampled from (seed, round)", "raysim.engine.sampling.sample_clients"),
    ("server", "the method's message: what every sampled client receives", "raysim.algorithms.base.Algorithm.message"),
    ("transport", "one call per host, carrying the message once", "raysim.engine.placement.Transport.train"),
    ("host", "each of the host's sampled clients, with its shard and state", "raysim.engine.host.Host.train"),
    ("client", "the method's local training", "raysim.algorithms.base.Algorithm.train"),
    ("client", "the one loop: all the host's jobs, stacked where it pays", "raysim.core.loop.Trainer.fit"),
    ("host", "privacy: the update clipped to C (client-level DP)", "raysim.federation.privacy.clip"),
    ("host", "compression: what the upload costs and carries", "raysim.federation.compression.upload"),
    ("host", "the replies summed in float64, in client-id order", "raysim.core.replies.Accumulator.add"),
    ("server", "the hosts' partial sums merged, in host order", "raysim.core.replies.Accumulator.merge"),
    ("server", "privacy: Gaussian noise on the sum", "raysim.federation.privacy.privatize"),
    (
        "server",
        "Byzantine runs: the attack and the robust rule on each reply",
        "raysim.federation.robust_round.RobustRound.reduce",
    ),
    ("server", "the method's aggregation: the new server state", "raysim.algorithms.base.Algorithm.aggregate"),
    ("server", "the round's record into MLflow", "raysim.results.tracking.Tracker.log_round"),
]
PLACES = {"server": "#e8eaf6", "transport": "#fff3e0", "host": "#e0f2f1", "client": "#f1f8e9"}


def _layering():
    """tests/test_layering.py, the rules' one home, as a module."""
    spec = importlib.util.spec_from_file_location("_layering_rules", ROOT / "tests" / "test_layering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names (a module's attribute, or an attribute of one): an error if
    it no longer exists."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                raise LookupError(f"docs/gen_figures.py names {dotted}, which does not exist; update ROUND")
            obj = getattr(obj, name)
        return obj
    raise LookupError(f"docs/gen_figures.py names {dotted}, whose module does not import; update ROUND")


def wing_facts() -> list[tuple[int, str, list[str], list[str]]]:
    """(floor, wing, its modules, the wings it imports) for every wing, top floor first."""
    rules = _layering()
    files = rules.sources("raysim", "algorithms")
    modules: dict[str, list[str]] = {w: [] for w in rules.FLOORS}
    uses: dict[str, set[str]] = {w: set() for w in rules.FLOORS}
    known = {rules.module_of(f) for f in files}
    for f in files:
        name = rules.module_of(f)
        here = rules.wing(name)
        short = name[len(here) + 1 :] if name != here else ""
        if short:
            modules[here].append(short)
        for mod in rules.imports(f):
            if mod in known and mod != "raysim" and rules.wing(mod) != here:
                uses[here].add(rules.wing(mod))
    rows = [(floor, w, sorted(modules[w]), sorted(uses[w])) for w, floor in rules.FLOORS.items() if w != "raysim"]
    return sorted(rows, key=lambda r: (-r[0], r[1]))


def _short(wing: str) -> str:
    return wing.removeprefix("raysim.") if wing != "raysim" else wing


def _text(x: float, y: float, s: str, size: int = 12, weight: str = "normal", anchor: str = "start") -> str:
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" font-weight="{weight}" text-anchor="{anchor}" '
        f'font-family="sans-serif">{escape(s)}</text>'
    )


def _wrap(words: list[str], width: int) -> list[str]:
    lines, line = [], ""
    for w in words:
        if line and len(line) + len(w) + 2 > width:
            lines.append(line + ",")
            line = w
        else:
            line = f"{line}, {w}" if line else w
    return [*lines, line] if line else lines


def wings_svg() -> str:
    """The wings, a row per floor (the highest on top), each box listing its modules and the
    wings it imports."""
    facts = wing_facts()
    floors = sorted({f for f, *_ in facts}, reverse=True)
    width, gap, left, line_h = 1000, 12, 70, 15
    rows, y = [], 12
    for floor in floors:
        here = [r for r in facts if r[0] == floor]
        box_w = (width - left - gap * len(here)) / len(here)
        chars = int(box_w / 5.6)
        texts = [(_wrap(mods, chars), _wrap([_short(u) for u in uses], chars - 9)) for _, _, mods, uses in here]
        height = 30 + line_h * max(len(m) + len(u) for m, u in texts)
        rows.append((floor, here, texts, y, height, box_w))
        y += height + gap
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" viewBox="0 0 {width} {y}">']
    for floor, here, texts, top, height, box_w in rows:
        out.append(_text(8, top + 20, f"floor {floor}", 12, "bold"))
        for i, ((_, wing, _, _), (mods, uses)) in enumerate(zip(here, texts)):
            x = left + i * (box_w + gap)
            out.append(
                f'<rect x="{x:.0f}" y="{top}" width="{box_w:.0f}" height="{height}" rx="6" fill="#f5f5f5" '
                'stroke="#5c6bc0"/>'
            )
            out.append(_text(x + 8, top + 17, wing, 13, "bold"))
            line = top + 17 + line_h
            for m in mods:
                out.append(_text(x + 8, line, m, 11))
                line += line_h
            for j, u in enumerate(uses):
                out.append(_text(x + 8, line, ("imports: " if j == 0 else "") + u, 11))
                line += line_h
    out.append("</svg>")
    return "\n".join(out)


def round_svg() -> str:
    """One round's data path, top to bottom, each step with the function that does it."""
    for _, _, dotted in ROUND:
        _resolve(dotted)
    box_h, gap, width = 44, 14, 760
    height = 20 + len(ROUND) * (box_h + gap)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    out.append(
        '<defs><marker id="a" viewBox="0 0 10 10" refX="5" refY="9" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M0,0 L10,0 L5,10 z" fill="#5c6bc0"/></marker></defs>'
    )
    for i, (place, what, dotted) in enumerate(ROUND):
        top = 10 + i * (box_h + gap)
        out.append(
            f'<rect x="100" y="{top}" width="{width - 110}" height="{box_h}" rx="6" fill="{PLACES[place]}" stroke="#5c6bc0"/>'
        )
        out.append(_text(90, top + 27, place, 12, "bold", "end"))
        out.append(_text(112, top + 18, what, 12))
        out.append(_text(112, top + 35, dotted.removeprefix("raysim."), 11))
        if i + 1 < len(ROUND):
            out.append(
                f'<line x1="400" y1="{top + box_h}" x2="400" y2="{top + box_h + gap - 2}" stroke="#5c6bc0" marker-end="url(#a)"/>'
            )
    out.append("</svg>")
    return "\n".join(out)


FIGURES = {WINGS_SVG: wings_svg, ROUND_SVG: round_svg}
