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
    write(
        tmp_path,
        {"HAMLET": {"x": [line[:80], line[1:81]], "y": [line[80], "f"]}},
        {"HAMLET": {"x": [line[:80]], "y": ["T"]}},
    )
    s = src("leaf_shakespeare", tmp_path, 1)
    c = s.client(0)
    assert s.input_kind == "tokens" and s.input_shape == (80,) and s.num_classes == s.vocab_size == 100
    assert c.train_x.dtype == torch.uint8 and c.train_x.shape == (2, 80)
    pairs = sorted((text_of(x), text_of([y])) for x, y in zip(c.train_x, c.train_y))  # train rows: shuffled
    assert pairs == sorted([(line[:80], line[80]), (line[1:81], "f")])
    assert text_of(c.test_y) == "T"
    assert build("next_char_lstm", LSTMParams(hidden=4), s)(c.train_x).shape == (2, 100)


def test_leaf_sent140_words_become_ids_of_the_most_frequent_train_words(tmp_path):
    row = lambda text: ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text]  # noqa: E731
    write(
        tmp_path,
        {
            "alice": {"x": [row("Good day, good night!"), row("bad day")], "y": [1, 0]},
            "bob": {"x": [row("GOOD good good bad")], "y": [1]},
        },
        {"alice": {"x": [row("good unknownword day")], "y": [1]}, "bob": {"x": [row("")], "y": [0]}},
    )
    s = src("leaf_sent140", tmp_path, 2, max_words=4, vocab_size=3)
    # train words: good x5, day x2, bad x2, night x1, "," x1, "!" x1 -> vocabulary (count, then
    # alphabetical): good=1, bad=2, day=3; everything else is 0, which also pads
    a, b = s.client(0), s.client(1)  # users sorted: alice, bob (one-row splits: order is moot)
    a_rows = sorted(zip(a.train_x.tolist(), a.train_y.tolist()))
    assert s.vocab_size == 4 and s.num_classes == 2 and s.input_shape == (4,)
    assert a_rows == [([1, 3, 0, 1], 1), ([2, 3, 0, 0], 0)]  # good day , good | bad day pad pad
    assert a.test_x.tolist() == [[1, 0, 3, 0]]
    assert b.train_x.tolist() == [[1, 1, 1, 2]] and b.test_x.tolist() == [[0, 0, 0, 0]]
    start = src("leaf_sent140", tmp_path, 2, max_words=4, vocab_size=3, pad="start")
    assert sorted(start.client(0).train_x.tolist()) == [[0, 0, 2, 3], [1, 3, 0, 1]]
    model = build("lstm_classifier", LSTMClassifierParams(embed=4, hidden=4, dense=3), s)
    assert model(a.train_x).shape == (2, 2) and model.embed.num_embeddings == 4


def test_leaf_synthetic_infers_dimension_and_classes(tmp_path):
    write(
        tmp_path,
        {"f_0": {"x": [[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]], "y": [4, 0]}},
        {"f_0": {"x": [[3.0, 2.0, 1.0]], "y": [2]}},
    )
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
    with pytest.raises(
        DataError, match="user u's x or y does not hold shakespeare samples .*9 characters, expected 80"
    ):
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


# ------------------------------------------------------------------ FEMNIST as TFF and Flower hold it
# Three writers; writer w's k-th image (split s: 0 train, 1 test) has every pixel equal to
# (40·w + 10·s + k) / 255 and label (7·w + k) % 62, so the LEAF, TFF and Flower copies below
# hold exactly the same samples.
WRITERS = {"f0002_01": (3, 1), "f0000_07": (2, 2), "f0001_33": (4, 1)}  # (train, test) images


def femnist_samples():
    out = {}
    for w, (name, sizes) in enumerate(WRITERS.items()):
        for s, n in enumerate(sizes):
            px = np.stack([np.full((28, 28), 40 * w + 10 * s + k, dtype=np.uint8) for k in range(n)])
            out[name, s] = (px, np.array([(7 * w + k) % 62 for k in range(n)]))
    return out


def write_leaf_json(root):
    data = femnist_samples()
    users = [
        {
            u: {"x": (data[u, s][0].reshape(-1, 784) / 255.0).astype(np.float32).tolist(), "y": data[u, s][1].tolist()}
            for u in WRITERS
        }
        for s in (0, 1)
    ]
    return write(root, users[0], users[1])


def write_tff(root):
    import h5py

    root.mkdir(parents=True)
    data = femnist_samples()
    for s, name in enumerate(("fed_emnist_train.h5", "fed_emnist_test.h5")):
        with h5py.File(root / name, "w") as h5:
            for u in WRITERS:
                g = h5.create_group(f"examples/{u}")
                g["pixels"] = data[u, s][0].astype(np.float32) / np.float32(255.0)
                g["label"] = data[u, s][1].astype(np.int32)
    return root


def write_flower(root, files=2):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    root.mkdir(parents=True)
    rows = []
    for (u, _), (px, ys) in sorted(femnist_samples().items()):
        for img, y in zip(px, ys):
            buf = io.BytesIO()
            Image.fromarray(img, mode="L").save(buf, format="PNG")
            rows.append(
                {"writer_id": u, "image": {"bytes": buf.getvalue(), "path": None}, "character": int(y), "hsf_id": 0}
            )
    for i in range(files):  # rows spread over several files
        pq.write_table(pa.Table.from_pylist(rows[i::files]), root / f"train-{i:05d}-of-{files:05d}.parquet")
    return root


