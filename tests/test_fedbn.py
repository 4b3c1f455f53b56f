"""FedBN: the ``norm`` parameter group, one round on two tiny clients against gradient descent
written out here (batch norm, its running statistics included, kept per client; the rest averaged
with n_k weights), unseen clients, the refusal of a model without batch norm, and a tiny serial
run where FedBN beats FedAvg on rotated digits (a feature shift)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Received
from raysim.algorithms.fedbn import FedBNState
from raysim.core.data import ClientData
from raysim.core.forward import params_of
from raysim.core.groups import groups_of
from raysim.core.loop import Job, Settings, Supervised, Trainer
from raysim.core.norm import BatchNorm1d
from raysim.core.tasks import TASKS
from raysim.engine.serial import serial_driver
from raysim.models import MLPParams, mlp
from raysim.scenario import config
from tests.conftest import write_scenario
from tests.test_algorithms import client, ctx, make, run
from tests.test_personal_layers import equal, reduce

# two clients of 3 and 2 samples; batch 3: every step is full batch
A = client(0, [2.0, -1.0, 0.5], [0, 1, 0], test=([2.0, -1.0, 0.0], [0, 1, 1]))
B = client(1, [1.0, 3.0], [1, 1], test=([1.0], [1]))
PLAIN = dict(lr=0.1, batch_size=3, momentum=0.0, weight_decay=0.0)
EPS = 1e-5


def close(a, b):
    return len(a) == len(b) and all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a, b))


# -- FedBN ---------------------------------------------------------------------------------------
def bn_mlp(variant=0):
    """1 -> 3 -> BatchNorm1d -> ReLU -> 2; parameters: 0.weight, 0.bias, 1.weight (γ), 1.bias (β),
    1.running_mean, 1.running_var, 3.weight, 3.bias."""
    torch.manual_seed(3 + variant)
    model = nn.Sequential(nn.Linear(1, 3), BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():  # γ, β away from 1, 0 so that they matter
        model[1].weight.copy_(torch.tensor([1.5, 0.5, 1.0]))
        model[1].bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return model


NORM, REST = [2, 3, 4, 5], [0, 1, 6, 7]
TRAINED = [0, 1, 2, 3, 6, 7]


def bn_forward(p, x, train):
    h = x @ p[0].T + p[1]
    if train:
        mu, var = h.mean(0), h.var(0, unbiased=False)
    else:
        mu, var = p[4], p[5]
    z = (h - mu) / torch.sqrt(var + EPS) * p[2] + p[3]
    return torch.relu(z) @ p[6].T + p[7]


def bn_gd(params, data, lr, epochs, train):
    """Full-batch GD on the mean cross-entropy of the tensors ``train``; the running statistics
    follow each forward pass (momentum 0.1, the unbiased batch variance), as batch norm's."""
    p = [t.clone() for t in params]
    for _ in range(epochs):
        h = (data.train_x @ p[0].T + p[1]).detach()
        p[4] = 0.9 * p[4] + 0.1 * h.mean(0)
        p[5] = 0.9 * p[5] + 0.1 * h.var(0, unbiased=True)
        q = [t.requires_grad_(i in train) for i, t in enumerate(p)]
        loss = F.cross_entropy(bn_forward(q, data.train_x, True), data.train_y)
        grads = torch.autograd.grad(loss, [q[i] for i in train])
        p = [t.detach() for t in q]
        for i, g in zip(train, grads):
            p[i] = p[i] - lr * g
    return p


def fedbn(**hp):
    return make("fedbn", model_fn=bn_mlp, **{**PLAIN, **hp})


