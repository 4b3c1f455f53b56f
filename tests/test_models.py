"""The seed papers' image models (raysim/models/vision.py, registered in raysim/models/__init__.py):
output shapes for their input sizes, parameter counts worked out by hand from the layer lists,
named head/body groups, and batch norm as client state through the training loop (running
statistics updated by the forward pass, never by the optimizer, kept per job, used in
evaluation)."""

import pytest
import torch
import torch.nn.functional as F

from raysim import cli
from raysim.core.data import ClientData, Context
from raysim.core.forward import params_of
from raysim.core.groups import groups_of
from raysim.core.loop import Settings, Supervised, Trainer, make_job
from raysim.core.tasks import TASKS
from raysim.models import (
    MODELS,
    FedSoftCNNParams,
    MobileNetParams,
    ResNet9Params,
    SqueezeNetParams,
    TwoNNParams,
    VGG9Params,
    fedsoft_cnn,
    mobilenet,
    resnet9,
    squeezenet,
    twocnn,
    twonn,
    vgg9,
)
from tests.conftest import write_scenario
from tests.test_vision import write_cifar10

CE = Supervised(TASKS["classification"])


def build(fn, params, shape, classes=10):
    torch.manual_seed(0)
    return fn(params, shape, classes)


def counts(model):
    """(trainable, running statistics) parameter counts."""
    ps = list(model.parameters())
    return sum(p.numel() for p in ps if p.requires_grad), sum(p.numel() for p in ps if not p.requires_grad)


# -- shapes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn, params, shape",
    [
        (twocnn, TwoNNParams(), (1, 28, 28)),
        (twocnn, TwoNNParams(), (3, 32, 32)),
        (vgg9, VGG9Params(), (1, 28, 28)),
        (vgg9, VGG9Params(norm="batch"), (3, 32, 32)),
        (resnet9, ResNet9Params(), (3, 28, 28)),
        (resnet9, ResNet9Params(norm="group"), (3, 32, 32)),
        (mobilenet, MobileNetParams(), (3, 64, 64)),
        (mobilenet, MobileNetParams(padding=1), (3, 32, 32)),
        (mobilenet, MobileNetParams(norm="batch_stateless"), (3, 33, 33)),
        (fedsoft_cnn, FedSoftCNNParams(), (3, 32, 32)),
        (squeezenet, SqueezeNetParams(), (3, 32, 32)),
        (squeezenet, SqueezeNetParams(classifier="conv"), (3, 32, 32)),
    ],
)
def test_output_shape_on_a_tiny_batch(fn, params, shape):
    model = build(fn, params, shape, classes=7)
    assert model(torch.randn(3, *shape)).shape == (3, 7)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_the_flattened_width_follows_the_input_and_too_small_inputs_are_refused():
    assert build(twocnn, TwoNNParams(), (1, 28, 28))[7].in_features == 64 * 7 * 7  # SuPerFed's 3136
    assert build(twocnn, TwoNNParams(), (3, 32, 32))[7].in_features == 64 * 8 * 8
    assert build(vgg9, VGG9Params(), (1, 28, 28)).classifier.fc1.in_features == 512  # 28/16 -> 1x1
    assert build(vgg9, VGG9Params(), (3, 32, 32)).classifier.fc1.in_features == 512 * 2 * 2
    assert build(fedsoft_cnn, FedSoftCNNParams(), (3, 32, 32)).classifier.fc1.in_features == 256 * 4 * 4
    with pytest.raises(ValueError, match=r"at least 33x33.*padding: 1"):
        build(mobilenet, MobileNetParams(), (3, 32, 32))
    with pytest.raises(ValueError, match="squeezenet1_1 needs 3 x H x W"):
        build(squeezenet, SqueezeNetParams(), (1, 28, 28))


