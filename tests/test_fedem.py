"""FedEM on tiny inputs: E-step, pi update, weighted loss, mixture prediction, unseen clients."""
import math

import pytest
import torch

import algorithms
from algorithms.base import ClientData
from algorithms.fedem import e_step, mixture_log_prob
from algorithms.local_sgd import local_sgd
from tests.test_algorithms import client, ctx, zero_model


def fedem(**hp):
    cls = algorithms.get("fedem")
    base = dict(lr=0.1, batch_size=8, momentum=0.0, weight_decay=0.0, lr_schedule="constant", components=2)
    return cls(cls.Hyper(**{**base, **hp}), lambda variant=0: zero_model(), rounds=10)


def test_e_step_by_hand():
    # pi = (1/2, 1/2); sample 0 has losses (1, 2), sample 1 has (2, 1)
    q = e_step(torch.log(torch.tensor([0.5, 0.5])), torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    a = math.exp(-1) / (math.exp(-1) + math.exp(-2))                  # 0.7311
    assert torch.allclose(q, torch.tensor([[a, 1 - a], [1 - a, a]]), atol=1e-6)
    assert torch.allclose(q.mean(dim=1), torch.tensor([0.5, 0.5]))    # the pi update
    # a prior tilts it: pi = (0.9, 0.1), equal losses -> q = pi for every sample
    q = e_step(torch.log(torch.tensor([0.9, 0.1])), torch.ones(2, 3))
    assert torch.allclose(q, torch.tensor([[0.9] * 3, [0.1] * 3]))


def test_weighted_loss_zero_weight_sample_contributes_nothing():
    # batch of 2: (x=2, y=0) weight 1 and (x=1, y=1) weight 0. The batch loss is mean_i w_i l_i,
    # so the gradient is half of sample 0's: W = 0.1 * 0.5 * [[1], [-1]] after one step.
    m = zero_model()
    data = client(0, [2.0, 1.0], [0, 1])
    hp = algorithms.get("fedem").Hyper(lr=0.1, batch_size=2, momentum=0.0, weight_decay=0.0,
                                       lr_schedule="constant")
    local_sgd(m, data.train_x, data.train_y, hp, ctx(), sample_weight=torch.tensor([1.0, 0.0]))
    assert torch.allclose(m.weight, torch.tensor([[0.05], [-0.05]]))
    assert torch.allclose(m.bias, torch.tensor([0.025, -0.025]))


def test_mixture_prediction_by_hand():
    # component 0 is sure of class 0, component 1 of class 1 -> p = pi
    logits = torch.tensor([[[50.0, 0.0]], [[0.0, 50.0]]])
    p = mixture_log_prob(torch.tensor([0.25, 0.75]), logits).exp()
    assert torch.allclose(p, torch.tensor([[0.25, 0.75]]), atol=1e-6)


def fixed_components():
    """Component 0 always predicts class 0 (bias +3), component 1 class 1."""
    return [[torch.zeros(2, 1), torch.tensor([3.0, 0.0])], [torch.zeros(2, 1), torch.tensor([0.0, 3.0])]]


def test_train_updates_pi_towards_the_component_that_explains_the_data():
    algo = fedem()
    data = client(0, [1.0, 2.0, 3.0, 4.0], [1, 1, 1, 1])
    state, replies, nll = algo.train(algo.init_client(0, None), fixed_components(), data, ctx())
    # per-sample losses: comp 0: log(1 + e^3) = 3.0486, comp 1: log(1 + e^-3) = 0.0486
    l0, l1 = math.log(1 + math.e ** 3), math.log(1 + math.e ** -3)
    q1 = 1 / (1 + math.exp(l1 - l0))
    assert state.pi[1].item() == pytest.approx(q1, abs=1e-6)
    assert nll == pytest.approx(-math.log(0.5 * math.exp(-l0) + 0.5 * math.exp(-l1)), abs=1e-6)
    assert len(replies) == 2 and all(r.weight == 4.0 for r in replies)


def test_server_averages_each_component_by_samples():
    algo = fedem()
    from algorithms.base import Weighted
    from raysim.engine.reduce import Accumulator
    acc = Accumulator()
    acc.add([Weighted([torch.tensor([1.0])], 1.0), Weighted([torch.tensor([10.0])], 1.0)])
    acc.add([Weighted([torch.tensor([4.0])], 3.0), Weighted([torch.tensor([20.0])], 3.0)])
    new = algo.aggregate([[torch.zeros(1)], [torch.zeros(1)]], acc.result(), 0)
    assert new[0][0].item() == pytest.approx((1 + 12) / 4) and new[1][0].item() == pytest.approx((10 + 60) / 4)


def test_unseen_client_personalizes_pi_from_uniform_with_components_frozen():
    algo = fedem(unseen_em_steps=5)
    data = ClientData(0, torch.tensor([[1.0], [2.0]]), torch.tensor([0, 0]), torch.zeros(0, 1),
                      torch.zeros(0, dtype=torch.long), torch.tensor([[1.0]]), torch.tensor([0]))
    msg = fixed_components()
    one = fedem(unseen_em_steps=1).personalize(msg, data, ctx())
    five = algo.personalize(msg, data, ctx())
    assert 0.5 < one.pi[0] < five.pi[0] < 1.0              # more EM steps: closer to component 0
    res = algo.evaluate(five, msg, data, ctx())
    assert res.correct == 1.0 and res.extras["pi_entropy"] < math.log(2)
    assert torch.equal(msg[0][1], torch.tensor([3.0, 0.0]))   # the components were not touched


MIXTURE = """
name: mixture
seed: 0
rounds: 60
data:
  dataset: synthetic        # two linear labelling rules; most clients follow mainly one
  clients: 40
  dim: 10
  components: 2
  alpha: 0.1
  min_samples: 30
  max_samples: 60
  noise: 0.0
model: {name: linear}
algorithm: {name: fedem, components: 2, lr: 0.3, batch_size: 16, momentum: 0.0, weight_decay: 0.0,
            lr_schedule: constant}
sampling: {fraction: 1.0}
eval: {every: 60}
resources: {hosts: 2}
"""


def final_accuracy(tmp_path, algorithm):
    from raysim import config
    from raysim.engine.serial import serial_driver
    from tests.conftest import write_scenario
    text = MIXTURE if algorithm == "fedem" else MIXTURE.replace("name: fedem, components: 2,", f"name: {algorithm},")
    d = serial_driver(config.load(write_scenario(tmp_path, text, f"{algorithm}.yaml")))
    for _ in range(60):
        d.step()
    return d.history[-1]["accuracy"]


def test_fedem_beats_fedavg_and_local_on_a_mixture(tmp_path):
    em, avg, local = (final_accuracy(tmp_path, a) for a in ("fedem", "fedavg", "local"))
    assert em > avg + 0.05 and em > local + 0.02, (em, avg, local)
    assert em > 0.85


@pytest.mark.parametrize("stack", ["always", "never"])
def test_keep_momentum_carries_the_buffer_to_the_next_round_by_hand(stack):
    # M = 1, one sample (x=2, y=0), zero weights: the gradient is dW = (-1, 1), db = (-0.5, 0.5).
    # Round 1: buf = g, W = -lr*g = (0.1, -0.1). Round 2 from zero weights again: with the
    # buffer kept, buf = 0.9*g + g and W = (0.19, -0.19); with a fresh buffer W = (0.1, -0.1).
    data = client(0, [2.0], [0])
    zeros = [[torch.zeros(2, 1), torch.zeros(2)]]
    for keep, expect in ((True, 0.19), (False, 0.1)):
        algo = fedem(components=1, momentum=0.9, batch_size=4, keep_momentum=keep, stack_components=stack)
        state, replies, _ = algo.train(algo.init_client(0, None), zeros, data, ctx())
        assert replies[0].values[0][:, 0].tolist() == pytest.approx([0.1, -0.1])
        assert (state.momentum is not None) == keep
        state, replies, _ = algo.train(state, zeros, data, ctx(round_=1))
        assert replies[0].values[0][:, 0].tolist() == pytest.approx([expect, -expect])


def test_keep_momentum_many_clients_at_once_equal_one_at_a_time():
    from tests.test_stacked import ctxs_for, fedem_algo, fedem_clients
    algo, comps = fedem_algo("mlp", keep_momentum=True)
    datas = fedem_clients([5, 17, 0, 30])
    one = [algo.init_client(d.cid, None) for d in datas]
    many = list(one)
    for r in range(2):
        res_many = algo.train_many(many, comps, datas, ctxs_for(datas, r))
        res_one = [algo.train(s, comps, d, c) for s, d, c in zip(one, datas, ctxs_for(datas, r))]
        many, one = [s for s, _, _ in res_many], [s for s, _, _ in res_one]
        for (s1, r1, _), (s2, r2, _) in zip(res_many, res_one):
            for a, b in zip(r1, r2):
                assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a.values, b.values))
            if s2.momentum is not None:
                for b1, b2 in zip(s1.momentum, s2.momentum):
                    assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(b1, b2))
    assert many[2].momentum is None and many[0].momentum is not None      # the empty client never trained
