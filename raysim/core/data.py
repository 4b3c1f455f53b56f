"""A client's data shard and the context of a client step."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch


@dataclass
class Context:
    """What a client step may know besides its state, the message and its data."""

    round: int  # 0-based round index
    rounds: int  # total rounds of the run
    cid: int  # client id
    generator: torch.Generator  # derived from (seed, purpose, round, cid)
    device: torch.device = torch.device("cpu")
    group: int = 0  # the group the server chose for this client this round (cluster, ...)
    work: float = 1.0  # the share of its local steps the client has time for (a straggler's partial work)

    def fork(self) -> Context:
        """This context with a generator of its own that starts where this one stands: a second
        pass (the validation scoring) draws what the first draws, and the first's draws are not
        moved by it."""
        g = torch.Generator(device=self.generator.device)
        g.set_state(self.generator.get_state())
        return dataclasses.replace(self, generator=g)


@dataclass
class Block:
    """A host's clients at once (``Algorithm.train_rows``): their ids, their train splits as row
    blocks of one tensor of inputs and one of targets (client k's at rows starts[k] ..
    starts[k] + ns[k]), the round and the seeds of their "train" generators."""

    cids: list[int]
    x: torch.Tensor
    y: torch.Tensor
    starts: list[int]
    ns: list[int]
    round: int
    rounds: int
    seeds: list[int]
    device: torch.device = torch.device("cpu")


@dataclass
class ClientData:
    """One client's shard: tensors already on the host's device. Labels are int64 class ids
    (classification) or float targets, (n,) or (n, d) (regression)."""

    cid: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_val(self) -> int:
        return int(self.val_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])

    def val_as_test(self) -> ClientData:
        """This shard with its validation split in the test split's place (and still in its
        own): what ``Algorithm.evaluations`` hands ``evaluate`` for the ``val_*`` metrics, so
        every method scores its validation split exactly as its test split, with no code of its
        own. A method that selects on the validation split (SuPerFed's λ, CFL's model) selects
        as it does for the test metrics."""
        return ClientData(self.cid, self.train_x, self.train_y, self.val_x, self.val_y, self.val_x, self.val_y)

    def to(self, device: torch.device) -> ClientData:
        if device.type == "cpu":
            return self
        return ClientData(
            self.cid,
            *(t.to(device) for t in (self.train_x, self.train_y, self.val_x, self.val_y, self.test_x, self.test_y)),
        )


class Pixels:
    """Images as a client holds them, uint8 pixels, turned into the model's float32 inputs batch
    by batch: (x / 255 − mean_c) / std_c for channel c (the axis three from the end, (C, H, W)).

    Held as bytes, a host's shards take a quarter of the memory (and of a GPU's) they took as
    float32; the loop decodes each batch it gathers, evaluation each block of inputs. The
    operations are float32 ones in the order the pool used to be normalized in with numpy, and
    the constants are tensors on the batch's device (a CUDA kernel divides by a Python number
    as a multiplication by its reciprocal, which rounds differently), so the inputs are the
    same numbers whichever way they were stored. Inputs already float pass through."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        if len(mean) != len(std):
            raise ValueError(f"{len(mean)} channel means but {len(std)} standard deviations")
        self.mean, self.std = (
            tuple(float(torch.tensor(m, dtype=torch.float32)) for m in mean),
            tuple(float(torch.tensor(s, dtype=torch.float32)) for s in std),
        )
        self._on: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """255, the means and the standard deviations as float32 tensors on ``device`` (the
        channels' as (C, 1, 1))."""
        got = self._on.get(device)
        if got is None:
            shape = () if len(self.mean) == 1 else (len(self.mean), 1, 1)
            got = self._on[device] = (
                torch.tensor(255.0, device=device),
                torch.tensor(self.mean, device=device).reshape(shape),
                torch.tensor(self.std, device=device).reshape(shape),
            )
        return got

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        scale, mean, std = self.constants(x.device)
        return x.to(torch.float32).div_(scale).sub_(mean).div_(std)

    def __eq__(self, other) -> bool:
        return isinstance(other, Pixels) and (self.mean, self.std) == (other.mean, other.std)

    def __hash__(self) -> int:
        return hash((self.mean, self.std))

    def __getstate__(self):
        return {"mean": self.mean, "std": self.std, "_on": {}}


ALIGN = 64  # bytes: where each client's rows start in a packed tensor (a cache line)


def pack(shards: list[ClientData]) -> list[ClientData]:
    """The shards with their train splits as row blocks of one tensor of inputs and one of
    targets (the same values): the loop then trains many clients straight from that storage
    instead of concatenating their data at every pass (``batches.pool``).

    Each client's block starts at a multiple of ``ALIGN`` bytes (zero rows in between, never
    read): the CPU's matrix kernels (MKL's, oneDNN's) take different paths for differently
    aligned inputs, and those add in different orders, so a client's numbers would otherwise
    depend on the sizes of the clients packed before it, i.e. on how clients are spread over
    hosts."""
    if len(shards) < 2:
        return shards
    x0, y0 = shards[0].train_x, shards[0].train_y
    row = math.prod(x0.shape[1:]) * x0.element_size()  # bytes a row (a client may hold none)
    step = ALIGN // math.gcd(max(row, 1), ALIGN)  # rows per aligned stretch
    at, starts = 0, []
    for d in shards:
        starts.append(at)
        at += -(-d.num_train // step) * step
    xs = x0.new_zeros((at, *x0.shape[1:]))
    ys = y0.new_zeros((at, *y0.shape[1:]))
    out = []
    for d, a in zip(shards, starts):
        n = d.num_train
        xs[a : a + n] = d.train_x
        ys[a : a + n] = d.train_y
        out.append(dataclasses.replace(d, train_x=xs[a : a + n], train_y=ys[a : a + n]))
    return out
