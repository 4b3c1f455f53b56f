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

import raysim.algorithms as algorithms
from raysim.algorithms.base import Received
from raysim.core.data import ClientData, Context
from raysim.core.loop import drive
from raysim.core.replies import Accumulator, ByKey, PerClient, Weighted
from raysim.core.tasks import TASKS

CPU = torch.device("cpu")


def zero_model():
    m = nn.Linear(1, 2)
    with torch.no_grad():
        m.weight.zero_()
        m.bias.zero_()
    return m


def client(cid, xs, ys, test=None):
    x = torch.tensor(xs, dtype=torch.float32).reshape(-1, 1)
    y = torch.tensor(ys, dtype=torch.int64)
    tx, ty = (
        (x, y)
        if test is None
        else (torch.tensor(test[0], dtype=torch.float32).reshape(-1, 1), torch.tensor(test[1], dtype=torch.int64))
    )
    return ClientData(cid, x, y, x[:0], y[:0], tx, ty)


def ctx(cid=0, round_=0, group=0):
    return Context(round_, 10, cid, torch.Generator().manual_seed(cid), CPU, group)


def make(name, task="classification", model_fn=None, **hp):
    cls = algorithms.get(name)
    return cls(
        cls.Hyper(**{"lr": 0.1, "batch_size": 1, **hp}),
        model_fn or (lambda variant=0: zero_model()),
        rounds=10,
        task=TASKS[task],
    )


def run(algo, *steps):
    """Drive client steps (generators yielding jobs) through the algorithm's trainer."""
    return drive(list(steps), algo.trainer(CPU).fit)


def zeros():
    return [torch.zeros(2, 1), torch.zeros(2)]


def test_fedavg_one_step_per_client_matches_hand_gradient():
    algo = make("fedavg")
    msg = algo.message(algo.init_server(np.random.default_rng(0)), 0)
    ((_, r0, loss0),) = run(algo, algo.train(None, Received(msg.shared), client(0, [2.0], [0]), ctx(0)))
    W, b = r0.values
    assert torch.allclose(W, torch.tensor([[0.1], [-0.1]]))
    assert torch.allclose(b, torch.tensor([0.05, -0.05]))
    assert r0.weight == 1.0
    assert loss0 == pytest.approx(math.log(2))  # CE at uniform softmax


def test_fedavg_aggregate_two_clients_weighted_by_samples():
    algo = make("fedavg")
    state = algo.init_server(np.random.default_rng(0))
    # client 0: one sample (x=2, y=0); client 1: two copies of (x=1, y=1), batch 2 -> one step
    ((_, r0, _),) = run(algo, algo.train(None, Received(state), client(0, [2.0], [0]), ctx(0)))
    algo2 = make("fedavg", batch_size=2)
    ((_, r1, _),) = run(algo2, algo2.train(None, Received(state), client(1, [1.0, 1.0], [1, 1]), ctx(1)))
    acc = Accumulator()
    acc.add(r0)
    acc.add(r1)
    new = algo.aggregate(state, acc.result(), 0)
    # (1 * [.1, -.1] + 2 * [-.05, .05]) / 3 = [0, 0] for W; b: (1*[.05,-.05] + 2*[-.05,.05]) / 3
    assert torch.allclose(new[0], torch.tensor([[0.0], [0.0]]), atol=1e-7)
    assert torch.allclose(new[1], torch.tensor([-0.05 / 3, 0.05 / 3]), atol=1e-7)


def test_two_clients_in_one_pass_equal_each_alone():
    # the one loop trains both clients' jobs together; each gets exactly what it gets alone
    algo = make("fedavg")
    a, b = client(0, [2.0], [0]), client(1, [1.0], [1])
    both = run(algo, algo.train(None, Received(zeros()), a, ctx(0)), algo.train(None, Received(zeros()), b, ctx(1)))
    alone = run(algo, algo.train(None, Received(zeros()), b, ctx(1)))
    assert torch.allclose(both[1][1].values[0], torch.tensor([[-0.05], [0.05]]))
    assert all(torch.equal(u, v) for u, v in zip(both[1][1].values, alone[0][1].values))


def test_fedprox_penalty_pulls_towards_global_on_second_step():
    # two single-sample steps on (x=2, y=0). Step 1 is as FedAvg (w = w_global, zero penalty).
    # Step 2: logits (.25, -.25), softmax p0 = sigmoid(.5); dW0 = (p0 - 1) * 2,
    # FedAvg: W0 = .1 - .1 * dW0; FedProx(mu=1) adds mu * (W0 - 0) = .1 to the gradient.
    p0 = 1 / (1 + math.exp(-0.5))
    dW0 = (p0 - 1) * 2
    plain = make("fedavg", local_epochs=2)
    prox = make("fedprox", local_epochs=2, mu=1.0)
    data = client(0, [2.0], [0])
    ((_, ra, _),) = run(plain, plain.train(None, Received(zeros()), data, ctx()))
    ((_, rb, _),) = run(prox, prox.train(None, Received(zeros()), data, ctx()))
    assert ra.values[0][0, 0].item() == pytest.approx(0.1 - 0.1 * dW0, abs=1e-6)
    assert rb.values[0][0, 0].item() == pytest.approx(0.1 - 0.1 * (dW0 + 0.1), abs=1e-6)


