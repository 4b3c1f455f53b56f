"""SuPerFed (MM, LM), APFL and pFedMe: hand-checked pieces on tiny inputs, the reductions to
FedAvg, and end to end on a pathological split of real digits."""

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from raysim.algorithms.base import Received, interpolate
from raysim.algorithms.superfed import SuPerFedObjective, SuPerFedState, add_cos2_grad, cos2, prox
from raysim.core import forward as fwd
from raysim.core.data import ClientData
from raysim.core.loop import Batch, Trainer
from raysim.core.tasks import TASKS
from raysim.data.partition import ShardsParams, shards
from raysim.engine.serial import serial_driver
from raysim.models import TwoNNParams, twocnn
from raysim.scenario import config
from tests.conftest import write_scenario
from tests.test_algorithms import ctx, make, run
from tests.test_runs import summary_of

CE = TASKS["classification"]

DIGITS = """
name: digits-superfed
seed: 0
rounds: {rounds}
data:
  dataset: digits
  clients: 20
  partition: {{kind: shards, classes_per_client: 2, assign: strided}}
  splits: {{train: 0.7, val: 0.1, test: 0.2}}
model: {{name: mlp, hidden: [32], bias: false, init: xavier_normal}}
algorithm: {algorithm}
sampling: {{count: 5}}
eval: {{every: {rounds}}}
resources: {{hosts: 2, cpus_per_host: 0.5}}
"""

SGD = "lr: 0.05, batch_size: 10, local_epochs: 2, momentum: 0.9, weight_decay: 0.0001, lr_schedule: exponential"


def mlp(seed=0, bias=False):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3, bias=bias), nn.ReLU(), nn.Linear(3, 2, bias=bias))


