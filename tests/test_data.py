"""Datasets, partitioners and per-client splits on small inputs, with hand-checkable numbers."""

import dataclasses
import gzip
import struct
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from raysim.data import DATASETS, PARTITIONERS, DataError, PartitionCfg, Splits, build_source, split_client
from raysim.data.fashion import MEAN, STD
from raysim.data.partition import DirichletParams, IIDParams, ShardsParams
from raysim.data.synthetic import GaussianParams, SyntheticMixture, SyntheticParams

IID = PartitionCfg("iid", IIDParams())


# ------------------------------------------------------------------------------- registries
def test_registries_name_their_components_and_params_have_checkable_defaults():
    assert {"synthetic", "gaussian", "fashion_mnist"} <= set(DATASETS)
    assert set(PARTITIONERS) == {"dirichlet", "shards", "iid", "mixture", "nfold", "client_dirichlet", "pachinko"}
    assert DATASETS["fashion_mnist"].pooled and not DATASETS["synthetic"].pooled
    for spec in list(DATASETS.values()) + list(PARTITIONERS.values()):
        assert spec.summary and "\n" not in spec.summary
        typing.get_type_hints(spec.Params)  # plain, resolvable annotations
        for f in dataclasses.fields(spec.Params):
            assert f.default is not dataclasses.MISSING, (spec.name, f.name)
            assert set(f.metadata) <= {"min", "max", "gt", "lt", "choices", "help"}, (spec.name, f.name)
        spec.Params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        SyntheticParams().dim = 3


# ------------------------------------------------------------------------------- split_client
def test_split_client_fractions_disjoint_deterministic():
    x = torch.arange(20, dtype=torch.float32).reshape(20, 1)
    y = torch.arange(20)
    c = split_client(4, x, y, Splits(0.7, 0.1, 0.2), seed=0)
    assert (len(c.train_y), len(c.val_y), len(c.test_y)) == (14, 2, 4)
    assert torch.equal(c.train_x[:, 0].long(), c.train_y)  # rows stay paired
    assert sorted(torch.cat([c.train_y, c.val_y, c.test_y]).tolist()) == list(range(20))
    again = split_client(4, x, y, Splits(0.7, 0.1, 0.2), seed=0)
    assert torch.equal(c.test_y, again.test_y) and torch.equal(c.train_y, again.train_y)
    other = split_client(5, x, y, Splits(0.7, 0.1, 0.2), seed=0)  # another client: another shuffle
    assert not torch.equal(c.train_y, other.train_y)
    assert c.train_x.dtype == torch.float32 and c.train_y.dtype == torch.int64


@pytest.mark.parametrize(
    "n, splits, sizes",
    [
        (10, Splits(0.85, 0.0, 0.15), (9, 0, 1)),  # round(8.5) = 9: half up
        (2, Splits(0.9, 0.0, 0.1), (1, 0, 1)),  # at least one test sample
        (2, Splits(0.1, 0.0, 0.9), (1, 0, 1)),  # at least one train sample
        (3, Splits(0.2, 0.6, 0.2), (1, 1, 1)),  # val gives way first
        (5, Splits(1.0, 0.0, 0.0), (5, 0, 0)),  # no test asked, none given
        (1, Splits(0.8, 0.0, 0.2), (1, 0, 0)),
    ],
)
def test_split_client_sizes(n, splits, sizes):
    c = split_client(0, np.zeros((n, 3), np.float32), np.arange(n), splits, seed=1)
    assert (len(c.train_y), len(c.val_y), len(c.test_y)) == sizes


def test_splits_must_sum_to_one():
    with pytest.raises(ValueError):
        Splits(0.5, 0.5, 0.5)


# ------------------------------------------------------------------------------- synthetic
def synth(clients=20, seed=0, **kw):
    return SyntheticMixture(SyntheticParams(**{"dim": 20, **kw}), clients, Splits(), seed)


