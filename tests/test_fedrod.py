"""FedRoD: the balanced softmax by hand, one local step of the generic model and the personal
head by hand (the personal loss never reaches the body), and its personalized accuracy above
FedAvg's on a pathological digits split."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Received
from raysim.algorithms.fedrod import BalancedSoftmax, FedRoDState, log_prior
from raysim.core import forward as fwd
from raysim.core.forward import params_of
from raysim.core.tasks import TASKS
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import write_scenario
from tests.test_algorithms import client, ctx, make, run
from tests.test_personal_layers import forward as mlp_forward
from tests.test_personal_layers import tiny_mlp

CLS = TASKS["classification"]


def test_balanced_softmax_on_three_logits_by_hand():
    prior = log_prior(torch.tensor([0, 0, 1, 2]), 3)  # π = (1/2, 1/4, 1/4)
    assert torch.allclose(prior.exp(), torch.tensor([0.5, 0.25, 0.25]))
    obj = BalancedSoftmax(CLS, None, 0)
    z = torch.tensor([[[1.0, 2.0, 0.0]]])
    got = obj.balanced(z, torch.tensor([[0]]), prior.unsqueeze(0))
    e = math.e
    want = -math.log(0.5 * e / (0.5 * e + 0.25 * e**2 + 0.25))  # −log softmax(z + log π)_0
    assert abs(float(got) - want) < 1e-6
    # a class the client lacks: log 0 = −inf, it takes no probability
    absent = log_prior(torch.tensor([0, 1]), 3)
    assert absent[2] == -math.inf
    got = obj.balanced(z, torch.tensor([[1]]), absent.unsqueeze(0))
    assert abs(float(got) - -math.log(0.5 * e**2 / (0.5 * e + 0.5 * e**2))) < 1e-6


def test_one_step_of_the_generic_model_and_the_personal_head_by_hand():
    # the linear 1 -> 2 model at 0 (all head); samples (2, 0), (1, 1), (−1, 0): π = (2/3, 1/3); lr 0.9,
    # one full batch. Generic: softmax(0 + log π) = (2/3, 1/3), so ∂/∂logits = (−1/3, 1/3) for y = 0 and
    # (2/3, −2/3) for y = 1: ∂W₀ = (2·(−1/3) + 1·(2/3) − 1·(−1/3)) / 3 = 1/9, ∂b₀ = 0: W = (−0.1, 0.1), b = 0.
    # Personal: softmax(0 + 0) = (1/2, 1/2): ∂W₀ = (2·(−1/2) + 1·(1/2) − 1·(−1/2)) / 3 = 0,
    # ∂b₀ = (−1/2 + 1/2 − 1/2) / 3 = −1/6: W = 0, b = (0.15, −0.15).
    fedrod = make("fedrod", lr=0.9, batch_size=3, momentum=0.0, weight_decay=0.0)
    data = client(0, [2.0, 1.0, -1.0], [0, 1, 0])
    glob = fedrod.init_server(None)
    ((state, reply, _),) = run(fedrod, fedrod.train(None, Received(glob), data, ctx(0)))
    W, b = reply.values
    assert torch.allclose(W, torch.tensor([[-0.1], [0.1]]), atol=1e-6) and torch.allclose(b, torch.zeros(2), atol=1e-7)
    pW, pb = state.head
    assert torch.allclose(pW, torch.zeros(2, 1), atol=1e-7) and torch.allclose(
        pb, torch.tensor([0.15, -0.15]), atol=1e-6
    )
    assert reply.weight == 3.0
    # personalized prediction: g(x) + p(x); at x = 1: (−0.1 + 0.15, 0.1 − 0.15) → class 0
    (m,) = run(fedrod, fedrod.evaluate(state, Received([W, b]), client(0, [1.0], [0]), ctx(0)))
    assert m["accuracy"] == 1.0 and m["global_accuracy"] == 0.0


def test_the_personal_loss_never_reaches_the_body_or_the_generic_head():
    fedrod = make("fedrod", model_fn=tiny_mlp, lr=0.5, batch_size=3, momentum=0.0, weight_decay=0.0)
    data = client(0, [2.0, -1.0, 0.5], [0, 1, 0])
    glob = params_of(tiny_mlp())
    mine = [torch.randn(2, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0.3, -0.2])]
    ((state, reply, _),) = run(fedrod, fedrod.train(FedRoDState(mine), Received(glob), data, ctx(0)))
    # by hand: the generic model takes a step on the balanced softmax alone ...
    q = [p.clone().requires_grad_() for p in glob]
    prior = torch.log(torch.tensor([2 / 3, 1 / 3]))
    bsm = F.cross_entropy(mlp_forward(q, data.train_x) + prior, data.train_y)
    want = [p - 0.5 * g for p, g in zip(glob, torch.autograd.grad(bsm, q))]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(reply.values, want))
    # ... and the personal head on CE(g(z) + p(z)) with z and g(z) fixed
    h = [p.clone().requires_grad_() for p in mine]
    z = torch.relu(data.train_x @ glob[0].T + glob[1])
    ce = F.cross_entropy(mlp_forward(glob, data.train_x) + z @ h[0].T + h[1], data.train_y)
    want = [p - 0.5 * g for p, g in zip(mine, torch.autograd.grad(ce, h))]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(state.head, want))


SCENARIO = """
name: fedrod-shards
seed: 0
rounds: 8
data:
  dataset: digits
  clients: 20
  partition: {kind: shards, classes_per_client: 2}
