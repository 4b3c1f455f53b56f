"""The built-in models: each one's options (a frozen dataclass subclassing ``ModelParams``) and
its builder ``(params, input_shape, classes[, vocab])`` -> ``nn.Module``. Linear models, MLPs,
SuPerFed's TwoNN and TwoCNN, SosicFL's SimpleCNN, LEAF's FEMNIST CNN and LSTMs, torchvision's
MobileNetV2 and ResNet-18; the larger image models (VGG-9, ResNet-9, MobileNet, FedSoft's CNN,
SqueezeNet) are built in ``raysim.models.vision`` and their options are here. The registry that
names them (``MODELS``, ``ModelSpec``, ``build``) is the package's (``raysim.models``), which
re-exports every name of this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn

from raysim.core.norm import BatchNorm1d, BatchNorm2d
from raysim.models import vision
from raysim.models.vision import group_norm as _group_norm
from raysim.models.vision import load_weights as _load_weights

INITS = ("default", "xavier_normal")


@dataclass(frozen=True)
class ModelParams:
    """Options every model has."""

    head: int | tuple[str, ...] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "the classifier head (the group personalized methods keep or share): a number of trailing "
            "layers with parameters, or layer/parameter names (default: the model's own, its last layer)"
        },
    )


def _init_field():
    return field(
        default="default",
        metadata={"choices": INITS, "help": "default: PyTorch's; xavier_normal: Glorot-normal weights (FedSoft's)"},
    )


@dataclass(frozen=True)
class LinearParams(ModelParams):
    bias: bool = field(default=True, metadata={"help": "false: no intercept (FedSoft's linear regression)"})
    init: str = _init_field()


@dataclass(frozen=True)
class MLPParams(ModelParams):
    hidden: tuple[int, ...] = field(default=(200, 200), metadata={"min": 1, "help": "hidden layer widths"})
    bias: bool = field(default=True, metadata={"help": "false: bias-free layers"})
    init: str = _init_field()
    norm: str = field(
        default="none",
        metadata={
            "choices": ("none", "batch"),
            "help": (
                "normalization after each hidden linear layer: none, or batch (BatchNorm1d before the ReLU, "
                "its running statistics client state like the weights; FedBN's digits model has one after each layer)"
            ),
        },
    )


@dataclass(frozen=True)
class TwoNNParams(ModelParams):
    bias: bool = field(default=False, metadata={"help": "true: layers with biases (SuPerFed's have none)"})
    init: str = field(
        default="xavier_normal",
        metadata={"choices": INITS, "help": "xavier_normal: SuPerFed's official init; default: PyTorch's"},
    )


def _initialized(model: nn.Module, how: str) -> nn.Module:
    """Linear and convolution weights re-drawn by ``how`` (biases keep PyTorch's default)."""
    if how == "xavier_normal":
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.xavier_normal_(m.weight)
    return model


@dataclass(frozen=True)
class CNNParams(ModelParams):
    pass


def linear(params: LinearParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """A linear model (multinomial logistic regression, or linear regression): flatten -> Linear."""
    dim = math.prod(input_shape)
    layer = nn.Linear(dim, classes, bias=params.bias)
    return _initialized(layer if len(input_shape) == 1 else nn.Sequential(nn.Flatten(), layer), params.init)


def mlp(params: MLPParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """Fully connected ReLU network with the given hidden widths (``norm: batch``: each hidden
    layer Linear -> BatchNorm1d -> ReLU)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in params.hidden:
        layers += [nn.Linear(width, h, bias=params.bias)]
        if params.norm == "batch":
            layers.append(BatchNorm1d(h))
        layers.append(nn.ReLU())
        width = h
    layers.append(nn.Linear(width, classes, bias=params.bias))
    return _initialized(nn.Sequential(*layers), params.init)


def twonn(params: TwoNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's TwoNN (official code): in -> 200 -> 200 -> 200 -> classes, ReLU, bias-free,
    Xavier-normal weights. Default head: the last two linear layers (``5``, ``7``), the
    official code's ``classifier``, which its FedPer, FedRep and LG-FedAvg baselines personalize."""
    model = mlp(MLPParams((200, 200, 200), params.bias, params.init), input_shape, classes)
    object.__setattr__(model, "raysim_head", ("5", "7"))
    return model


def twocnn(params: TwoNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's TwoCNN (official code): conv5x5·32 (padding 1) -> ReLU -> maxpool 2 (padding
    1) -> conv5x5·64 (padding 1) -> ReLU -> maxpool 2 (padding 1) -> fc 200 -> 200 -> classes,
    bias-free, Xavier-normal weights. The flattened width follows from the input: 64·7·7 = 3136
    for C x 28 x 28 (the paper's size: it resizes CIFAR to 28x28), 64·8·8 = 4096 for C x 32 x 32.
    Default head: the three linear layers (``7``, ``9``, ``11``), the official code's
    ``classifier``, which its FedPer, FedRep and LG-FedAvg baselines personalize."""
    if len(input_shape) != 3 or min(input_shape[1:]) < 8:
        raise ValueError(
            f"twocnn needs C x H x W images of at least 8x8 (e.g. 28x28 or 32x32), "
            f"the dataset gives {tuple(input_shape)}"
        )
    c, h, w = input_shape
    for _ in range(2):  # conv5x5 padding 1 (-2), then maxpool 2 padding 1
        h, w = (h - 2) // 2 + 1, (w - 2) // 2 + 1
    b = params.bias
    model = _initialized(
        nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=1, bias=b),
            nn.ReLU(),
            nn.MaxPool2d(2, padding=1),
            nn.Conv2d(32, 64, 5, padding=1, bias=b),
            nn.ReLU(),
            nn.MaxPool2d(2, padding=1),
            nn.Flatten(),
            nn.Linear(64 * h * w, 200, bias=b),
            nn.ReLU(),
            nn.Linear(200, 200, bias=b),
            nn.ReLU(),
            nn.Linear(200, classes, bias=b),
        ),
        params.init,
    )
    object.__setattr__(model, "raysim_head", ("7", "9", "11"))
    return model


@dataclass(frozen=True)
class SimpleCNNParams(ModelParams):
    init: str = field(
        default="xavier_normal",
        metadata={"choices": INITS, "help": "xavier_normal: the authors' init; default: PyTorch's"},
    )


def simplecnn(params: SimpleCNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SosicFL's / Floco's SimpleCNN (the authors' CifarCNN, after Hahn et al. 2022): conv5x5·16
    -> conv5x5·32 (padding 1) -> conv3x3·64 (padding 1), each LeakyReLU and maxpool 2, then fc
    128 (LeakyReLU) and the classifier. For 3x32x32 inputs the flattened features are
    64·3·3 = 576, as the authors'; for 1x28x28 (Fashion-MNIST, its equivalent) 64·2·2 = 256."""
    if len(input_shape) != 3 or min(input_shape[1:]) < 16:
        raise ValueError(f"simplecnn needs C x H x W images of at least 16x16, the dataset gives {tuple(input_shape)}")
    c, h, w = input_shape
    for k, pad in ((5, 0), (5, 1), (3, 1)):
        h, w = (h + 2 * pad - k + 1) // 2, (w + 2 * pad - k + 1) // 2
    return _initialized(
        nn.Sequential(
            nn.Conv2d(c, 16, 5),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * h * w, 128),
            nn.LeakyReLU(),
            nn.Linear(128, classes),
        ),
        params.init,
    )


def femnist_cnn(params: CNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """The FEMNIST CNN of LEAF / FedEM: conv5x5·32 -> pool -> conv5x5·64 -> pool -> fc 2048 -> fc."""
    if tuple(input_shape) != (1, 28, 28):
        raise ValueError(f"femnist_cnn needs 1x28x28 inputs, the dataset gives {tuple(input_shape)}")
    return nn.Sequential(
        nn.Conv2d(1, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 2048),
        nn.ReLU(),
        nn.Linear(2048, classes),
    )


@dataclass(frozen=True)
class LSTMParams(ModelParams):
    embed: int = field(default=8, metadata={"min": 1, "help": "token embedding width"})
    hidden: int = field(default=256, metadata={"min": 1, "help": "LSTM hidden units per layer"})
    layers: int = field(default=2, metadata={"min": 1, "help": "stacked LSTM layers"})
    bias: bool = field(default=True, metadata={"help": "false: bias-free LSTM and linear layers (SuPerFed's)"})


@dataclass(frozen=True)
class LSTMClassifierParams(LSTMParams):
    embed: int = field(default=100, metadata={"min": 1, "help": "word embedding width (LEAF: 100 without GloVe)"})
    hidden: int = field(default=100, metadata={"min": 1, "help": "LSTM hidden units per layer"})
    dense: int = field(
        default=128, metadata={"min": 0, "help": "width of the linear layer before the output (0: none)"}
    )


class TokenLSTM(nn.Module):
    """A stacked LSTM over token ids (B, T): Embedding(vocab, embed) -> LSTM(embed -> hidden,
    ``layers`` stacked, batch first) -> the last time step -> [Linear(hidden, dense)] ->
    Linear(., classes) logits. The ids may be any integer dtype (datasets keep them small)."""

    def __init__(self, vocab: int, classes: int, p: LSTMParams, dense: int = 0):
        super().__init__()
        self.embed = nn.Embedding(vocab, p.embed)
        self.lstm = nn.LSTM(p.embed, p.hidden, p.layers, bias=p.bias, batch_first=True)
        self.dense = nn.Linear(p.hidden, dense, bias=p.bias) if dense else nn.Identity()
        self.out = nn.Linear(dense or p.hidden, classes, bias=p.bias)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x.long()))
        return self.out(self.dense(h[:, -1]))


def _token_shape(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 1:
        raise ValueError(f"{name} needs sequences of token ids (T,), the dataset gives {tuple(input_shape)}")


def next_char_lstm(params: LSTMParams, input_shape: tuple[int, ...], classes: int, vocab: int) -> nn.Module:
    """LEAF's / FedEM's next-character model: embedding 8, 2 x LSTM 256, linear to the
    classes (the vocabulary)."""
    _token_shape("next_char_lstm", input_shape)
    return TokenLSTM(vocab, classes, params)


def lstm_classifier(params: LSTMClassifierParams, input_shape: tuple[int, ...], classes: int, vocab: int) -> nn.Module:
    """LEAF's Sent140 model: embedding 100 (trained here: LEAF's GloVe vectors need a
    download), 2 x LSTM 100, a linear layer of 128 (no activation, as LEAF's), linear to the
    classes."""
    _token_shape("lstm_classifier", input_shape)
    return TokenLSTM(vocab, classes, params, params.dense)


@dataclass(frozen=True)
class TorchvisionParams(ModelParams):
    weights: str = field(
        default="",
        metadata={
            "help": "a local state-dict file (e.g. torchvision's ImageNet weights), loaded with weights_only; empty: random init"
        },
    )
    norm: str = field(
        default="group",
        metadata={
            "choices": ("group", "batch"),
            "help": "normalization layers: group (GroupNorm, no running statistics: the usual FL choice after Hsieh "
            "et al. 2020) or batch (batch norm, its running statistics client state like the weights)",
        },
    )
    groups: int = field(
        default=2, metadata={"min": 1, "help": "GroupNorm groups (a layer with fewer channels uses their gcd)"}
    )


def _torchvision(builder: str, params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    import torchvision

    if len(input_shape) != 3 or input_shape[0] != 3:
        raise ValueError(f"{builder} needs 3 x H x W images, the dataset gives {tuple(input_shape)}")
    norm = BatchNorm2d if params.norm == "batch" else _group_norm(params.groups)
    model = getattr(torchvision.models, builder)(weights=None, num_classes=classes, norm_layer=norm)
    return _load_weights(model, params.weights, builder) if params.weights else model


def mobilenet_v2(params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's MobileNetV2 (FedEM's CIFAR model) with GroupNorm; ``weights`` from a local file."""
    return _torchvision("mobilenet_v2", params, input_shape, classes)


def resnet18(params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's ResNet-18 with GroupNorm; ``weights`` from a local file."""
    return _torchvision("resnet18", params, input_shape, classes)


_NORM_HELP = {
    "batch": "batch norm whose running statistics are client state (sent, averaged or kept local, checkpointed)",
    "batch_stateless": "batch norm with the batch's statistics in evaluation too (SuPerFed's official code)",
    "group": "GroupNorm",
    "none": "no normalization",
}


def _norm_field(default: str, choices: tuple[str, ...], why: str):
    return field(
        default=default,
        metadata={
            "choices": choices,
            "help": (
                f"normalization after each convolution (default {default}: {why}); "
                + "; ".join(f"{c}: {_NORM_HELP[c]}" for c in choices)
            ),
        },
    )


def _groups_field():
    return field(
        default=2,
        metadata={"min": 1, "help": "GroupNorm groups with norm: group (a layer with fewer channels uses their gcd)"},
    )


@dataclass(frozen=True)
class VGG9Params(ModelParams):
    norm: str = _norm_field("none", ("none", "batch", "group"), "the official code's VGG-9 has none")
    groups: int = _groups_field()


@dataclass(frozen=True)
class ResNet9Params(ModelParams):
    norm: str = _norm_field("batch", vision.NORMS, "the paper's layer")
    groups: int = _groups_field()


@dataclass(frozen=True)
class MobileNetParams(ResNet9Params):
    padding: int = field(
        default=0,
        metadata={
            "choices": (0, 1),
            "help": (
                "padding of the depthwise 3x3 convolutions: 0 (the official code's) needs images of at least "
                "33x33 (Tiny-ImageNet's 64x64); 1 fits 28x28 and 32x32 images"
            ),
        },
    )


@dataclass(frozen=True)
class FedSoftCNNParams(ModelParams):
    norm: str = _norm_field("none", ("none", "batch", "group"), "the official code's CNN has none")
    groups: int = _groups_field()
    init: str = field(
        default="fedsoft",
        metadata={
            "choices": ("fedsoft", "default"),
            "help": (
                "fedsoft: the official code's (Kaiming-uniform convolution, Xavier-normal linear weights); "
                "default: PyTorch's"
            ),
        },
    )


@dataclass(frozen=True)
class SqueezeNetParams(ModelParams):
    version: str = field(
        default="1_1", metadata={"choices": ("1_1", "1_0"), "help": "torchvision's SqueezeNet version"}
    )
    classifier: str = field(
        default="linear",
        metadata={
            "choices": ("linear", "conv"),
            "help": (
                "linear: pooled features -> fc to the classes (a linear head, as simplex heads need); conv: "
                "torchvision's 1x1 convolution -> ReLU -> pool"
            ),
        },
    )
    dropout: float = field(default=0.5, metadata={"min": 0.0, "lt": 1.0, "help": "dropout before the classifier"})
    weights: str = field(
        default="",
        metadata={
            "help": "a local state-dict file (e.g. torchvision's ImageNet weights), loaded with weights_only; empty: random init"
        },
    )


def vgg9(params: VGG9Params, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's VGG-9 (``raysim.models.vision.vgg9``)."""
    return vision.vgg9(input_shape, classes, params.norm, params.groups)


def resnet9(params: ResNet9Params, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's ResNet-9 (``raysim.models.vision.resnet9``)."""
    return vision.resnet9(input_shape, classes, params.norm, params.groups)


def mobilenet(params: MobileNetParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's MobileNet (``raysim.models.vision.mobilenet``)."""
    return vision.mobilenet(input_shape, classes, params.norm, params.groups, params.padding)


def fedsoft_cnn(params: FedSoftCNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """FedSoft's CIFAR CNN (``raysim.models.vision.fedsoft_cnn``)."""
    return vision.fedsoft_cnn(input_shape, classes, params.norm, params.groups, params.init)


def squeezenet(params: SqueezeNetParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's SqueezeNet as SosicFL uses it (``raysim.models.vision.squeezenet``)."""
    return vision.squeezenet(input_shape, classes, params.version, params.classifier, params.dropout, params.weights)
