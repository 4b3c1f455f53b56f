"""The one local-training loop (raysim/core/loop.py): K jobs at once must equal a plain PyTorch
loop per job, on every model of the zoo and on models the stacked forward does not know; a
job's numbers must not depend on the other jobs in the pass."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.core import forward as fwd
from raysim.core.data import ClientData, Context
from raysim.core.loop import Job, Objective, Settings, Supervised, Trainer, draw_orders, drive, gather, make_job
from raysim.core.optim import Stacked
from raysim.core.tasks import TASKS
from raysim.models import CNNParams, LinearParams, MLPParams, femnist_cnn, linear, mlp

CE = Supervised(TASKS["classification"])
ZOO = {
    "linear": (lambda: linear(LinearParams(), (5,), 3), (5,)),
    "linear_image": (lambda: linear(LinearParams(), (1, 4, 4), 3), (1, 4, 4)),
    "mlp": (lambda: mlp(MLPParams((7, 6)), (1, 4, 4), 3), (1, 4, 4)),
    "femnist_cnn": (lambda: femnist_cnn(CNNParams(), (1, 28, 28), 62), (1, 28, 28)),
    "layernorm_mlp": (
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(5, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 3)),
        (5,),
    ),
}


def reference(model, x, y, orders, s: Settings, weights=None, mu=0.0):
    """The plain loop: torch.optim.SGD, batches in the given orders, mean_i w_i l_i per batch,
    plus (mu/2)||w - w_start||^2."""
    model = copy.deepcopy(model)
    anchor = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
    for order in orders:
        for i in range(0, len(order), s.batch_size):
            idx = order[i : i + s.batch_size]
            per = F.cross_entropy(model(x[idx]), y[idx], reduction="none")
            loss = (per * (1 if weights is None else weights[idx])).mean()
            if mu:
                loss = loss + 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach() for p in model.parameters()]


def jobs_for(models, x, y, s, weights=None, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [
        Job(
            fwd.params_of(m),
            x,
            y,
            draw_orders(g, len(y), s.epochs),
            s,
            CE,
            None if weights is None else weights[k],
            cid=0,
        )
        for k, m in enumerate(models)
    ]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_k_jobs_equal_the_plain_loop_one_job_at_a_time(name):
    build, shape = ZOO[name]
    torch.manual_seed(0)
    models = [build() for _ in range(3)]
    n = 21
    x, y = torch.randn(n, *shape), torch.randint(0, 3, (n,))
    q = torch.softmax(torch.randn(3, n), dim=0)
    s = Settings(lr=0.05, epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    trainer = Trainer(build(), "always")
    jobs = jobs_for(models, x, y, s, q)
    out = trainer.fit(jobs)
    for k, model in enumerate(models):
        expect = reference(model, x, y, jobs[k].orders, s, q[k])
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out[k].params, expect)), (name, k)
        assert not torch.equal(out[k].params[0], jobs[k].params[0])  # it did train
    one = Trainer(build(), "never").fit(jobs)  # K = 1, one after another
    for a, b in zip(out, one):
        assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a.params, b.params))
        assert a.loss == pytest.approx(b.loss, abs=1e-5)


def test_two_jobs_by_hand():
    # two 1-d logistic jobs from zero weights, one sample (x=2, y=0), weights (1) and (0):
    # job 0 steps by lr * grad = 0.1 * (0.5*2, -0.5*2) on W; job 1 (weight 0) does not move.
    start = [torch.zeros(2, 1), torch.zeros(2)]
    x, y = torch.tensor([[2.0]]), torch.tensor([0])
    s = Settings(lr=0.1, batch_size=4)
    orders = torch.zeros(1, 1, dtype=torch.long)
    out = Trainer(nn.Linear(1, 2)).fit(
        [Job(start, x, y, orders, s, CE, torch.tensor([1.0])), Job(start, x, y, orders, s, CE, torch.tensor([0.0]))]
    )
    assert torch.allclose(out[0].params[0], torch.tensor([[0.1], [-0.1]]))
    assert torch.allclose(out[0].params[1], torch.tensor([0.05, -0.05]))
    assert torch.equal(out[1].params[0], torch.zeros(2, 1)) and torch.equal(out[1].params[1], torch.zeros(2))
    assert out[0].loss == pytest.approx(torch.log(torch.tensor(2.0)).item())


def clients(sizes, seed=0, dim=4, classes=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for cid, n in enumerate(sizes):
        x = torch.randn(n, dim, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        out.append(ClientData(cid, x, y, x[:0], y[:0], x, y))
    return out


def ctx_of(d, round_=0):
    return Context(round_, 10, d.cid, torch.Generator().manual_seed(100 + d.cid))


def test_across_clients_a_jobs_numbers_do_not_depend_on_the_others_bitwise():
    model = mlp(MLPParams((6,)), (4,), 3)
    trainer = Trainer(model)
    assert trainer.across
    s = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    datas = clients([5, 17, 40, 30, 0, 12])
    start = fwd.params_of(model)

    def fit(pick):
        return trainer.fit([make_job(start, datas[i], ctx_of(datas[i]), s, CE) for i in pick])

    everyone = fit(range(6))
    for pick in ([1], [0, 3], [2, 4, 5]):
        for i, f in zip(pick, fit(pick)):
            assert all(torch.equal(u, v) for u, v in zip(f.params, everyone[i].params)) and f.loss == everyone[i].loss
    assert all(torch.equal(u, v) for u, v in zip(everyone[4].params, start)) and everyone[4].loss == 0.0


def test_prox_and_weights_across_clients_equal_the_reference():
    model = mlp(MLPParams((6,)), (4,), 3)
    s = Settings(lr=0.1, epochs=1, batch_size=8, momentum=0.9)
    datas = clients([5, 17, 30])
    start = fwd.params_of(model)
    jobs = [make_job(start, d, ctx_of(d), s, CE, consts={"anchor": start, "mu": 0.5}) for d in datas]
    for d, j, f in zip(datas, jobs, Trainer(model).fit(jobs)):
        expect = reference(model, d.train_x, d.train_y, j.orders, s, mu=0.5)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(f.params, expect))


@pytest.mark.parametrize("momentum, wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.0, 1e-2)])
def test_sgd_matches_torch_sgd_bitwise(momentum, wd):
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    b = copy.deepcopy(a)
    P = [p.detach().unsqueeze(0).clone() for p in a.parameters()]
    ours = Stacked("sgd", 0.1, momentum, wd, (0.9, 0.999), 1e-8, P, [None])
    ref = torch.optim.SGD(b.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    for _ in range(5):  # the same gradients into both: the update arithmetic alone
        with torch.no_grad():
            for p, q in zip(a.parameters(), P):
                p.copy_(q[0])
        grads = torch.autograd.grad(F.cross_entropy(a(x), y), list(a.parameters()))
        ours.step(P, [g.unsqueeze(0) for g in grads], 0, 1)
        ref.zero_grad()
        F.cross_entropy(b(x), y).backward()
        ref.step()
    for p, q in zip(P, b.parameters()):
        assert torch.equal(p[0], q)


def test_adam_matches_torch_adam_and_continues_from_kept_state():
    torch.manual_seed(0)
    a = nn.Linear(5, 3)
    b = copy.deepcopy(a)
    ref = torch.optim.Adam(b.parameters(), lr=0.01, weight_decay=1e-3)
    s = Settings(lr=0.01, epochs=1, batch_size=4, optimizer="adam", weight_decay=1e-3)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    orders = torch.arange(8).unsqueeze(0)
    state, params = None, fwd.params_of(a)
    for _ in range(3):  # three rounds of 2 steps, the state kept in between
        (f,) = Trainer(a).fit([Job(params, x, y, orders, s, CE, opt_state=state, keep_state=True)])
        params, state = f.params, f.opt_state
        for i in range(0, 8, 4):
            ref.zero_grad()
            F.cross_entropy(b(x[i : i + 4]), y[i : i + 4]).backward()
            ref.step()
    assert float(state["step"]) == 6.0
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(params, b.parameters()))


def test_lr_schedules_by_hand():
    from raysim.algorithms.base import LocalTraining

    step = LocalTraining(lr=1.0, lr_schedule="step")
    assert [step.lr_at(r, 8) for r in (0, 3, 4, 5, 6, 7)] == [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    exp = LocalTraining(lr=1.0, lr_schedule="exponential", lr_decay=0.5)
    assert [exp.lr_at(r, 8) for r in (0, 1, 3)] == [1.0, 0.5, 0.125]


class ScaledByDraw(Objective):
    """A test objective: the loss of step t is scaled by a per-step draw u ~ U(1, 2)."""

    def draws(self, generator, steps):
        return 1 + torch.rand(steps, generator=generator)

    def loss(self, forward, params, batch, consts, draws):
        per = CE.task.per_sample(forward(params, batch.x), batch.y)
        return (per * batch.weight).sum(1) * draws, (per.detach() * batch.valid).sum(1)


def test_per_step_draws_come_from_the_clients_generator_and_do_not_depend_on_others():
    model = linear(LinearParams(), (4,), 3)
    trainer = Trainer(model)
    s = Settings(lr=0.1, batch_size=4)
    datas = clients([9, 5, 13])
    start = fwd.params_of(model)
    obj = ScaledByDraw()
    jobs = [make_job(start, d, ctx_of(d), s, obj) for d in datas]
    assert jobs[0].draws.shape == (3,) and bool(((jobs[0].draws >= 1) & (jobs[0].draws < 2)).all())
    together = trainer.fit(jobs)
    alone = trainer.fit([make_job(start, datas[2], ctx_of(datas[2]), s, obj)])
    assert all(torch.equal(u, v) for u, v in zip(together[2].params, alone[0].params))
    # by hand: one step of job 1 (5 samples -> batches of 4 and 1) with the draw scaling the loss
    j = jobs[1]
    w = [p.clone().requires_grad_(True) for p in start]
    for t, i in enumerate(range(0, 5, 4)):
        idx = j.orders[0, i : i + 4]
        loss = F.cross_entropy(F.linear(datas[1].train_x[idx], w[0], w[1]), datas[1].train_y[idx]) * j.draws[t]
        g = torch.autograd.grad(loss, w)
        w = [(p - 0.1 * gi).detach().requires_grad_(True) for p, gi in zip(w, g)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(together[1].params, w))


def test_drive_batches_every_clients_jobs_and_supports_several_phases():
    calls = []

    def fit(jobs):
        calls.append(len(jobs))
        return [f"trained {j}" for j in jobs]

    def two_phases(tag):
        a = yield [f"{tag}1", f"{tag}2"]
        b = yield [f"{tag}3"]
        return a + b

    def no_jobs():
        return "plain"
        yield  # unreachable: makes this a generator

    out = drive([two_phases("x"), "value", two_phases("y"), no_jobs()], fit)
    assert out[0] == ["trained x1", "trained x2", "trained x3"] and out[1] == "value" and out[3] == "plain"
    assert calls == [4, 2]  # both clients' phase-1 jobs in one pass, then both phase-2 jobs


CHAINS = {
    "mlp relu": lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)
    ),
    "tanh sigmoid leaky, no bias": lambda: nn.Sequential(
        nn.Linear(5, 6, bias=False),
        nn.Tanh(),
        nn.Linear(6, 4),
        nn.Sigmoid(),
        nn.Linear(4, 5),
        nn.LeakyReLU(0.1),
        nn.Linear(5, 3, bias=False),
    ),
    "linear": lambda: nn.Linear(5, 3),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("consts", ["none", "prox", "linear"])
@pytest.mark.parametrize("momentum, wd", [(0.9, 1e-3), (0.0, 0.0), (0.0, 1e-3)])
def test_chain_gradients_by_hand_equal_autograd(name, consts, momentum, wd):
    """The fast path (chain.py) and autograd train the same: weights, prox and linear terms,
    padded batches (across clients), a frozen first layer; SGD with momentum (products fused
    into the momentum buffers), plain SGD (fused into the weights where nothing else is added)
    and SGD with weight decay (not fused)."""
    torch.manual_seed(1)
    model = CHAINS[name]()
    start = fwd.params_of(model)
    datas = clients([5, 17, 23], dim=5)
    s = Settings(lr=0.1, epochs=2, batch_size=4, momentum=momentum, weight_decay=wd)
    extra = {
        "none": {},
        "prox": {"anchor": [p + 0.3 for p in start], "mu": 0.7},
        "linear": {"linear": [torch.full_like(p, 0.05) for p in start]},
    }[consts]
    for trainable in (None, (False,) + (True,) * (len(start) - 1)):
        obj = Supervised(TASKS["classification"], trainable=trainable)
        fast, slow = Trainer(model, "always"), Trainer(model, "always")
        assert fast.chain is not None
        slow.chain = None
        jobs = [make_job(start, d, ctx_of(d), s, obj, weights=torch.rand(d.num_train), consts=extra) for d in datas]
        for a, b in zip(fast.fit(jobs), slow.fit(jobs)):
            assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(a.params, b.params)), name
            assert a.loss == pytest.approx(b.loss, rel=1e-6)
        if trainable:
            assert torch.equal(a.params[0], start[0])


def test_chain_regression_and_unsupported_models():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    x, y = torch.randn(9, 4), torch.randn(9, 2)
    d = ClientData(0, x, y, x[:0], y[:0], x, y)
    s = Settings(lr=0.05, epochs=3, batch_size=4)
    obj = Supervised(TASKS["regression"])
    fast, slow = Trainer(model), Trainer(model)
    slow.chain = None
    jobs = [make_job(fwd.params_of(model), d, ctx_of(d), s, obj)]
    (a,), (b,) = fast.fit(jobs), slow.fit(jobs)
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(a.params, b.params))
    # batch norm, dropout, convolutions and an activation before any layer stay with autograd
    for other in (
        nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2)),
        nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.1), nn.Linear(6, 2)),
        nn.Sequential(nn.ReLU(), nn.Linear(4, 2)),
        femnist_cnn(CNNParams(), (1, 28, 28), 62),
    ):
        assert Trainer(other).chain is None


@pytest.mark.parametrize("gradients", ["auto", "autograd"])
def test_a_stragglers_partial_work_stops_after_its_share_of_steps(gradients):
    """``ctx.work`` (a straggler with part of the time it needs): the job takes ⌊work·steps⌋
    steps (at least one) of its orders, the first batches of the plain loop, and reports them in
    ``Fitted.steps``; the other jobs of the pass are untouched."""
    import dataclasses

    model = mlp(MLPParams((6,)), (4,), 3)
    trainer = Trainer(model, gradients=gradients)
    s = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9)
    datas = clients([30, 17, 40])  # 2 x 4, 2 x 3, 2 x 5 steps
    start = fwd.params_of(model)
    full = trainer.fit([make_job(start, d, ctx_of(d), s, CE) for d in datas])
    cut = dataclasses.replace(ctx_of(datas[0]), work=0.4)  # 0.4 x 8 steps -> 3
    jobs = [make_job(start, datas[0], cut, s, CE)] + [make_job(start, d, ctx_of(d), s, CE) for d in datas[1:]]
    out = trainer.fit(jobs)
    assert [f.steps for f in out] == [3, 6, 10] and [f.steps for f in full] == [8, 6, 10]
    order = draw_orders(ctx_of(datas[0]).generator, 30, 2).reshape(-1)
    three = [order[i : i + 8] for i in (0, 8, 16)]  # epoch 1's first three batches
    want = reference(model, datas[0].train_x, datas[0].train_y, [torch.cat(three)], s)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(out[0].params, want))
    assert out[0].loss != full[0].loss
    for a, b in zip(out[1:], full[1:]):
        assert all(torch.equal(u, v) for u, v in zip(a.params, b.params)) and a.loss == b.loss
    tiny = dataclasses.replace(ctx_of(datas[1]), work=0.01)  # never below one step
    assert trainer.fit([make_job(start, datas[1], tiny, s, CE)])[0].steps == 1


class AtOnePoint(Supervised):
    """``Supervised``'s loss given as gradients (``Objective.gradients``) at one point, the
    job's parameters: the contract's simplest user."""

    def gradients(self, grad, params, batch, consts, draws):
        seen, g = grad(params)
        g = list(g)
        self.add_terms_grad(params, consts, g)
        return seen, g, {}


@pytest.mark.parametrize("name", ["mlp", "femnist_cnn", "layernorm_mlp"])
def test_an_objective_given_as_gradients_trains_as_its_loss_does(name):
    """Through ``gradients`` (the data gradient by hand for the chain, by autograd for the CNN
    and the layer-norm MLP; the prox term in closed form) jobs end where the plain loop with
    torch.optim ends them."""
    build, shape = ZOO[name]
    torch.manual_seed(0)
    model = build()
    n = 21
    x, y = torch.randn(n, *shape), torch.randint(0, 3, (n,))
    s = Settings(lr=0.05, epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    start = fwd.params_of(model)
    g = torch.Generator().manual_seed(3)
    obj = AtOnePoint(TASKS["classification"])
    assert obj.by_points() and not Supervised.by_points()
    jobs = [
        Job(start, x, y, draw_orders(g, n, s.epochs), s, obj, consts={"anchor": start, "mu": torch.tensor(0.5)}, cid=k)
        for k in range(2)
    ]
    trainer = Trainer(build())
    assert (trainer.chain is not None) == (name == "mlp")
    for j, f in zip(jobs, trainer.fit(jobs)):
        expect = reference(model, x, y, j.orders, s, mu=0.5)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(f.params, expect)), name
        assert not torch.equal(f.params[0], start[0])


def test_an_objective_given_as_gradients_keeps_a_jobs_numbers_independent_of_the_others_bitwise():
    model = mlp(MLPParams((6,)), (4,), 3)
    s = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    datas = clients([5, 17, 40, 30, 12])
    start = fwd.params_of(model)
    obj = AtOnePoint(TASKS["classification"])
    prox = {"anchor": [p + 0.1 for p in start], "mu": 0.3}
    for trainer in (Trainer(model, "always"), Trainer(model, "always", gradients="autograd")):

        def fit(pick):
            jobs = [make_job(start, datas[i], ctx_of(datas[i]), s, obj, consts=prox) for i in pick]
            return trainer.fit(jobs)  # noqa: B023 - called in this pass

        everyone = fit(range(5))
        for pick in ([1], [0, 3], [2, 4]):
            for i, f in zip(pick, fit(pick)):
                assert all(torch.equal(u, v) for u, v in zip(f.params, everyone[i].params))
                assert f.loss == everyone[i].loss


def test_pack_starts_every_client_on_a_64_byte_boundary_with_its_own_values():
    from raysim.core.data import ClientData, pack
    from raysim.core.loop import pool

    sizes = [3, 5, 7]
    shards = [
        ClientData(
            c,
            torch.arange(n * 5, dtype=torch.float32).reshape(n, 5) + 100 * c,
            torch.full((n,), c),
            torch.zeros(0, 5),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, 5),
            torch.zeros(0, dtype=torch.long),
        )
        for c, n in enumerate(sizes)
    ]
    packed = pack(shards)
    for d, p in zip(shards, packed):
        assert p.train_x.data_ptr() % 64 == 0 and torch.equal(p.train_x, d.train_x)
        assert torch.equal(p.train_y, d.train_y)
    # rows of 20 bytes: 16 rows make 320 bytes = 5 x 64, so client 1 starts at row 16, client 2 at 32
    X, Y, starts = pool([p.train_x for p in packed], [p.train_y for p in packed])
    assert starts == [0, 16, 32]
    assert torch.equal(X[16:21], shards[1].train_x) and torch.equal(Y[32:39], shards[2].train_y)


def test_auto_stacks_clients_together_on_the_cpu_and_only_a_clients_own_sets_on_a_gpu():
    """Across clients a stack's width is a host's clients; a GPU picks a batched product's kernel
    by it (and with it the order of the additions), so ``auto`` keeps a GPU's passes to one
    client's sets, whose count does not depend on the hosts. ``padded`` stacks clients in passes
    of a fixed width (``GPU_PASS``) on any device; ``always`` stacks a host's clients in one
    pass; convolutions never stack across clients."""
    mlp_ = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert fwd.stack_across("auto", mlp_, cpu) and fwd.stack_across("auto", mlp_)
    assert not fwd.stack_across("auto", mlp_, gpu) and fwd.stack_within("auto", mlp_)
    assert fwd.stack_across("always", mlp_, gpu) and not fwd.stack_across("never", mlp_, cpu)
    assert fwd.stack_across("padded", mlp_, gpu) and fwd.fixed_width("padded", mlp_) == fwd.GPU_PASS
    assert fwd.fixed_width("auto", mlp_) == fwd.fixed_width("always", mlp_) == fwd.fixed_width("never", mlp_) == 0
    assert not fwd.stack_across("padded", cnn, gpu) and fwd.fixed_width("padded", cnn) == 0
    assert Trainer(mlp_, "padded").fixed == fwd.GPU_PASS and Trainer(mlp_).fixed == 0


class WithDraws(Supervised):
    """The data loss plus a per-step drawn scalar times the first weight's sum: a job's draws
    must stay its own when passes are padded."""

    def draws(self, generator, steps):
        return torch.rand(steps, generator=generator)

    def loss(self, forward, params, batch, consts, draws):
        loss, seen = super().loss(forward, params, batch, consts, draws)
        return loss + draws * params[0].sum(dim=tuple(range(1, params[0].dim()))), seen


@pytest.mark.parametrize("case", ["chain-momentum", "autograd-adam-kept", "points-prox", "draws", "rows", "dp-sgd"])
def test_passes_of_a_fixed_width_give_every_job_the_numbers_of_measured_widths_bitwise(case):
    """``padded``'s fixed-width passes, run on the CPU (where a job's numbers do not depend on
    its pass): 7 jobs of unequal sizes (one empty, one a straggler) in passes of 3, the last padded
    with copies of the last job, jobs whose steps are done computing on and put back. Every
    job's parameters, loss, steps and kept optimizer state equal the measured-width path's."""
    import dataclasses

    from raysim.core.loop import make_rows

    model = mlp(MLPParams((6,)), (4,), 3)
    datas = clients([5, 17, 40, 30, 0, 12, 23], seed=4)
    start = fwd.params_of(model)
    s = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    obj, consts, state = CE, {}, None
    gradients = "auto"
    if case == "autograd-adam-kept":
        s, gradients = Settings(lr=0.01, epochs=2, batch_size=8, optimizer="adam"), "autograd"
        state = Trainer(model).fit([make_job(start, datas[2], ctx_of(datas[2]), s, CE, keep_state=True)])[0].opt_state
    elif case == "points-prox":
        obj, consts = AtOnePoint(TASKS["classification"]), {"anchor": [p + 0.1 for p in start], "mu": 0.3}
    elif case == "draws":
        obj, gradients = WithDraws(TASKS["classification"]), "autograd"
    elif case == "dp-sgd":  # each job's noise from its own seed, padded copies too
        s = dataclasses.replace(s, dp_clip=0.5, dp_noise=1.0)
        consts = {"anchor": [p - 0.1 for p in start], "mu": 0.2}
    measured, fixed = Trainer(model, gradients=gradients), Trainer(model, "padded", gradients=gradients)
    fixed.fixed = 3  # GPU_PASS would pad these 7 jobs to one pass
    if case == "rows":
        x = torch.cat([d.train_x for d in datas])
        y = torch.cat([d.train_y for d in datas])
        ns = [d.num_train for d in datas]
        starts = torch.tensor([0] + ns[:-1]).cumsum(0).tolist()
        stacked = [torch.stack([p + 0.01 * k for k in range(7)]) for p in start]
        rows = make_rows(stacked, x, y, starts, ns, list(range(7)), s, CE, {"anchor": stacked, "mu": 0.2})
        (pa, la), (pb, lb) = measured.fit_rows(rows), fixed.fit_rows(rows)
        assert all(torch.equal(a, b) for a, b in zip(pa, pb)) and la == lb and pa[0].shape[0] == 7
        assert not torch.equal(pa[0][6], stacked[0][6])
        return

    def jobs():
        out = [make_job(start, d, ctx_of(d), s, obj, consts=consts, opt_state=state, keep_state=True) for d in datas]
        straggler = dataclasses.replace(ctx_of(datas[3]), work=0.3)
        out[3] = make_job(start, datas[3], straggler, s, obj, consts=consts, opt_state=state, keep_state=True)
        return out

    a, b = measured.fit(jobs()), fixed.fit(jobs())
    assert [f.steps for f in b] == [f.steps for f in a] and a[3].steps < 8
    for u, v in zip(a, b):
        assert all(torch.equal(p, q) for p, q in zip(u.params, v.params)) and u.loss == v.loss
        assert (u.opt_state is None) == (v.opt_state is None)
        for key in u.opt_state or {}:
            x, z = u.opt_state[key], v.opt_state[key]
            assert all(torch.equal(p, q) for p, q in zip(x, z)) if isinstance(x, list) else torch.equal(x, z)
    assert not torch.equal(a[2].params[0], start[0]) and torch.equal(b[4].params[0], start[0])


def test_pack_keeps_a_client_without_training_rows_first_in_line():
    from raysim.core.data import ClientData, pack

    empty = ClientData(
        0,
        torch.zeros(0, 3),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, 3),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, 3),
        torch.zeros(0, dtype=torch.long),
    )
    full = ClientData(
        1,
        torch.ones(5, 3),
        torch.ones(5, dtype=torch.long),
        torch.zeros(0, 3),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, 3),
        torch.zeros(0, dtype=torch.long),
    )
    a, b = pack([empty, full])
    assert a.train_x.shape == (0, 3) and torch.equal(b.train_x, full.train_x) and b.train_x.data_ptr() % 64 == 0


def test_a_known_best_width_splits_the_jobs_left_into_passes_of_nearly_equal_width():
    """Once the best width w is measured, k jobs go in ceil(k / w) passes of at most w each,
    as equal as they can be: no narrow remainder pass (a pass of one job costs 3 to 4 times a
    wide pass per job-step)."""
    from raysim.core.widths import Widths

    def passes(best: int, jobs: int) -> list[int]:
        w = Widths("auto")
        w.best["kind"] = best
        out, left = [], jobs
        while left:
            out.append(w.pick("kind", left))
            left -= out[-1]
        return out

    assert passes(8, 25) == [7, 6, 6, 6]  # not 8, 8, 8, 1
    assert passes(16, 25) == [13, 12]  # not 16, 9
    assert passes(8, 24) == [8, 8, 8]
    assert passes(8, 5) == [5]
    assert passes(1, 3) == [1, 1, 1]


def _settle(costs: dict[int, float], jobs: int, slow: dict[int, float] | None = None) -> tuple[int, list[int]]:
    """Drive Widths as the loop does, fit after fit of ``jobs`` jobs, each pass taking
    ``costs[width]`` seconds a job-step (10 steps a job), except the first timed pass of each
    width in ``slow``, which takes that long instead (preempted): (the width chosen, the widths
    of the timed passes in order)."""
    from raysim.core.widths import Widths

    w, timed, slowed = Widths("auto"), [], set()
    for _ in range(20):
        left = jobs
        while left:
            width = w.pick("kind", left)
            per = costs.get(width, 1.0)
            if "kind" not in w.best and width == w.plan.get("kind", 1):  # a timed pass
                timed.append(width)
                if width in (slow or {}) and width not in slowed:
                    per = slow[width]
                    slowed.add(width)
            w.record("kind", width, per * 10 * width, 10 * width, jobs)
            left -= width
        if "kind" in w.best:
            return w.best["kind"], timed
    raise AssertionError("no width chosen in 20 fits")


def test_one_preempted_pass_does_not_settle_the_width_on_a_narrower_one():
    """Per job-step, 16 jobs a pass cost 1.3 and 8 cost 1.5; the first pass of 16 is preempted
    and takes 2.0 (more than 1.1 × 1.5). Timed once, 8 would win; 16, the widest, is timed again
    before the choice, each width's cost is its fastest timing, so 16 is chosen (and, being
    the best and the widest with two timings, settles it)."""
    costs = {1: 5.0, 2: 3.0, 4: 2.0, 8: 1.5, 16: 1.3, 32: 1.2}
    best, timed = _settle(costs, 25, slow={16: 2.0})
    assert best == 16
    assert timed == [1, 2, 4, 8, 16, 16]  # the ladder, then 16 again


def test_a_width_that_is_slower_on_both_timings_still_ends_the_ladder():
    """32 jobs a pass cost 1.8 per job-step against 1.5 for 16, on both timings: the ladder stops
    there and keeps 16; 64 is never tried."""
    costs = {1: 5.0, 2: 3.0, 4: 2.0, 8: 1.6, 16: 1.5, 32: 1.8, 64: 1.0}
    best, timed = _settle(costs, 100)
    assert best == 16
    assert timed == [1, 2, 4, 8, 16, 32, 32, 16]


def test_a_wider_pass_that_lost_once_by_preemption_lets_the_ladder_go_on():
    """4 jobs a pass lose their first timing (2.5 against 1.8 for 2); timed again they cost 1.6,
    so the ladder goes on up to 8, the fastest."""
    costs = {1: 3.0, 2: 1.8, 4: 1.6, 8: 1.2, 16: 1.4}
    best, timed = _settle(costs, 40, slow={4: 2.5})
    assert best == 8
    assert timed == [1, 2, 4, 4, 8, 16, 16, 8]


def test_the_chosen_width_is_the_cheapest_as_the_jobs_will_be_split():
    """Measured per job-step: 4 jobs a pass 159, 8 jobs 105, 16 jobs 110. For 25 jobs, 8 means
    passes of 7 and 6: 159 + (log2 7 − 2)·(105 − 159) = 115.4 at 7; 16 means passes of 13 and
    12: 105 + (log2 13 − 3)·(110 − 105) = 108.5 at 13; so 16. For 24 jobs, 8 means passes of
    exactly 8 (105) and 16 passes of 12 (107.9): 8. Equal costs go to the wider."""
    from raysim.core.widths import split_best

    cost = {1: 429.0, 2: 254.0, 4: 159.0, 8: 105.0, 16: 110.0}
    assert split_best(cost, 25) == 16
    assert split_best(cost, 24) == 8
    assert split_best({4: 2.0, 8: 1.0, 16: 1.0}, 32) == 16
    assert split_best({1: 1.0}, 1) == 1


@pytest.mark.parametrize(
    "name,mode,gradients", [("mlp", "always", "auto"), ("mlp", "never", "autograd"), ("femnist_cnn", "auto", "auto")]
)
def test_uint8_pixels_decoded_per_batch_train_and_score_as_their_floats_do_bitwise(name, mode, gradients):
    """Clients holding an image source's uint8 pixels (the loop decodes each gathered batch)
    get the numbers of clients holding the decoded floats: by-hand chain and autograd steps,
    stacked or one job at a time, and evaluation."""
    from raysim.core.data import Pixels

    build, shape = ZOO[name]
    pixels = Pixels((0.2860,), (0.3530,))
    g = torch.Generator().manual_seed(1)
    raw = [torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g) for n in (9, 20, 14)]
    ys = [torch.randint(0, 3, (len(x),), generator=g) for x in raw]
    held = [ClientData(c, x, y, x[:0], y[:0], x, y) for c, (x, y) in enumerate(zip(raw, ys))]
    floats = [ClientData(c, pixels(x), y, pixels(x[:0]), y[:0], pixels(x), y) for c, (x, y) in enumerate(zip(raw, ys))]
    assert floats[0].train_x.dtype == torch.float32 and held[0].train_x.dtype == torch.uint8
    torch.manual_seed(0)
    model = build()
    s = Settings(lr=0.05, epochs=2, batch_size=4, momentum=0.9)
    start = fwd.params_of(model)
    a = Trainer(model, mode, gradients=gradients, decode=pixels)
    b = Trainer(model, mode, gradients=gradients)
    got = a.fit([make_job(start, d, ctx_of(d), s, CE) for d in held])
    want = b.fit([make_job(start, d, ctx_of(d), s, CE) for d in floats])
    for u, v in zip(got, want):
        assert all(torch.equal(p, q) for p, q in zip(u.params, v.params)) and u.loss == v.loss
        assert not torch.equal(u.params[0], start[0])  # it did train
    sets = [u.params for u in got]
    assert torch.equal(a.outputs(sets, held[1].test_x), b.outputs(sets, floats[1].test_x))


def test_gather_picks_the_same_rows_as_advanced_indexing_for_any_shape_of_row_numbers():
    t = torch.arange(10, dtype=torch.float32).view(5, 2)  # row r is [2r, 2r + 1]
    rows = torch.tensor([[4, 0, 2], [1, 1, 3]])[:, :2]  # a non-contiguous (2, 2) slice
    got = gather(t, rows)
    assert got.shape == (2, 2, 2)
    assert got.tolist() == [[[8.0, 9.0], [0.0, 1.0]], [[2.0, 3.0], [2.0, 3.0]]]
    assert torch.equal(got, t[rows])
    y = torch.tensor([7, 8, 9, 10, 11])
    assert gather(y, rows).tolist() == [[11, 7], [8, 8]]