def test_local_keeps_each_clients_model_and_sends_nothing():
    algo = make("local")
    server = algo.init_server(np.random.default_rng(0))
    msg = Received(algo.message(server, 0).shared)
    ((s0, reply, _),) = run(algo, algo.train(None, msg, client(0, [2.0], [0]), ctx(0)))
    assert reply is None
    assert torch.allclose(s0.params[0], torch.tensor([[0.1], [-0.1]]))
    ((s0b, _, _),) = run(algo, algo.train(s0, msg, client(0, [2.0], [0]), ctx(0, 1)))  # continues from its own model
    assert s0b.params[0][0, 0] > 0.1
    assert algo.aggregate(server, None, 0) is server
    assert torch.equal(server[0], torch.zeros(2, 1))


def test_local_unseen_client_trains_on_its_own_split_before_it_is_scored():
    # an unseen Local client starts from the common initialization and trains unseen_epochs
    # epochs on its train split: one step on (x=2, y=0) gives W = (0.1, -0.1), so x=2 -> class 0
    algo = make("local", unseen_epochs=1)
    data = client(0, [2.0], [0], test=([2.0], [0]))
    (state,) = run(algo, algo.personalize(Received(zeros()), data, ctx()))
    assert torch.allclose(state.params[0], torch.tensor([[0.1], [-0.1]]))
    (scores,) = run(algo, algo.evaluate(state, Received(zeros()), data, ctx()))
    assert scores["accuracy"] == 1.0
    default, ten = make("local"), make("local", unseen_epochs=10)  # default: rounds x local_epochs
    (s_default,) = run(default, default.personalize(Received(zeros()), data, ctx()))
    (s10,) = run(ten, ten.personalize(Received(zeros()), data, ctx()))
    assert torch.equal(s_default.params[0], s10.params[0]) and s10.params[0][0, 0] > 0.4


def test_fedavg_plus_tunes_before_evaluating_and_reports_global_accuracy():
    algo = make("fedavg+", lr=1.0)
    data = client(0, [2.0, 2.0], [0, 0], test=([2.0], [1]))  # at W=0 the prediction is a tie (argmax -> 0)
    (res,) = run(algo, algo.evaluation(None, Received(zeros()), data, ctx()))
    assert res["global_accuracy"] == 0.0  # untuned ties go to class 0, label is 1
    assert res["accuracy"] == 0.0  # tuning on label-0 data keeps predicting 0
    data1 = client(0, [2.0], [1], test=([2.0], [1]))
    (res1,) = run(algo, algo.evaluation(None, Received(zeros()), data1, ctx()))
    assert res1["global_accuracy"] == 0.0 and res1["accuracy"] == 1.0  # one tuning step flips it


def test_regression_task_mse_by_hand():
    # a 1-d linear regression y = 2x from w = 0: the gradient of (w x - y)^2 at x=1, y=2 is
    # 2 (w x - y) x = -4, so one step of lr 0.1 gives w = 0.4 and the loss before it is 4
    def model_fn(variant=0):
        m = nn.Linear(1, 1, bias=False)
        nn.init.zeros_(m.weight)
        return m

    algo = make("fedavg", task="regression", model_fn=model_fn)
    x = torch.tensor([[1.0]])
    data = ClientData(
        0, x, torch.tensor([2.0]), x[:0], torch.zeros(0), torch.tensor([[1.0], [3.0]]), torch.tensor([2.0, 6.0])
    )
    ((_, reply, loss),) = run(algo, algo.train(None, Received([torch.zeros(1, 1)]), data, ctx()))
    assert reply.values[0].item() == pytest.approx(0.4) and loss == pytest.approx(4.0)
    (res,) = run(algo, algo.evaluate(None, Received(reply.values), data, ctx()))
    # predictions 0.4 and 1.2 against 2 and 6: ((1.6)^2 + (4.8)^2) / 2 = 12.8
    assert res["mse"] == pytest.approx(12.8) and res["global_mse"] == pytest.approx(12.8)


def test_accumulator_sum_is_grouping_independent_bitwise():
    g = torch.Generator().manual_seed(0)
    replies = [Weighted([torch.randn(1000, generator=g) * 10 ** float(k % 5 - 2)], float(k + 1)) for k in range(30)]
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


def test_accumulator_by_key_sums_equal_keys_across_hosts():
    # client A trains cluster 0, B cluster 1, C cluster 0 (n = 1, 2, 3): per-key weighted sums
    a = ByKey({0: Weighted([torch.tensor([1.0])], 1.0)})
    b = ByKey({1: Weighted([torch.tensor([5.0])], 2.0)})
    c = ByKey({0: Weighted([torch.tensor([2.0])], 3.0)})
    h1, h2 = Accumulator(), Accumulator()
    h1.add(a), h2.add(b), h2.add(c)
    total = Accumulator()
    total.merge(h1), total.merge(h2)
    out = total.result()
    assert sorted(out) == [0, 1]
    assert out[0].weight == 4.0 and out[0].mean()[0].item() == pytest.approx((1 + 6) / 4)
    assert out[1].mean()[0].item() == pytest.approx(5.0)
