"""Image classifiers of the seed papers: SuPerFed's VGG-9, ResNet-9 and MobileNet, FedSoft's
CIFAR CNN and SqueezeNet (SosicFL), plus the helpers the torchvision models share (GroupNorm,
weights from a local file).

Every model here is an ``nn.Sequential`` of two named parts, ``features`` and ``classifier``
(SqueezeNet: torchvision's module, with the same two attributes), and every layer inside has a
name (``features.conv1``, ``features.layer2.norm1``, ``classifier.fc2``), so a parameter group
can be named in a scenario (``model.head``) and read in a checkpoint.

Normalization (``norm``):

- ``batch``: batch norm whose running mean and variance are client state (raysim's
  ``BatchNorm2d``: non-trainable parameters, sent, averaged or kept local, checkpointed with the
  weights; the forward pass in training updates each job's own copy, evaluation uses them).
  ``torch.nn.BatchNorm2d`` would keep them in buffers of the host's scratch model, shared by all
  the clients it trains and lost from what they send (meaningless for a shared model); that is
  why raysim's torchvision ResNet-18 and MobileNetV2 use GroupNorm.
- ``batch_stateless``: batch norm without running statistics: the statistics of the batch at
  hand normalize it in evaluation as in training, so a client's outputs depend on which samples
  are evaluated together (raysim evaluates a client's split in blocks of up to 4096 samples).
  SuPerFed's official code builds its batch norm this way (``track_running_stats=False``).
- ``group``: GroupNorm (``groups`` groups; a layer with fewer channels uses their gcd): no
  running statistics at all (Hsieh et al. 2020).
- ``none``: no normalization layer.

The SuPerFed models are bias-free, with Xavier-normal convolution and linear weights and
normalization weights 1, biases 0, as the official code builds them.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from raysim.core.norm import BatchNorm2d

NORMS = ("batch", "batch_stateless", "group", "none")


def group_norm(groups: int):
    """A ``channels -> nn.GroupNorm`` factory with ``groups`` groups (their gcd with the channels)."""
    return lambda channels: nn.GroupNorm(math.gcd(channels, groups), channels)


def norm2d(kind: str, channels: int, groups: int = 2) -> nn.Module:
    """The normalization layer ``kind`` (one of NORMS) for ``channels`` channels; ``none``: Identity."""
    if kind == "batch":
        return BatchNorm2d(channels)
    if kind == "batch_stateless":
        return nn.BatchNorm2d(channels, track_running_stats=False)
    if kind == "group":
        return group_norm(groups)(channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm {kind!r}: choose one of {', '.join(NORMS)}")


def load_weights(model: nn.Module, path: str, name: str) -> nn.Module:
    """Copy every tensor of the state-dict file at ``path`` whose name and shape match the
    model's (a classifier for another number of classes, and batch-norm running statistics,
    are left out); ValueError when the file cannot be read or nothing matches."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"{name}: cannot load weights from {path}: {str(e).splitlines()[0]}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    own = model.state_dict()
    matched = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    if not matched:
        raise ValueError(
            f"{name}: no tensor of {path} matches the model's names and shapes; is it a {name} state dict?"
        )
    model.load_state_dict(matched, strict=False)
    return model