def test_synthetic_is_deterministic_per_client_and_seed():
    a, b, c = synth(), synth(clients=5), synth(seed=1)
    xa, ya, _ = a.raw(3)
    xb, yb, _ = b.raw(3)  # client 3 does not depend on how many clients exist
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb) and np.array_equal(a.theta, b.theta)
    assert not np.array_equal(xa[:5], c.raw(3)[0][:5]) and not np.array_equal(a.theta, c.theta)
    assert torch.equal(a.client(3).test_x, b.client(3).test_x)
    assert xa.dtype == np.float32 and ya.dtype == np.int64 and xa.shape[1] == 20
    assert set(np.unique(ya)) <= {0, 1} and np.abs(xa).max() <= 1 and np.abs(a.theta).max() <= 1


def test_synthetic_sizes_follow_lognormal_plus_min_capped():
    s = synth(clients=300)
    n = np.array([s.num_samples(c) for c in range(300)])
    assert n.min() >= 50 and n.max() <= 1000
    assert 85 <= np.median(n) <= 130  # median int(e^4 = 54.6) + 50 ≈ 104
    assert 0.03 <= np.mean(n == 1000) <= 0.15  # P(lognormal(4, 2) > 950) ≈ 0.077
    c = s.client(7)
    assert c.num_train + len(c.val_y) + c.num_test == s.num_samples(7) == len(s.raw(7)[1])
    assert c.train_x.shape == (c.num_train, 20) and s.input_shape == (20,) and s.num_classes == 2
    fixed = synth(min_samples=60, max_samples=60)
    assert {fixed.num_samples(c) for c in range(20)} == {60}


def test_synthetic_labels_follow_the_component_models_exactly_without_noise():
    one = synth(noise=0.0, components=1)
    x, y, comp = one.raw(0)
    expected = np.round(1 / (1 + np.exp(-(x.astype(np.float64) @ one.theta[0]))))
    assert np.array_equal(y, expected.astype(np.int64)) and np.all(comp == 0)
    three = synth(noise=0.0)
    x, y, comp = three.raw(1)
    logits = np.einsum("nd,nd->n", x.astype(np.float64), three.theta[comp])
    assert np.array_equal(y, np.round(1 / (1 + np.exp(-logits))).astype(np.int64))
    noisy = synth(noise=0.5).raw(1)[1]
    assert 0 < np.sum(noisy != y) < 0.2 * len(y)  # same x, logit noise flips a few labels


def test_synthetic_components_follow_the_mixture_weights():
    s = synth(min_samples=1000, max_samples=1000)
    for cid in range(3):
        share = np.bincount(s.component_of(cid), minlength=3) / 1000
        assert np.abs(share - s.mixture_weights(cid)).max() < 0.06


def test_legacy_overwrite_reproduces_the_official_label_skew():
    fixed = synth(clients=150, dim=150)
    legacy = synth(clients=150, dim=150, legacy_overwrite=True)
    rate = lambda s: np.mean(np.concatenate([s.raw(c)[1] for c in range(150)]))  # noqa: E731
    assert 0.45 < rate(fixed) < 0.55
    assert 0.30 < rate(legacy) < 0.42
    for cid in range(10):
        xf, _, comp_f = fixed.raw(cid)
        xl, yl, comp_l = legacy.raw(cid)
        assert np.array_equal(xf, xl)  # same draws, only the label writes differ
        counts = np.bincount(comp_f, minlength=3)
        assert np.sum(comp_l == -1) == len(yl) - counts.max()
        assert np.all(yl[comp_l == -1] == 0)  # rows past the largest block keep label 0
        for m in range(3):  # the last write wins
            later = counts[m + 1 :].max(initial=0)
            assert np.sum(comp_l == m) == max(0, counts[m] - later)


def test_synthetic_rejects_max_below_min():
    with pytest.raises(DataError, match="max_samples"):
        synth(min_samples=100, max_samples=50)


