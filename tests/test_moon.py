"""MOON: the model-contrastive term on tiny fixed representations by hand through the objective,
the first round (previous model = global model) as plain FedAvg, the previous local model kept
as client state, the refusal of a model without a body, and end to end on digits against FedAvg."""

import math

import pytest
import torch
from torch import nn

from raysim.algorithms.base import Received
from raysim.algorithms.moon import MOONState
from raysim.core.features import split_model
from raysim.core.loop import Batch
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import write_scenario
from tests.test_algorithms import ctx, make, run


def tiny(variant=0):
    """2 -> 2 (the body) -> 2 (the head): the body's output is the representation z."""
    torch.manual_seed(3 + variant)
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))


def body(W):
    return [torch.tensor(W).unsqueeze(0), torch.zeros(1, 2)]


def test_the_contrastive_term_by_hand_through_the_objective():
    algo = make("moon", model_fn=tiny, mu=1.0, tau=0.5)
    obj = algo.moon
    assert (obj.body_idx, obj.head_idx) == ((0, 1), (2, 3))
    # x = (1, 0): the current body (identity) gives z = (1, 0), the global one z_glob = (1, 1),
    # the previous one z_prev = (0, 1); the head is 0, so the logits are (0, 0)
    params = body([[1.0, 0.0], [0.0, 1.0]]) + [torch.zeros(1, 2, 2), torch.zeros(1, 2)]
    consts = {"glob": body([[1.0, 0.0], [1.0, 0.0]]), "prev": body([[0.0, 0.0], [1.0, 0.0]])}
    batch = Batch(torch.tensor([[[1.0, 0.0]]]), torch.tensor([[0]]), torch.ones(1, 1), torch.ones(1, 1))
    loss, data = obj.loss(None, params, batch, consts, None)
    # sim(z, z_glob) = 1/√2, sim(z, z_prev) = 0; over τ = 0.5: √2 and 0
    # ℓ_con = −log(e^√2 / (e^√2 + e^0)) = log(1 + e^−√2); CE = log 2
    con = math.log(1 + math.exp(-math.sqrt(2)))
    assert data.item() == pytest.approx(math.log(2))
    assert loss.item() == pytest.approx(math.log(2) + con, rel=1e-6)
    algo5 = make("moon", model_fn=tiny, mu=5.0, tau=1.0)  # μ and τ enter as written
    loss5, _ = algo5.moon.loss(None, params, batch, consts, None)
    assert loss5.item() == pytest.approx(math.log(2) + 5 * math.log(1 + math.exp(-1 / math.sqrt(2))), rel=1e-6)
    # two rows with weights 1/2: the batch mean of the per-sample terms
    batch2 = Batch(
        torch.tensor([[[1.0, 0.0], [2.0, 0.0]]]), torch.tensor([[0, 0]]), torch.full((1, 2), 0.5), torch.ones(1, 2)
    )
    loss2, data2 = obj.loss(None, params, batch2, consts, None)
    assert loss2.item() == pytest.approx(math.log(2) + con, rel=1e-6)  # z scales, cosines do not
    assert data2.item() == pytest.approx(2 * math.log(2))  # reported: the sum


@pytest.mark.parametrize("mu", [0.0, 2.0])
def test_the_hand_written_gradients_equal_autograd_of_the_loss(mu):
    # MLP 3 -> 5 -> ReLU -> 4 -> Tanh -> 3 with model.head 1 (the representation: the Tanh's
    # output), 2 sets, 4 rows, the last of set 1 padding; the loop's gradient for this chain is by
    # hand, with the contrastive term's gradient entering at the head's input
    from raysim.core import forward as fwd
    from raysim.core.loop import Trainer
    from raysim.core.tasks import TASKS

    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    obj = make("moon", model_fn=lambda: model, mu=mu, tau=0.5).moon
    assert obj.needs_chain and obj.head_idx == (4, 5)
    gen = torch.Generator().manual_seed(1)
    sets = [[torch.randn(2, *p.shape, generator=gen) for p in model.parameters()] for _ in range(3)]
    consts = {"glob": obj.const_params(sets[1]), "prev": obj.const_params(sets[2])}
    valid = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    batch = Batch(
        torch.randn(2, 4, 3, generator=gen),
        torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]),
        valid / valid.sum(1, keepdim=True),
        valid,
    )
    trainer = Trainer(model)
    assert trainer.chain is not None
    seen, got, assign = obj.gradients(trainer.point_grad(TASKS["classification"], batch), sets[0], batch, consts, None)
    leaves = [t.clone().requires_grad_() for t in sets[0]]
    loss, data = obj.loss(fwd.make_forward(model), leaves, batch, consts, None)
    want = torch.autograd.grad(loss.sum(), leaves)
    assert assign == {} and torch.allclose(seen, data)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def two_d(cid, rows, ys):
    from raysim.core.data import ClientData

    x, y = torch.tensor(rows), torch.tensor(ys)
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


def test_first_round_is_fedavg_then_the_previous_model_is_the_state():
    hp = dict(lr=0.1, batch_size=3, momentum=0.0, weight_decay=0.0)
    moon, fedavg = make("moon", model_fn=tiny, **hp), make("fedavg", model_fn=tiny, **hp)
    data = two_d(0, [[2.0, 1.0], [-1.0, 0.0], [0.5, -2.0]], [0, 1, 0])
    glob = moon.init_server(None)
    ((s, r, _),) = run(moon, moon.train(None, Received(glob), data, ctx(0)))
    ((_, rf, _),) = run(fedavg, fedavg.train(None, Received(glob), data, ctx(0)))
    # z_prev = z_glob: ℓ_con = log 2 with zero gradient, the steps are FedAvg's
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(r.values, rf.values))
    assert isinstance(s, MOONState) and all(torch.equal(a, b) for a, b in zip(s.prev, r.values))
    assert r.weight == 3.0
    # round 2 from the same global model with that previous model: the contrastive term now acts
    ((s2, r2, _),) = run(moon, moon.train(s, Received(glob), data, ctx(0, 1)))
    ((_, rf2, _),) = run(fedavg, fedavg.train(None, Received(glob), data, ctx(0, 1)))
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(r2.values, rf2.values))