def _xavier(model: nn.Module) -> nn.Module:
    """SuPerFed's init: Xavier-normal convolution and linear weights (normalization layers keep
    PyTorch's weight 1, bias 0)."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_normal_(m.weight)
    return model


def _image(name: str, input_shape: tuple[int, ...], min_side: int) -> tuple[int, int, int]:
    if len(input_shape) != 3 or min(input_shape[1:]) < min_side:
        raise ValueError(
            f"{name} needs C x H x W images of at least {min_side}x{min_side}, the dataset gives {tuple(input_shape)}"
        )
    return tuple(int(s) for s in input_shape)


def _conv_norm_relu(
    name: str,
    cin: int,
    cout: int,
    norm: str,
    groups: int,
    *,
    k: int = 3,
    stride: int = 1,
    padding: int = 1,
    depthwise: bool = False,
    bias: bool = False,
) -> list[tuple[str, nn.Module]]:
    """[conv<name>, norm<name> (left out for ``none``), relu<name>]."""
    out: list[tuple[str, nn.Module]] = [
        (f"conv{name}", nn.Conv2d(cin, cout, k, stride, padding, bias=bias, groups=cin if depthwise else 1))
    ]
    if norm != "none":
        out.append((f"norm{name}", norm2d(norm, cout, groups)))
    out.append((f"relu{name}", nn.ReLU()))
    return out


def _superfed_classifier(width: int, classes: int, pool: bool) -> nn.Sequential:
    """SuPerFed's two-layer classifier (its personalized head): [global average pool] ->
    flatten -> fc1 (width -> 256) -> ReLU -> fc2 (256 -> classes), bias-free."""
    parts: list[tuple[str, nn.Module]] = [("pool", nn.AdaptiveAvgPool2d(1))] if pool else []
    parts += [
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(width, 256, bias=False)),
        ("relu", nn.ReLU()),
        ("fc2", nn.Linear(256, classes, bias=False)),
    ]
    return nn.Sequential(OrderedDict(parts))


def _with_head(model: nn.Module, head: tuple[str, ...]) -> nn.Module:
    object.__setattr__(model, "raysim_head", head)
    return model


# -- SuPerFed (Hahn et al., KDD 2022) ---------------------------------------------------------------
def vgg9(input_shape: tuple[int, ...], classes: int, norm: str = "none", groups: int = 2) -> nn.Module:
    """SuPerFed's VGG-9 (its FEMNIST model): six bias-free 3x3 convolutions (padding 1) of 16,
    32, 64, 128, 256, 512 channels, each followed by ReLU, with a 2x2 max pool after the 1st,
    2nd, 4th and 6th; then the classifier: flatten -> fc 256 -> ReLU -> fc classes.

    The flattened width is 512·(H/16)·(W/16) (floors): 512 for 28x28 inputs (the paper's: FEMNIST,
    and SuPerFed resizes its other images to 28x28 too), 2048 for 32x32.

    Normalization: none by default, as the official code's VGG-9 has no normalization layer;
    ``norm`` batch or group puts one after every convolution.

    Default head: ``classifier`` (fc1 and fc2), the layers the official code personalizes for
    its FedPer, FedRep and LG-FedAvg baselines."""
    c, h, w = _image("vgg9", input_shape, 16)
    widths = (16, 32, 64, 128, 256, 512)
    pool_after = {1, 2, 4, 6}
    parts: list[tuple[str, nn.Module]] = []
    cin, pools = c, 0
    for i, cout in enumerate(widths, 1):
        parts += _conv_norm_relu(str(i), cin, cout, norm, groups)
        if i in pool_after:
            pools += 1
            parts.append((f"pool{pools}", nn.MaxPool2d(2, 2)))
            h, w = h // 2, w // 2
        cin = cout
    model = nn.Sequential(
        OrderedDict(
            features=nn.Sequential(OrderedDict(parts)),
            classifier=_superfed_classifier(512 * h * w, classes, pool=False),
        )
    )
    return _with_head(_xavier(model), ("classifier",))


class BasicBlock(nn.Module):
    """A ResNet basic block: conv3x3 (stride s) -> norm -> ReLU -> conv3x3 -> norm, plus the input
    (through ``downsample``, conv1x1 stride s -> norm, where the shape changes), then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = norm2d(norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = norm2d(norm, cout, groups)
        self.downsample = (
            nn.Sequential(
                OrderedDict(conv=nn.Conv2d(cin, cout, 1, stride, bias=False), norm=norm2d(norm, cout, groups))
            )
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x):
        out = self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x)))))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


