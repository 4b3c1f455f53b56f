"""The "local update" (``eval.finetune``; FedAvg-LU, FedProx-LU, SCAFFOLD-LU; ``fedavg+``).

Hand-checked on a 1-feature, 2-class linear model at W = 0, b = 0: the softmax is (1/2, 1/2), so
the cross-entropy gradient w.r.t. the logits is softmax − onehot(y). One full batch of
(x=2, y=0) and (x=1, y=1): per-sample weight gradients (−1, +1) and (+.5, −.5), bias gradients
(−.5, +.5) and (+.5, −.5); their mean is ∇W = (−.25, +.25), ∇b = 0. One SGD step of lr gives
W = lr·(+.25, −.25), b = 0: x > 0 is class 0, x < 0 class 1.
"""

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

import raysim.algorithms as algorithms
from raysim.algorithms.base import Received
from raysim.core.data import ClientData, Context
from raysim.core.loop import drive
from raysim.core.tasks import TASKS
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from raysim.scenario.config import FinetuneCfg, ScenarioError
from tests.conftest import TINY, write_scenario

CPU = torch.device("cpu")
TRAIN = ([2.0, 1.0], [0, 1])
TEST = ([2.0, -1.0, 3.0], [0, 1, 1])


def zero_model(variant=0):
    m = nn.Linear(1, 2)
    with torch.no_grad():
        m.weight.zero_()
        m.bias.zero_()
    return m


def data():
    x = torch.tensor(TRAIN[0]).reshape(-1, 1)
    tx = torch.tensor(TEST[0]).reshape(-1, 1)
    return ClientData(0, x, torch.tensor(TRAIN[1]), x[:0], torch.zeros(0, dtype=torch.int64), tx, torch.tensor(TEST[1]))


def ctx(round_=10, rounds=10):
    return Context(round_, rounds, 0, torch.Generator().manual_seed(0), CPU, 0)


def make(name="fedavg", finetune=None, **hp):
    cls = algorithms.get(name)
    algo = cls(cls.Hyper(**{"lr": 1.0, "batch_size": 2, **hp}), zero_model, rounds=10, task=TASKS["classification"])
    algo.finetune = finetune
    return algo


def evaluate(algo, received=None, state=None):
    """The engine's evaluation of one client, and every parameter set the loop trained for it."""
    trained = []

    def fit(jobs):
        out = algo.trainer(CPU).fit(jobs)
        trained.extend(f.params for f in out)
        return out

    (metrics,) = drive(
        [algo.evaluation(state, received or Received([torch.zeros(2, 1), torch.zeros(2)]), data(), ctx())], fit
    )
    return metrics, trained


def by_hand(lr):
    """Scores of W = lr·(.25, −.25), b = 0 on TEST: logits ±.25·lr·x."""
    w = 0.25 * lr
    losses = []
    right = 0
    for x, y in zip(*TEST):
        z = [w * x, -w * x]
        losses.append(math.log(math.exp(z[0]) + math.exp(z[1])) - z[y])
        right += int((0 if z[0] >= z[1] else 1) == y)
    return right / len(TEST[1]), sum(losses) / len(losses)


def test_one_full_batch_epoch_is_one_sgd_step_by_hand_and_the_scores_are_the_tuned_models():
    metrics, trained = evaluate(make(finetune=FinetuneCfg(epochs=1)))
    (tuned,) = trained
    assert torch.allclose(tuned[0], torch.tensor([[0.25], [-0.25]])) and torch.allclose(tuned[1], torch.zeros(2))
    # the same step by torch's autograd on the same data
    m = zero_model()
    x, y = data().train_x, data().train_y
    nn.functional.cross_entropy(m(x), y).backward()
    assert torch.allclose(tuned[0], -1.0 * m.weight.grad) and torch.allclose(tuned[1], -1.0 * m.bias.grad)
    acc, loss = by_hand(1.0)
    assert acc == pytest.approx(2 / 3)  # x = 3 (label 1) still says 0
    for prefix in ("lu_", ""):  # FedAvg-LU: the personalized metrics are the tuned model's
        assert metrics[f"{prefix}accuracy"] == pytest.approx(acc)
        assert metrics[f"{prefix}test_loss"] == pytest.approx(loss, rel=1e-6)
    assert metrics["global_accuracy"] == pytest.approx(1 / 3)  # untuned: ties go to class 0
    assert metrics["global_test_loss"] == pytest.approx(math.log(2))