def test_the_norm_group_is_every_normalization_parameter_and_its_complement_the_rest():
    g = groups_of(bn_mlp())
    assert g.norm == tuple(NORM) and g.stats == (4, 5) and g.of("~norm") == tuple(REST)
    assert g.of("~head") == g.body and g.mask("~norm") == (True, True, False, False, False, False, True, True)
    # an MLP with norm: batch has a BatchNorm1d after each hidden layer; without, no norm group
    names = groups_of(mlp(MLPParams((6, 5), norm="batch"), (4,), 3)).names
    assert names == (
        "1.weight",
        "1.bias",
        "2.weight",
        "2.bias",
        "2.running_mean",
        "2.running_var",
        "4.weight",
        "4.bias",
        "5.weight",
        "5.bias",
        "5.running_mean",
        "5.running_var",
        "7.weight",
        "7.bias",
    )
    assert groups_of(mlp(MLPParams((6, 5)), (4,), 3)).norm == ()


def test_fedbn_round_keeps_batch_norm_per_client_and_averages_the_rest_by_samples():
    algo = fedbn(local_epochs=2)
    init = params_of(bn_mlp())
    server = algo.init_server(None)
    msg = algo.message(server, 0).shared
    assert equal(msg.shared, [init[i] for i in REST]) and msg.local is None  # batch norm never goes down
    (sa, ra, _), (sb, rb, _) = run(algo, *(algo.train(None, Received(msg), d, ctx(d.cid)) for d in (A, B)))
    ta, tb = bn_gd(init, A, 0.1, 2, TRAINED), bn_gd(init, B, 0.1, 2, TRAINED)  # the whole model trains
    # each client keeps its own batch norm: γ, β and the running statistics of its own batches
    assert (
        isinstance(sa, FedBNState) and close(sa.norm, [ta[i] for i in NORM]) and close(sb.norm, [tb[i] for i in NORM])
    )
    assert not torch.allclose(sa.norm[2], sb.norm[2]) and not torch.allclose(sa.norm[0], sb.norm[0])
    # the reply is the rest, weighted by n_k; the server averages it, its batch norm stays the initial one
    assert close(ra.values, [ta[i] for i in REST]) and (ra.weight, rb.weight) == (3.0, 2.0)
    new = algo.aggregate(server, reduce(ra, rb), 0)
    assert close([new[i] for i in REST], [(3 * ta[i] + 2 * tb[i]) / 5 for i in REST])
    assert equal([new[i] for i in NORM], [init[i] for i in NORM])
    # round 2: A starts from the averaged rest and its own batch norm
    msg2 = algo.message(new, 1).shared
    (jobs,) = [next(algo.train(sa, Received(msg2), A, ctx(0, 1)))]
    assert equal([jobs[0].params[i] for i in REST], msg2.shared) and equal([jobs[0].params[i] for i in NORM], sa.norm)
    # evaluation: the client's own batch norm in evaluation mode (its running statistics)
    (ma,) = run(algo, algo.evaluate(sa, Received(msg2), A, ctx(0)))
    mine = list(jobs[0].params)
    pred = bn_forward(mine, A.test_x, False).argmax(1)
    assert ma["accuracy"] == pytest.approx(float((pred == A.test_y).float().mean()))
    assert not any(k.startswith("global_") for k in ma)
    # the paper's 1/K
    uni = fedbn(local_epochs=2, weighting="uniform")
    (_, ua, _), (_, ub, _) = run(uni, *(uni.train(None, Received(msg), d, ctx(d.cid)) for d in (A, B)))
    assert (ua.weight, ub.weight) == (1.0, 1.0) and equal(ua.values, ra.values)


def test_fedbn_unseen_clients_train_only_their_batch_norm_and_a_model_without_one_is_refused(tmp_path):
    algo = fedbn()
    init = params_of(bn_mlp())
    msg = algo.message(algo.init_server(None), 0).shared
    ((state,),) = [run(algo, algo.personalize(Received(msg), A, ctx(0)))]
    assert close(state.norm, [bn_gd(init, A, 0.1, 1, [2, 3])[i] for i in NORM])
    with pytest.raises(ValueError, match="no normalization layer"):
        make("fedbn", model_fn=lambda variant=0: nn.Sequential(nn.Linear(1, 3), nn.ReLU(), nn.Linear(3, 2)))
    path = write_scenario(
        tmp_path, FEATURE_SHIFT.replace("NAME", "fedbn").replace("SEED", "0").replace(", norm: batch", "")
    )
    with pytest.raises(config.ScenarioError, match="no normalization layer"):
        config.load(path)