def resnet9(input_shape: tuple[int, ...], classes: int, norm: str = "batch", groups: int = 2) -> nn.Module:
    """SuPerFed's ResNet-9 (its CIFAR-100 model, after Wortsman et al.'s learning-subspaces
    code): stem conv3x3·64 stride 2 -> norm -> ReLU -> max pool 3 stride 2 (padding 1); four
    basic blocks of 64, 128, 256 (stride 2), 512 (stride 2) channels, where the channels or the
    stride change with a conv1x1 + norm shortcut; then the classifier: global average pool ->
    fc 256 -> ReLU -> fc classes. Bias-free; any input size (the paper's are 28x28).

    Normalization: batch by default, the paper's layer; raysim keeps its running statistics as
    client state, so a client evaluates with the statistics of its own training data, as batch
    norm is meant to. ``batch_stateless`` is the official code's variant (no running statistics:
    evaluation normalizes with the evaluated batch's own); ``group`` and ``none`` are offered too.

    Default head: ``classifier`` (fc1 and fc2), the official code's personalized head."""
    c, _, _ = _image("resnet9", input_shape, 1)
    stem = nn.Sequential(OrderedDict(_conv_norm_relu("", c, 64, norm, groups, stride=2)))
    features = nn.Sequential(
        OrderedDict(
            stem=stem,
            pool=nn.MaxPool2d(3, 2, 1),
            layer1=BasicBlock(64, 64, 1, norm, groups),
            layer2=BasicBlock(64, 128, 1, norm, groups),
            layer3=BasicBlock(128, 256, 2, norm, groups),
            layer4=BasicBlock(256, 512, 2, norm, groups),
        )
    )
    model = nn.Sequential(OrderedDict(features=features, classifier=_superfed_classifier(512, classes, pool=True)))
    return _with_head(_xavier(model), ("classifier",))


def mobilenet(
    input_shape: tuple[int, ...], classes: int, norm: str = "batch", groups: int = 2, padding: int = 0
) -> nn.Module:
    """SuPerFed's MobileNet (its Tiny-ImageNet model, a small MobileNet v1): stem conv3x3·32
    stride 2 (padding 1) -> norm -> ReLU; four depthwise-separable blocks 32 -> 64 (stride 1),
    -> 128 (stride 2), -> 256 (stride 2), -> 512 (stride 1), each a depthwise conv3x3 (padding
    ``padding``) -> norm -> ReLU -> pointwise conv1x1 -> norm -> ReLU; then the classifier:
    global average pool -> fc 256 -> ReLU -> fc classes. Bias-free.

    ``padding`` 0 is the official code's: the depthwise convolutions shrink the image, so inputs
    need at least 33x33 pixels (Tiny-ImageNet's 64x64 leave 4x4 before the pool); ``padding`` 1
    keeps the stride-1 blocks' size, for 28x28 or 32x32 images.

    Normalization: batch by default, the paper's layer, with its running statistics as client
    state (as ResNet-9's; ``batch_stateless``: the official code's variant; ``group``, ``none``).

    Default head: ``classifier`` (fc1 and fc2), the official code's personalized head."""
    c, h, w = _image("mobilenet", input_shape, 1)
    size = min(h, w)
    size = (size - 1) // 2 + 1  # the stem
    for stride in (1, 2, 2, 1):
        size = (size + 2 * padding - 3) // stride + 1
    if size < 1:
        raise ValueError(
            f"mobilenet with padding {padding} needs larger images than {tuple(input_shape)} "
            f"(at least 33x33); set model.padding: 1 for 28x28 or 32x32 images"
        )
    parts: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(OrderedDict(_conv_norm_relu("", c, 32, norm, groups, stride=2))))
    ]
    for i, (cin, cout, stride) in enumerate(((32, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 1)), 1):
        block = _conv_norm_relu(
            "_dw", cin, cin, norm, groups, stride=stride, padding=padding, depthwise=True
        ) + _conv_norm_relu("_pw", cin, cout, norm, groups, k=1, padding=0)
        parts.append((f"block{i}", nn.Sequential(OrderedDict(block))))
    model = nn.Sequential(
        OrderedDict(
            features=nn.Sequential(OrderedDict(parts)), classifier=_superfed_classifier(512, classes, pool=True)
        )
    )
    return _with_head(_xavier(model), ("classifier",))