def client(cid=0, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return ClientData(cid, x, y, x[:4], y[:4], x, y)


def final_global(tmp_path, algorithm: str, rounds=4, hosts=1):
    path = write_scenario(tmp_path, DIGITS.format(rounds=rounds, algorithm=algorithm), f"{abs(hash(algorithm))}.yaml")
    driver = serial_driver(config.load(path), hosts)
    for _ in range(rounds):
        driver.step()
    return driver


# -- reductions -------------------------------------------------------------------------------------
def same(a, b, gradients):
    """Bit for bit with autograd on both sides; by hand, FedAvg's gradient is fused into its
    optimizer step (one product-accumulate) while an ``Objective.gradients`` method's is
    stepped after: equal up to float32 rounding."""
    if gradients == "autograd":
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return all(torch.allclose(x, y, rtol=0, atol=1e-6) for x, y in zip(a, b))


@pytest.mark.parametrize("gradients", ["autograd", "auto"])
def test_superfed_without_nu_mu_and_mixing_gives_exactly_the_fedavg_weights(tmp_path, gradients):
    fedavg = final_global(tmp_path, "{name: fedavg, gradients: " + gradients + ", " + SGD + "}").server_state
    superfed = final_global(
        tmp_path, "{name: superfed-mm, nu: 0, mu: 0, start: 1.0, gradients: " + gradients + ", " + SGD + "}"
    ).server_state
    assert len(fedavg) == len(superfed) == 2
    assert same(fedavg, superfed, gradients)
    # and mixing does change them (the test can fail)
    mixed = final_global(tmp_path, "{name: superfed-mm, nu: 0, mu: 0, start: 0.0, " + SGD + "}").server_state
    assert not torch.equal(fedavg[0], mixed[0])


@pytest.mark.parametrize("gradients", ["autograd", "auto"])
def test_superfed_phase_one_is_exactly_fedprox_at_twice_mu(tmp_path, gradients):
    # the paper's prox μ‖w − w^g‖² is FedProx's (μ'/2)‖w − w^g‖² at μ' = 2μ: the same objective
    fedprox = final_global(tmp_path, "{name: fedprox, mu: 0.2, gradients: " + gradients + ", " + SGD + "}").server_state
    superfed = final_global(
        tmp_path, "{name: superfed-mm, mu: 0.1, start: 1.0, gradients: " + gradients + ", " + SGD + "}"
    ).server_state
    assert all(torch.equal(a, b) for a, b in zip(fedprox, superfed))
    # the official code's unsquared prox is another objective
    other = final_global(
        tmp_path,
        "{name: superfed-mm, mu: 0.1, start: 1.0, prox_form: unsquared_sum, gradients: " + gradients + ", " + SGD + "}",
    ).server_state
    assert not torch.equal(fedprox[0], other[0])


@pytest.mark.parametrize("gradients", ["autograd", "auto"])
def test_apfl_global_model_is_exactly_fedavgs(tmp_path, gradients):
    fedavg = final_global(tmp_path, "{name: fedavg, gradients: " + gradients + ", " + SGD + "}").server_state
    apfl = final_global(tmp_path, "{name: apfl, gradients: " + gradients + ", " + SGD + "}").server_state
    assert same(fedavg, apfl, gradients)


# -- SuPerFed's pieces ------------------------------------------------------------------------------
def test_interpolation_endpoints_are_exact():
    a = [torch.randn(3, 4), torch.randn(2)]
    b = [torch.randn(3, 4), torch.randn(2)]
    assert all(torch.equal(x, y) for x, y in zip(interpolate(a, b, 0.0), a))
    assert all(torch.equal(x, y) for x, y in zip(interpolate(a, b, 1.0), b))
    assert torch.allclose(interpolate(a, b, 0.25)[1], 0.75 * a[1] + 0.25 * b[1])
    # stacked sets, one t per set
    sa, sb = torch.zeros(2, 3), torch.ones(2, 3)
    assert interpolate([sa], [sb], torch.tensor([0.2, 0.7]))[0][:, 0].tolist() == pytest.approx([0.2, 0.7])


def test_lambda_zero_evaluates_the_global_model_and_one_the_local_model():
    algo = make("superfed-mm", model_fn=lambda v=0: mlp(v), lr=0.1, batch_size=4)
    glob = algo.init_server(np.random.default_rng(0))
    local = [p + torch.randn_like(p) for p in glob]
    d = client(3, n=40)
    (out,) = run(algo, algo.evaluate(SuPerFedState(local), Received(glob), d, ctx(3)))
    g_out, l_out = algo.outputs([glob, local], d.test_x, torch.device("cpu"))
    assert out["lambda_0_accuracy"] == out["global_accuracy"] == CE.scores(g_out, d.test_y)["accuracy"]
    assert out["global_test_loss"] == CE.scores(g_out, d.test_y)["test_loss"]
    assert out["lambda_1_accuracy"] == out["local_accuracy"] == CE.scores(l_out, d.test_y)["accuracy"]
    # the headline is the test score at the λ chosen on validation; the paper's is the best on test
    assert out["accuracy"] == out[f"lambda_{out['lambda_chosen']:g}_accuracy"]
    grid = [out[f"lambda_{t:g}_accuracy"] for t in np.linspace(0, 1, 11)]
    assert out["accuracy_test_chosen"] == max(grid)


def test_lambda_is_chosen_on_the_validation_split():
    # global model right on validation, local model wrong there; on test the reverse
    algo = make("superfed-mm", model_fn=lambda v=0: nn.Linear(1, 2, bias=False))
    glob = [torch.tensor([[-1.0], [1.0]])]  # x > 0 -> class 1
    local = [torch.tensor([[1.0], [-1.0]])]  # x > 0 -> class 0
    x = torch.tensor([[1.0], [2.0]])
    d = ClientData(0, x, torch.tensor([1, 1]), x, torch.tensor([1, 1]), x, torch.tensor([0, 0]))
    (out,) = run(algo, algo.evaluate(SuPerFedState(local), Received(glob), d, ctx(0)))
    assert out["lambda_chosen"] == 0.0 and out["accuracy"] == 0.0  # honest: validation picks λ = 0
    assert out["accuracy_test_chosen"] == 1.0  # the oracle picks λ = 1


def test_cos2_is_zero_for_orthogonal_and_one_for_parallel_weights_and_its_gradient_is_exact():
    a = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0]])]
    b = [torch.tensor([[0.0, 3.0]]), torch.tensor([[0.0]])]
    assert cos2(a, b).tolist() == [0.0]
    c = [torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0]])]
    assert cos2(a, c).tolist() == [1.0]
    assert cos2(a, [-t for t in c]).tolist() == [1.0]
    # over the whole concatenated model, not per tensor: (1·1 + 1·0)² / (2 · 1) = 1/2
    assert cos2(
        [torch.tensor([[1.0]]), torch.tensor([[1.0]])], [torch.tensor([[1.0]]), torch.tensor([[0.0]])]
    ).tolist() == [0.5]
    g = torch.Generator().manual_seed(0)
    x = [
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True),
    ]
    y = [
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True),
        torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True),
    ]
    assert torch.autograd.gradcheck(lambda *t: cos2(list(t[:2]), list(t[2:])), (*x, *y))


