"""Sample-level differential privacy (``privacy.level: sample``, DP-SGD in every local step):
per-sample clipping against autograd sample by sample, the noise's scale and independence, the
accountant against dp_accounting's own composition, a private run that learns and is the same
on any number of hosts, and the scenarios it refuses."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raysim.core import forward as fwd
from raysim.core.data import ClientData, Context
from raysim.core.loop import Settings, Supervised, Trainer, make_job
from raysim.core.tasks import TASKS
from raysim.experiment.runner import run as run_scenario
from raysim.federation import privacy
from raysim.models import LinearParams, MLPParams, linear, mlp
from raysim.scenario import config
from tests.conftest import ROOT, TINY, write_scenario
from tests.test_bad_inputs import run_refused

CE = Supervised(TASKS["classification"])


@pytest.mark.parametrize("frozen_first", [False, True])
def test_each_samples_gradient_is_clipped_to_c_as_autograd_sample_by_sample_gives_it(frozen_first):
    """The chain's per-sample norms (‖δ‖²‖a‖² per weight, ‖δ‖² per bias) against autograd on
    each sample alone: the clipped sum, and how many samples the bound cut; a padding row
    (validity 0) adds nothing. With the first layer frozen, its weights count in no norm."""
    torch.manual_seed(1)
    model = mlp(MLPParams((6,)), (4,), 3)
    start = fwd.params_of(model)
    x, y = torch.randn(2, 8, 4), torch.randint(0, 3, (2, 8))
    valid = torch.ones(2, 8)
    valid[1, 7] = 0.0
    mask = (not frozen_first, not frozen_first, True, True)
    clip = 0.4
    data_sum, sums, clipped = Trainer(model).chain.private_step(
        CE.task, [torch.stack([p, p + 0.1]) for p in start], x, y, valid, clip, mask
    )
    for k in range(2):
        want = [torch.zeros_like(p) for p, m in zip(start, mask) if m]
        count, loss = 0, 0.0
        for r in range(8 if k == 0 else 7):
            ps = [(p + 0.1 * k).requires_grad_(m) for p, m in zip(start, mask)]
            out = torch.func.functional_call(
                model, dict(zip([n for n, _ in model.named_parameters()], ps)), x[k, r : r + 1]
            )
            sample = F.cross_entropy(out, y[k, r : r + 1])
            g = torch.autograd.grad(sample, [p for p, m in zip(ps, mask) if m])
            norm = float(torch.sqrt(sum((t * t).sum() for t in g)))
            count += norm > clip
            loss += float(sample.detach())
            for w, t in zip(want, g):
                w += t * min(1.0, clip / norm)
        assert all(torch.allclose(s[k], w, atol=1e-6) for s, w in zip(sums, want))
        assert int(clipped[k]) == count and 0 < count
        assert float(data_sum[k]) == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("mask", [(True,) * 4, (False, False, True, True)])
def test_torch_funcs_per_sample_gradients_clip_as_the_chains_norms_do(mask):
    """Models that are not chains take each sample's gradient from torch.func (vmap of grad):
    on an MLP, which both paths take, the same clipped sums, losses and counts."""
    torch.manual_seed(2)
    model = mlp(MLPParams((6,)), (4,), 3)
    P = [torch.stack([p, p - 0.2]) for p in fwd.params_of(model)]
    x, y = torch.randn(2, 8, 4), torch.randint(0, 3, (2, 8))
    valid = torch.ones(2, 8)
    valid[0, 6:] = 0.0
    trainer = Trainer(model)
    a = trainer.chain.private_step(CE.task, P, x, y, valid, 0.3, mask)
    b = trainer._private_step(CE.task, P, x, y, valid, 0.3, mask)
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.equal(a[2], b[2]) and int(a[2].sum()) > 0
    assert len(a[1]) == len(b[1]) == sum(mask) and all(torch.allclose(u, w, atol=1e-6) for u, w in zip(a[1], b[1]))


def test_dp_sgd_on_a_cnn_without_noise_and_with_a_bound_no_sample_reaches_is_sgd():
    from torch import nn

    torch.manual_seed(3)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    start = fwd.params_of(cnn)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    data = ClientData(0, x, y, x[:0], y[:0], x, y)
    plain = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9)
    trainer = Trainer(cnn)
    assert trainer.chain is None
    a = trainer.fit([make_job(start, data, ctx(0), plain, CE)])[0]
    b = trainer.fit([make_job(start, data, ctx(0), dataclasses.replace(plain, dp_clip=1e6), CE)])[0]
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(a.params, b.params)) and b.loss == pytest.approx(a.loss)
    c = trainer.fit([make_job(start, data, ctx(0), dataclasses.replace(plain, dp_clip=0.01), CE)])[0]
    moved = sum(float((u - s).norm() ** 2) for u, s in zip(c.params, start)) ** 0.5
    assert (
        0 < moved <= 4 * 0.1 * 0.01 * (1 + 0.9 + 0.9**2 + 0.9**3) + 1e-6
    )  # 4 steps of at most lr·C each, with momentum


def client(n, seed=0, dim=4):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, dim, generator=g), torch.randint(0, 3, (n,), generator=g)
    return ClientData(seed, x, y, x[:0], y[:0], x, y)


def ctx(cid):
    return Context(0, 1, cid, torch.Generator().manual_seed(100 + cid))


def test_without_noise_and_with_a_bound_no_sample_reaches_dp_sgd_is_sgd():
    """z = 0 and C above every sample's norm: the sum of the samples' gradients over B, which on
    full batches is the mean loss's gradient, the plain loop's step (momentum, weight decay)."""
    model = mlp(MLPParams((6,)), (4,), 3)
    start = fwd.params_of(model)
    plain = Settings(lr=0.1, epochs=2, batch_size=8, momentum=0.9, weight_decay=1e-3)
    loose = dataclasses.replace(plain, dp_clip=1e6, dp_noise=0.0)
    trainer = Trainer(model)
    a = trainer.fit([make_job(start, client(24), ctx(0), plain, CE)])[0]
    b = trainer.fit([make_job(start, client(24), ctx(0), loose, CE)])[0]
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(a.params, b.params)) and a.steps == b.steps == 6
    assert b.loss == pytest.approx(a.loss, rel=1e-6)


def test_the_noise_has_std_z_c_over_b_each_coordinate_and_is_the_jobs_own():
    """One step (n = B) from the same start, with and without noise: their difference is
    −lr·z·C·N(0, 1)/B per coordinate. A job's noise comes from its own seed, drawn from its
    client's generator: the same job gives the same numbers alone or beside others."""
    model = linear(LinearParams(), (50,), 40)  # 2 040 coordinates
    start = fwd.params_of(model)
    lr, z, c, b = 0.5, 2.0, 0.3, 16
    quiet = Settings(lr=lr, epochs=1, batch_size=b, dp_clip=c, dp_noise=0.0)
    noisy = dataclasses.replace(quiet, dp_noise=z)
    trainer = Trainer(model)
    data = client(b, dim=50)
    base = trainer.fit([make_job(start, data, ctx(0), quiet, CE)])[0]
    alone = trainer.fit([make_job(start, data, ctx(0), noisy, CE)])[0]
    diff = torch.cat([(u - v).reshape(-1) for u, v in zip(alone.params, base.params)]) / -lr
    assert abs(float(diff.mean())) < 0.01 and float(diff.std()) == pytest.approx(z * c / b, rel=0.05)
    others = [make_job(start, client(n, seed=s, dim=50), ctx(s), noisy, CE) for s, n in ((1, 40), (2, 7))]
    together = trainer.fit(others[:1] + [make_job(start, data, ctx(0), noisy, CE)] + others[1:])[1]
    assert all(torch.equal(u, v) for u, v in zip(together.params, alone.params))
    other_seed = trainer.fit([make_job(start, data, ctx(9), noisy, CE)])[0]
    assert not torch.equal(other_seed.params[0], alone.params[0])