def test_split_model_and_the_refusals():
    b, h = split_model(tiny(), (0, 1))
    assert len(b) == 2 and len(h) == 1  # the activation is the body's
    with pytest.raises(ValueError, match="sequence of layers"):

        class Custom(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        split_model(Custom(), (0, 1))


DIGITS = """
name: digits-moon
seed: 0
rounds: {rounds}
data:
  dataset: digits
  clients: 20
  partition: {{kind: dirichlet, alpha: 0.5}}
model: {{name: mlp, hidden: [32]}}
algorithm: {{name: {name}, lr: 0.05, batch_size: 16, local_epochs: 2}}
sampling: {{fraction: 0.5}}
eval: {{every: {rounds}}}
resources: {{hosts: 2, cpus_per_host: 1}}
"""


def final_accuracy(tmp_path, name, rounds=20, *overrides):
    path = write_scenario(tmp_path, DIGITS.format(rounds=rounds, name=name), f"{name}.yaml")
    d = serial_driver(config.load(path, list(overrides)), 2)
    for _ in range(rounds):
        d.step()
    return d.history[-1]["accuracy"]


def test_moon_learns_digits_near_fedavg(tmp_path):
    # Dirichlet(0.5) split, MLP 64-32-10 (the body: the hidden layer), 20 rounds of half the
    # clients. Measured: MOON (μ 1, τ 0.5) 0.895 vs FedAvg 0.889 (after 10 rounds 0.576 vs
    # 0.593; μ = 0 gives FedAvg's numbers exactly)
    acc, fedavg = final_accuracy(tmp_path, "moon"), final_accuracy(tmp_path, "fedavg")
    assert acc > 0.6, acc  # 10 classes: chance is 0.1
    assert acc > fedavg - 0.03, (acc, fedavg)


def test_a_model_without_a_body_is_refused(tmp_path):
    from raysim.scenario.config import ScenarioError

    path = write_scenario(tmp_path, DIGITS.format(rounds=1, name="moon"), "moon.yaml")
    with pytest.raises(ScenarioError):
        config.load(path, ["model.name=linear"])


def test_a_convolutional_body_and_two_clients_in_one_pass():
    def cnn(variant=0):
        torch.manual_seed(5)
        return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))

    from raysim.core.data import ClientData

    g = torch.Generator().manual_seed(0)
    xs = [torch.rand(n, 1, 4, 4, generator=g) for n in (3, 3)]
    ys = [torch.tensor([0, 1, 2]), torch.tensor([2, 2, 1])]
    data = [ClientData(c, x, y, x[:0], y[:0], x, y) for c, (x, y) in enumerate(zip(xs, ys))]
    hp = dict(lr=0.1, batch_size=2, momentum=0.0, weight_decay=0.0, stacking="always")
    moon, fedavg = make("moon", model_fn=cnn, **hp), make("fedavg", model_fn=cnn, **hp)
    assert moon.groups.body == (0, 1)
    glob = moon.init_server(None)
    first = run(moon, *[moon.train(None, Received(glob), d, ctx(c)) for c, d in enumerate(data)])
    plain = run(fedavg, *[fedavg.train(None, Received(glob), d, ctx(c)) for c, d in enumerate(data)])
    for (_, r, _), (_, rf, _) in zip(first, plain):
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(r.values, rf.values))
    again = run(
        moon, *[moon.train(s, Received(glob), d, ctx(c, 1)) for c, ((s, _, _), d) in enumerate(zip(first, data))]
    )
    alone = run(moon, moon.train(first[1][0], Received(glob), data[1], ctx(1, 1)))
    # client 1 trained beside client 0 or alone: the same numbers
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(again[1][1].values, alone[0][1].values))


def test_a_model_that_is_not_a_sequence_gives_the_same_loss_through_its_head_input():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.feat, self.act, self.fc = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(self.act(self.feat(x)))

    torch.manual_seed(0)
    net = Net()
    seq = nn.Sequential(net.feat, net.act, net.fc)
    a, b = make("moon", model_fn=lambda variant=0: net), make("moon", model_fn=lambda variant=0: seq)
    assert not a.moon.body_only and b.moon.body_only
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(2, *p.shape, generator=g) for p in net.parameters()]  # K = 2 jobs
    glob = [torch.randn(2, *p.shape, generator=g) for p in net.parameters()]
    prev = [torch.randn(2, *p.shape, generator=g) for p in net.parameters()]
    batch = Batch(
        torch.randn(2, 4, 2, generator=g),
        torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]]),
        torch.full((2, 4), 0.25),
        torch.ones(2, 4),
    )
    la, _ = a.moon.loss(
        None, params, batch, {"glob": a.moon.const_params(glob), "prev": a.moon.const_params(prev)}, None
    )
    lb, _ = b.moon.loss(
        None, params, batch, {"glob": b.moon.const_params(glob), "prev": b.moon.const_params(prev)}, None
    )
    assert torch.allclose(la, lb, atol=1e-6)
