"""FedLC: the calibration by hand, the calibrated loss on three logits by hand (both
denominators), one local step by hand (the by-hand gradient path against autograd on an MLP),
and end to end on a pathological digits split."""

import math

import torch
import torch.nn.functional as F

from raysim.algorithms.base import Received
from raysim.algorithms.fedlc import calibration
from raysim.core.forward import params_of
from raysim.core.objectives import LogitAdjusted, LogitAdjustedNotTrue
from raysim.core.tasks import TASKS
from tests.test_algorithms import client, ctx, make, run
from tests.test_personal_layers import forward as mlp_forward
from tests.test_personal_layers import tiny_mlp

CLS = TASKS["classification"]


def test_the_calibration_is_minus_tau_times_the_count_to_the_minus_quarter():
    y = torch.tensor([0] * 16 + [1])  # counts 16, 1, 0: an absent class counts as 1
    assert torch.allclose(calibration(y, 3, 1.0), torch.tensor([-0.5, -1.0, -1.0]))
    assert torch.allclose(calibration(y, 3, 2.0), torch.tensor([-1.0, -2.0, -2.0]))
    # FL-bench's stand-in count 1e-8: (1e-8)^(−1/4) = 100
    assert torch.allclose(calibration(y, 3, 1.0, 1e-8), torch.tensor([-0.5, -1.0, -100.0]))


def test_the_calibrated_loss_on_three_logits_by_hand():
    z = torch.tensor([[[1.0, 0.0, 0.0]]])
    o = torch.tensor([[-0.5, -1.0, -100.0]])  # z + o = (0.5, −1, −100)
    got = LogitAdjusted(CLS).adjusted_loss(z + o.unsqueeze(1), torch.tensor([[0]]))
    want = -0.5 + math.log(math.exp(0.5) + math.exp(-1) + math.exp(-100))
    assert abs(float(got) - want) < 1e-6
    # the paper's print: the true class out of the denominator, −0.5 + log(e^−1 + e^−100)
    got = LogitAdjustedNotTrue(CLS).adjusted_loss(z + o.unsqueeze(1), torch.tensor([[0]]))
    assert abs(float(got) - (-0.5 + math.log(math.exp(-1) + math.exp(-100)))) < 1e-6


def test_one_step_of_the_linear_model_by_hand():
    # the linear 1 -> 2 model at 0; samples (2, 0), (1, 1), (−1, 0): counts (2, 1), offsets
    # −(2^−1/4, 1) = (−0.8409, −1); lr 0.9, one full batch. softmax(0 + o) = (p, 1 − p),
    # p = 1 / (1 + e^(−1 + 0.8409)); ∂/∂logits = (p − 1, 1 − p) for y = 0 and (p, −p) for y = 1;
    # ∂W₀ = (2(p − 1) + p − (p − 1)) / 3 = (2p − 1) / 3, ∂b₀ = ((p − 1) + p + (p − 1)) / 3 = (3p − 2) / 3
    fedlc = make("fedlc", lr=0.9, batch_size=3, momentum=0.0, weight_decay=0.0)
    data = client(0, [2.0, 1.0, -1.0], [0, 1, 0])
    glob = fedlc.init_server(None)
    ((_, reply, _),) = run(fedlc, fedlc.train(None, Received(glob), data, ctx(0)))
    p = 1 / (1 + math.exp(-1 + 2**-0.25))
    gW, gb = (2 * p - 1) / 3, (3 * p - 2) / 3
    W, b = reply.values
    assert torch.allclose(W, torch.tensor([[-0.9 * gW], [0.9 * gW]]), atol=1e-6)
    assert torch.allclose(b, torch.tensor([-0.9 * gb, 0.9 * gb]), atol=1e-6)
    assert reply.weight == 3.0


def test_one_step_of_an_mlp_equals_autograds():
    fedlc = make("fedlc", model_fn=tiny_mlp, lr=0.5, batch_size=3, momentum=0.0, weight_decay=0.0, tau=0.7)
    data = client(0, [2.0, -1.0, 0.5], [0, 1, 0])
    glob = params_of(tiny_mlp())
    ((_, reply, _),) = run(fedlc, fedlc.train(None, Received(glob), data, ctx(0)))
    q = [t.clone().requires_grad_() for t in glob]
    offset = -0.7 * torch.tensor([2.0, 1.0]) ** -0.25
    loss = F.cross_entropy(mlp_forward(q, data.train_x) + offset, data.train_y)
    want = [t - 0.5 * g for t, g in zip(glob, torch.autograd.grad(loss, q))]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(reply.values, want))


SHARDS = """
name: fedlc-shards
seed: 0
rounds: 30
data: {dataset: digits, clients: 20, partition: {kind: shards, classes_per_client: 2}}
model: {name: mlp, hidden: [32]}
algorithm: {name: NAME, lr: 0.1, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 30}
resources: {hosts: 2}
"""


def test_fedlc_learns_a_pathological_split_as_well_as_fedavg(tmp_path):
    from tests.conftest import last_record

    def final(name):
        return last_record(tmp_path, SHARDS.replace("NAME", name))["accuracy"]

    fedavg, fedlc = final("fedavg"), final("fedlc")
    # measured: FedAvg 0.836, FedLC 0.842 (chance 0.1)
    assert fedlc > 0.75 and fedlc > fedavg - 0.02
