"""Server optimizers (Reddi et al., ICLR 2021, Algorithm 2): one FedAdam and one FedYogi step
against the formulas by hand, FedAvgM with momentum 0 and lr 1 equal to FedAvg bit for bit, the
optimizer state through a checkpoint, validation, and FedAdam/FedYogi on a Dirichlet digits split."""

from types import SimpleNamespace

import pytest
import torch

from raysim.core import server_opt
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import TINY, write_scenario


def cfg(name, **kw):
    base = dict(optimizer=name, lr=0.1, momentum=0.9, beta1=0.9, beta2=0.99, tau=1e-3)
    base.update(kw)
    return SimpleNamespace(**base)


OLD = [torch.tensor([1.0, -2.0])]
NEW = [torch.tensor([1.5, -2.25])]  # Δ = (0.5, -0.25)


def test_one_fedadam_step_by_hand():
    c = cfg("adam")
    state = server_opt.init_state(c, OLD)
    assert torch.equal(state["v"][0], torch.full((2,), 1e-6))  # v₋₁ = τ²
    # m = 0.1·Δ = (0.05, -0.025); v = 0.99·1e-6 + 0.01·Δ² = (0.00250099, 0.00062599)
    got, st = server_opt.step(c, state, OLD, NEW)
    m = [0.05, -0.025]
    v = [0.99e-6 + 0.01 * 0.25, 0.99e-6 + 0.01 * 0.0625]
    want = [1.0 + 0.1 * m[0] / (v[0] ** 0.5 + 1e-3), -2.0 + 0.1 * m[1] / (v[1] ** 0.5 + 1e-3)]
    assert torch.allclose(got[0], torch.tensor(want), atol=1e-6)
    assert torch.allclose(st["m"][0], torch.tensor(m)) and torch.allclose(st["v"][0], torch.tensor(v))
    # about η·sign(Δ)·0.1/√0.01 ≈ 0.1 each way: x = (1.0980, -2.0961)
    assert torch.allclose(got[0], torch.tensor([1.09804, -2.09612]), atol=1e-4)


def test_one_fedyogi_step_by_hand_from_a_given_state():
    c = cfg("yogi", lr=0.01)
    # v = (0.9, 1e-6): coordinate 0 has v > Δ² = 0.25 (v shrinks), coordinate 1 v < Δ² (v grows)
    state = {"m": [torch.tensor([0.2, 0.0])], "v": [torch.tensor([0.9, 1e-6])]}
    got, st = server_opt.step(c, state, OLD, NEW)
    m = [0.9 * 0.2 + 0.1 * 0.5, 0.1 * -0.25]  # (0.23, -0.025)
    v = [0.9 - 0.01 * 0.25 * 1.0, 1e-6 - 0.01 * 0.0625 * -1.0]  # (0.8975, 0.000626)
    want = [1.0 + 0.01 * m[0] / (v[0] ** 0.5 + 1e-3), -2.0 + 0.01 * m[1] / (v[1] ** 0.5 + 1e-3)]
    assert torch.allclose(st["v"][0], torch.tensor(v), atol=1e-9)
    assert torch.allclose(st["m"][0], torch.tensor(m))
    assert torch.allclose(got[0], torch.tensor(want), atol=1e-6)
    # Adam from the same state shrinks v by 1 % of itself, Yogi by 1 % of Δ²: 0.8935 vs 0.8975
    _, adam = server_opt.step(cfg("adam", lr=0.01), state, OLD, NEW)
    assert abs(float(adam["v"][0][0]) - 0.8935) < 1e-7


def test_fedavgm_step_by_hand():
    c = cfg("sgd", lr=0.5, momentum=0.9)
    state = {"m": [torch.tensor([0.1, 0.1])], "v": []}
    got, st = server_opt.step(c, state, OLD, NEW)
    assert torch.allclose(st["m"][0], torch.tensor([0.59, -0.16]))  # v ← βv + Δ
    assert torch.allclose(got[0], torch.tensor([1.295, -2.08]))  # x ← x + η v


# -- through the engine ------------------------------------------------------------------------
def scenario(tmp_path, *overrides):
    return config.load(write_scenario(tmp_path, TINY), list(overrides))


def rounds(d, n):
    for _ in range(n):
        d.step()
    return d


