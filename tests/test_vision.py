"""CIFAR-10/100 (binary versions) and EMNIST (IDX) from files written here, Pachinko allocation,
and torchvision's MobileNetV2 / ResNet-18 with weights from a local file."""

import gzip
import struct

import numpy as np
import pytest
import torch

from raysim.data import DATASETS, PARTITIONERS, DataError, PartitionCfg, Splits, build_source
from raysim.data.partition import PachinkoParams, pachinko
from raysim.data.vision import CIFAR
from raysim.models import TorchvisionParams, mobilenet_v2, resnet18


def cifar_records(labels, coarse=None):
    """One record per label: its pixels all equal to the label's value (mod 256) per channel c + 10 c."""
    out = []
    for i, y in enumerate(labels):
        px = np.concatenate([np.full(1024, (y + 10 * c) % 256, dtype=np.uint8) for c in range(3)])
        head = [coarse[i], y] if coarse is not None else [y]
        out.append(np.concatenate([np.array(head, dtype=np.uint8), px]))
    return np.stack(out).tobytes()


def write_cifar10(root, per_file=4):
    d = root / "cifar-10-batches-bin"
    d.mkdir(parents=True)
    for k, name in enumerate(CIFAR["cifar10"]["files"]):
        (d / name).write_bytes(cifar_records([(k + i) % 10 for i in range(per_file)]))
    return root


def source(name, root, clients=2, kind="iid", params=None, **kw):
    spec = DATASETS[name]
    part = PartitionCfg(kind, params or PARTITIONERS[kind].Params())
    return build_source(name, spec.Params(root=str(root), **kw), clients, part, Splits(0.5, 0.0, 0.5), 0)


def test_cifar10_binary_records_become_normalized_images(tmp_path):
    src = source("cifar10", write_cifar10(tmp_path))
    x, y, parts = src.pool()
    assert x.shape == (24, 3, 32, 32) and x.dtype == np.uint8 and y.tolist()[:5] == [0, 1, 2, 3, 1]
    c = src.client(0)
    assert c.train_x.shape[1:] == (3, 32, 32) and c.train_x.dtype == torch.uint8  # the pixels, held
    i = int(parts[0][0])  # the client's first sample, by hand
    spec = CIFAR["cifar10"]
    want = [((y[i] + 10 * ch) / 255 - spec["mean"][ch]) / spec["std"][ch] for ch in range(3)]
    got = src.pixels(torch.cat([c.train_x, c.test_x]))[:, :, 0, 0]  # decoded per channel
    assert any(np.allclose(row.numpy(), want, atol=1e-5) for row in got)


def test_cifar_errors_refuse_the_pickled_version_and_truncated_files(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(DataError, match="pickled Python version, which raysim does not load.*cifar-10-binary.tar.gz"):
        source("cifar10", tmp_path).pool()
    root = write_cifar10(tmp_path / "t")
    with open(root / "cifar-10-batches-bin" / "test_batch.bin", "ab") as f:
        f.write(b"xx")
    with pytest.raises(DataError, match="not a whole number of 3073-byte records"):
        source("cifar10", root).pool()


def write_cifar100(root, n_train=300, n_test=100):
    d = root / "cifar-100-binary"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", n_train), ("test.bin", n_test)):
        fine = rng.integers(0, 20, n)  # 20 fine labels: coarse = fine // 5
        (d / name).write_bytes(cifar_records(fine.tolist(), (fine // 5).tolist()))
    return root


def test_cifar100_keeps_coarse_labels_and_pachinko_splits_by_them(tmp_path):
    src = source(
        "cifar100", write_cifar100(tmp_path), clients=8, kind="pachinko", params=PachinkoParams(alpha=0.05, beta=10.0)
    )
    assert src.coarse_labels[:20].tolist() == [f // 5 for f in range(20)]
    x, y, parts = src.pool()
    idx = np.concatenate(parts)
    assert all(len(p) == 400 // 8 for p in parts) and len(np.unique(idx)) == len(idx)  # disjoint, equal
    # alpha 0.05: a client's samples come mostly from one coarse label (until it runs out)
    shares = [np.bincount(y[p] // 5, minlength=4).max() / len(p) for p in parts]
    assert np.mean(shares) > 0.6
    with pytest.raises(DataError, match="partition pachinko needs coarse labels.*cifar100"):
        source("cifar10", write_cifar10(tmp_path / "c10"), kind="pachinko").pool()


def test_pachinko_renormalizes_when_labels_run_out():
    # 2 coarse labels x 2 fine labels, 3 samples each: 4 clients x 3 samples empty every label
    labels = np.repeat(np.arange(4), 3)
    coarse = np.array([0, 0, 1, 1])
    parts = pachinko(labels, 4, PachinkoParams(alpha=0.1, beta=0.1), np.random.default_rng(1), coarse)
    assert sorted(np.concatenate(parts).tolist()) == list(range(12))
    again = pachinko(labels, 4, PachinkoParams(alpha=0.1, beta=0.1), np.random.default_rng(1), coarse)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def idx(path, array, ndim):
    header = struct.pack(">I", 0x800 | ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_emnist_images_are_turned_upright_and_letters_start_at_zero(tmp_path):
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    img = np.zeros((28, 28), dtype=np.uint8)
    img[0, 5] = 255  # stored column-major: upright it is at (5, 0)
    for s, n in (("train", 6), ("test", 2)):
        idx(raw / f"emnist-letters-{s}-images-idx3-ubyte.gz", np.stack([img] * n), 3)
        idx(raw / f"emnist-letters-{s}-labels-idx1-ubyte.gz", np.arange(1, n + 1), 1)
    src = source("emnist", tmp_path, split="letters")
    x, y, _ = src.pool()
    assert x.shape == (8, 28, 28) and x[0, 5, 0] == 255 and x[0, 0, 5] == 0
    assert y.tolist() == [0, 1, 2, 3, 4, 5, 0, 1] and src.num_classes == 26
    half = source("emnist", tmp_path, split="letters", fraction=0.5)
    assert len(half.pool()[1]) == 4
    with pytest.raises(DataError, match="no emnist-byclass-train-images-idx3-ubyte.*gzip.zip"):
        source("emnist", tmp_path).pool()


def test_torchvision_models_take_weights_from_a_local_file_only_where_they_fit(tmp_path):
    import torchvision

    imagenet = torchvision.models.resnet18(weights=None)  # the layout of torchvision's ImageNet file
    torch.save(imagenet.state_dict(), tmp_path / "r18.pth")
    m = resnet18(TorchvisionParams(weights=str(tmp_path / "r18.pth")), (3, 32, 32), 10)
    assert torch.equal(m.conv1.weight, imagenet.conv1.weight)
    assert torch.equal(m.bn1.weight, imagenet.bn1.weight)  # the affine part goes to GroupNorm
    assert m.fc.weight.shape == (10, 512) and not list(m.buffers())  # 10 classes: fc left out; no stats
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    (tmp_path / "junk.pth").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="cannot load weights from .*junk.pth"):
        resnet18(TorchvisionParams(weights=str(tmp_path / "junk.pth")), (3, 32, 32), 10)
    with pytest.raises(ValueError, match="no tensor of .* matches"):
        mobilenet_v2(TorchvisionParams(weights=str(tmp_path / "r18.pth")), (3, 32, 32), 10)
    with pytest.raises(ValueError, match="needs 3 x H x W images"):
        mobilenet_v2(TorchvisionParams(), (1, 28, 28), 10)
    assert mobilenet_v2(TorchvisionParams(), (3, 32, 32), 100)(torch.randn(2, 3, 32, 32)).shape == (2, 100)
