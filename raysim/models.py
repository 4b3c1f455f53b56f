"""Models (plain nn.Modules) and their registry.

Each model takes the dataset's per-sample input shape and number of classes and outputs logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from torch import nn


INITS = ("default", "xavier_normal")


@dataclass(frozen=True)
class ModelParams:
    """Options every model has."""

    head: int | tuple[str, ...] | None = field(default=None, kw_only=True, metadata={
        "help": "the classifier head (the group personalized methods keep or share): a number of trailing "
                "layers with parameters, or layer/parameter names (default: the model's own, its last layer)"})


def _init_field():
    return field(default="default", metadata={
        "choices": INITS, "help": "default: PyTorch's; xavier_normal: Glorot-normal weights (FedSoft's)"})


@dataclass(frozen=True)
class LinearParams(ModelParams):
    bias: bool = field(default=True, metadata={"help": "false: no intercept (FedSoft's linear regression)"})
    init: str = _init_field()


@dataclass(frozen=True)
class MLPParams(ModelParams):
    hidden: tuple[int, ...] = field(default=(200, 200), metadata={"min": 1, "help": "hidden layer widths"})
    bias: bool = field(default=True, metadata={"help": "false: bias-free layers"})
    init: str = _init_field()


@dataclass(frozen=True)
class TwoNNParams(ModelParams):
    bias: bool = field(default=False, metadata={"help": "true: layers with biases (SuPerFed's have none)"})
    init: str = field(default="xavier_normal", metadata={
        "choices": INITS, "help": "xavier_normal: SuPerFed's official init; default: PyTorch's"})


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
    """Fully connected ReLU network with the given hidden widths."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in params.hidden:
        layers += [nn.Linear(width, h, bias=params.bias), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes, bias=params.bias))
    return _initialized(nn.Sequential(*layers), params.init)


def twonn(params: TwoNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's TwoNN (official code): in -> 200 -> 200 -> 200 -> classes, ReLU, bias-free,
    Xavier-normal weights."""
    return mlp(MLPParams((200, 200, 200), params.bias, params.init), input_shape, classes)


def twocnn(params: TwoNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """SuPerFed's TwoCNN (official code) for C x 28 x 28 inputs: conv5x5·32 (padding 1) ->
    ReLU -> maxpool 2 (padding 1) -> conv5x5·64 (padding 1) -> ReLU -> maxpool 2 (padding 1) ->
    fc 3136 -> 200 -> 200 -> classes, bias-free, Xavier-normal weights."""
    if tuple(input_shape[1:]) != (28, 28) or len(input_shape) != 3:
        raise ValueError(f"twocnn needs C x 28 x 28 inputs, the dataset gives {tuple(input_shape)}")
    b = params.bias
    return _initialized(nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 5, padding=1, bias=b), nn.ReLU(), nn.MaxPool2d(2, padding=1),
        nn.Conv2d(32, 64, 5, padding=1, bias=b), nn.ReLU(), nn.MaxPool2d(2, padding=1), nn.Flatten(),
        nn.Linear(64 * 7 * 7, 200, bias=b), nn.ReLU(), nn.Linear(200, 200, bias=b), nn.ReLU(),
        nn.Linear(200, classes, bias=b)), params.init)


@dataclass(frozen=True)
class SimpleCNNParams(ModelParams):
    init: str = field(default="xavier_normal", metadata={
        "choices": INITS, "help": "xavier_normal: the authors' init; default: PyTorch's"})


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
    return _initialized(nn.Sequential(
        nn.Conv2d(c, 16, 5), nn.LeakyReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=1), nn.LeakyReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.LeakyReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * h * w, 128), nn.LeakyReLU(), nn.Linear(128, classes)), params.init)


def femnist_cnn(params: CNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """The FEMNIST CNN of LEAF / FedEM: conv5x5·32 -> pool -> conv5x5·64 -> pool -> fc 2048 -> fc."""
    if tuple(input_shape) != (1, 28, 28):
        raise ValueError(f"femnist_cnn needs 1x28x28 inputs, the dataset gives {tuple(input_shape)}")
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 4 * 4, 2048), nn.ReLU(), nn.Linear(2048, classes))


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
    dense: int = field(default=128, metadata={"min": 0, "help": "width of the linear layer before the output (0: none)"})


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
    weights: str = field(default="", metadata={
        "help": "a local state-dict file (e.g. torchvision's ImageNet weights), loaded with weights_only; empty: random init"})
    norm: str = field(default="group", metadata={
        "choices": ("group",), "help": "normalization layers: GroupNorm (no running statistics; Hsieh et al. 2020)"})
    groups: int = field(default=2, metadata={"min": 1, "help": "GroupNorm groups (a layer with fewer channels uses their gcd)"})


def _group_norm(groups: int):
    return lambda channels: nn.GroupNorm(math.gcd(channels, groups), channels)


def _load_weights(model: nn.Module, path: str, name: str) -> nn.Module:
    """Copy every tensor of the state-dict file at ``path`` whose name and shape match the
    model's (a classifier for another number of classes, and batch-norm running statistics,
    are left out); ValueError when the file cannot be read or nothing matches."""
    import pickle

    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"{name}: cannot load weights from {path}: {str(e).splitlines()[0]}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    own = model.state_dict()
    matched = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    if not matched:
        raise ValueError(f"{name}: no tensor of {path} matches the model's names and shapes; is it a {name} state dict?")
    model.load_state_dict(matched, strict=False)
    return model


def _torchvision(builder: str, params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    import torchvision
    if len(input_shape) != 3 or input_shape[0] != 3:
        raise ValueError(f"{builder} needs 3 x H x W images, the dataset gives {tuple(input_shape)}")
    model = getattr(torchvision.models, builder)(weights=None, num_classes=classes,
                                                 norm_layer=_group_norm(params.groups))
    return _load_weights(model, params.weights, builder) if params.weights else model


def mobilenet_v2(params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's MobileNetV2 (FedEM's CIFAR model) with GroupNorm; ``weights`` from a local file."""
    return _torchvision("mobilenet_v2", params, input_shape, classes)