def test_prox_forms_by_hand():
    w = [torch.tensor([[3.0]]), torch.tensor([[4.0]])]
    zero = [torch.zeros(1, 1), torch.zeros(1, 1)]
    assert prox(w, zero, "squared").tolist() == [25.0]  # ‖(3, 4)‖²
    assert prox(w, zero, "unsquared_sum").tolist() == [7.0]  # |3| + |4|, one norm per tensor
    assert prox([torch.tensor([[3.0, 4.0]])], [torch.zeros(1, 2)], "unsquared_sum").tolist() == [5.0]


def superfed_batch(seed=0):
    model = mlp(seed, bias=True)
    f = [p.detach().unsqueeze(0) for p in model.parameters()]
    l = [p.detach().unsqueeze(0) for p in mlp(seed + 1, bias=True).parameters()]
    x = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(seed))
    y = (x[..., 0] > 0).long()
    return model, f, l, Batch(x, y, torch.full((1, 6), 1 / 6), torch.ones(1, 6)), {"anchor": [t + 0.1 for t in f]}


def test_layer_mixing_with_equal_lambdas_is_model_mixing():
    model, f, l, batch, consts = superfed_batch()
    n = 4
    mm = SuPerFedObjective(CE, 0.01, 1.0, "squared", [0] * n)
    lm = SuPerFedObjective(CE, 0.01, 1.0, "squared", [0, 0, 1, 1])  # a module's weight and bias share λ
    assert lm.draws(torch.Generator().manual_seed(0), 5).shape == (5, 2)
    grad = Trainer(model).point_grad(CE, batch)

    def grads(obj, lam):
        return obj.gradients(grad, f + l, batch, consts, lam)[1]

    g_mm = grads(mm, torch.tensor([[0.3]]))
    g_lm = grads(lm, torch.tensor([[0.3, 0.3]]))
    assert all(torch.equal(a, b) for a, b in zip(g_mm, g_lm))
    g_lm2 = grads(lm, torch.tensor([[0.3, 0.8]]))
    assert not torch.equal(g_mm[0], g_lm2[0])


@pytest.mark.parametrize("form", ["squared", "unsquared_sum"])
@pytest.mark.parametrize("gradients", ["auto", "autograd"])
def test_superfed_gradients_are_autograds_of_the_papers_loss(form, gradients):
    # CE(W(λ)) + μ·prox(w^f, w^g) + ν·cos²(w^f, w^l), λ one per module, differentiated by
    # autograd against Objective.gradients (the data gradient by hand for this chain, or by
    # autograd; prox and cos² in closed form)
    model, f, l, batch, consts = superfed_batch(3)
    obj = SuPerFedObjective(CE, 0.3, 2.0, form, [0, 0, 1, 1])
    lam = torch.tensor([[0.25, 0.6]])
    seen, got, assign = obj.gradients(
        Trainer(model, gradients=gradients).point_grad(CE, batch), f + l, batch, consts, lam
    )
    ps = [t.clone().requires_grad_() for t in f + l]
    w = interpolate(ps[:4], ps[4:], [lam[:, m] for m in (0, 0, 1, 1)])
    per = CE.per_sample(fwd.make_forward(model)(w, batch.x), batch.y)
    loss = (per * batch.weight).sum(1) + 0.3 * prox(ps[:4], consts["anchor"], form) + 2.0 * cos2(ps[:4], ps[4:])
    want = torch.autograd.grad(loss.sum(), ps)
    assert assign == {} and torch.allclose(seen, per.detach().sum(1))
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    # phase I: CE + μ·prox alone
    phase1 = SuPerFedObjective(CE, 0.3, 2.0, form, None)
    _, got1, _ = phase1.gradients(Trainer(model, gradients=gradients).point_grad(CE, batch), f, batch, consts, None)
    ps = [t.clone().requires_grad_() for t in f]
    per = CE.per_sample(fwd.make_forward(model)(ps, batch.x), batch.y)
    want1 = torch.autograd.grad(((per * batch.weight).sum(1) + 0.3 * prox(ps, consts["anchor"], form)).sum(), ps)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got1, want1))