def pool(client):
    """A client's samples as a sorted list of (first pixel·255, label)."""
    xs = torch.cat([client.train_x, client.val_x, client.test_x])
    ys = torch.cat([client.train_y, client.val_y, client.test_y])
    return sorted((round(float(x.reshape(-1)[0]) * 255), int(y)) for x, y in zip(xs, ys))


def test_femnist_reads_tff_hdf5_as_the_same_clients_as_leaf_json(tmp_path):
    leaf = src("leaf_femnist", write_leaf_json(tmp_path / "leaf"), 3, splits=Splits(0.5, 0.25, 0.25))
    tff = src("leaf_femnist", write_tff(tmp_path / "tff"), 3, splits=Splits(0.5, 0.25, 0.25))
    for c in range(3):  # writers sorted: f0000_07 (w=1), f0001_33 (w=2), f0002_01 (w=0)
        a, b = leaf.client(c), tff.client(c)
        for f in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
    c = tff.client(0)
    assert sorted(c.test_x[:, 0, 0, 0].mul(255).round().tolist()) == [50.0, 51.0]  # w=1, test: 40+10+k
    assert c.test_y.tolist() == [7, 8] and tff.input_shape == (1, 28, 28) and tff.num_classes == 62


def test_femnist_reads_a_flower_datasets_parquet_export(tmp_path):
    flower = src("leaf_femnist", write_flower(tmp_path / "flower"), 3, splits=Splits(0.6, 0.0, 0.4))
    leaf = src("leaf_femnist", write_leaf_json(tmp_path / "leaf"), 3)
    for c in range(3):  # the same samples; no test split in the export: split by data.splits
        f = flower.client(c)
        assert pool(f) == pool(leaf.client(c))
        n = flower.num_samples(c)
        assert (f.num_train, f.num_test) == (round(0.6 * n), n - round(0.6 * n))
    assert flower.client(0).train_x.dtype == torch.float32


def test_flower_shakespeare_export_gets_leafs_contiguous_split(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "sh").mkdir()
    text = "".join(chr(ord("a") + (i * 7) % 26) for i in range(600))
    rows = [{"character_id": "HAMLET", "x": text[i : i + 80], "y": text[i + 80]} for i in range(500)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sh" / "train.parquet")
    s = src("leaf_shakespeare", tmp_path / "sh", 1)
    c = s.client(0)
    assert (c.num_train, c.num_test) == (400, 21)  # leaf_sizes(500, 0.8)
    assert text_of(c.train_x[3]) == text[3:83] and text_of(c.test_x[0]) == text[479:559]


def test_femnist_fedem_runs_unchanged_on_each_copy_but_for_the_data_path(tmp_path):
    from raysim.experiment.runner import run as run_scenario
    from raysim.scenario import config

    finals = {}
    for kind, make in (("leaf", write_leaf_json), ("tff", write_tff)):
        root = make(tmp_path / kind)
        sc = config.load(
            Path(__file__).resolve().parents[1] / "scenarios" / "femnist_fedem.yaml",
            [
                f"data.root={root}",
                "data.clients=3",
                "rounds=1",
                "eval.every=1",
                "algorithm.batch_size=2",
                f"tracking.uri=sqlite:///{tmp_path}/m.db",
                f"checkpoint.dir={tmp_path}/ck",
            ],
        )
        finals[kind] = run_scenario(sc, engine="serial", progress=False)["final"]
    assert finals["leaf"] == finals["tff"]


def test_tff_and_flower_errors_name_the_file_and_what_it_lacks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pylist([{"client": "a", "pixels": 1}]), tmp_path / "p" / "x.parquet")
    with pytest.raises(
        DataError,
        match=r"x.parquet is not Flower Datasets' femnist export: needs columns "
        r"writer_id, image, character \(it has client, pixels\)",
    ):
        src("leaf_femnist", tmp_path / "p", 1).prepare()
    write_tff(tmp_path / "t")
    with pytest.raises(DataError, match="reads TensorFlow Federated's FEMNIST and Shakespeare files only"):
        src("leaf_sent140", tmp_path / "t", 1).prepare()
    (tmp_path / "t" / "fed_emnist_digitsonly_train.h5").write_bytes(b"")
    with pytest.raises(
        DataError,
        match=r"expected one file \*train\*.h5 .*found fed_emnist_digitsonly_train.h5, "
        r"fed_emnist_train.h5",
    ):
        src("leaf_femnist", tmp_path / "t", 1).prepare()


def test_tff_shakespeare_snippets_become_leafs_windows(tmp_path):
    import h5py

    from raysim.data.shakespeare import role_text

    lines = {
        "train": [
            "To be, or not to be: that is the question:",
            "Whether 'tis nobler in the mind to suffer",
            "The slings and arrows of outrageous fortune,",
        ],
        "test": [
            "Or to take arms against a sea of troubles",
            "And by opposing end them. To die: to sleep;",
            "No more; and by a sleep to say we end",
        ],
    }
    (tmp_path / "sh").mkdir()
    for sub, ls in lines.items():
        with h5py.File(tmp_path / "sh" / f"shakespeare_{sub}.h5", "w") as h5:
            h5.create_dataset("examples/HAMLET_HAMLET/snippets", data=[v.encode() for v in ls])
    s = src("leaf_shakespeare", tmp_path / "sh", 1)
    c = s.client(0)
    for sub, x, y in (("train", c.train_x, c.train_y), ("test", c.test_x, c.test_y)):
        text = role_text(lines[sub])
        assert len(y) == len(text) - 80
        got = sorted((text_of(a), text_of([b])) for a, b in zip(x, y))
        assert got == sorted((text[i : i + 80], text[i + 80]) for i in range(len(text) - 80))