# -- parameter counts by hand -----------------------------------------------------------------------
def test_parameter_counts_by_hand():
    # VGG-9, 1x28x28, 62 classes, bias-free: convs 3x3
    #   1·16·9 = 144, 16·32·9 = 4 608, 32·64·9 = 18 432, 64·128·9 = 73 728, 128·256·9 = 294 912,
    #   256·512·9 = 1 179 648 (sum 1 571 472); fc1 512·256 = 131 072; fc2 256·62 = 15 872
    #   total 1 571 472 + 131 072 + 15 872 = 1 718 416
    assert counts(build(vgg9, VGG9Params(), (1, 28, 28), 62)) == (1_718_416, 0)
    # VGG-9, 3x32x32, 10 classes: first conv 3·16·9 = 432 (convs 1 571 760); fc1 2048·256 = 524 288;
    #   fc2 2 560: 1 571 760 + 524 288 + 2 560 = 2 098 608
    assert counts(build(vgg9, VGG9Params(), (3, 32, 32))) == (2_098_608, 0)
    # ResNet-9, 3 channels, 10 classes, batch norm (2·C trainable + 2·C running statistics per norm):
    #   stem   3·64·9 = 1 728 + bn 128                                      =     1 856  (stats   128)
    #   layer1 64·64·9 = 36 864, twice, + 2 bn of 128                        =    73 984  (stats   256)
    #   layer2 64·128·9 = 73 728 + 128·128·9 = 147 456 + 1x1 64·128 = 8 192
    #          + 3 bn of 256                                                 =   230 144  (stats   768)
    #   layer3 128·256·9 = 294 912 + 256·256·9 = 589 824 + 128·256 = 32 768
    #          + 3 bn of 512                                                 =   919 040  (stats 1 536)
    #   layer4 256·512·9 = 1 179 648 + 512·512·9 = 2 359 296 + 256·512 = 131 072
    #          + 3 bn of 1 024                                               = 3 673 088  (stats 3 072)
    #   classifier 512·256 = 131 072 + 256·10 = 2 560                        =   133 632
    #   trainable 5 031 744, running statistics 5 760
    assert counts(build(resnet9, ResNet9Params(), (3, 32, 32))) == (5_031_744, 5_760)
    assert counts(build(resnet9, ResNet9Params(norm="none"), (3, 32, 32))) == (5_031_744 - 5_760, 0)
    # MobileNet, 3 channels, 10 classes, batch norm:
    #   stem 3·32·9 = 864 + bn 64                                            =    928  (stats    64)
    #   block1 dw 32·9 = 288 + bn 64 + pw 32·64 = 2 048 + bn 128             =  2 528  (stats   192)
    #   block2 dw 64·9 = 576 + bn 128 + pw 64·128 = 8 192 + bn 256           =  9 152  (stats   384)
    #   block3 dw 128·9 = 1 152 + bn 256 + pw 128·256 = 32 768 + bn 512      = 34 688  (stats   768)
    #   block4 dw 256·9 = 2 304 + bn 512 + pw 256·512 = 131 072 + bn 1 024   = 134 912 (stats 1 536)
    #   classifier 131 072 + 2 560                                           = 133 632
    #   trainable 315 840, running statistics 2 944
    assert counts(build(mobilenet, MobileNetParams(), (3, 64, 64))) == (315_840, 2_944)
    assert counts(build(mobilenet, MobileNetParams(norm="batch_stateless"), (3, 64, 64))) == (315_840, 0)
    # FedSoft's CNN, 3x32x32, 10 classes, with biases:
    #   3·32·9+32 = 896; 32·64·9+64 = 18 496; 64·128·9+128 = 73 856; 128·128·9+128 = 147 584;
    #   128·256·9+256 = 295 168; 256·256·9+256 = 590 080 (convs 1 126 080);
    #   4096·1024+1024 = 4 195 328; 1024·512+512 = 524 800; 512·10+10 = 5 130
    #   total 1 126 080 + 4 195 328 + 524 800 + 5 130 = 5 851 338
    assert counts(build(fedsoft_cnn, FedSoftCNNParams(), (3, 32, 32))) == (5_851_338, 0)
    # SqueezeNet 1.1 features: conv 3·64·9+64 = 1 792; fires (squeeze s, expand e, input c:
    #   c·s+s + s·e+e + s·e·9+e): (64,16,64) 11 408; (128,16,64) 12 432; (128,32,128) 45 344;
    #   (256,32,128) 49 440; (256,48,192) 104 880; (384,48,192) 111 024; (384,64,256) 188 992;
    #   (512,64,256) 197 184 -> 722 496; classifier 512·10+10 = 5 130 (linear or 1x1 conv): 727 626
    assert counts(build(squeezenet, SqueezeNetParams(), (3, 32, 32))) == (727_626, 0)
    assert counts(build(squeezenet, SqueezeNetParams(classifier="conv"), (3, 32, 32))) == (727_626, 0)