def test_cos2_gradient_by_hand_on_two_numbers_and_against_autograd():
    # a = (1, 0), b = (1, 1): D = 1, A = 1, B = 2, cos² = 1/2;
    # ∂/∂a = (2D/AB)(b − (D/A) a) = 1·((1, 1) − (1, 0)) = (0, 1); ∂/∂b = 1·((1, 0) − ½(1, 1)) = (½, −½)
    a, b = [torch.tensor([[1.0, 0.0]])], [torch.tensor([[1.0, 1.0]])]
    ga, gb = [torch.zeros(1, 2)], [torch.zeros(1, 2)]
    add_cos2_grad(a, b, ga, gb, 1.0)
    assert ga[0].tolist() == [[0.0, 1.0]] and gb[0].tolist() == [[0.5, -0.5]]
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(3, 4, 2, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)]
    y = [torch.randn(3, 4, 2, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)]
    ga, gb = [torch.zeros_like(t) for t in x], [torch.zeros_like(t) for t in y]
    add_cos2_grad(x, y, ga, gb, 1.5)
    xs, ys = [t.clone().requires_grad_() for t in x], [t.clone().requires_grad_() for t in y]
    want = torch.autograd.grad((1.5 * cos2(xs, ys)).sum(), xs + ys)
    assert all(torch.allclose(u, v) for u, v in zip(ga + gb, want))


def test_layer_mixing_draws_one_lambda_per_module():
    algo = make("superfed-lm", model_fn=lambda v=0: mlp(v, bias=True))
    assert algo.phase2.modules == [0, 0, 1, 1]
    assert make("superfed-mm", model_fn=lambda v=0: mlp(v, bias=True)).phase2.modules == [0, 0, 0, 0]


def test_no_local_tensor_reaches_the_server_and_unsampled_clients_keep_theirs():
    algo = make("superfed-mm", model_fn=lambda v=0: mlp(v), batch_size=4, start=0.0)
    glob = algo.init_server(np.random.default_rng(0))
    d = client(5)
    ((state, reply, _),) = run(algo, algo.train(None, Received(glob), d, ctx(5, round_=0)))
    n = len(glob)
    assert len(reply.values) == n and len(state.local) == n
    initial_local = algo._local(None, 5, glob)
    for sent, local, start in zip(reply.values, state.local, initial_local):
        assert sent.shape == local.shape
        assert not torch.equal(sent, local) and sent.data_ptr() != local.data_ptr()
        assert not torch.equal(local, start)  # the local model trained
    # the local init is the client's own, deterministic, and not the global model
    again = algo._local(None, 5, glob)
    assert all(torch.equal(a, b) for a, b in zip(initial_local, again))
    assert not torch.equal(initial_local[0], algo._local(None, 6, glob)[0])
    assert not torch.equal(initial_local[0], glob[0])
    # phase I leaves w^l alone
    late = make("superfed-mm", model_fn=lambda v=0: mlp(v), batch_size=4, start=1.0)
    ((kept, _, _),) = run(late, late.train(state, Received(glob), d, ctx(5, round_=0)))
    assert kept is state


def test_copy_global_takes_the_global_model_at_the_first_update():
    algo = make("superfed-mm", model_fn=lambda v=0: mlp(v), batch_size=4, start=1.0, local_init="copy_global")
    glob = algo.init_server(np.random.default_rng(0))
    ((state, _, _),) = run(algo, algo.train(None, Received(glob), client(1), ctx(1)))
    assert all(torch.equal(a, b) for a, b in zip(state.local, glob))


def test_mixing_starts_after_round_floor_L_times_R():
    algo = make("superfed-mm", model_fn=lambda v=0: mlp(v), start=0.4)  # R = 10
    assert [algo.mixing(r) for r in range(10)] == [False] * 4 + [True] * 6
    assert not any(make("superfed-mm", model_fn=lambda v=0: mlp(v), start=1.0).mixing(r) for r in range(10))