# ------------------------------------------------------------------------------- gaussian
def test_gaussian_shapes_and_determinism():
    src = build_source(
        "gaussian", GaussianParams(samples=10, features=(1, 4, 4), classes=3), 5, None, Splits(0.6, 0.0, 0.4), 7
    )
    c = src.client(2)
    assert c.train_x.shape == (6, 1, 4, 4) and c.test_x.shape == (4, 1, 4, 4)
    assert src.input_shape == (1, 4, 4) and src.num_classes == 3 and src.num_samples(2) == 10
    assert 0 <= c.train_y.min() and c.train_y.max() < 3 and c.train_x.dtype == torch.float32
    assert torch.equal(c.train_x, src.client(2).train_x)
    assert not torch.equal(c.train_x, src.client(3).train_x)
    big = build_source("gaussian", GaussianParams(samples=4000, features=(25,)), 1, None, Splits(), 0).client(0)
    assert abs(big.train_x.mean().item()) < 0.01 and abs(big.train_x.std().item() - 1) < 0.01
    assert abs(big.train_y.float().mean().item() - 0.5) < 0.03


# ------------------------------------------------------------------------------- fashion_mnist
NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_idx(path, arr, gz=False):
    data = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data += arr.astype(np.uint8).tobytes()
    Path(f"{path}.gz" if gz else path).write_bytes(gzip.compress(data) if gz else data)


def fashion_root(root, gz):
    """50 images: image i has pixel (0, 0) = 5i, pixel (27, 27) = 255 - i, label i % 10."""
    imgs = np.zeros((50, 28, 28), np.uint8)
    imgs[:, 0, 0] = 5 * np.arange(50)
    imgs[:, 27, 27] = 255 - np.arange(50)
    labels = np.arange(50) % 10
    for name, arr in zip(NAMES, (imgs[:40], labels[:40], imgs[40:], labels[40:])):
        write_idx(root / name, arr, gz=gz)


def fashion(root, clients=5, partition=IID):
    return build_source(
        "fashion_mnist", DATASETS["fashion_mnist"].Params(root=str(root)), clients, partition, Splits(0.8, 0, 0.2), 0
    )


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_mnist_reads_idx_files_and_its_pixels_decode_normalized(tmp_path, gz):
    fashion_root(tmp_path, gz)
    src = fashion(tmp_path)
    assert [src.num_samples(c) for c in range(5)] == [10] * 5
    parts = [src.client(c) for c in range(5)]
    assert all(p.num_train == 8 and p.num_test == 2 for p in parts)
    x = torch.cat([t for p in parts for t in (p.train_x, p.test_x)])
    y = torch.cat([t for p in parts for t in (p.train_y, p.test_y)])
    assert x.shape == (50, 1, 28, 28) and x.dtype == torch.uint8  # clients hold the pixels
    x = src.pixels(x)  # the model's inputs
    assert x.dtype == torch.float32
    i = torch.round((x[:, 0, 0, 0] * STD + MEAN) * 255 / 5).long()  # recover each image's index
    assert sorted(i.tolist()) == list(range(50)) and torch.equal(y, i % 10)
    assert torch.allclose(x[:, 0, 27, 27], ((255 - i) / 255 - MEAN) / STD, atol=1e-6)
    assert abs(x[i == 0][0, 0, 0, 0].item() - (-0.2860 / 0.3530)) < 1e-6  # pixel 0 -> -0.81020
    assert abs(x[i == 0][0, 0, 5, 5].item() + 0.810198) < 1e-5


def test_fltrusts_root_set_of_fashion_mnist_holds_pool_images_no_client_holds(tmp_path):
    fashion_root(tmp_path, False)
    src = fashion(tmp_path)
    src.root_size = 5  # what defence: {rule: fltrust, root_size: 5} sets
    root = src.root_set(5)
    assert root.num_train == 5 and root.train_x.dtype == torch.uint8 and root.train_x.shape == (5, 1, 28, 28)

    def index(x):  # each image's index, from its pixel (0, 0) = 5i
        return set(torch.round((src.pixels(x)[:, 0, 0, 0] * STD + MEAN) * 255 / 5).long().tolist())

    held = set().union(*(index(torch.cat([p.train_x, p.test_x])) for p in map(src.client, range(5))))
    assert len(held) == 45 and not held & index(root.train_x) and held | index(root.train_x) == set(range(50))