# -- end to end ----------------------------------------------------------------------------------
FEATURE_SHIFT = """
name: feature-shift
seed: SEED
rounds: 15
data:
  dataset: digits
  clients: 8
  groups: 4
  group_transform: rotate
  partition: {kind: iid}
model: {name: mlp, hidden: [32], norm: batch}
algorithm: {name: NAME, lr: 0.05, batch_size: 16, local_epochs: 1}
sampling: {fraction: 1.0}
eval: {every: 15}
resources: {hosts: 2, cpus_per_host: 0.5}
"""


def final(tmp_path, text):
    sc = config.load(write_scenario(Path(tmp_path), text))
    d = serial_driver(sc, 2)
    for _ in range(sc.rounds):
        d.step()
    return d


def test_fedbn_beats_fedavg_on_rotated_digits(tmp_path):
    # 8 clients in 4 groups, group g's digits turned g·90°: a feature shift, one labelling.
    # Measured (final accuracy, seeds 0-4): FedAvg .728 .633 .689 .703 .667, FedBN .750 .683
    # .753 .744 .678 (same model, same optimizer)
    text = FEATURE_SHIFT.replace("SEED", "0")
    fedavg = final(tmp_path, text.replace("NAME", "fedavg")).history[-1]
    fedbn_ = final(tmp_path, text.replace("NAME", "fedbn")).history[-1]
    assert fedbn_["accuracy"] > 0.5 and fedbn_["accuracy"] >= fedavg["accuracy"], (
        fedbn_["accuracy"],
        fedavg["accuracy"],
    )
    assert fedbn_["bytes_up"] < fedavg["bytes_up"]  # batch norm never sent


def test_a_training_batch_of_one_sample_is_normalized_by_the_running_statistics():
    """A client's last batch of one sample (9 samples, batches of 8 and 1) trains: that step
    normalizes by the running statistics (PyTorch refuses batch statistics of one sample) and
    leaves them as they are; by hand: full-batch GD on the 8 samples, then the one sample's step
    in evaluation form."""
    model = bn_mlp()
    start = [p.detach().clone() for p in model.parameters()]
    x = torch.tensor([[-1.0], [0.5], [2.0], [1.0], [-0.5], [0.0], [1.5], [-2.0], [0.7]])
    y = torch.tensor([0, 1, 1, 1, 0, 0, 1, 0, 1])
    s = Settings(lr=0.1, epochs=1, batch_size=8)
    orders = torch.arange(9).unsqueeze(0)
    (fit,) = Trainer(bn_mlp(), "never").fit([Job(start, x, y, orders, s, Supervised(TASKS["classification"]))])
    p = bn_gd(start, ClientData(0, x[:8], y[:8], x[:0], y[:0], x[:0], y[:0]), 0.1, 1, TRAINED)
    stats = (p[4].clone(), p[5].clone())
    q = [t.clone().requires_grad_(i in TRAINED) for i, t in enumerate(p)]
    grads = torch.autograd.grad(F.cross_entropy(bn_forward(q, x[8:], False), y[8:]), [q[i] for i in TRAINED])
    for i, g in zip(TRAINED, grads):
        p[i] = p[i] - 0.1 * g
    assert close(fit.params, p)  # its running statistics: those of the 8-sample step
    h = x[8:] @ p[0].T + p[1]  # a one-sample update of them would have moved the mean
    assert not torch.allclose(fit.params[4], 0.9 * stats[0] + 0.1 * h[0], atol=1e-3)