# -- FedSoft (Ruan & Joe-Wong, AAAI 2022) -----------------------------------------------------------
def fedsoft_cnn(
    input_shape: tuple[int, ...], classes: int, norm: str = "none", groups: int = 2, init: str = "fedsoft"
) -> nn.Module:
    """FedSoft's CIFAR-10 CNN (official code): six 3x3 convolutions (padding 1, with biases) of
    32, 64, 128, 128, 256, 256 channels, each followed by ReLU, a 2x2 max pool after every second;
    then the classifier: flatten -> fc 1024 -> ReLU -> fc 512 -> ReLU -> fc classes. For 32x32
    inputs the flattened width is 256·4·4 = 4096, as the authors'; in general 256·(H/8)·(W/8).

    Init ``fedsoft``: the official code's, Kaiming-uniform convolution weights (PyTorch's
    ``kaiming_uniform_`` defaults) and Xavier-normal linear weights, biases PyTorch's; ``default``:
    PyTorch's.

    Normalization: none by default, as the official code's; ``norm`` batch or group puts one after
    every convolution.

    Default head: the last linear layer (``classifier.fc3``); FedSoft does not personalize a head."""
    c, h, w = _image("fedsoft_cnn", input_shape, 8)
    parts: list[tuple[str, nn.Module]] = []
    cin = c
    for i, cout in enumerate((32, 64, 128, 128, 256, 256), 1):
        parts += _conv_norm_relu(str(i), cin, cout, norm, groups, bias=True)
        if i % 2 == 0:
            parts.append((f"pool{i // 2}", nn.MaxPool2d(2, 2)))
            h, w = h // 2, w // 2
        cin = cout
    model = nn.Sequential(
        OrderedDict(
            features=nn.Sequential(OrderedDict(parts)),
            classifier=nn.Sequential(
                OrderedDict(
                    flatten=nn.Flatten(),
                    fc1=nn.Linear(256 * h * w, 1024),
                    relu1=nn.ReLU(),
                    fc2=nn.Linear(1024, 512),
                    relu2=nn.ReLU(),
                    fc3=nn.Linear(512, classes),
                )
            ),
        )
    )
    if init == "fedsoft":
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
    return model


# -- SqueezeNet (SosicFL, Grinwald et al. 2024, after Nguyen et al. 2022) ------------------------------
def squeezenet(
    input_shape: tuple[int, ...],
    classes: int,
    version: str = "1_1",
    classifier: str = "linear",
    dropout: float = 0.5,
    weights: str = "",
) -> nn.Module:
    """torchvision's SqueezeNet (``version`` 1_0 or 1_1, built with ``weights=None``), the CIFAR-10
    model SosicFL fine-tunes from ImageNet weights (``weights``: a local state-dict file such as
    torchvision's, loaded where names and shapes match: the features).

    ``classifier`` linear (default): dropout -> global average pool -> flatten -> fc (512 ->
    classes; weights N(0, 0.01), bias 0, as torchvision draws its last convolution); SosicFL's
    simplex is "the last fully connected layer", which needs a linear one. ``conv``: torchvision's
    own classifier: dropout -> conv1x1 to the classes -> ReLU -> global average pool (names
    ``classifier.1.*`` as in torchvision's files). SosicFL publishes no code, so which version and
    classifier it used is not known; 1_1 is torchvision's recommended one (the same accuracy with
    2.4x less computation).

    Normalization: none (SqueezeNet has no normalization layer). Dropout: ``dropout`` (torchvision's
    0.5) before the classifier in training, drawn from torch's global generator (set 0 for runs
    that repeat exactly).

    Default head: the classifier's layer with parameters (``classifier.fc`` or ``classifier.1``)."""
    import torchvision

    least = {"1_0": 21, "1_1": 17}[version]
    if len(input_shape) != 3 or input_shape[0] != 3 or min(input_shape[1:]) < least:
        raise ValueError(
            f"squeezenet{version} needs 3 x H x W images of at least {least}x{least}, "
            f"the dataset gives {tuple(input_shape)}"
        )
    builder = {"1_0": torchvision.models.squeezenet1_0, "1_1": torchvision.models.squeezenet1_1}[version]
    model = builder(weights=None, num_classes=classes, dropout=dropout)
    if classifier == "linear":
        fc = nn.Linear(512, classes)
        nn.init.normal_(fc.weight, 0.0, 0.01)
        nn.init.zeros_(fc.bias)
        model.classifier = nn.Sequential(
            OrderedDict(dropout=nn.Dropout(dropout), pool=nn.AdaptiveAvgPool2d(1), flatten=nn.Flatten(), fc=fc)
        )
    return load_weights(model, weights, f"squeezenet{version}") if weights else model
