"""Datasets, partitioners and per-client splits on small inputs."""
import gzip
import struct

import numpy as np
import pytest
import torch

from raysim.data import DATASETS, PARTITIONERS, DataError, PartitionCfg, Splits, build_source, split_client
from raysim.data.fashion import MEAN, STD
from raysim.data.partition import DirichletParams, IIDParams, ShardsParams
from raysim.data.synthetic import GaussianParams, SyntheticMixture, SyntheticParams


def synth(clients=20, seed=0, **kw):
    return SyntheticMixture(SyntheticParams(**{"dim": 20, **kw}), clients, Splits(), seed)


def test_synthetic_is_deterministic_and_in_range():
    a, b, c = synth(), synth(), synth(seed=1)
    xa, ya, _ = a.raw(3)
    xb, yb, _ = b.raw(3)
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not np.array_equal(xa[:5], c.raw(3)[0][:5])
    for cid in range(20):
        n = a.num_samples(cid)
        assert 50 <= n <= 1000 and len(a.raw(cid)[1]) == n
    assert set(np.unique(ya)) <= {0, 1} and xa.shape[1] == 20 and np.abs(xa).max() <= 1


def test_synthetic_labels_follow_the_component_models_exactly_without_noise():
    s = synth(noise=0.0)
    x, y, comp = s.raw(0)
    logits = np.einsum("nd,nd->n", x.astype(np.float64), s.theta[comp])
    expected = np.round(1 / (1 + np.exp(-logits)))
    assert np.array_equal(y, expected.astype(np.int64))


def test_legacy_overwrite_reproduces_the_official_label_skew():
    fixed = synth(clients=150, dim=150)
    legacy = synth(clients=150, dim=150, legacy_overwrite=True)
    rate = lambda s: np.mean(np.concatenate([s.raw(c)[1] for c in range(150)]))   # noqa: E731
    assert 0.45 < rate(fixed) < 0.55
    assert 0.30 < rate(legacy) < 0.42
    _, y, comp = legacy.raw(0)
    assert np.all(y[comp == -1] == 0)          # rows no component block reached keep label 0


def test_gaussian_shapes_and_determinism():
    spec = DATASETS["gaussian"]
    src = build_source("gaussian", GaussianParams(samples=10, features=(1, 4, 4), classes=3), 5, None,
                       Splits(0.6, 0.0, 0.4), 7)
    c = src.client(2)
    assert c.train_x.shape == (6, 1, 4, 4) and c.test_x.shape == (4, 1, 4, 4)
    assert c.train_y.max() < 3 and not spec.pooled
    assert torch.equal(c.train_x, src.client(2).train_x)


def write_idx(path, arr, magic_type=0x08, gz=False):
    header = struct.pack(">BBBB", 0, 0, magic_type, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    (gzip.open(str(path) + ".gz", "wb") if gz else open(path, "wb")).write(data)


def fashion_root(tmp_path, gz):
    rng = np.random.default_rng(0)
    tr_x, te_x = rng.integers(0, 256, (40, 28, 28)), rng.integers(0, 256, (10, 28, 28))
    tr_y, te_y = np.arange(40) % 10, np.arange(10)
    for name, arr in (("train-images-idx3-ubyte", tr_x), ("train-labels-idx1-ubyte", tr_y),
                      ("t10k-images-idx3-ubyte", te_x), ("t10k-labels-idx1-ubyte", te_y)):
        write_idx(tmp_path / name, arr, gz=gz)
    return np.concatenate([tr_x, te_x]), np.concatenate([tr_y, te_y])


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_mnist_reads_idx_files(tmp_path, gz):
    images, labels = fashion_root(tmp_path, gz)
    params = DATASETS["fashion_mnist"].Params(root=str(tmp_path))
    src = build_source("fashion_mnist", params, 5, PartitionCfg("iid", IIDParams()), Splits(0.8, 0, 0.2), 0)
    total = sum(src.num_samples(c) for c in range(5))
    assert total == 50
    c = src.client(0)
    assert c.train_x.shape[1:] == (1, 28, 28)
    # every client sample is one of the pool's images, normalized with the dataset's mean/std
    pix = c.train_x[0, 0, 0, 0].item()
    raw = round((pix * STD + MEAN) * 255)
    assert 0 <= raw <= 255 and abs(((raw / 255) - MEAN) / STD - pix) < 1e-5


def test_fashion_mnist_errors_name_files_and_package(tmp_path):
    params = DATASETS["fashion_mnist"].Params(root=str(tmp_path / "absent"))
    src = build_source("fashion_mnist", params, 2, PartitionCfg("iid", IIDParams()), Splits(), 0)
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        src.client(0)
    fashion_root(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x09\x01garbage")
    src = build_source("fashion_mnist", DATASETS["fashion_mnist"].Params(root=str(tmp_path)), 2,
                       PartitionCfg("iid", IIDParams()), Splits(), 0)
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.*bad magic"):
        src.client(0)


def labels_pool(n_per_class=100, classes=10):
    return np.repeat(np.arange(classes), n_per_class)


def test_dirichlet_assigns_every_sample_once_and_skews_labels():
    y = labels_pool()
    rng = np.random.default_rng(0)
    parts = PARTITIONERS["dirichlet"].fn(y, 20, DirichletParams(alpha=0.05, min_size=5), rng)
    allidx = np.concatenate(parts)
    assert len(allidx) == len(y) and len(np.unique(allidx)) == len(y)
    assert min(len(p) for p in parts) >= 5
    share = np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts])
    iid = PARTITIONERS["iid"].fn(y, 20, IIDParams(), np.random.default_rng(0))
    iid_share = np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in iid])
    assert share > 0.6 and iid_share < 0.4
    assert sorted(len(p) for p in iid) == [50] * 20


def test_shards_give_at_most_k_labels_and_are_deterministic():
    y = labels_pool()
    a = PARTITIONERS["shards"].fn(y, 10, ShardsParams(2), np.random.default_rng(1))
    b = PARTITIONERS["shards"].fn(y, 10, ShardsParams(2), np.random.default_rng(1))
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert all(len(np.unique(y[p])) <= 2 for p in a)
    assert len(np.unique(np.concatenate(a))) == 1000


def test_split_client_fractions_disjoint_deterministic():
    x = torch.arange(20, dtype=torch.float32).reshape(20, 1)
    y = torch.arange(20)
    c = split_client(4, x, y, Splits(0.7, 0.1, 0.2), seed=0)
    assert (len(c.train_y), len(c.val_y), len(c.test_y)) == (14, 2, 4)
    ids = torch.cat([c.train_y, c.val_y, c.test_y])
    assert sorted(ids.tolist()) == list(range(20))
    assert torch.equal(c.test_y, split_client(4, x, y, Splits(0.7, 0.1, 0.2), seed=0).test_y)
    tiny = split_client(0, x[:2], y[:2], Splits(0.9, 0.0, 0.1), seed=0)
    assert len(tiny.train_y) == 1 and len(tiny.test_y) == 1