@pytest.mark.parametrize("dataset", ["fashion_mnist", "cifar10", "cifar100", "emnist"])
def test_pixels_decode_to_the_floats_numpy_normalization_of_the_pool_gave(dataset):
    """Every value of every channel, bit for bit: (x / 255 - mean) / std in float32, as the
    pool was normalized before clients held uint8 pixels, so runs keep their numbers."""
    from raysim.core.data import Pixels
    from raysim.data.vision import CIFAR

    constants = {
        "fashion_mnist": ((MEAN,), (STD,)),
        "emnist": ((0.0,), (1.0,)),
        **{name: (spec["mean"], spec["std"]) for name, spec in CIFAR.items()},
    }
    mean, std = constants[dataset]
    if dataset in ("fashion_mnist", "emnist"):  # CIFAR's are set per instance (its test_vision test)
        assert DATASETS[dataset].build.pixels == Pixels(mean, std)
    c = len(mean)
    u = np.broadcast_to(np.arange(256, dtype=np.uint8)[:, None, None, None], (256, c, 2, 3)).copy()
    m = np.asarray(mean, dtype=np.float32).reshape(1, c, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, c, 1, 1)
    want = (u.astype(np.float32) / np.float32(255.0) - m) / s
    got = Pixels(mean, std)(torch.from_numpy(u))
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), want)
    stacked = Pixels(mean, std)(torch.from_numpy(u).expand(2, *u.shape))  # (K, B, C, H, W) batches
    assert np.array_equal(stacked[1].numpy(), want)
    floats = torch.from_numpy(want)
    assert Pixels(mean, std)(floats) is floats  # floats pass through


def test_fashion_mnist_reads_gzip_without_the_suffix_and_partitions(tmp_path):
    fashion_root(tmp_path, gz=True)
    for name in NAMES[:2]:
        (tmp_path / f"{name}.gz").rename(tmp_path / name)
    src = fashion(tmp_path, clients=10, partition=PartitionCfg("shards", ShardsParams(1)))
    for c in range(10):  # 10 shards of 5 label-sorted samples (5 per label): one label per client
        assert len(torch.unique(torch.cat([src.client(c).train_y, src.client(c).test_y]))) == 1


def test_fashion_mnist_errors_name_files_and_package(tmp_path):
    absent = fashion(tmp_path / "absent")  # building reads nothing
    with pytest.raises(DataError, match="dataset-fashion-mnist") as e:
        absent.client(0)
    assert "\n" not in str(e.value) and str(tmp_path / "absent") in str(e.value)
    assert "train-images-idx3-ubyte[.gz]" in str(e.value)
    fashion_root(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="lacks t10k-labels-idx1-ubyte"):
        fashion(tmp_path).client(0)
    fashion_root(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x03" + bytes(16))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.*bad magic.*0x00000801"):
        fashion(tmp_path).client(0)
    fashion_root(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.*truncated"):
        fashion(tmp_path).client(0)
    fashion_root(tmp_path, gz=False)
    with pytest.raises(DataError, match="too few"):
        fashion(tmp_path, clients=60).client(0)
    with pytest.raises(ValueError, match="partition"):
        fashion(tmp_path, partition=None)


def test_fashion_mnist_idx_decompressed_once_into_a_memory_mapped_cache(tmp_path, monkeypatch):
    fashion_root(tmp_path, gz=True)
    first = [fashion(tmp_path).client(c) for c in range(5)]
    folder = tmp_path / ".raysim-cache" / "fashion_mnist"
    x, y = np.load(folder / "x.npy"), np.load(folder / "y.npy")
    assert x.shape == (50, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert x[:, 0, 0].tolist() == [5 * i for i in range(50)]  # train (40) then test (10)
    assert y.tolist() == [i % 10 for i in range(50)]

    from raysim.data import fashion as fashion_module

    def no_reading(*a, **k):
        raise AssertionError("read the IDX files again")

    monkeypatch.setattr(fashion_module, "read_idx", no_reading)
    src = fashion(tmp_path)
    again = [src.client(c) for c in range(5)]
    pool_x, pool_y, _ = src.pool()
    assert isinstance(pool_x, np.memmap) and Path(pool_x.filename) == folder / "x.npy"
    for a, b in zip(first, again):
        assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    monkeypatch.undo()

    # a changed file (other size, mtime) is read again: test labels now 9 - i % 10
    write_idx(tmp_path / NAMES[3], 9 - np.arange(40, 50) % 10, gz=False)
    (tmp_path / f"{NAMES[3]}.gz").unlink()
    _, labels, _ = fashion(tmp_path).pool()
    assert labels[40:].tolist() == [9 - i % 10 for i in range(40, 50)] and labels[:40].tolist() == y[:40].tolist()


def test_a_prepared_pooled_source_carries_its_partition_not_its_pool(tmp_path, monkeypatch):
    import pickle

    fashion_root(tmp_path, gz=False)
    src = fashion(tmp_path, clients=5, partition=PartitionCfg("dirichlet", DirichletParams(alpha=0.5, min_size=2)))
    src.prepare()
    blob = pickle.dumps(src)
    assert len(blob) < 50 * 28 * 28  # the images stay behind
    clone = pickle.loads(blob)
    assert clone._arrays is None
    assert all(np.array_equal(a, b) for a, b in zip(clone._parts, src._parts))

    def no_partitioning(*a, **k):
        raise AssertionError("partitioned again")

    spec = PARTITIONERS["dirichlet"]
    monkeypatch.setitem(PARTITIONERS, "dirichlet", dataclasses.replace(spec, fn=no_partitioning))
    for c in range(5):
        a, b = src.client(c), clone.client(c)
        assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y)
        assert clone.num_samples(c) == len(src._parts[c])


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="dataset-fashion-mnist absent")
def test_fashion_mnist_from_the_debian_package():
    src = build_source("fashion_mnist", DATASETS["fashion_mnist"].Params(), 10, IID, Splits(), 0)
    assert sum(src.num_samples(c) for c in range(10)) == 70_000
    _, labels, _ = src.pool()
    assert np.array_equal(np.bincount(labels), [7000] * 10)
    assert src.client(3).train_x.shape == (5600, 1, 28, 28)