# -- APFL -------------------------------------------------------------------------------------------
def _apfl_by_hand(w, v, alpha, x, y, lr):
    w = [t.clone().requires_grad_() for t in w]
    v = [t.clone().requires_grad_() for t in v]
    a = torch.tensor(alpha, requires_grad=True)
    fw = nn.functional.cross_entropy(x @ w[0].T, y)
    gw = torch.autograd.grad(fw, w)
    vbar = [a * tv + (1 - a) * tw.detach() for tv, tw in zip(v, w)]
    fv = nn.functional.cross_entropy(x @ vbar[0].T, y)
    gv = torch.autograd.grad(fv, v, retain_graph=True)
    # the paper's α step: ⟨v − w, ∇f(v̄)⟩
    gbar = torch.autograd.grad(fv, vbar)
    ga = sum(((tv - tw) * g).sum() for tv, tw, g in zip(v, w, gbar))
    return (
        [t - lr * g for t, g in zip(w, gw)],
        [t - lr * g for t, g in zip(v, gv)],
        float(min(max(alpha - lr * float(ga.detach()), 0.0), 1.0)),
    )


def test_apfl_one_step_by_hand():
    algo = make("apfl", model_fn=lambda v=0: nn.Linear(4, 2, bias=False), lr=0.5, batch_size=12, alpha=0.5)
    glob = [torch.randn(2, 4, generator=torch.Generator().manual_seed(1))]
    v = [torch.randn(2, 4, generator=torch.Generator().manual_seed(2))]
    d = client(0, n=12)
    from raysim.algorithms.apfl import APFLState

    state = APFLState(v, torch.tensor([0.5]))
    ((new, reply, _),) = run(algo, algo.train(state, Received(glob), d, ctx(0)))
    w1, v1, a1 = _apfl_by_hand(glob, v, 0.5, d.train_x, d.train_y, 0.5)
    assert torch.allclose(reply.values[0], w1[0], atol=1e-6)
    assert torch.allclose(new.v[0], v1[0], atol=1e-6)
    assert float(new.alpha) == pytest.approx(a1, abs=1e-6) and a1 != 0.5
    # fixed α stays put
    fixed = make("apfl", model_fn=lambda v=0: nn.Linear(4, 2, bias=False), lr=0.5, batch_size=12, adapt_alpha=False)
    ((kept, _, _),) = run(fixed, fixed.train(state, Received(glob), d, ctx(0)))
    assert float(kept.alpha) == 0.5


def test_apfl_alpha_is_clipped_to_the_unit_interval():
    algo = make("apfl", model_fn=lambda v=0: nn.Linear(4, 2, bias=False), lr=1000.0, batch_size=12)
    glob = [torch.zeros(2, 4)]
    from raysim.algorithms.apfl import APFLState

    v = [torch.randn(2, 4, generator=torch.Generator().manual_seed(3))]
    alphas = set()
    for seed in range(6):
        ((st, _, _),) = run(
            algo, algo.train(APFLState(v, torch.tensor([0.5])), Received(glob), client(0, 12, seed), ctx(0))
        )
        alphas.add(float(st.alpha))
    assert alphas <= {0.0, 1.0} and alphas  # a huge step lands on a bound, never beyond


# -- pFedMe -----------------------------------------------------------------------------------------
def test_pfedme_one_batch_by_hand():
    lam, k, plr, lr = 15.0, 3, 0.02, 0.1
    algo = make(
        "pfedme",
        model_fn=lambda v=0: nn.Linear(4, 2, bias=False),
        lr=lr,
        batch_size=12,
        lam=lam,
        inner_steps=k,
        personal_lr=plr,
    )
    glob = [torch.randn(2, 4, generator=torch.Generator().manual_seed(4))]
    d = client(0, n=12)
    ((state, reply, _),) = run(algo, algo.train(None, Received(glob), d, ctx(0)))
    theta, w_loc = glob[0].clone(), glob[0].clone()
    for _ in range(k):
        t = theta.clone().requires_grad_()
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(d.train_x @ t.T, d.train_y), t)
        theta = theta - plr * (g + lam * (theta - w_loc))
    w_loc = w_loc - lr * lam * (w_loc - theta)
    assert torch.allclose(state.theta[0], theta, atol=1e-6)
    assert torch.allclose(reply.values[0], w_loc, atol=1e-6)


def test_pfedme_server_moves_by_beta():
    algo = make("pfedme", model_fn=lambda v=0: nn.Linear(1, 1, bias=False), beta=0.5)
    from raysim.core.replies import Weighted

    new = algo.aggregate([torch.tensor([[2.0]])], Weighted([torch.tensor([[6.0]])], 1.0), 0)
    assert new[0].item() == 4.0  # (1 − β)·2 + β·6


