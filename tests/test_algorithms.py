"""Two-client tests with numbers checkable by hand (a 1-feature, 2-class linear model).

With W = 0, b = 0 the softmax is (1/2, 1/2); for a sample x with label y the cross-entropy
gradient w.r.t. the logits is softmax - onehot(y), so one SGD step of size lr on (x=2, y=0) gives
W = lr*[[+1], [-1]], b = lr*[+.5, -.5]; and on (x=1, y=1): W = lr*[[-.5], [+.5]], b = lr*[-.5, +.5].
"""
import math

import numpy as np
import pytest
import torch
from torch import nn

import algorithms
from algorithms.base import ClientData, Context, PerClient, Weighted
from raysim.engine.reduce import Accumulator


def zero_model():
    m = nn.Linear(1, 2)
    with torch.no_grad():
        m.weight.zero_()
        m.bias.zero_()
    return m


def client(cid, xs, ys):
    x = torch.tensor(xs, dtype=torch.float32).reshape(-1, 1)
    y = torch.tensor(ys, dtype=torch.int64)
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


def ctx(cid=0, round_=0):
    return Context(round_, 10, cid, torch.Generator().manual_seed(cid))


def make(name, **hp):
    cls = algorithms.get(name)
    return cls(cls.Hyper(**{"lr": 0.1, "batch_size": 1, **hp}), zero_model, rounds=10)


def params_of(reply):
    return [v.clone() for v in reply.values]


def test_fedavg_one_step_per_client_matches_hand_gradient():
    algo = make("fedavg")
    msg = algo.broadcast(algo.init_server(zero_model(), np.random.default_rng(0)), 0)
    _, r0, loss0 = algo.train(None, msg, client(0, [2.0], [0]), ctx(0))
    W, b = params_of(r0)
    assert torch.allclose(W, torch.tensor([[0.1], [-0.1]]))
    assert torch.allclose(b, torch.tensor([0.05, -0.05]))
    assert r0.weight == 1.0
    assert loss0 == pytest.approx(math.log(2))      # CE at uniform softmax


def test_fedavg_aggregate_two_clients_weighted_by_samples():
    algo = make("fedavg")
    state = algo.init_server(zero_model(), np.random.default_rng(0))
    acc = Accumulator()
    # client 0: one sample (x=2, y=0); client 1: two copies of (x=1, y=1), batch 2 -> one step
    _, r0, _ = algo.train(None, state, client(0, [2.0], [0]), ctx(0))
    acc.add(r0)
    algo2 = make("fedavg", batch_size=2)
    _, r1, _ = algo2.train(None, state, client(1, [1.0, 1.0], [1, 1]), ctx(1))
    acc.add(r1)
    new = algo.aggregate(state, acc.result(), 0)
    # (1 * [.1, -.1] + 2 * [-.05, .05]) / 3 = [0, 0] for W; b: (1*[.05,-.05] + 2*[-.05,.05]) / 3
    assert torch.allclose(new[0], torch.tensor([[0.0], [0.0]]), atol=1e-7)
    assert torch.allclose(new[1], torch.tensor([-0.05 / 3, 0.05 / 3]), atol=1e-7)


def test_fedprox_penalty_pulls_towards_global_on_second_step():
    # two single-sample steps on (x=2, y=0). Step 1 is as FedAvg (w = w_global, zero penalty).
    # Step 2: logits (.25, -.25), softmax p0 = sigmoid(.5); dW0 = (p0 - 1) * 2,
    # FedAvg: W0 = .1 - .1 * dW0; FedProx(mu=1) adds mu * (W0 - 0) = .1 to the gradient.
    p0 = 1 / (1 + math.exp(-0.5))
    dW0 = (p0 - 1) * 2
    plain = make("fedavg", local_epochs=2)
    prox = make("fedprox", local_epochs=2, mu=1.0)
    msg = [torch.zeros(2, 1), torch.zeros(2)]
    data = client(0, [2.0], [0])
    _, ra, _ = plain.train(None, msg, data, ctx())
    _, rb, _ = prox.train(None, msg, data, ctx())
    assert ra.values[0][0, 0].item() == pytest.approx(0.1 - 0.1 * dW0, abs=1e-6)
    assert rb.values[0][0, 0].item() == pytest.approx(0.1 - 0.1 * (dW0 + 0.1), abs=1e-6)


def test_local_keeps_each_clients_model_and_sends_nothing():
    algo = make("local")
    server = algo.init_server(zero_model(), np.random.default_rng(0))
    msg = algo.broadcast(server, 0)
    s0, reply, _ = algo.train(None, msg, client(0, [2.0], [0]), ctx(0))
    assert reply is None
    assert torch.allclose(s0.params[0], torch.tensor([[0.1], [-0.1]]))
    s0b, _, _ = algo.train(s0, msg, client(0, [2.0], [0]), ctx(0, 1))   # continues from its own model
    assert s0b.params[0][0, 0] > 0.1
    assert algo.aggregate(server, None, 0) is server
    assert torch.equal(server[0], torch.zeros(2, 1))


def test_fedavg_plus_tunes_before_evaluating_and_reports_global_accuracy():
    algo = make("fedavg+", lr=1.0)
    data = client(0, [2.0, 2.0], [0, 0])          # at W=0 the prediction is a tie (argmax -> 0)
    data = ClientData(0, data.train_x, data.train_y, data.val_x, data.val_y,
                      torch.tensor([[2.0]]), torch.tensor([1]))
    res = algo.evaluate(None, [torch.zeros(2, 1), torch.zeros(2)], data, ctx())
    assert res.global_correct == 0.0              # untuned ties go to class 0, label is 1
    assert res.correct == 0.0 and res.total == 1  # tuning on label-0 data keeps predicting 0
    data1 = ClientData(0, torch.tensor([[2.0]]), torch.tensor([1]), data.val_x, data.val_y,
                       torch.tensor([[2.0]]), torch.tensor([1]))
    res1 = algo.evaluate(None, [torch.zeros(2, 1), torch.zeros(2)], data1, ctx())
    assert res1.global_correct == 0.0 and res1.correct == 1.0   # one tuning step flips it


def test_accumulator_sum_is_grouping_independent_bitwise():
    g = torch.Generator().manual_seed(0)
    replies = [Weighted([torch.randn(1000, generator=g) * 10 ** float(k % 5 - 2)], float(k + 1))
               for k in range(30)]
    one = Accumulator()
    for r in replies:
        one.add(r)
    groups = [Accumulator() for _ in range(3)]
    for k, r in enumerate(replies):
        groups[k % 3].add(r)
    merged = Accumulator()
    for a in reversed(groups):
        merged.merge(a)
    a, b = one.result(), merged.result()
    assert a.weight == b.weight == sum(range(1, 31))
    assert torch.equal(a.mean()[0], b.mean()[0])


def test_accumulator_per_client_union_and_numbers():
    acc = Accumulator()
    acc.add((PerClient({3: 1.5}), 2.0))
    acc.add((PerClient({1: 0.5}), 3.0))
    per, total = acc.result()
    assert dict(per) == {1: 0.5, 3: 1.5} and total == 5.0


@pytest.mark.parametrize("momentum, wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.0, 1e-2)])
def test_local_sgd_optimizer_matches_torch_sgd_bitwise(momentum, wd):
    from algorithms.local_sgd import SGD
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    b = __import__("copy").deepcopy(a)
    ours = SGD(list(a.parameters()), 0.1, momentum, wd)
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    for _ in range(5):
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