# -- groups -----------------------------------------------------------------------------------------
def names(model, group):
    g = groups_of(model)
    return [g.names[i] for i in g.of(group)]


def test_heads_are_the_papers_classifiers_and_the_body_the_rest():
    m = build(vgg9, VGG9Params(), (1, 28, 28))
    assert names(m, "head") == ["classifier.fc1.weight", "classifier.fc2.weight"]
    assert names(m, "body") == [f"features.conv{i}.weight" for i in range(1, 7)]
    m = build(resnet9, ResNet9Params(), (3, 32, 32))
    g = groups_of(m)
    assert names(m, "head") == ["classifier.fc1.weight", "classifier.fc2.weight"]
    assert names(m, "body")[:6] == [
        "features.stem.conv.weight",
        "features.stem.norm.weight",
        "features.stem.norm.bias",
        "features.stem.norm.running_mean",
        "features.stem.norm.running_var",
        "features.layer1.conv1.weight",
    ]
    # 12 norms (stem 1, layer1 2, layers 2-4 3 each with their shortcut), mean and variance each
    assert len(g.stats) == 2 * 12 and all(g.names[i].endswith(("running_mean", "running_var")) for i in g.stats)
    assert set(g.stats) <= set(g.body)
    assert "features.layer2.downsample.conv" in g.layers and "features.layer1.downsample.conv" not in g.layers
    assert [g.names[i] for i in groups_of(m, 1).head] == ["classifier.fc2.weight"]  # model.head still overrides
    m = build(mobilenet, MobileNetParams(), (3, 64, 64))
    assert names(m, "head") == ["classifier.fc1.weight", "classifier.fc2.weight"]
    assert "features.block3.conv_dw" in groups_of(m).layers
    m = build(fedsoft_cnn, FedSoftCNNParams(), (3, 32, 32))
    assert names(m, "head") == ["classifier.fc3.weight", "classifier.fc3.bias"]
    assert names(m, "body")[-4:] == [
        "classifier.fc1.weight",
        "classifier.fc1.bias",
        "classifier.fc2.weight",
        "classifier.fc2.bias",
    ]
    assert names(build(squeezenet, SqueezeNetParams(), (3, 32, 32)), "head") == [
        "classifier.fc.weight",
        "classifier.fc.bias",
    ]
    assert names(build(squeezenet, SqueezeNetParams(classifier="conv"), (3, 32, 32)), "head") == [
        "classifier.1.weight",
        "classifier.1.bias",
    ]
    # SuPerFed's TwoNN / TwoCNN keep their numbered names; their head is the official classifier
    assert names(build(twocnn, TwoNNParams(), (1, 28, 28)), "head") == ["7.weight", "9.weight", "11.weight"]
    assert names(build(twocnn, TwoNNParams(), (1, 28, 28)), "body") == ["0.weight", "3.weight"]
    assert names(build(twonn, TwoNNParams(), (1, 28, 28)), "head") == ["5.weight", "7.weight"]


# -- batch norm through the loop --------------------------------------------------------------------
def client(cid, n, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g) + shift
    y = torch.randint(0, 10, (n,), generator=g)
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


def job(start, data, settings):
    return make_job(start, data, Context(0, 1, data.cid, torch.Generator().manual_seed(10 + data.cid)), settings, CE)


