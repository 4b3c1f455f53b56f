"""LeafFEMNIST's cache: the JSON is parsed once into numpy arrays, which later sources memory-map.

The fixture writes a tiny LEAF tree whose pixel values say where they come from: every pixel of
writer w's k-th image in split s (0 train, 1 test) is ``100·w + 10·s + k + p/1000`` (p the pixel
index, 0..783), and its label ``(10·w + k) % 62``; train and test each span two JSON files, and the
last writer has no test data.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.data import cache, leaf
from raysim.data.base import DataError, Splits, split_client
from raysim.data.leaf import LeafFEMNIST, LeafParams
from raysim.rng import generator

WRITERS = ["f0003_11", "f0001_42", "f0002_07", "f0004_00"]  # sorted: f0001_42, f0002_07, f0003_11, f0004_00
SIZES = {"train": [5, 4, 6, 3], "test": [2, 1, 2, 0]}  # per writer, in WRITERS' order
ROOT_SRC = Path(__file__).resolve().parents[1]


def image(code: float) -> list[float]:
    return [code + p / 1000 for p in range(784)]


def write_tree(root: Path, offset: int = 0) -> None:
    """Train/test JSON, each split over all_data_0.json (first two writers) and all_data_1.json."""
    for s, sub in enumerate(("train", "test")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for part, users in enumerate((WRITERS[:2], WRITERS[2:])):
            write_part(root / sub / f"all_data_{part}.json", sub, s, users, offset)


def write_part(path: Path, sub: str, s: int, users, offset: int) -> None:
    users = [u for u in users if SIZES[sub][WRITERS.index(u)] > 0]
    data = {}
    for u in users:
        w, n = WRITERS.index(u), SIZES[sub][WRITERS.index(u)]
        data[u] = {
            "x": [image(offset + 100 * w + 10 * s + k) for k in range(n)],
            "y": [(10 * w + k + offset) % 62 for k in range(n)],
        }
    path.write_text(json.dumps({"users": users, "num_samples": [len(data[u]["y"]) for u in users], "user_data": data}))


def reference(root: Path, cid: int, leaf_split: bool, splits: Splits, seed: int):
    """The client straight from the JSON, the way LeafFEMNIST computed it before the cache."""
    parts = {}
    for sub in ("train", "test"):
        users = {}
        for f in sorted((root / sub).glob("*.json")):
            doc = json.loads(f.read_text())
            for u in doc["users"]:
                users[u] = (doc["user_data"][u]["x"], doc["user_data"][u]["y"])
        parts[sub] = users
    names = sorted(set(parts["train"]) | set(parts["test"]))
    name = names[cid]
    (trx, try_), (tex, tey) = (
        (np.asarray(x, np.float32).reshape(-1, 1, 28, 28), np.asarray(y, np.int64))
        for x, y in (parts[s].get(name, ([], [])) for s in ("train", "test"))
    )
    if not leaf_split:
        c = split_client(cid, np.concatenate([trx, tex]), np.concatenate([try_, tey]), splits, seed)
        return [c.train_x, c.train_y, c.val_x, c.val_y, c.test_x, c.test_y]
    n_val = int(round(splits.val * len(try_)))
    perm = generator(seed, "split", cid).permutation(len(try_))
    va, tr = perm[:n_val], perm[n_val:]
    t = torch.from_numpy
    return [t(trx[tr]), t(try_[tr]), t(trx[va]), t(try_[va]), t(tex), t(tey)]


def fields(c):
    return [c.train_x, c.train_y, c.val_x, c.val_y, c.test_x, c.test_y]


def assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape)
        assert torch.equal(g, w)


def source(root, leaf_split=True, clients=4, splits=Splits(0.5, 0.25, 0.25), seed=3):
    return LeafFEMNIST(
        LeafParams(root=str(root), leaf_split=leaf_split), clients=clients, partition=None, splits=splits, seed=seed
    )


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # never touch the real ~/.cache
    root = tmp_path / "femnist"
    write_tree(root)
    return root


def local_cache(root: Path) -> Path:
    return root / ".raysim-cache" / "leaf_femnist"


@pytest.mark.parametrize("leaf_split", [True, False])
def test_clients_identical_before_and_after_the_cache(tree, leaf_split):
    assert not local_cache(tree).exists()
    first = source(tree, leaf_split)
    before = [fields(first.client(cid)) for cid in range(4)]
    assert (local_cache(tree) / "index.json").is_file()
    second = source(tree, leaf_split)
    after = [fields(second.client(cid)) for cid in range(4)]
    for cid in range(4):
        want = reference(tree, cid, leaf_split, Splits(0.5, 0.25, 0.25), 3)
        assert_same(before[cid], want)
        assert_same(after[cid], want)
        assert first.num_samples(cid) == second.num_samples(cid) == sum(len(w) for w in want[1::2])
    # pixel values as written: f0001_42 is WRITERS[1]; its train images are codes 100..103
    c = second.client(0)
    if leaf_split:
        assert sorted(c.train_x[:, 0, 0, 0].tolist() + c.val_x[:, 0, 0, 0].tolist()) == [100, 101, 102, 103]
        assert c.test_x[:, 0, 0, 0].tolist() == [110.0]
        assert c.test_x.shape == (1, 1, 28, 28) and c.train_x.dtype == torch.float32
        assert c.train_y.dtype == torch.int64
        assert torch.allclose(c.test_x.reshape(-1), torch.tensor(image(110), dtype=torch.float32))
    last = second.client(3)  # f0004_00: no test data anywhere
    assert last.num_train + last.num_val + int(last.test_y.shape[0]) == 3
    if leaf_split:
        assert last.test_x.shape == (0, 1, 28, 28) and last.test_y.shape == (0,)


def test_second_source_reads_the_cache_not_the_json(tree, monkeypatch):
    source(tree).client(0)  # builds the cache

    def no_parsing(*a, **k):
        raise AssertionError("parsed the JSON again")

    monkeypatch.setattr(leaf, "_decode", no_parsing)
    monkeypatch.setattr(leaf, "_parse", no_parsing)

    src = source(tree)
    assert src.num_samples(2) == 5 + 2  # f0003_11 = WRITERS[0]: 5 train, 2 test
    assert src.cache().cached._arrays is None  # counting read only the index
    c = src.client(2)  # its codes: train 0..4, test 10..11
    assert sorted(c.train_x[:, 0, 0, 0].tolist() + c.val_x[:, 0, 0, 0].tolist()) == [0, 1, 2, 3, 4]
    assert c.test_x[:, 0, 0, 0].tolist() == [10, 11]
    arrays = src.cache().arrays()
    for k, a in arrays.items():
        assert isinstance(a, np.memmap) and Path(a.filename) == local_cache(tree) / f"{k}.npy"
        assert not a.flags.writeable
    assert arrays["train_x"].dtype == np.float32 and arrays["train_x"].shape == (18, 1, 28, 28)
    assert arrays["test_y"].dtype == np.int64 and arrays["test_y"].shape == (5,)
    index = json.loads((local_cache(tree) / "index.json").read_text())
    assert index["writers"] == sorted(WRITERS)
    assert index["train_offsets"] == [0, 4, 10, 15, 18] and index["test_offsets"] == [0, 1, 3, 5, 5]
    # a pickled source carries no memory maps and reopens the cache on the other side
    import pickle

    clone = pickle.loads(pickle.dumps(src))
    assert clone._cache is None
    assert_same(fields(clone.client(2)), fields(c))


def test_changed_json_rebuilds_the_cache(tree):
    old = source(tree)
    old_client = fields(old.client(2))
    f = tree / "train" / "all_data_1.json"  # writers f0002_07 and f0004_00
    st = f.stat()
    SIZES["train"][2] += 2  # f0002_07 gets 2 more images
    try:
        write_part(f, "train", 0, WRITERS[2:], offset=1000)
    finally:
        SIZES["train"][2] -= 2
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert f.stat().st_size != st.st_size

    new = source(tree)
    assert new.num_samples(1) == 8 + 2  # f0002_07: now 8 train, still 2 test
    index = json.loads((local_cache(tree) / "index.json").read_text())
    assert [r[1:] for r in index["files"]["train"] if r[0] == f.name] == [[f.stat().st_size, f.stat().st_mtime_ns]]
    c = new.client(1)
    codes = sorted(c.train_x[:, 0, 0, 0].tolist() + c.val_x[:, 0, 0, 0].tolist())
    assert codes == [1200.0 + k for k in range(8)]  # the new values: 1000 + 100·2 + k
    assert_same(fields(c), reference(tree, 1, True, Splits(0.5, 0.25, 0.25), 3))
    assert_same(fields(new.client(2)), old_client)  # f0003_11 unchanged (other file)


def test_read_only_root_caches_under_xdg(tmp_path, monkeypatch):
    root = tmp_path / "femnist"
    write_tree(root)
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    if os.geteuid() == 0:  # root ignores chmod: say it is read-only
        real = cache.writable
        monkeypatch.setattr(cache, "writable", lambda p: False if root in Path(p).parents else real(p))
    else:
        os.chmod(root, 0o555)
    try:
        src = source(root)
        c = src.client(0)
        assert not (root / ".raysim-cache").exists()
        found = list((xdg / "raysim").glob("leaf_femnist-*/index.json"))
        assert len(found) == 1
        assert src.cache().folder == found[0].parent
        assert isinstance(src.cache().arrays()["train_x"], np.memmap)
        assert_same(fields(c), reference(root, 0, True, Splits(0.5, 0.25, 0.25), 3))
        monkeypatch.setattr(leaf, "_parse", lambda *a: (_ for _ in ()).throw(AssertionError("parsed again")))
        assert_same(fields(source(root).client(0)), fields(c))
    finally:
        os.chmod(root, 0o755)


def test_damaged_or_half_written_cache_is_rebuilt(tree):
    want = fields(source(tree).client(1))
    cache = local_cache(tree)
    (cache / "index.json").unlink()  # a crash before the index was written
    (cache / "train_x.tmp999.deadbeef.npy").write_bytes(b"junk")
    assert_same(fields(source(tree).client(1)), want)
    assert (cache / "index.json").is_file() and not list(cache.glob("*.tmp*"))
    with open(cache / "train_x.npy", "r+b") as fh:  # truncated array: size no longer matches
        fh.truncate(1000)
    assert_same(fields(source(tree).client(1)), want)
    assert (cache / "train_x.npy").stat().st_size > 1000


def test_concurrent_builders_parse_once(tree):
    code = f"""