# ------------------------------------------------------------------------------- partitioners
def labels_pool(n_per_class=100, classes=10):
    return np.repeat(np.arange(classes), n_per_class)


def max_share(y, parts):
    return np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts])


def exactly_once(parts, n):
    idx = np.concatenate(parts)
    return len(idx) == n and np.array_equal(np.sort(idx), np.arange(n))


def test_dirichlet_assigns_every_sample_once_and_skews_labels():
    y = labels_pool()
    parts = PARTITIONERS["dirichlet"].fn(y, 20, DirichletParams(alpha=0.05, min_size=5), np.random.default_rng(0))
    assert exactly_once(parts, 1000) and min(len(p) for p in parts) >= 5
    iid = PARTITIONERS["iid"].fn(y, 20, IIDParams(), np.random.default_rng(0))
    assert exactly_once(iid, 1000) and sorted(len(p) for p in iid) == [50] * 20
    assert max_share(y, parts) > 0.6 and max_share(y, iid) < 0.4
    wide = PARTITIONERS["dirichlet"].fn(y, 20, DirichletParams(alpha=100.0), np.random.default_rng(0))
    assert max_share(y, wide) < 0.4  # large alpha: close to iid
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def test_dirichlet_fix_up_reaches_min_size_and_rejects_impossible_requests():
    y = labels_pool()
    parts = PARTITIONERS["dirichlet"].fn(y, 50, DirichletParams(alpha=0.01, min_size=15), np.random.default_rng(3))
    assert exactly_once(parts, 1000) and min(len(p) for p in parts) >= 15
    with pytest.raises(ValueError, match="too few"):
        PARTITIONERS["dirichlet"].fn(y, 100, DirichletParams(min_size=11), np.random.default_rng(0))