model: {name: mlp, hidden: [32]}
algorithm: {name: NAME, lr: 0.1, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 8}
"""


def final(tmp_path, name):
    sc = config.load(write_scenario(tmp_path, SCENARIO.replace("NAME", name), f"{name}.yaml"))
    d = serial_driver(sc, 1)
    for _ in range(sc.rounds):
        d.step()
    return d.history[-1]


def test_fedrod_personalized_beats_fedavg_on_a_pathological_split(tmp_path):
    # 20 clients of two classes, 8 rounds of half of them. Measured (seeds 0, 1, 2): FedAvg 0.239, 0.372,
    # 0.392; FedRoD personalized 0.800, 0.889, 0.889, its generic model 0.369, 0.225, 0.375 (the
    # generic model against FedAvg's goes either way this early: not asserted)
    fedavg, fedrod = final(tmp_path, "fedavg"), final(tmp_path, "fedrod")
    assert fedrod["accuracy"] > fedavg["accuracy"] + 0.3, (fedrod["accuracy"], fedavg["accuracy"])
    assert fedrod["global_accuracy"] > 0.2  # the generic model learns too (chance: 0.1)


@pytest.mark.parametrize("gradients", ["auto", "autograd"])
def test_the_gradients_path_equals_autograd_of_the_loss_with_an_absent_class_and_a_padded_row(gradients):
    # 2 sets, MLP 3 -> 4 -> ReLU -> 3 (the chain: by hand under "auto"), a batch of 5 rows whose last
    # is padding (weight 0) labelled with the class set 0 lacks (log π = −inf there)
    from raysim.core.groups import groups_of
    from raysim.core.loop import Batch, Trainer

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
    groups = groups_of(model)
    n = 4
    gen = torch.Generator().manual_seed(0)
    sets = [torch.randn(2, *p.shape, generator=gen) for p in model.parameters()]
    personal = [torch.randn(2, *model[2].weight.shape, generator=gen), torch.randn(2, 3, generator=gen)]
    x = torch.randn(2, 5, 3, generator=gen)
    y = torch.tensor([[0, 1, 0, 1, 2], [2, 1, 0, 2, 1]])
    valid = torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    weight = valid / valid.sum(1, keepdim=True)
    prior = torch.stack([log_prior(y[0, :4], 3), log_prior(y[1], 3)])
    assert prior[0, 2] == -math.inf
    batch = Batch(x, y, weight, valid)
    obj = BalancedSoftmax(CLS, groups, n)
    seen, got, assign = obj.gradients(
        Trainer(model, gradients=gradients).point_grad(CLS, batch), sets + personal, batch, {"log_prior": prior}, None
    )
    # the reference: autograd of ``loss`` with the padded row labelled with a class set 0 has (its
    # balanced loss is then finite, and weighs 0 as before; with class 2 it is inf · 0 = nan)
    ref = Batch(x, torch.where(valid > 0, y, torch.zeros_like(y)), weight, valid)
    leaves = [t.clone().requires_grad_() for t in sets + personal]
    loss, plain = obj.loss(fwd.make_forward(model), leaves, ref, {"log_prior": prior}, None)
    want = torch.autograd.grad(loss.sum(), leaves)
    assert assign == {} and torch.allclose(seen, plain)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