def resnet18(params: TorchvisionParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's ResNet-18 with GroupNorm; ``weights`` from a local file."""
    return _torchvision("resnet18", params, input_shape, classes)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    summary: str
    Params: type
    build: Callable[..., nn.Module]
    inputs: str = "features"      # the FederatedSource.input_kind it takes


def build(name: str, params, source) -> nn.Module:
    """Model ``name`` for ``source``'s inputs and outputs; ValueError (one line, naming the
    models that fit) when the model does not take the dataset's kind of input."""
    spec = MODELS[name]
    kind = getattr(source, "input_kind", "features")
    if spec.inputs != kind:
        fits = ", ".join(n for n, s in MODELS.items() if s.inputs == kind)
        what = {"tokens": "token ids (characters or words)", "features": "float features"}[kind]
        raise ValueError(f"model {name} takes {spec.inputs}, the dataset gives {what}; models for it: {fits}")
    if kind == "tokens":
        model = spec.build(params, source.input_shape, source.num_outputs, source.vocab_size)
    else:
        model = spec.build(params, source.input_shape, source.num_outputs)
    if getattr(params, "head", None) is not None:
        object.__setattr__(model, "raysim_head", params.head)
    return model


MODELS: dict[str, ModelSpec] = {
    s.name: s for s in (
        ModelSpec("linear", "multinomial logistic regression (flatten -> linear)", LinearParams, linear),
        ModelSpec("mlp", "fully connected ReLU network (hidden widths configurable)", MLPParams, mlp),
        ModelSpec("twonn", "SuPerFed's TwoNN: 3 hidden layers of 200, bias-free, Xavier init", TwoNNParams, twonn),
        ModelSpec("twocnn", "SuPerFed's TwoCNN: 2 conv5x5 + pool, fc 200-200, bias-free (Cx28x28 inputs)",
                  TwoNNParams, twocnn),
        ModelSpec("simplecnn", "SosicFL's/Floco's SimpleCNN: 3 conv + pool, fc 128 (CxHxW images, e.g. 32x32 or 28x28)",
                  SimpleCNNParams, simplecnn),
        ModelSpec("femnist_cnn", "LEAF/FedEM FEMNIST CNN: 2 conv5x5 + pool, fc 2048 (1x28x28 inputs)",
                  CNNParams, femnist_cnn),
        ModelSpec("mobilenet_v2", "torchvision's MobileNetV2 (FedEM's CIFAR model), GroupNorm; weights from a local "
                  "file", TorchvisionParams, mobilenet_v2),
        ModelSpec("resnet18", "torchvision's ResNet-18, GroupNorm; weights from a local file", TorchvisionParams, resnet18),
        ModelSpec("next_char_lstm", "LEAF/FedEM stacked LSTM: embed 8, 2 x LSTM 256, linear to the vocabulary "
                  "(character windows: shakespeare, leaf_shakespeare)", LSTMParams, next_char_lstm, "tokens"),
        ModelSpec("lstm_classifier", "LEAF's Sent140 LSTM: embed 100, 2 x LSTM 100, linear 128, classes "
                  "(word ids: leaf_sent140)", LSTMClassifierParams, lstm_classifier, "tokens"),
    )
}
