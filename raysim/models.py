"""Models (plain nn.Modules) and their registry.

Each model takes the dataset's per-sample input shape and number of classes and outputs logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from torch import nn


@dataclass(frozen=True)
class LinearParams:
    pass


@dataclass(frozen=True)
class MLPParams:
    hidden: tuple[int, ...] = field(default=(200, 200), metadata={"help": "hidden layer widths"})


@dataclass(frozen=True)
class CNNParams:
    pass


def linear(params: LinearParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """Multinomial logistic regression: flatten -> Linear."""
    dim = math.prod(input_shape)
    if len(input_shape) == 1:
        return nn.Linear(dim, classes)
    return nn.Sequential(nn.Flatten(), nn.Linear(dim, classes))


def mlp(params: MLPParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """Fully connected ReLU network with the given hidden widths."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in params.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def femnist_cnn(params: CNNParams, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """The FEMNIST CNN of LEAF / FedEM: conv5x5·32 -> pool -> conv5x5·64 -> pool -> fc 2048 -> fc."""
    if tuple(input_shape) != (1, 28, 28):
        raise ValueError(f"femnist_cnn needs 1x28x28 inputs, the dataset gives {tuple(input_shape)}")
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 4 * 4, 2048), nn.ReLU(), nn.Linear(2048, classes))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    summary: str
    Params: type
    build: Callable[..., nn.Module]


MODELS: dict[str, ModelSpec] = {
    s.name: s for s in (
        ModelSpec("linear", "multinomial logistic regression (flatten -> linear)", LinearParams, linear),
        ModelSpec("mlp", "fully connected ReLU network (hidden widths configurable)", MLPParams, mlp),
        ModelSpec("femnist_cnn", "LEAF/FedEM FEMNIST CNN: 2 conv5x5 + pool, fc 2048 (1x28x28 inputs)",
                  CNNParams, femnist_cnn),
    )
}