def test_fedbn_eval_stats_refit_scores_with_the_running_statistics_of_the_clients_train_split():
    """Client A's kept statistics are stale (made up here); refit replaces them, before scoring,
    by the mean and unbiased variance of its train split's pre-normalization activations under
    the received weights (3 samples, one pass), γ and β its own; kept scores with the stale ones."""
    init = params_of(bn_mlp())
    stale = FedBNState([init[2], init[3], torch.tensor([5.0, -4.0, 3.0]), torch.tensor([0.01, 9.0, 0.2])])
    kept, refit = fedbn(), fedbn(eval_stats="refit")
    msg = kept.message(kept.init_server(None), 0).shared
    h = A.train_x @ init[0].T + init[1]  # (3, 3), by hand
    fresh = [init[2], init[3], h.mean(0), h.var(0, unbiased=True)]
    for algo, stats in ((kept, stale.norm), (refit, fresh)):
        (m,) = run(algo, algo.evaluate(stale, Received(msg), A, ctx(0)))
        p = list(init)
        p[2:6] = stats
        pred = bn_forward(p, A.test_x, False).argmax(1)
        assert m["accuracy"] == pytest.approx(float((pred == A.test_y).float().mean()))
        assert m["test_loss"] == pytest.approx(
            float(F.cross_entropy(bn_forward(p, A.test_x, False), A.test_y)), rel=1e-5
        )
    got = refit.refit_stats(kept.model(stale, msg, torch.device("cpu")), A.train_x, torch.device("cpu"))
    assert close([got[i] for i in NORM], fresh) and equal([got[i] for i in REST], [init[i] for i in REST])
    # in blocks: block k folded in with momentum 1/k, the average of the blocks' statistics
    refit.REFIT_BLOCK = 2
    got = refit.refit_stats(kept.model(stale, msg, torch.device("cpu")), A.train_x, torch.device("cpu"))
    # the second block is one sample: batch norm cannot take its statistics, so it leaves them
    assert close([got[4], got[5]], [h[:2].mean(0), h[:2].var(0, unbiased=True)])
    four = client(2, [2.0, -1.0, 0.5, 3.0], [0, 1, 0, 1])  # two blocks of two
    h4 = four.train_x @ init[0].T + init[1]
    got = refit.refit_stats(kept.model(stale, msg, torch.device("cpu")), four.train_x, torch.device("cpu"))
    assert close(
        [got[4], got[5]],
        [(h4[:2].mean(0) + h4[2:].mean(0)) / 2, (h4[:2].var(0, unbiased=True) + h4[2:].var(0, unbiased=True)) / 2],
    )


def test_rescoring_a_fedbn_checkpoint_gives_the_runs_scores_and_refit_those_of_a_run_with_it(tmp_path):
    """bench/rescore.py on a finished run's checkpoint (2 of 8 clients a round, so most clients'
    statistics are stale at the end), the serial driver restored from it: with the run's options
    it gives the run's final scores;
    with eval_stats=refit, that of the same run made with the option (training is the same), which
    differs from the kept statistics' score."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import rescore

    from raysim import api

    text = (
        FEATURE_SHIFT.replace("SEED", "1")
        .replace("NAME", "fedbn")
        .replace("rounds: 15", "rounds: 8")
        .replace("fraction: 1.0", "count: 2")
        .replace("every: 15", "every: 8")
    )
    path = write_scenario(Path(tmp_path), text)
    common = {"tracking.uri": f"sqlite:///{tmp_path}/m.db", "checkpoint.dir": str(tmp_path / "ck")}
    kept = api.run(path, common, engine="serial")
    refit = api.run(path, {**common, "algorithm.eval_stats": "refit"}, engine="serial")
    assert refit.history["train_loss"].tolist() == kept.history["train_loss"].tolist()  # the same training
    folder = str(tmp_path / "ck" / kept.run_id)
    as_run, round_ = rescore.scores(folder, [])
    again, _ = rescore.scores(folder, ["algorithm.eval_stats=refit"])
    assert round_ == 8
    for name in ("accuracy", "bottom_decile_accuracy", "test_loss"):
        assert as_run[name] == pytest.approx(kept.final[name], abs=1e-12)
        assert again[name] == pytest.approx(refit.final[name], abs=1e-12)
    assert again["test_loss"] != as_run["test_loss"]