@pytest.mark.parametrize(
    "sizes,rounds,epochs,batch,z", [([20, 50, 50, 300, 40], [30, 3, 30, 12, 0], 1, 10, 1.0), ([64], [5], 2, 64, 0.8)]
)
def test_sample_epsilon_is_the_worst_clients_composition_of_its_poisson_sampled_steps(sizes, rounds, epochs, batch, z):
    """Client k of n_k samples, in r_k rounds: r_k·epochs·⌈n_k/B⌉ steps at q = B/n_k, composed by
    dp_accounting itself; the largest ε over clients (one that never trained spends nothing)."""
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    delta = 1e-5
    worst = 0.0
    for n, r in zip(sizes, rounds):
        if r == 0:
            continue
        acc = rdp.RdpAccountant()  # built here from dp_accounting, not raysim's step_event
        step = dpa.PoissonSampledDpEvent(min(1.0, batch / n), dpa.GaussianDpEvent(z))
        acc.compose(dpa.SelfComposedDpEvent(step, r * epochs * -(-n // batch)))
        worst = max(worst, acc.get_epsilon(delta))
    got = privacy.sample_epsilon(np.array(rounds), np.array(sizes), epochs, batch, z, delta)
    assert got == pytest.approx(worst, rel=1e-12) and got > 0
    each = privacy.client_epsilons(np.array(rounds), np.array(sizes), epochs, batch, z, delta)
    assert len(each) == len(sizes) and each.max() == got and all((e == 0) == (r == 0) for e, r in zip(each, rounds))
    assert privacy.sample_epsilon(np.array(rounds), np.array(sizes), epochs, batch, 0.0, delta) == float("inf")
    assert privacy.sample_epsilon(np.zeros(len(sizes)), np.array(sizes), epochs, batch, z, delta) == 0.0


DIGITS = ROOT / "scenarios" / "quickstart.yaml"


def test_dp_sgd_fedavg_learns_digits_logs_the_worst_clients_epsilon_and_noise_costs_accuracy(tmp_path):
    def run(*overrides):
        sc = config.load(
            DIGITS,
            [
                "rounds=30",
                "eval.every=10",
                f"tracking.uri=sqlite:///{tmp_path}/m.db",
                f"checkpoint.dir={tmp_path}/ck",
                "checkpoint.every=0",
                "privacy.level=sample",
                *overrides,
            ],
        )
        return sc, run_scenario(sc, engine="serial", progress=False)

    _, clipped = run("privacy.clip=3.0", "privacy.noise_multiplier=0")
    sc, private = run("privacy.clip=3.0", "privacy.noise_multiplier=3.0")
    _, drowned = run("privacy.clip=3.0", "privacy.noise_multiplier=30")
    acc = {n: s["final"]["accuracy"] for n, s in (("clip", clipped), ("dp", private), ("drowned", drowned))}
    # 10 classes: chance is 0.1 (here, seed 0: 0.82 clipped only, 0.70 at z = 3)
    assert (
        acc["clip"] > 0.75 and acc["dp"] > 0.6 and acc["dp"] < acc["clip"] - 0.05 and acc["drowned"] < acc["dp"] - 0.2
    )
    from raysim.data.base import Splits, split_sizes
    from raysim.scenario.config import make_source

    source = make_source(sc)
    sizes = np.array([split_sizes(source.num_samples(c), Splits(0.8, 0.0, 0.2))[0] for c in range(50)])
    # each client's rounds: those the sampler drew it in (25 of 50 a round)
    from raysim.engine.driver import sample_clients, split_unseen

    train_ids, _ = split_unseen(sc)
    counts, want = np.zeros(50, dtype=np.int64), []
    for h in private["history"]:
        counts[sample_clients(sc, train_ids, h["round"] - 1)] += 1
        want.append(privacy.sample_epsilon(counts, sizes, 2, 16, 3.0, float(sizes.max()) ** -1.1))
    assert [h["dp_epsilon"] for h in private["history"]] == pytest.approx(want, rel=1e-12)
    median = np.median(privacy.client_epsilons(counts, sizes, 2, 16, 3.0, float(sizes.max()) ** -1.1))
    assert private["history"][-1]["dp_epsilon_median"] == pytest.approx(median, rel=1e-12) and median < want[-1]
    everyone = privacy.sample_epsilon(np.full(50, 30), sizes, 2, 16, 3.0, float(sizes.max()) ** -1.1)
    assert want[-1] < everyone  # a client sampled in half the rounds spends less
    assert "dp_epsilon" not in clipped["history"][-1] and "dp_clipped" not in private["history"][-1]


def test_a_dp_sgd_run_is_the_same_on_one_host_or_three(tmp_path):
    from tests.test_privacy import one_host_and_three

    out = one_host_and_three(tmp_path, "{level: sample, clip: 0.5, noise_multiplier: 1.1}")
    eps = [h["dp_epsilon"] for h in out[1]["history"]]
    assert eps == [h["dp_epsilon"] for h in out[3]["history"]] and eps[-1] > 0


@pytest.mark.parametrize(
    "extra,key,says",
    [
        ("algorithm: {name: apfl, lr: 0.1}", "algorithm.name", "fedavg, fedprox, fedavg+, ditto"),
        ("algorithm: {name: scaffold, lr: 0.1}", "algorithm.name", "beyond DP-SGD's steps"),
        ("topology: {kind: ring}", "privacy.level", "leave the topology out"),
        ("privacy_extra: {target_quantile: 0.5}", "privacy.target_quantile", "level client"),
        ("privacy_extra: {accounting: sampled}", "privacy.accounting", "poisson"),
        ("systems: {aggregation: fedbuff, buffer: 2}", "privacy.level", "systems.aggregation: sync"),
    ],
)
def test_sample_level_privacy_is_refused_where_its_guarantee_would_not_hold(tmp_path, capsys, extra, key, says):
    text = TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}\n", "")
    if "topology" in extra:
        text = text.replace("sampling: {fraction: 0.5}\n", "")
    if not extra.startswith("algorithm"):
        text += "algorithm: {name: fedavg, lr: 0.1}\n"
    options = "level: sample, clip: 1.0"
    if extra.startswith("privacy_extra"):
        options += ", " + extra.split("{", 1)[1].rstrip("}")
        extra = ""
    path = write_scenario(tmp_path, text + extra + f"\nprivacy: {{{options}}}\n")
    line = run_refused(capsys, tmp_path, path)
    assert f": {key}: " in line and says in line, line


def test_a_dp_sgd_run_crashed_after_round_two_resumes_to_the_uninterrupted_runs_numbers(tmp_path):
    """The noise seeds come from the clients' generators and the rounds each client trained in
    are in the checkpoint: ε and the metrics go on as if never interrupted."""
    from tests.test_runs import raysim, summary_of, tracked

    path = tracked(
        tmp_path,
        TINY.replace("rounds: 3", "rounds: 5") + "privacy: {level: sample, clip: 0.5, noise_multiplier: 1.3}\n",
    )
    full = summary_of(tmp_path, path, "--engine", "serial", name="full.json")
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1 and "injected failure after round 2" in proc.stderr
    failed = proc.stderr.split("--resume ")[-1].split()[0]
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", failed, name="resumed.json")
    assert resumed["final"] == full["final"]
    keys = ("dp_epsilon", "dp_epsilon_median")
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [{k: h[k] for k in keys} for h in full["history"]]
    eps = [h["dp_epsilon"] for h in full["history"]]
    assert all(a <= b for a, b in zip(eps, eps[1:])) and eps[-1] > eps[0] > 0  # the worst client's


def test_a_model_dp_sgd_cannot_take_per_sample_norms_of_is_refused_in_one_line(tmp_path, capsys):
    from tests.test_runs import raysim, tracked

    path = tracked(
        tmp_path,
        TINY.replace("model: {name: linear}", "model: {name: mlp, hidden: [8], norm: batch}")
        + "privacy: {level: sample, clip: 1.0}\n",
    )
    proc = raysim("run", path, "-q", "--engine", "serial", check=False, here=True)
    assert proc.returncode == 2, proc.stderr
    assert "needs each sample's own gradient" in proc.stderr and "BatchNorm1d" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_sample_level_privacy_goes_with_compressed_uploads(tmp_path):
    sc = config.load(write_scenario(tmp_path, TINY + "privacy: {level: sample}\ncommunication: {compress: qsgd}\n"))
    assert sc.privacy.level == "sample" and sc.privacy.accounting == "poisson" and sc.communication.compress == "qsgd"


PLUGIN_MODELS = '''
"""Models a user might bring to DP-SGD: each built on the features' shape."""
from dataclasses import dataclass

import torch
from torch import nn

from raysim.models import ModelParams, ModelSpec


@dataclass(frozen=True)
class P(ModelParams):
    pass


class Centred(nn.Module):
    """Each sample minus its batch's mean: one sample's output depends on the others."""
    def __init__(self, d, k):
        super().__init__()
        self.lin = nn.Linear(d, k)

    def forward(self, x):
        return self.lin(x - x.mean(0, keepdim=True))


class Gated(nn.Module):
    """A random mask of its own (no dropout class): two passes differ."""
    def __init__(self, d, k):
        super().__init__()
        self.lin = nn.Linear(d, k)

    def forward(self, x):
        return self.lin(x * (torch.rand_like(x) > 0.5))


class Scaled(nn.Module):
    """Deterministic and sample by sample (a layer norm of its own): DP-SGD takes it."""
    def __init__(self, d, k):
        super().__init__()
        self.lin = nn.Linear(d, k)

    def forward(self, x):
        return self.lin((x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5))


ALPHA = ModelSpec("alpha", "linear with alpha dropout", P,
                  lambda p, shape, k: nn.Sequential(nn.AlphaDropout(0.2), nn.Linear(shape[0], k)))
CENTRED = ModelSpec("centred", "batch-centred linear", P, lambda p, shape, k: Centred(shape[0], k))
GATED = ModelSpec("gated", "randomly gated linear", P, lambda p, shape, k: Gated(shape[0], k))
SCALED = ModelSpec("scaled", "per-sample normalised linear", P, lambda p, shape, k: Scaled(shape[0], k))
'''


@pytest.mark.parametrize(
    "spec,says",
    [
        ("ALPHA", "a layer of type AlphaDropout"),
        ("CENTRED", "depend on the other samples of its batch"),
        ("GATED", "different outputs in two passes over the same batch"),
    ],
)
def test_a_plugin_model_dp_sgd_cannot_train_sample_by_sample_is_refused_in_one_line(
    tmp_path, capsys, monkeypatch, spec, says
):
    (tmp_path / "dpmodels.py").write_text(PLUGIN_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_scenario(
        tmp_path,
        TINY.replace("model: {name: linear}", f'model: {{name: "dpmodels:{spec}"}}')
        + "privacy: {level: sample, clip: 1.0}\n",
    )
    line = run_refused(capsys, tmp_path, path)
    assert ": model.name: " in line and says in line and "own gradient" in line, line


def test_a_plugin_model_dp_sgd_accepts_has_the_one_sample_loops_per_sample_gradients(tmp_path, monkeypatch):
    """The loop's per-sample clipped sum (torch.func's path for a model that is not a chain of
    linear layers) against each sample's gradient taken alone with autograd, clipped by hand."""
    (tmp_path / "dpmodels.py").write_text(PLUGIN_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import dpmodels

    from raysim.core.loop import Trainer
    from raysim.core.tasks import TASKS

    torch.manual_seed(0)
    model = dpmodels.Scaled(5, 3)
    x, y = torch.randn(4, 5), torch.tensor([0, 2, 1, 2])
    assert privacy.per_sample_problem(model, x) is None
    task = TASKS["classification"]
    trainer = Trainer(model, gradients="autograd")
    params = [p.detach().unsqueeze(0) for p in model.parameters()]
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last row is padding
    clip = 0.3
    _, sums, clipped = trainer._private_step(task, params, x.unsqueeze(0), y.unsqueeze(0), valid, clip, (True, True))
    want = [torch.zeros_like(p) for p in model.parameters()]
    hits = 0
    for i in range(3):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        g = [p.grad.clone() for p in model.parameters()]
        norm = torch.sqrt(sum((t**2).sum() for t in g))
        hits += int(norm > clip)
        for w, t in zip(want, g):
            w += t * min(1.0, clip / float(norm))
    for got, w in zip(sums, want):
        assert torch.allclose(got[0], w, atol=1e-6)
    assert int(clipped[0]) == hits


def test_noise_and_clipping_options_that_would_overflow_are_refused_before_any_run(tmp_path, capsys):
    for option, key, says in (
        ("noise_multiplier: 1e-200", "privacy.noise_multiplier", "at least 0.01"),
        ("clip_lr: 1e6, target_quantile: 0.5", "privacy.clip_lr", "<= 10"),
        ("clip: 1e300", "privacy.clip", "<= 1000000"),
    ):
        path = write_scenario(tmp_path, TINY + f"privacy: {{{option}}}\n")
        line = run_refused(capsys, tmp_path, path)
        assert f": {key}: " in line and says in line, line
    path = write_scenario(tmp_path, TINY + "privacy: {level: sample, noise_multiplier: 0.001}\n")
    line = run_refused(capsys, tmp_path, path)
    assert ": privacy.noise_multiplier: " in line and "at least 0.01" in line, line


@pytest.mark.parametrize(
    "extra,key,says",
    [
        ("algorithm: {name: fedavg+, lr: 0.1}", "eval.finetune", "outside DP-SGD (1 epoch)"),
        ("algorithm: {name: fedavg, lr: 0.1}\neval: {every: 1, finetune: {epochs: 2}}", "eval.finetune", "(2 epochs)"),
        (
            "algorithm: {name: ditto, lr: 0.1}\neval: {every: 1, unseen_fraction: 0.25}",
            "eval.unseen_fraction",
            "personalizes unseen clients by training",
        ),
    ],
)
def test_training_the_sample_level_accountant_would_not_count_is_refused(tmp_path, capsys, extra, key, says):
    text = TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}\n", "")
    if "eval:" in extra:
        text = text.replace("eval: {every: 1}\n", "")
    path = write_scenario(tmp_path, text + extra + "\nprivacy: {level: sample, clip: 1.0}\n")
    line = run_refused(capsys, tmp_path, path)
    assert f": {key}: " in line and says in line, line
    # the same methods without that training run under DP-SGD
    config.load(
        write_scenario(
            tmp_path,
            TINY.replace("name: fedavg,", "name: fedavg+,")
            + "eval: {every: 1, finetune: {epochs: 0}}\nprivacy: {level: sample}\n",
        )
    )


def test_dittos_epsilon_counts_the_personal_models_dp_sgd_steps_too(tmp_path):
    """Ditto trains w and v on the same samples, both with DP-SGD: each client's ε composes
    rounds · (E_w + E_v) · ⌈n/B⌉ steps (dp_accounting's own composition of that many)."""
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from tests.test_runs import summary_of, tracked

    text = (
        TINY.replace("rounds: 3", "rounds: 2")
        .replace("sampling: {fraction: 0.5}", "sampling: {fraction: 1.0}")
        .replace(
            "algorithm: {name: fedavg, lr: 0.1, batch_size: 16}",
            "algorithm: {name: ditto, lr: 0.1, batch_size: 16, personal_epochs: 2}",
        )
    )
    path = tracked(tmp_path, text + "privacy: {level: sample, clip: 0.5, noise_multiplier: 1.2, delta: 1e-4}\n")
    out = summary_of(tmp_path, path, "--engine", "serial", name="d.json")
    sc = config.load(path)
    from raysim.engine.serial import serial_driver

    sizes = serial_driver(sc).n_train(list(range(12))).astype(int)
    worst = []
    for n in sorted(set(sizes.tolist())):
        acc = rdp.RdpAccountant()
        steps = 2 * (1 + 2) * -(-n // 16)  # 2 rounds, w's 1 epoch and v's 2
        acc.compose(dpa.PoissonSampledDpEvent(min(1.0, 16 / n), dpa.GaussianDpEvent(1.2)), steps)
        worst.append(acc.get_epsilon(1e-4))
    assert out["history"][-1]["dp_epsilon"] == pytest.approx(max(worst), rel=1e-9)


def test_poisson_batches_take_each_sample_with_probability_b_over_n_in_rows_of_one_width():
    """``draw_poisson``: every sample joins each step independently with probability B/n (all of
    them when n ≤ B), a step's samples first in index order, -1 after them, in W columns for any
    n; W is the smallest w with P(Poisson(B) > w) ≤ 1e-12 (scipy's tail, a second library)."""
    from scipy.stats import poisson

    from raysim.core.loop import POISSON_TAIL, draw_poisson, poisson_width

    w = poisson_width(10)
    assert poisson.sf(w - 1, 10) <= POISSON_TAIL < poisson.sf(w - 2, 10)  # P(X > w−1) ≤ tail < P(X > w−2)
    g = torch.Generator().manual_seed(0)
    every = draw_poisson(g, 6, 4, 10)  # n ≤ B: q = 1
    assert (
        every.shape == (4, w) and torch.equal(every[:, :6], torch.arange(6).expand(4, 6)) and (every[:, 6:] == -1).all()
    )
    steps = draw_poisson(g, 200, 4000, 10)  # q = 0.05
    assert steps.shape == (4000, w)
    joined = torch.zeros(4000, 200)
    for t, row in enumerate(steps):
        taken = row[row >= 0]
        assert torch.equal(taken, taken.sort().values) and (row[len(taken) :] == -1).all()
        joined[t, taken] = 1
    rate = joined.mean(0)  # each sample's share of steps: 0.05 ± 3.4 sd
    assert float((rate - 0.05).abs().max()) < 3.4 * (0.05 * 0.95 / 4000) ** 0.5 * 1.6
    sizes = joined.sum(1)
    assert float(sizes.mean()) == pytest.approx(10, abs=0.15) and float(sizes.var()) == pytest.approx(9.5, rel=0.1)


def test_a_poisson_step_is_the_clipped_sum_of_the_samples_it_drew_over_b():
    """One DP-SGD step without noise on Poisson batches, by hand: the samples the job's generator
    drew, each gradient clipped to C by autograd alone, summed and divided by B (not by the
    batch's size, which varies), times −lr."""
    model = linear(LinearParams(), (4,), 3)
    start = fwd.params_of(model)
    s = Settings(lr=0.5, epochs=1, batch_size=4, dp_clip=0.2, dp_noise=0.0, poisson=True)
    data = client(16, dim=4)
    job = make_job(start, data, ctx(3), s, CE)
    assert job.orders.shape[0] == 4  # ⌈16/4⌉ steps an epoch
    first = job.orders[0][job.orders[0] >= 0]
    one = make_job(start, data, ctx(3), s, CE)
    one.max_steps = 1  # only the first step
    got = Trainer(model).fit([one])[0]
    want = [p.clone() for p in start]
    grads = [torch.zeros_like(p) for p in start]
    for i in first.tolist():
        ps = [p.clone().requires_grad_(True) for p in start]
        out = torch.func.functional_call(
            model, dict(zip([n for n, _ in model.named_parameters()], ps)), data.train_x[i : i + 1]
        )
        g = torch.autograd.grad(F.cross_entropy(out, data.train_y[i : i + 1]), ps)
        norm = float(torch.sqrt(sum((t * t).sum() for t in g)))
        for acc, t in zip(grads, g):
            acc += t * min(1.0, 0.2 / norm)
    for w, g in zip(want, grads):
        w -= 0.5 * g / 4
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(got.params, want))


def test_a_run_with_poisson_batches_learns_is_the_same_on_one_host_or_three_and_keeps_its_epsilon(tmp_path):
    from tests.test_privacy import one_host_and_three

    out = one_host_and_three(tmp_path, "{level: sample, clip: 0.5, noise_multiplier: 1.1, batches: poisson}")
    (tmp_path / "s").mkdir()
    shuffled = one_host_and_three(tmp_path / "s", "{level: sample, clip: 0.5, noise_multiplier: 1.1}")
    assert [h["dp_epsilon"] for h in out[1]["history"]] == [h["dp_epsilon"] for h in shuffled[1]["history"]]
    assert out[1]["final"] != shuffled[1]["final"]  # other batches
    assert out[1]["final"]["accuracy"] > 0.55  # two classes: chance is 0.5


def test_poisson_batches_are_level_samples_and_its_default_stays_shuffle(tmp_path, capsys):
    assert config.load(write_scenario(tmp_path, TINY + "privacy: {level: sample}\n")).privacy.batches == "shuffle"
    path = write_scenario(tmp_path, TINY + "privacy: {batches: poisson}\n")
    line = run_refused(capsys, tmp_path, path)
    assert ": privacy.batches: " in line and "level sample" in line, line
