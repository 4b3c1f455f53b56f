"""Per-FedAvg: the meta step on quadratics by hand (FO through the loop, HF's Hessian-vector
product by autograd and by finite differences), the local update at α as its evaluation, and its
personalized accuracy above its global model's on a pathological digits split."""

import torch
from torch import nn

import raysim.algorithms as algorithms
from raysim.algorithms.base import Received
from raysim.algorithms.perfedavg import ExactHVP, MetaObjective
from raysim.core.data import ClientData
from raysim.core.loop import Batch, Trainer
from raysim.core.tasks import TASKS
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from raysim.scenario.config import FinetuneCfg
from tests.conftest import write_scenario
from tests.test_algorithms import ctx, run

REG = TASKS["regression"]


def scalar_model(w0=1.0):
    def make(variant=0):
        m = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            m.weight.fill_(w0)
        return m

    return make


def make(model_fn, **hp):
    cls = algorithms.get("perfedavg")
    return cls(cls.Hyper(**{"momentum": 0.0, "weight_decay": 0.0, **hp}), model_fn, rounds=10, task=REG)


def regression_client(xs, ys):
    x = torch.tensor(xs, dtype=torch.float32).reshape(len(xs), -1)
    y = torch.tensor(ys, dtype=torch.float32)
    return ClientData(0, x, y, x[:0], y[:0], x, y)


def test_fo_step_on_a_one_parameter_quadratic_by_hand_through_the_loop():
    # f(w; x, y) = (w·x − y)², w0 = 1, α = 0.1, β = 0.5, B = 1: one step on D = one sample, D′ = the other.
    # D = (1, 3): ∇ = 2·1·(1 − 3) = −4, w̃ = 1.4; D′ = (2, 2): ∇f(w̃) = 2·2·(2.8 − 2) = 3.2, w = 1 − 0.5·3.2 = −0.6.
    # The other order: D = (2, 2): ∇ = 0, w̃ = 1; D′ = (1, 3): ∇ = −4, w = 1 + 2 = 3.
    algo = make(scalar_model(), lr=0.5, alpha=0.1, batch_size=1)
    data = regression_client([1.0, 2.0], [3.0, 2.0])
    first = int(torch.randperm(2, generator=torch.Generator().manual_seed(0))[0])  # ctx(0)'s first draw
    ((_, reply, loss),) = run(algo, algo.train(None, Received(algo.init_server(None)), data, ctx(0)))
    expected = -0.6 if first == 0 else 3.0
    assert torch.allclose(reply.values[0], torch.tensor([[expected]]), atol=1e-6)
    assert reply.weight == 2.0
    assert abs(loss - (4.0 + 0.0) / 2) < 1e-6  # f at w0 on both samples, averaged


def forward(p, x):
    return x @ p[0].transpose(-1, -2)  # (K, B, d) @ (K, d, 1)


def step_gradient(obj, batch, gradients="auto"):
    """The step's gradient at w = (1, −1) of the linear model 2 → 1: the objective's
    ``gradients`` (its data gradients from the loop's Trainer: by hand, or by autograd), or the
    gradient of its loss (HF's exact product)."""
    w = torch.tensor([[[1.0, -1.0]]])
    if obj.by_points():
        grad = Trainer(nn.Linear(2, 1, bias=False), gradients=gradients).point_grad(REG, batch)
        seen, (g,), _ = obj.gradients(grad, [w], batch, {}, None)
        return g[0, 0], seen
    w.requires_grad_()
    loss, seen = obj.loss(forward, [w], batch, {}, None)
    (g,) = torch.autograd.grad(loss.sum(), [w])
    return g[0, 0], seen


def objective(variant, hvp="autograd"):
    if variant == "hf" and hvp == "autograd":
        return ExactHVP(REG, alpha=0.1)
    return MetaObjective(REG, alpha=0.1, variant=variant, delta=1e-2)


def meta_gradient(variant, hvp="autograd", gradients="auto"):
    """The step's gradient on one batch of 3 samples (D, D′, D″ one each)."""
    x = torch.tensor([[[1.0, 0.0], [1.0, 2.0], [0.5, 1.0]]])
    y = torch.tensor([[1.0, 0.0, 2.0]])
    one = torch.ones(1, 3)
    return step_gradient(objective(variant, hvp), Batch(x, y, one / 3, one), gradients)


def by_hand(hf: bool):
    w = torch.tensor([1.0, -1.0])
    x1, x2, x3 = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 2.0]), torch.tensor([0.5, 1.0])
    y1, y2 = 1.0, 0.0
    alpha = 0.1
    g1 = 2 * x1 * (w @ x1 - y1)  # w·x1 = 1: g1 = 0, w̃ = w
    tilde = w - alpha * g1
    v = 2 * x2 * (tilde @ x2 - y2)  # w̃·x2 = −1: v = (−2, −4)
    if not hf:
        return v
    hv = 2 * x3 * (x3 @ v)  # ∇²f = 2·x3·x3ᵀ: x3·v = −5, Hv = (−5, −10)
    return v - alpha * hv  # (−1.5, −3)


