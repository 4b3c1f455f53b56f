"""Data poisoning: pure tensor transforms the data layer applies to the malicious clients' training
sets, the model-replacement boost of their updates, and the backdoor's metric. Images are (N, C, H,
W), (N, H, W), or flattened (N, D) with ``image_shape`` (C, H, W) or (H, W); nothing is modified in
place; random choices come only from the ``torch.Generator`` passed.

- ``flip_labels``: ``reverse``, y → C − 1 − y (the common convention: Fang et al. 2020's label
  flipping, Karimireddy et al.'s code, Blades); ``target``, each (source, target) pair relabels
  the source class, the other labels kept (Tolpegin et al., ESORICS 2020).
- A trigger (BadNets, Gu, Dolan-Gavitt & Garg, 2017; the pixel pattern of Bagdasaryan et al.,
  AISTATS 2020): a small boolean ``pattern`` (``square``: size × size; ``plus``: the middle row and
  column of size × size, size odd) written at ``location`` (its top-left pixel; None: the
  bottom-right corner, BadNets' place) with ``value`` (one number for every channel, or one per
  channel; 1.0, white for images in [0, 1]) by ``stamp``; a trigger placed on the image is an (H, W)
  mask (``place``), which ``apply`` writes.
- ``poison``: ⌊fraction·N⌋ samples drawn without replacement, stamped and relabelled to ``target``.
  The fraction defaults to DBA's MNIST setting, 20 poisoned samples per batch of 64 (0.3125).
- ``boost`` (model replacement, Bagdasaryan, Veit, Hua, Estrin & Shmatikov, "How To Backdoor
  Federated Learning", AISTATS 2020): the server computes G + (η/n) Σ_i (L_i − G), so an attacker
  sending γ(X − G) + G with γ = n/η (n the clients of the round, η the server's learning rate)
  replaces G by X when the others' updates cancel; on updates, γ·Δ. ``gamma`` gives γ directly (DBA's
  code: 100).
- DBA (Xie, Huang, Chen & Li, "DBA: Distributed Backdoor Attacks against Federated Learning", ICLR
  2020): the global trigger cut into P local parts; attacker i stamps part i mod P during training,
  the test-time trigger is their union (``union``). ``dba_parts``: the official code's layout, P bars
  of 1 × size, two to a row, part i at row (i // 2)(1 + gap) + shift and column (i % 2)(size + gap)
  + shift (its MNIST: size 4, gap 2, shift 0; CIFAR-10: 6, 3, 0); ``split_trigger`` cuts any
  global mask's pixels, in row-major order, into P consecutive groups (a 4 × 4 square: its 4 rows).
- ``attack_success_rate``: the share of triggered test inputs whose true label is not the target
  that are classified as the target (inputs of the target class left out, as in the papers); nan
  when there is none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

PATTERNS = ("square", "plus")


# ----------------------------------------------------------------------------- labels


def flip_labels(
    y: torch.Tensor, num_classes: int, mode: str = "reverse", pairs: Sequence[tuple[int, int]] = ()
) -> torch.Tensor:
    """The flipped labels: ``reverse`` C − 1 − y; ``target`` each (source, target) of ``pairs``,
    from the original labels (so (1, 2), (2, 1) swaps two classes)."""
    if mode == "reverse":
        return num_classes - 1 - y
    if mode != "target":
        raise ValueError(f"unknown label-flipping mode {mode!r}: reverse or target")
    out = y.clone()
    for source, target in pairs:
        out[y == source] = target
    return out


# ----------------------------------------------------------------------------- triggers


def pattern(name: str = "square", size: int = 3) -> torch.Tensor:
    """A trigger's (size, size) boolean pattern: ``square`` all set, ``plus`` the middle row and
    column (size odd)."""
    if name == "square":
        return torch.ones(size, size, dtype=torch.bool)
    if name == "plus":
        if size % 2 == 0:
            raise ValueError(f"a plus needs an odd size (got {size})")
        p = torch.zeros(size, size, dtype=torch.bool)
        p[size // 2, :] = True
        p[:, size // 2] = True
        return p
    raise ValueError(f"unknown trigger pattern {name!r}: one of {', '.join(PATTERNS)}")


def place(pat: torch.Tensor, location: tuple[int, int] | None, hw: tuple[int, int]) -> torch.Tensor:
    """The (H, W) mask of ``pat`` with its top-left pixel at ``location`` (None: the bottom-right
    corner); it must fit in the image."""
    h, w = pat.shape
    H, W = hw
    r, c = (H - h, W - w) if location is None else location
    if r < 0 or c < 0 or r + h > H or c + w > W:
        raise ValueError(f"a {h}×{w} trigger at {(r, c)} does not fit in a {H}×{W} image")
    mask = torch.zeros(H, W, dtype=torch.bool)
    mask[r : r + h, c : c + w] = pat.bool()
    return mask


def _images(x: torch.Tensor, image_shape: Sequence[int] | None) -> torch.Tensor:
    """x as (N, C, H, W) (a view)."""
    if x.dim() == 2:
        if image_shape is None:
            raise ValueError("flattened images (N, D) need their image_shape")
        shape = tuple(image_shape) if len(image_shape) == 3 else (1, *image_shape)
        return x.view(x.shape[0], *shape)
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() == 4:
        return x
    raise ValueError(f"images must be (N, C, H, W), (N, H, W) or (N, D), not {tuple(x.shape)}")


def apply(
    x: torch.Tensor,
    mask: torch.Tensor,
    value: float | Sequence[float] = 1.0,
    image_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """A copy of ``x`` with ``value`` written at the mask's (H, W) pixels of every image, in every
    channel (one value, or one per channel)."""
    out = x.clone()
    imgs = _images(out, image_shape)
    v = torch.as_tensor(value, dtype=out.dtype, device=out.device).reshape(-1, 1)  # (1 or C, 1)
    m = mask.to(out.device)
    imgs[:, :, m] = v.expand(imgs.shape[1], int(m.sum()))  # (N, C, k) ← (C, k), the same for every image
    return out


def stamp(
    x: torch.Tensor,
    pat: torch.Tensor,
    location: tuple[int, int] | None = None,
    value: float | Sequence[float] = 1.0,
    image_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """``x`` with the pattern written at ``location`` (None: bottom-right) in every image."""
    H, W = _images(x, image_shape).shape[-2:]
    return apply(x, place(pat, location, (H, W)), value, image_shape)


def poison(
    x: torch.Tensor,
    y: torch.Tensor,
    target: int,
    fraction: float,
    generator: torch.Generator,
    trigger: torch.Tensor,
    value: float | Sequence[float] = 1.0,
    image_shape: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, idx): ⌊fraction·N⌋ samples ``idx`` drawn without replacement, stamped with the
    ``trigger`` mask (H, W) and relabelled ``target``; the others unchanged."""
    n = x.shape[0]
    idx = torch.randperm(n, generator=generator, device=generator.device)[: math.floor(fraction * n)].to(x.device)
    xs, ys = x.clone(), y.clone()
    xs[idx] = apply(x[idx], trigger, value, image_shape)
    ys[idx] = target
    return xs, ys, idx


