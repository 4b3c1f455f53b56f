"""One LEAF JSON reader for FEMNIST, Shakespeare, Sent140 and Synthetic: each dataset's x and y
decoded as written in small JSON trees made here (FEMNIST's own tests: test_leaf_cache.py)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.data import DATASETS, Splits, build_source
from raysim.data.base import DataError
from raysim.data.shakespeare import VOCAB
from raysim.models import LSTMClassifierParams, LSTMParams, build


def write(root: Path, train: dict, test: dict) -> Path:
    """LEAF's layout: train/ and test/ JSON with users, num_samples and user_data."""
    for sub, users in (("train", train), ("test", test)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        doc = {"users": list(users), "num_samples": [len(v["y"]) for v in users.values()], "user_data": users}
        (root / sub / "data.json").write_text(json.dumps(doc))
    return root


def src(name, root, clients, splits=Splits(0.8, 0.0, 0.2), **kw):
    return build_source(name, DATASETS[name].Params(root=str(root), **kw), clients, None, splits, 0)


def text_of(ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def test_leaf_shakespeare_windows_become_character_ids(tmp_path):
    line = "To be, or not to be: that is the question: Whether 'tis nobler in the mind to suf"
    assert len(line) == 81
    write(tmp_path, {"HAMLET": {"x": [line[:80], line[1:81]], "y": [line[80], "f"]}},
          {"HAMLET": {"x": [line[:80]], "y": ["T"]}})
    s = src("leaf_shakespeare", tmp_path, 1)
    c = s.client(0)
    assert s.input_kind == "tokens" and s.input_shape == (80,) and s.num_classes == s.vocab_size == 100
    assert c.train_x.dtype == torch.uint8 and c.train_x.shape == (2, 80)
    pairs = sorted((text_of(x), text_of([y])) for x, y in zip(c.train_x, c.train_y))   # train rows: shuffled
    assert pairs == sorted([(line[:80], line[80]), (line[1:81], "f")])
    assert text_of(c.test_y) == "T"
    assert build("next_char_lstm", LSTMParams(hidden=4), s)(c.train_x).shape == (2, 100)


def test_leaf_sent140_words_become_ids_of_the_most_frequent_train_words(tmp_path):
    row = lambda text: ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text]  # noqa: E731
    write(tmp_path,
          {"alice": {"x": [row("Good day, good night!"), row("bad day")], "y": [1, 0]},
           "bob": {"x": [row("GOOD good good bad")], "y": [1]}},
          {"alice": {"x": [row("good unknownword day")], "y": [1]}, "bob": {"x": [row("")], "y": [0]}})
    s = src("leaf_sent140", tmp_path, 2, max_words=4, vocab_size=3)
    # train words: good x5, day x2, bad x2, night x1, "," x1, "!" x1 -> vocabulary (count, then
    # alphabetical): good=1, bad=2, day=3; everything else is 0, which also pads
    a, b = s.client(0), s.client(1)          # users sorted: alice, bob (one-row splits: order is moot)
    a_rows = sorted(zip(a.train_x.tolist(), a.train_y.tolist()))
    assert s.vocab_size == 4 and s.num_classes == 2 and s.input_shape == (4,)
    assert a_rows == [([1, 3, 0, 1], 1), ([2, 3, 0, 0], 0)]     # good day , good | bad day pad pad
    assert a.test_x.tolist() == [[1, 0, 3, 0]]
    assert b.train_x.tolist() == [[1, 1, 1, 2]] and b.test_x.tolist() == [[0, 0, 0, 0]]
    start = src("leaf_sent140", tmp_path, 2, max_words=4, vocab_size=3, pad="start")
    assert sorted(start.client(0).train_x.tolist()) == [[0, 0, 2, 3], [1, 3, 0, 1]]
    model = build("lstm_classifier", LSTMClassifierParams(embed=4, hidden=4, dense=3), s)
    assert model(a.train_x).shape == (2, 2) and model.embed.num_embeddings == 4


def test_leaf_synthetic_infers_dimension_and_classes(tmp_path):
    write(tmp_path, {"f_0": {"x": [[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]], "y": [4, 0]}},
          {"f_0": {"x": [[3.0, 2.0, 1.0]], "y": [2]}})
    s = src("leaf_synthetic", tmp_path, 1)
    c = s.client(0)
    assert s.input_kind == "features" and s.input_shape == (3,) and s.num_classes == 5
    assert c.train_x.dtype == torch.float32
    assert sorted(zip(c.train_x.tolist(), c.train_y.tolist())) == [([0.5, -1.0, 2.0], 4), ([1.0, 1.0, 1.0], 0)]
    assert c.test_x.tolist() == [[3.0, 2.0, 1.0]]
    pooled = src("leaf_synthetic", tmp_path, 1, splits=Splits(0.5, 0.0, 0.5), leaf_split=False).client(0)
    assert sorted(pooled.train_y.tolist() + pooled.test_y.tolist()) == [0, 2, 4]


def test_leaf_formats_say_what_is_wrong_and_how_to_make_the_data(tmp_path):
    with pytest.raises(DataError, match=r"leaf_sent140: no train/ folder .*cd leaf/data/sent140 && ./preprocess.sh"):
        src("leaf_sent140", tmp_path, 1).prepare()
    write(tmp_path / "a", {"u": {"x": ["too short"], "y": ["x"]}}, {"u": {"x": [], "y": []}})
    with pytest.raises(DataError, match="user u's x or y does not hold shakespeare samples .*9 characters, expected 80"):
        src("leaf_shakespeare", tmp_path / "a", 1).prepare()
    write(tmp_path / "b", {"u": {"x": [[1.0, 2.0]], "y": [0]}, "v": {"x": [[1.0]], "y": [1]}}, {})
    with pytest.raises(DataError, match="inputs of different shapes"):
        src("leaf_synthetic", tmp_path / "b", 1).prepare()
    write(tmp_path / "c", {"u": {"x": [[0.0] * 784], "y": [62]}}, {})
    with pytest.raises(DataError, match="holds label 62, expected 0..61"):
        src("leaf_femnist", tmp_path / "c", 1).prepare()


def test_each_leaf_dataset_has_its_own_cache_and_sent140_options_rebuild_it(tmp_path):
    row = ["1", "d", "q", "u", "a b c"]
    write(tmp_path, {"u": {"x": [row], "y": [1]}}, {"u": {"x": [row], "y": [0]}})
    assert src("leaf_sent140", tmp_path, 1, vocab_size=1).client(0).train_x[0, :3].tolist() == [1, 0, 0]
    assert src("leaf_sent140", tmp_path, 1, vocab_size=3).client(0).train_x[0, :3].tolist() == [1, 2, 3]
    assert (tmp_path / ".raysim-cache" / "leaf_sent140" / "index.json").is_file()
    index = json.loads((tmp_path / ".raysim-cache" / "leaf_sent140" / "index.json").read_text())
    assert index["vocab"] == ["a", "b", "c"]
    assert np.load(tmp_path / ".raysim-cache" / "leaf_sent140" / "train_x.npy").dtype == np.int32