@pytest.mark.parametrize(
    "kind, params", [("dirichlet", DirichletParams()), ("shards", ShardsParams()), ("iid", IIDParams())]
)
def test_partitioners_are_deterministic_for_a_fixed_rng(kind, params):
    y = labels_pool()
    fn = PARTITIONERS[kind].fn
    a, b = fn(y, 10, params, np.random.default_rng(1)), fn(y, 10, params, np.random.default_rng(1))
    c = fn(y, 10, params, np.random.default_rng(2))
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def test_shards_give_at_most_k_labels_and_drop_nothing():
    y = labels_pool()
    parts = PARTITIONERS["shards"].fn(y, 10, ShardsParams(2), np.random.default_rng(1))
    assert all(len(np.unique(y[p])) <= 2 and len(p) == 100 for p in parts) and exactly_once(parts, 1000)
    uneven = PARTITIONERS["shards"].fn(
        labels_pool()[:900].tolist() + [9] * 103, 7, ShardsParams(3), np.random.default_rng(0)
    )
    assert exactly_once(uneven, 1003) and {len(p) for p in uneven} <= {141, 142, 143, 144}


def test_iid_sizes_differ_by_at_most_one():
    parts = PARTITIONERS["iid"].fn(np.zeros(1003, np.int64), 10, IIDParams(), np.random.default_rng(0))
    assert exactly_once(parts, 1003) and sorted(len(p) for p in parts) == [100] * 7 + [101] * 3


def write_leaf(root, users, seed=0):
    rng = np.random.default_rng(seed)
    import json

    for sub, n in (("train", 6), ("test", 2)):
        (root / sub).mkdir(parents=True)
        doc = {
            "users": users,
            "num_samples": [n] * len(users),
            "user_data": {
                u: {"x": rng.random((n, 784)).round(3).tolist(), "y": [int(v) for v in rng.integers(0, 62, n)]}
                for u in users
            },
        }
        (root / sub / "all_data_0.json").write_text(json.dumps(doc))


def test_leaf_femnist_one_client_per_writer(tmp_path):
    write_leaf(tmp_path, ["f0003_11", "f0001_42", "f0002_07"])
    params = DATASETS["leaf_femnist"].Params(root=str(tmp_path))
    src = build_source("leaf_femnist", params, 2, None, Splits(0.8, 0.0, 0.2), 0)
    c = src.client(0)  # writers sorted: f0001_42 first
    assert c.train_x.shape == (6, 1, 28, 28) and c.test_x.shape == (2, 1, 28, 28)
    assert src.num_samples(1) == 8 and src.num_classes == 62
    import json

    doc = json.loads((tmp_path / "train" / "all_data_0.json").read_text())
    assert sorted(c.train_y.tolist()) == sorted(doc["user_data"]["f0001_42"]["y"])


def test_leaf_femnist_errors_say_how_to_make_the_data(tmp_path):
    src = build_source("leaf_femnist", DATASETS["leaf_femnist"].Params(root=str(tmp_path)), 2, None, Splits(), 0)
    with pytest.raises(DataError, match="preprocess.sh -s niid --sf 0.15"):
        src.client(0)
    write_leaf(tmp_path, ["a"])
    src = build_source("leaf_femnist", DATASETS["leaf_femnist"].Params(root=str(tmp_path)), 2, None, Splits(), 0)
    with pytest.raises(DataError, match="holds 1 writers"):
        src.client(0)
    (tmp_path / "train" / "all_data_0.json").write_text("{not json")
    src = build_source("leaf_femnist", DATASETS["leaf_femnist"].Params(root=str(tmp_path)), 1, None, Splits(), 0)
    with pytest.raises(DataError, match="not a LEAF JSON file"):
        src.client(0)


def test_digits_read_from_scikit_learns_file_equal_its_loader_without_importing_sklearn_datasets():
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sk_load_digits

    from raysim.data.synthetic import load_digits

    x, y = load_digits()
    want_x, want_y = sk_load_digits(return_X_y=True)
    assert x.shape == (1797, 64) and np.array_equal(x, want_x) and np.array_equal(y, want_y)
    assert x.dtype == want_x.dtype and y.dtype == want_y.dtype
    # the point of reading the file: a host loading the digits imports neither scikit-learn's
    # datasets module nor what it drags in (SciPy's statistics, pandas)
    code = (
        "import sys; from raysim.data.synthetic import load_digits; load_digits(); "
        "print(sorted(m for m in ('sklearn.datasets', 'scipy.stats', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    assert out.strip() == "[]"