import sys
sys.path.insert(0, {str(ROOT_SRC)!r})
from raysim.data import leaf
from raysim.data.base import Splits
built = []
real = leaf._parse
leaf._parse = lambda *a: (built.append(1), real(*a))[1]
src = leaf.LeafFEMNIST(leaf.LeafParams(root={str(tree)!r}), 4, None, Splits(0.5, 0.25, 0.25), 3)
c = src.client(2)
print(len(built), float(c.test_x.sum()))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT_SRC))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    rows = [o[0].split() for o in outs]
    assert sum(int(r[0]) for r in rows) == 1  # exactly one process parsed the JSON
    assert len({r[1] for r in rows}) == 1
    assert not list(local_cache(tree).glob("*.tmp*"))


def test_errors_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "femnist"
    (root / "train").mkdir(parents=True)
    with pytest.raises(DataError, match=r"no test/ folder .*preprocess.sh"):
        source(root).num_samples(0)
    (root / "test").mkdir()
    with pytest.raises(DataError, match=r"no JSON files in .*train.*preprocess.sh"):
        source(root).client(0)
    write_tree(root)
    with pytest.raises(DataError, match="holds 4 writers, the scenario asks for data.clients = 5"):
        source(root, clients=5).client(0)
    (root / "test" / "all_data_1.json").write_text('{"users": ["a"]}')
    with pytest.raises(DataError, match=r"all_data_1.json is not a LEAF JSON file .*KeyError"):
        source(root).client(0)
