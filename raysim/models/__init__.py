"""Models (plain nn.Modules) and their registry.

Each model takes the dataset's per-sample input shape and number of classes and outputs logits.
The built-in models, each with its options, are in ``raysim.models.zoo``; the seed papers'
larger image models (VGG-9, ResNet-9, MobileNet, FedSoft's CNN, SqueezeNet) are built in
``raysim.models.vision``, their options in the zoo. Here: the registry ``MODELS``, what a model
is (``ModelSpec``), the plugins' (entry point group ``raysim.models``), ``spec`` and ``build``;
every name of the zoo is importable from here (``from raysim.models import mlp, MLPParams``).

May import ``raysim.core`` and the foundation modules (``raysim.plugins``, ``raysim.errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from raysim import plugins
from raysim.models.zoo import (  # noqa: F401 - re-exported: every name of the zoo imports from here
    INITS,
    CNNParams,
    FedSoftCNNParams,
    LinearParams,
    LSTMClassifierParams,
    LSTMParams,
    MLPParams,
    MobileNetParams,
    ModelParams,
    ResNet9Params,
    SimpleCNNParams,
    SqueezeNetParams,
    TokenLSTM,
    TorchvisionParams,
    TwoNNParams,
    VGG9Params,
    fedsoft_cnn,
    femnist_cnn,
    linear,
    lstm_classifier,
    mlp,
    mobilenet,
    mobilenet_v2,
    next_char_lstm,
    resnet9,
    resnet18,
    simplecnn,
    squeezenet,
    twocnn,
    twonn,
    vgg9,
)


@dataclass(frozen=True)
class ModelSpec:
    """A model: what the registry holds and what a model plugin provides (``raysim.plugins``).

    ``build(params, input_shape, classes)`` (``inputs="tokens"``: ``(params, input_shape,
    classes, vocab_size)``) returns a fresh ``nn.Module`` whose output has ``classes`` columns;
    ``params`` is an instance of ``Params``, the frozen dataclass of the scenario's ``model``
    options (subclass ``ModelParams`` to get ``head``). It is called under a seeded RNG for the
    run's initial weights, so it must draw them from torch's global generator."""

    name: str
    summary: str  # one line for `raysim list`
    Params: type
    build: Callable[..., nn.Module]
    inputs: str = "features"  # the FederatedSource.input_kind it takes


def spec(name: str) -> ModelSpec:
    """The model ``name``: built-in (``MODELS``), ``module:Name`` or an entry point of the group
    ``raysim.models`` (``raysim.plugins``); PluginError (one line) when none."""
    return plugins.resolve(PLUGINS, name)


def build(name: str, params, source) -> nn.Module:
    """Model ``name`` for ``source``'s inputs and outputs; ValueError (one line, naming the
    models that fit) when the model does not take the dataset's kind of input."""
    found = spec(name)
    kind = getattr(source, "input_kind", "features")
    if found.inputs != kind:
        fits = ", ".join(n for n, s in MODELS.items() if s.inputs == kind)
        what = {"tokens": "token ids (characters or words)", "features": "float features"}[kind]
        raise ValueError(f"model {name} takes {found.inputs}, the dataset gives {what}; models for it: {fits}")
    if kind == "tokens":
        model = found.build(params, source.input_shape, source.num_outputs, source.vocab_size)
    else:
        model = found.build(params, source.input_shape, source.num_outputs)
    if getattr(params, "head", None) is not None:
        object.__setattr__(model, "raysim_head", params.head)
    return model


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("linear", "multinomial logistic regression (flatten -> linear)", LinearParams, linear),
        ModelSpec("mlp", "fully connected ReLU network (hidden widths configurable)", MLPParams, mlp),
        ModelSpec("twonn", "SuPerFed's TwoNN: 3 hidden layers of 200, bias-free, Xavier init", TwoNNParams, twonn),
        ModelSpec(
            "twocnn",
            "SuPerFed's TwoCNN: 2 conv5x5 + pool, fc 200-200, bias-free (Cx28x28 or Cx32x32 inputs)",
            TwoNNParams,
            twocnn,
        ),
        ModelSpec(
            "simplecnn",
            "SosicFL's/Floco's SimpleCNN: 3 conv + pool, fc 128 (CxHxW images, e.g. 32x32 or 28x28)",
            SimpleCNNParams,
            simplecnn,
        ),
        ModelSpec(
            "femnist_cnn", "LEAF/FedEM FEMNIST CNN: 2 conv5x5 + pool, fc 2048 (1x28x28 inputs)", CNNParams, femnist_cnn
        ),
        ModelSpec(
            "vgg9",
            "SuPerFed's VGG-9: 6 conv3x3 (16-512), 4 pools, fc 256, no norm (CxHxW images, the paper's 1x28x28)",
            VGG9Params,
            vgg9,
        ),
        ModelSpec(
            "resnet9",
            "SuPerFed's ResNet-9: 4 basic blocks (64-512), fc 256, batch norm (CxHxW images, the paper's 3x28x28)",
            ResNet9Params,
            resnet9,
        ),
        ModelSpec(
            "mobilenet",
            "SuPerFed's MobileNet: 4 depthwise-separable blocks (32-512), fc 256, batch norm "
            "(CxHxW images of at least 33x33, the paper's 3x64x64)",
            MobileNetParams,
            mobilenet,
        ),
        ModelSpec(
            "fedsoft_cnn",
            "FedSoft's CIFAR-10 CNN: 6 conv3x3 (32-256), 3 pools, fc 1024-512 (CxHxW images, the paper's 3x32x32)",
            FedSoftCNNParams,
            fedsoft_cnn,
        ),
        ModelSpec(
            "squeezenet",
            "SosicFL's SqueezeNet: torchvision's squeezenet1_1, linear classifier; weights from "
            "a local file (3xHxW images, the paper's CIFAR-10 3x32x32)",
            SqueezeNetParams,
            squeezenet,
        ),
        ModelSpec(
            "mobilenet_v2",
            "torchvision's MobileNetV2 (FedEM's CIFAR model), GroupNorm; weights from a local file",
            TorchvisionParams,
            mobilenet_v2,
        ),
        ModelSpec(
            "resnet18", "torchvision's ResNet-18, GroupNorm; weights from a local file", TorchvisionParams, resnet18
        ),
        ModelSpec(
            "next_char_lstm",
            "LEAF/FedEM stacked LSTM: embed 8, 2 x LSTM 256, linear to the vocabulary "
            "(character windows: shakespeare, leaf_shakespeare)",
            LSTMParams,
            next_char_lstm,
            "tokens",
        ),
        ModelSpec(
            "lstm_classifier",
            "LEAF's Sent140 LSTM: embed 100, 2 x LSTM 100, linear 128, classes (word ids: leaf_sent140)",
            LSTMClassifierParams,
            lstm_classifier,
            "tokens",
        ),
    )
}

# plugins: a ModelSpec named by an entry point of the group raysim.models, or by module:Name
PLUGINS = plugins.Kind("raysim.models", "model", MODELS, ModelSpec, "raysim.models.MODELS")