def test_batch_norm_statistics_are_updated_by_the_forward_pass_never_by_the_optimizer():
    model = build(resnet9, ResNet9Params(), (3, 32, 32))
    g = groups_of(model)
    idx = {n: i for i, n in enumerate(g.names)}
    trainer = Trainer(model)
    start = params_of(model)
    data = client(0, 8, seed=1, shift=0.5)
    # one step on one full batch, a large lr, momentum and weight decay that would move any trained tensor
    settings = Settings(lr=0.5, epochs=1, batch_size=8, momentum=0.9, weight_decay=0.5)
    (fit,) = trainer.fit([job(start, data, settings)])
    # the stem's norm sees the stem convolution's output: its per-channel batch mean and variance
    h = F.conv2d(data.train_x, start[idx["features.stem.conv.weight"]], stride=2, padding=1)
    mean, var = h.mean((0, 2, 3)), h.var((0, 2, 3), unbiased=True)
    rm, rv = idx["features.stem.norm.running_mean"], idx["features.stem.norm.running_var"]
    assert torch.equal(start[rm], torch.zeros(64)) and torch.equal(start[rv], torch.ones(64))
    assert torch.allclose(fit.params[rm], 0.9 * 0 + 0.1 * mean, atol=1e-5)
    assert torch.allclose(fit.params[rv], 0.9 * 1 + 0.1 * var, rtol=1e-4, atol=1e-5)
    for i in g.stats:  # every layer's statistics moved from 0 / 1
        assert not torch.equal(fit.params[i], start[i]), g.names[i]
    assert not torch.equal(fit.params[idx["features.stem.conv.weight"]], start[idx["features.stem.conv.weight"]])
    # the scratch model's own statistics are untouched
    assert torch.equal(model.features.stem.norm.running_mean, torch.zeros(64))
    # evaluation (eval mode) uses the job's statistics, not the scratch model's
    x = client(5, 4, seed=3).train_x
    out = trainer.outputs([fit.params], x)[0]
    model.eval()
    with torch.no_grad():
        ref = torch.func.functional_call(model, dict(zip(g.names, fit.params)), (x,))
        scratch_stats = [p if i in g.stats else q for i, (p, q) in enumerate(zip(start, fit.params))]
        other = torch.func.functional_call(model, dict(zip(g.names, scratch_stats)), (x,))
    assert torch.allclose(out, ref, atol=1e-5) and not torch.allclose(out, other, atol=1e-3)


def test_two_clients_on_one_host_keep_their_own_statistics():
    model = build(resnet9, ResNet9Params(), (3, 32, 32))
    g = groups_of(model)
    trainer = Trainer(model)
    start = params_of(model)
    settings = Settings(lr=0.05, epochs=1, batch_size=4)
    a, b = client(0, 8, seed=1, shift=-1.0), client(1, 8, seed=2, shift=2.0)
    (fa,) = trainer.fit([job(start, a, settings)])
    a_stats = [fa.params[i].clone() for i in g.stats]
    (fb,) = trainer.fit([job(start, b, settings)])  # B after A, through the same trainer
    assert all(torch.equal(fa.params[i], s) for i, s in zip(g.stats, a_stats))  # A's untouched by B
    assert all(not torch.allclose(fa.params[i], fb.params[i]) for i in g.stats)
    assert all(torch.equal(p, q) for p, q in zip(start, params_of(model)))  # the start point unchanged
    # B trained on a fresh host gives the same numbers: nothing of A's leaked into B
    (fresh,) = Trainer(build(resnet9, ResNet9Params(), (3, 32, 32))).fit([job(start, b, settings)])
    assert all(torch.equal(p, q) for p, q in zip(fb.params, fresh.params))
    # and both in one fit call give each the same as alone
    both = trainer.fit([job(start, a, settings), job(start, b, settings)])
    assert all(torch.equal(p, q) for p, q in zip(both[0].params, fa.params))
    assert all(torch.equal(p, q) for p, q in zip(both[1].params, fb.params))


# -- a scenario on CIFAR-shaped data ----------------------------------------------------------------
CIFAR = """
name: cifar-models
seed: 0
rounds: 1
data:
  dataset: cifar10
  root: {root}
  clients: 2
  partition: {{kind: iid}}
  splits: {{train: 0.5, test: 0.5}}
model: {model}
algorithm: {{name: fedavg, lr: 0.05, batch_size: 4}}
"""


def test_validate_a_cifar_scenario_with_the_new_models(tmp_path, capsys):
    root = write_cifar10(tmp_path / "data")
    for model in (
        "{name: resnet9}",
        "{name: vgg9, norm: batch}",
        "{name: mobilenet, padding: 1}",
        "{name: fedsoft_cnn}",
        "{name: squeezenet}",
        "{name: twocnn}",
    ):
        path = write_scenario(tmp_path, CIFAR.format(root=root, model=model))
        assert cli.main(["validate", path]) == 0, (model, capsys.readouterr().err)
        assert "ok (fedavg on cifar10, 2 clients, 1 rounds)" in capsys.readouterr().out
    path = write_scenario(tmp_path, CIFAR.format(root=root, model="{name: mobilenet}"))
    assert cli.main(["validate", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.name" in err[0] and "at least 33x33" in err[0]
    assert set(MODELS) >= {"vgg9", "resnet9", "mobilenet", "fedsoft_cnn", "squeezenet"}