def test_fo_meta_gradient_splits_a_batch_into_d_and_d_prime():
    # 4 rows, 2 parts: D = rows 0, 1 and D′ = rows 2, 3 (part ⌊rank·2/4⌋), each a mean over its rows.
    # w = (1, −1), α = 0.1. D: residuals w·x − y = 1 − 0 = 1 and −1 − 1 = −2, so
    # ∇f(w; D) = (2·1·(1, 0) + 2·(−2)·(1, 2)) / 2 = (−1, −4), w̃ = (1.1, −0.6).
    # D′: w̃·(0, 1) − 1 = −1.6 and w̃·(2, 1) − 0 = 1.6, so
    # ∇f(w̃; D′) = (2·(−1.6)·(0, 1) + 2·1.6·(2, 1)) / 2 = (3.2, 0).
    x = torch.tensor([[[1.0, 0.0], [1.0, 2.0], [0.0, 1.0], [2.0, 1.0]]])
    y = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    one = torch.ones(1, 4)
    for gradients in ("auto", "autograd"):  # the data gradients by hand, and by autograd
        g, seen = step_gradient(objective("fo"), Batch(x, y, one / 4, one), gradients)
        assert torch.allclose(g, torch.tensor([3.2, 0.0]), atol=1e-5), g
        assert torch.allclose(seen, torch.tensor([1.0 + 4.0 + 4.0 + 1.0]))  # f(w) summed over the batch


def test_hf_hessian_vector_product_on_a_quadratic_is_exact():
    for hvp in ("autograd", "difference"):  # a quadratic's central difference is exact too
        for gradients in ("auto", "autograd"):
            g, _ = meta_gradient("hf", hvp, gradients)
            assert torch.allclose(g, by_hand(True), atol=1e-4), (hvp, g, by_hand(True))
    assert torch.allclose(by_hand(True), torch.tensor([-1.5, -3.0]))


def test_hf_step_through_the_loop_draws_three_samples_per_step():
    # B = 1: the loop's batch is 3 rows, D, D′, D″ in the epoch's order (ctx(0)'s first draw)
    x = [[1.0, 0.0], [1.0, 2.0], [0.5, 1.0]]
    y = [1.0, 0.0, 2.0]

    def model(variant=0):
        m = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.tensor([[1.0, -1.0]]))
        return m

    for hvp in ("autograd", "difference"):
        algo = make(model, lr=0.5, alpha=0.1, batch_size=1, variant="hf", hvp=hvp, delta=1e-2)
        order = torch.randperm(3, generator=torch.Generator().manual_seed(0)).tolist()
        ((_, reply, _),) = run(
            algo, algo.train(None, Received(algo.init_server(None)), regression_client(x, y), ctx(0))
        )
        w = torch.tensor([1.0, -1.0])
        (x1, y1), (x2, y2), (x3, _) = [(torch.tensor(x[i]), y[i]) for i in order]
        tilde = w - 0.1 * 2 * x1 * (w @ x1 - y1)
        v = 2 * x2 * (tilde @ x2 - y2)
        want = w - 0.5 * (v - 0.1 * 2 * x3 * (x3 @ v))
        assert torch.allclose(reply.values[0][0], want, atol=1e-4), (hvp, reply.values[0], want)


def test_local_update_defaults_to_one_epoch_at_alpha():
    algo = make(scalar_model(), lr=0.001, alpha=0.03, batch_size=4)
    algo.finetune = FinetuneCfg()
    s = algo.finetune_settings(ctx(0))
    assert (s.lr, s.epochs, s.batch_size) == (0.03, 1, 4)
    algo.finetune = FinetuneCfg(lr=0.2, epochs=2)
    s = algo.finetune_settings(ctx(0))
    assert (s.lr, s.epochs) == (0.2, 2)
    assert algo.personalized_is_global and algo.has_global_model()


SCENARIO = """
name: perfedavg-shards
seed: 0
rounds: 8
data:
  dataset: digits
  clients: 20
  partition: {kind: shards, classes_per_client: 2}
model: {name: mlp, hidden: [32]}
algorithm: {name: perfedavg, lr: 0.05, alpha: 0.05, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 8}
"""


def test_personalized_accuracy_after_the_local_step_beats_the_global_model(tmp_path):
    # 20 clients of two classes, 8 rounds of half of them. Measured (seeds 0, 1, 2): after the local
    # step 0.733, 0.806, 0.753; the global model 0.153, 0.156, 0.331
    sc = config.load(write_scenario(tmp_path, SCENARIO))
    d = serial_driver(sc, 1)
    for _ in range(sc.rounds):
        d.step()
    final = d.history[-1]
    assert final["accuracy"] == final["lu_accuracy"]
    assert final["accuracy"] > final["global_accuracy"] + 0.3, (final["accuracy"], final["global_accuracy"])
    assert final["accuracy"] > 0.5  # chance: 0.1