def test_options_override_the_algorithms_settings_and_off_means_untouched():
    # the algorithm trains with lr 0.1, batch 1; the local update's own lr 1 and batch 2 give the step above
    metrics, (tuned,) = evaluate(make(lr=0.1, batch_size=1, finetune=FinetuneCfg(epochs=1, lr=1.0, batch_size=2)))
    assert torch.allclose(tuned[0], torch.tensor([[0.25], [-0.25]]))
    off, trained = evaluate(make(finetune=FinetuneCfg(epochs=0)))
    assert trained == [] and not any(k.startswith("lu_") for k in off) and off["accuracy"] == off["global_accuracy"]
    plain, trained = evaluate(make(finetune=None))
    assert trained == [] and plain == off


def test_the_lr_does_not_follow_the_schedule_to_zero_unless_asked():
    # lr_schedule step: the evaluated round 10 of 10 trains at lr x0.01; the local update does not
    algo = make(lr_schedule="step", finetune=FinetuneCfg(epochs=1))
    assert algo.hp.lr_at(10, 10) == pytest.approx(0.01)
    _, (base,) = evaluate(algo)
    assert torch.allclose(base[0], torch.tensor([[0.25], [-0.25]]))  # the base lr's step
    _, (sched,) = evaluate(make(lr_schedule="step", finetune=FinetuneCfg(epochs=1, lr_source="schedule")))
    assert torch.allclose(sched[0], torch.tensor([[0.0025], [-0.0025]]))  # x0.01: SuPerFed's choice
    _, (given,) = evaluate(make(lr_schedule="step", finetune=FinetuneCfg(epochs=1, lr=2.0, lr_source="schedule")))
    assert torch.allclose(given[0], torch.tensor([[0.005], [-0.005]]))  # a given lr scaled too


def test_methods_with_a_personal_model_keep_theirs_and_add_lu():
    # Ditto's personalized model is v (here still the global model: state None); lu_ is the tuned w
    metrics, (tuned,) = evaluate(make("ditto", finetune=FinetuneCfg(epochs=1)))
    acc, _ = by_hand(1.0)
    assert metrics["lu_accuracy"] == pytest.approx(acc)
    assert metrics["accuracy"] == metrics["global_accuracy"] == pytest.approx(1 / 3)
    # SCAFFOLD: the global model is x of its message
    from raysim.algorithms.scaffold import ScaffoldMessage

    zeros = [torch.zeros(2, 1), torch.zeros(2)]
    metrics, (tuned,) = evaluate(
        make("scaffold", finetune=FinetuneCfg(epochs=1)), Received(ScaffoldMessage(zeros, zeros))
    )
    assert torch.allclose(tuned[0], torch.tensor([[0.25], [-0.25]])) and metrics["accuracy"] == pytest.approx(acc)


def test_fedavg_plus_is_fedavg_with_the_local_update_on_by_default():
    metrics, (tuned,) = evaluate(make("fedavg+"))  # eval.finetune not given: 1 epoch
    assert torch.allclose(tuned[0], torch.tensor([[0.25], [-0.25]]))
    assert metrics["accuracy"] == metrics["lu_accuracy"] == pytest.approx(by_hand(1.0)[0])
    _, (two,) = evaluate(make("fedavg+", tune_epochs=2))  # the deprecated alias still counts
    assert not torch.allclose(two[0], tuned[0])
    off, trained = evaluate(make("fedavg+", finetune=FinetuneCfg(epochs=0)))
    assert trained == [] and "lu_accuracy" not in off