# -- data and models --------------------------------------------------------------------------------
def test_strided_shards_give_client_i_shards_i_and_i_plus_k():
    labels = np.repeat(np.arange(4), 10)  # 4 classes of 10, 4 clients, 8 shards of 5
    parts = shards(labels, 4, ShardsParams(2, "strided"), np.random.default_rng(0))
    assert [sorted(set(labels[p])) for p in parts] == [[0, 2], [0, 2], [1, 3], [1, 3]]
    assert parts[0].tolist() == [0, 1, 2, 3, 4, 20, 21, 22, 23, 24]
    assert sorted(np.concatenate(parts).tolist()) == list(range(40))


def test_twocnn_is_the_papers_bias_free_net_for_28x28():
    m = twocnn(TwoNNParams(), (1, 28, 28), 10)
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    assert not any(n.endswith("bias") for n, _ in m.named_parameters())
    assert m[7].in_features == 3136


# -- end to end -------------------------------------------------------------------------------------
SWEEP = (
    DIGITS.format(rounds=24, algorithm="{name: superfed-mm, " + SGD + "}")
    + """
sweep:
  superfed-mm: {}
  superfed-lm: {algorithm: {name: superfed-lm, """
    + SGD
    + """}}
  fedavg: {algorithm: {name: fedavg, """
    + SGD
    + """}}
  apfl: {algorithm: {name: apfl, """
    + SGD
    + """}}
  pfedme: {algorithm: {name: pfedme, lr: 0.05, batch_size: 10, local_epochs: 2, personal_lr: 0.05}}
"""
)


def test_superfed_apfl_pfedme_personalize_on_a_pathological_split(tmp_path):
    path = write_scenario(
        tmp_path, SWEEP + f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\ncheckpoint: {{dir: '{tmp_path}/ck'}}\n"
    )
    s = summary_of(tmp_path, path, "--engine", "serial")["variants"]
    fedavg = s["fedavg"]["final"]["accuracy"]
    # measured: FedAvg .86; SuPerFed-MM .95, -LM .94, APFL .99, pFedMe .97
    assert 0.5 < fedavg < 0.9  # one global model for 2-class clients
    for name in ("superfed-mm", "superfed-lm", "apfl", "pfedme"):
        f = s[name]["final"]
        assert f["accuracy"] > fedavg + 0.05, name  # personalized beats global
        assert f["accuracy"] > f["global_accuracy"], name
    mm = s["superfed-mm"]["final"]
    curve = mm["lambda_curve"]
    assert list(curve) == [f"{t:g}" for t in np.linspace(0, 1, 11)]
    assert curve["0"] == mm["global_accuracy"] and curve["1"] == mm["local_accuracy"]
    assert max(curve.values()) > curve["0"] + 0.1  # mixing helps
    assert mm["accuracy_test_chosen"] >= mm["accuracy"]
    # the plot and its table are MLflow artifacts
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = s["superfed-mm"]["mlflow_run_id"]
    arts = {a.path for a in client.list_artifacts(run_id, "curves")}
    assert arts == {"curves/lambda_curve.csv", "curves/lambda_curve.png"}
    png = client.download_artifacts(run_id, "curves/lambda_curve.png", str(tmp_path))
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    import matplotlib.image

    h, w = matplotlib.image.imread(png).shape[:2]
    assert (w, h) == (600, 420)


@pytest.mark.ray
def test_superfed_lm_on_ray_hosts_equals_the_serial_run(tmp_path):
    text = DIGITS.format(rounds=6, algorithm="{name: superfed-lm, start: 0.5, " + SGD + "}").replace(
        "hosts: 2, cpus_per_host: 0.5", "hosts: 3, cpus_per_host: 0.5"
    )
    path = write_scenario(
        tmp_path, text + f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\ncheckpoint: {{dir: '{tmp_path}/ck'}}\n"
    )
    ray_run = summary_of(tmp_path, path, name="ray.json")
    serial = summary_of(tmp_path, path, "--engine", "serial", name="serial.json")
    assert ray_run["final"] == serial["final"]
    assert ray_run["history"][-1]["train_loss"] == serial["history"][-1]["train_loss"]
    assert set(ray_run["final"]["lambda_curve"]) == {f"{t:g}" for t in np.linspace(0, 1, 11)}