def strip(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k} for h in history]


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_fedavgm_with_momentum_0_and_lr_1_is_the_method_bit_for_bit(tmp_path, name):
    plain = rounds(serial_driver(scenario(tmp_path, f"algorithm.name={name}"), 2), 3)
    m0 = rounds(
        serial_driver(
            scenario(tmp_path, f"algorithm.name={name}", "server.optimizer=sgd", "server.momentum=0", "server.lr=1"), 2
        ),
        3,
    )
    assert strip(m0.history) == strip(plain.history)
    a, b = (plain.algo.server_params(plain.server_state), m0.algo.server_params(m0.server_state))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # and a real momentum changes the run
    m9 = rounds(serial_driver(scenario(tmp_path, f"algorithm.name={name}", "server.optimizer=sgd"), 2), 3)
    assert strip(m9.history) != strip(plain.history)


@pytest.mark.parametrize("name,opt", [("fedavg", "yogi"), ("fedper", "adam")])
def test_the_optimizer_state_survives_a_checkpoint(tmp_path, name, opt):
    extra = ["model.name=mlp", "model.hidden=[8]"] if name == "fedper" else []
    sc = scenario(tmp_path, f"algorithm.name={name}", f"server.optimizer={opt}", "rounds=4", *extra)
    full = rounds(serial_driver(sc, 2), 4)
    part = rounds(serial_driver(sc, 2), 2)
    assert float(part.server_opt["m"][0].abs().sum()) > 0
    path = tmp_path / "ck"
    part.save(str(path))
    resumed = serial_driver(sc, 2)
    assert resumed.restore(str(path)) == 2
    for a, b in zip(resumed.server_opt["m"] + resumed.server_opt["v"], part.server_opt["m"] + part.server_opt["v"]):
        assert torch.equal(a, b)
    rounds(resumed, 2)
    assert strip(resumed.history) == strip(full.history)
    assert all(torch.equal(a, b) for a, b in zip(resumed.server_state, full.server_state))


def test_validation(tmp_path):
    from raysim.scenario.config import ScenarioError

    sc = scenario(tmp_path, "server.optimizer=adam")
    assert (sc.server.optimizer, sc.server.lr, sc.server.beta1, sc.server.beta2, sc.server.tau) == (
        "adam",
        None,
        0.9,
        0.99,
        1e-3,
    )
    assert server_opt.server_lr(sc.server) == 0.01
    assert scenario(tmp_path).server.optimizer == "none"
    for bad, words in (
        ("server.optimizer=rmsprop", "choose one of"),
        ("server.lr=0", "server.lr"),
        ("server.beta2=1", "server.beta2: 1.0 is out of range"),
        ("server.momentum=-1", "server.momentum"),
        ("server.tau=0", "server.tau"),
    ):
        with pytest.raises(ScenarioError, match=words):
            scenario(tmp_path, "server.optimizer=yogi", bad)
    for words, over in (
        ("no global model", ["algorithm.name=local"]),
        ("no global model", ["algorithm.name=ifca"]),
        ("needs a server", ["topology.kind=ring", "sampling.fraction=1"]),
    ):
        with pytest.raises(ScenarioError, match=words):
            scenario(tmp_path, "server.optimizer=adam", *over)


# -- end to end ----------------------------------------------------------------------------------
DIGITS = """
name: digits-server-opt
seed: 0
rounds: 15
data:
  dataset: digits
  clients: 20
  partition: {kind: dirichlet, alpha: 0.3}
model: {name: linear}
algorithm: {name: fedavg, lr: 0.05, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 1}
resources: {hosts: 2, cpus_per_host: 1}
"""


def curve(tmp_path, *overrides):
    sc = config.load(write_scenario(tmp_path, DIGITS, "digits.yaml"), list(overrides))
    return [h["accuracy"] for h in rounds(serial_driver(sc, 2), sc.rounds).history]


def test_fedadam_and_fedyogi_reach_fedavgs_accuracy_in_no_more_rounds(tmp_path):
    # Dirichlet(0.3) labels over 20 clients, half sampled, linear model, 15 rounds. Measured
    # (seed 0): FedAvg ends at 0.761 (0.8 at round 16 of 20); FedAdam and FedYogi at η = 0.03
    # pass 0.761 in round 6 and end at 0.87; at the default η = 0.01 they track FedAvg (0.708 at
    # round 15, 0.84 at round 20 against FedAvg's 0.78); η = 0.1: 0.806 in round 4. Seed 1 alike.
    fedavg = curve(tmp_path)
    target = fedavg[-1]
    assert target > 0.6, fedavg
    for opt in ("adam", "yogi"):
        acc = curve(tmp_path, f"server.optimizer={opt}", "server.lr=0.03")
        reached = next((r for r, a in enumerate(acc) if a >= target), None)
        assert reached is not None and reached < len(fedavg) // 2, (opt, acc, fedavg)
        assert acc[-1] >= target, (opt, acc, fedavg)