# -- scenarios ---------------------------------------------------------------------------------
SYNTH = """
name: lu
seed: 0
rounds: 8
data:
  dataset: synthetic
  clients: 16
  dim: 20
  alpha: 0.2
  min_samples: 60
  max_samples: 120
model: {name: linear}
algorithm: {name: fedavg, lr: 0.1, batch_size: 32, momentum: 0.9, lr_schedule: step}
eval: {every: 8}
resources: {hosts: 2, cpus_per_host: 0.5}
"""
MARGIN = 0.03  # measured on seed 0: fedavg 62.6 %, fedavg+ 68.4 % (seeds 1-4: +2.7 to +6.7 points)


def metrics_of(record):
    return {k: v for k, v in record.items() if "seconds" not in k and "bytes" not in k}


def last(tmp_path, text, *overrides, hosts=None):
    sc = config.load(write_scenario(tmp_path, text), list(overrides))
    d = serial_driver(sc, hosts)
    for _ in range(sc.rounds):
        d.step()
    return d.history[-1]


def test_fedavg_plus_beats_fedavg_on_heterogeneous_data_with_the_same_global_model(tmp_path):
    plain = last(tmp_path, SYNTH)
    plus = last(tmp_path, SYNTH, "algorithm.name=fedavg+")
    assert plus["global_accuracy"] == plain["global_accuracy"]  # same training, same seed
    assert plus["global_test_loss"] == plain["global_test_loss"]
    assert plain["accuracy"] == plain["global_accuracy"] and "lu_accuracy" not in plain
    assert plus["accuracy"] == plus["lu_accuracy"]
    assert plus["accuracy"] > plain["accuracy"] + MARGIN
    lu = last(tmp_path, SYNTH, "eval.finetune.epochs=1")  # FedAvg-LU: the same numbers
    assert metrics_of(lu) == metrics_of(plus)
    # lr_source: schedule at the step schedule's end (lr x0.01) barely moves the global model
    sched = last(tmp_path, SYNTH, "algorithm.name=fedavg+", "eval.finetune.lr_source=schedule")
    assert abs(sched["accuracy"] - plain["accuracy"]) < abs(plus["accuracy"] - plain["accuracy"])


@pytest.mark.parametrize("name,extra", [("fedprox", ["algorithm.mu=0.01"]), ("scaffold", [])])
def test_fedprox_lu_and_scaffold_lu_are_scenario_settings(tmp_path, name, extra):
    one = last(tmp_path, SYNTH, f"algorithm.name={name}", "eval.finetune.epochs=1", *extra, "rounds=3", "eval.every=3")
    assert {
        "lu_accuracy",
        "lu_accuracy_std",
        "bottom_decile_lu_accuracy",
        "lu_test_loss",
        "lu_ece",
        "lu_ece_union",
        "global_accuracy",
    } <= set(one)
    assert one["accuracy"] == one["lu_accuracy"] != one["global_accuracy"]
    three = last(
        tmp_path, SYNTH, f"algorithm.name={name}", "eval.finetune.epochs=1", *extra, "rounds=3", "eval.every=3", hosts=3
    )
    assert metrics_of(three) == metrics_of(one)  # any host count: the same numbers


def test_a_method_without_a_global_model_is_refused(tmp_path):
    path = write_scenario(tmp_path, TINY)
    with pytest.raises(ScenarioError, match="eval.finetune: 'local' has no global model"):
        config.load(path, ["algorithm.name=local", "eval.finetune.epochs=1"])
    config.load(path, ["algorithm.name=local", "eval.finetune.epochs=0"])  # off: fine
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "raysim.cli",
            "validate",
            path,
            "--set",
            "algorithm.name=local",
            "--set",
            "eval.finetune.epochs=1",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "eval.finetune" in line and "fedavg" in line and "Traceback" not in proc.stderr
    with pytest.raises(ScenarioError, match="eval.finetune.lr_source: 'last' is not allowed"):
        config.load(path, ["eval.finetune.lr_source=last"])
    with pytest.raises(ScenarioError, match="eval.finetune.speed: unknown key"):
        config.load(path, ["eval.finetune.speed=1"])