# ----------------------------------------------------------------------------- model replacement


def boost(
    update: torch.Tensor, gamma: float | None = None, clients: int | None = None, server_lr: float = 1.0
) -> torch.Tensor:
    """γ·Δ, γ = ``gamma`` or n/η (``clients`` per round over the server's learning rate)."""
    if gamma is None:
        if clients is None:
            raise ValueError("boost needs gamma, or the clients per round (and the server lr) for γ = n/η")
        gamma = clients / server_lr
    return gamma * update


# ----------------------------------------------------------------------------- DBA


def dba_parts(hw: tuple[int, int], parts: int = 4, size: int = 4, gap: int = 2, shift: int = 0) -> list[torch.Tensor]:
    """DBA's local triggers as (H, W) masks: ``parts`` bars of 1 × size, two to a row."""
    bar = torch.ones(1, size, dtype=torch.bool)
    return [place(bar, ((i // 2) * (1 + gap) + shift, (i % 2) * (size + gap) + shift), hw) for i in range(parts)]


def split_trigger(mask: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """A global trigger's pixels, row-major, cut into ``parts`` consecutive groups (the first ones
    one pixel larger when they do not divide evenly)."""
    pixels = mask.nonzero()  # row-major
    if parts < 1 or parts > len(pixels):
        raise ValueError(f"cannot cut a trigger of {len(pixels)} pixels into {parts} parts")
    out = []
    for group in torch.tensor_split(pixels, parts):
        m = torch.zeros_like(mask, dtype=torch.bool)
        m[group[:, 0], group[:, 1]] = True
        out.append(m)
    return out


def dba_local(parts: Sequence[torch.Tensor], attacker: int) -> torch.Tensor:
    """The part attacker i stamps: part i mod P."""
    return parts[attacker % len(parts)]


def union(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The global (test-time) trigger: every part."""
    out = torch.zeros_like(parts[0], dtype=torch.bool)
    for p in parts:
        out |= p.bool()
    return out


# ----------------------------------------------------------------------------- metric


def attack_success_rate(pred: torch.Tensor, y_true: torch.Tensor, target: int) -> float:
    """Of the triggered inputs whose true label is not ``target``, the share predicted ``target``
    (nan when every input is of the target class)."""
    keep = torch.as_tensor(y_true) != target
    n = int(keep.sum())
    return float((torch.as_tensor(pred)[keep] == target).sum()) / n if n else math.nan


# ----------------------------------------------------------------------------- the data attacks' options


@dataclass(frozen=True)
class LabelFlipParams:
    mode: str = field(
        default="reverse",
        metadata={"choices": ("reverse", "target"), "help": "reverse: y → C − 1 − y; target: sources → targets"},
    )
    sources: tuple[int, ...] = field(default=(), metadata={"help": "mode target: the classes relabelled"})
    targets: tuple[int, ...] = field(default=(), metadata={"help": "mode target: their new labels, one per source"})


@dataclass(frozen=True)
class BackdoorParams:
    target: int = field(default=0, metadata={"min": 0, "help": "the class triggered inputs are relabelled to"})
    fraction: float = field(
        default=0.3125, metadata={"gt": 0.0, "max": 1.0, "help": "share of an attacker's training samples poisoned"}
    )
    pattern: str = field(default="square", metadata={"choices": PATTERNS, "help": "the trigger's shape"})
    size: int = field(default=4, metadata={"min": 1, "help": "the trigger's side in pixels"})
    location: tuple[int, ...] | None = field(
        default=None, metadata={"help": "[row, column] of its top-left pixel; null: the bottom-right corner"}
    )
    value: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0, "help": "its intensity, 1 white"})
    gamma: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "help": "model replacement's boost γ of the update; null: n/(m·η) (n clients a round, m attackers among them, η the server lr); 1: none",
        },
    )


@dataclass(frozen=True)
class DBAParams:
    target: int = field(default=0, metadata={"min": 0, "help": "the class triggered inputs are relabelled to"})
    fraction: float = field(
        default=0.3125, metadata={"gt": 0.0, "max": 1.0, "help": "share of an attacker's training samples poisoned"}
    )
    parts: int = field(default=4, metadata={"min": 1, "help": "P, the local triggers the global one is cut into"})
    size: int = field(default=4, metadata={"min": 1, "help": "each local bar's length in pixels"})
    gap: int = field(default=2, metadata={"min": 0, "help": "pixels between the bars"})
    shift: int = field(default=0, metadata={"min": 0, "help": "the pattern's offset from the top-left corner"})
    value: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0, "help": "its intensity, 1 white"})
    gamma: float | None = field(
        default=None,
        metadata={"gt": 0.0, "help": "the boost γ of the update; null: n/(m·η); 1: none (DBA's code scales by 100)"},
    )


@dataclass(frozen=True)
class DataAttack:
    """A data-poisoning attack: the attackers train on poisoned data (``trigger``: a backdoor,
    scored by the attack success rate), their updates boosted by γ where the options have one."""

    name: str
    paper: str
    Params: type
    trigger: bool


DATA_ATTACKS: dict[str, DataAttack] = {
    a.name: a
    for a in (
        DataAttack(
            "label_flip", "Fang et al., USENIX Security 2020; Tolpegin et al., ESORICS 2020", LabelFlipParams, False
        ),
        DataAttack("backdoor", "Gu et al. 2017 (BadNets); Bagdasaryan et al., AISTATS 2020", BackdoorParams, True),
        DataAttack("dba", "Xie, Huang, Chen & Li, ICLR 2020", DBAParams, True),
    )
}


def triggers(p: BackdoorParams | DBAParams, hw: tuple[int, int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(the local triggers attackers stamp, attacker i the i mod P-th; the test-time trigger)."""
    if isinstance(p, DBAParams):
        parts = dba_parts(hw, p.parts, p.size, p.gap, p.shift)
        return parts, union(parts)
    loc = None if p.location is None else (int(p.location[0]), int(p.location[1]))
    mask = place(pattern(p.pattern, p.size), loc, hw)
    return [mask], mask
