"""Ray hosts give the serial engine's numbers for the methods whose state and messages take
paths of their own, in one sweep (one Ray start):

- SCAFFOLD: a statistics phase (N), an (x, c) message, (Δy, Δc) replies, c_i kept on hosts;
- MOCHA: the statistics phase (the m tasks), one message part per client (w_t, Σ_tt, σ'),
  ``PerClient`` Δb replies, an Ω update (every 2 rounds) and the duals kept on hosts;
- FedRep: the head step then the body step (two batched jobs with masked objectives), heads
  kept on hosts, replies carrying the body only;

- FedDyn: the statistics phase (m), h_k kept on hosts, the linear and proximal constants;
- MOON: the previous local model kept on hosts, the contrastive objective's frozen models;
- FedRoD: the personal head kept on hosts, the balanced softmax with each client's prior;
- FedBN: batch-norm layers (weights and running statistics) kept on hosts, the rest averaged;
- pFedHN: each client its own group with its own θ_k, ``PerClient`` Δθ replies, the
  hypernetwork's VJP on the server;
- FedAvg under privacy with adaptive clipping: clipped updates summed on hosts, the round's
  bound sent with each ``train`` call, the server's noise and its next bound;
- FedAvg with top-k uploads and error feedback: the remainders kept on hosts;
- FedAvg with DP-SGD (``privacy.level: sample``): the settings set in every host's algorithm,
  each job's noise from its client's generator, the server's count of each client's rounds;
- FedLC: each client's calibration from its own label counts (a job constant);
- FedNTD: the received global model as the distillation's frozen teacher (a job constant);
- AFL: a statistics round over every client each round, each client's λ_k its own group's
  part, and the clients scored with the average of the iterates (an evaluation group);
- TERM: a statistics round over the round's sampled clients, their tilted weights as parts;

each also scoring its clients' validation split (``val_*``, the summary's ``val_best_round`` and
``test_at_val_best_*``). The Ray runs go one after another, each finished run's host actors
serving the next run asking the same hosts (``ray_engine.reuse_hosts``); FedBN asks other CPUs,
so it and the run after it start hosts of their own.
"""

import json

import pytest

from tests.conftest import TINY, write_scenario
from tests.test_runs import raysim

SWEEP = """
sweep:
  scaffold: {algorithm.name: scaffold}
  mocha: {algorithm: {name: mocha, lam: 0.03, omega_every: 2}}
  fedrep: {algorithm: {name: fedrep, head_epochs: 2, lr: 0.1, batch_size: 16}, model: {name: mlp, hidden: [8]}}
  feddyn: {algorithm.name: feddyn}
  moon: {algorithm.name: moon, model: {name: mlp, hidden: [8]}}
  fedrod: {algorithm.name: fedrod, model: {name: mlp, hidden: [8]}}
  fedbn: {algorithm.name: fedbn, model: {name: mlp, hidden: [8], norm: batch}, resources.cpus_per_host: 0.4}
  pfedhn: {algorithm.name: pfedhn}
  dp-adaptive: {privacy: {clip: 0.05, noise_multiplier: 1.0, target_quantile: 0.5, count_noise: 2}}
  topk-ef: {communication: {compress: topk, ratio: 0.3, error_feedback: true}}
  dp-sgd: {privacy: {level: sample, clip: 0.5, noise_multiplier: 1.0}}
  fedlc: {algorithm.name: fedlc, model: {name: mlp, hidden: [8]}}
  fedntd: {algorithm.name: fedntd, model: {name: mlp, hidden: [8]}}
  afl: {algorithm: {name: afl, lambda_lr: 0.5}}
  term: {algorithm: {name: term, t: 2.0}}
"""


@pytest.mark.ray
def test_stateful_methods_on_three_ray_hosts_equal_the_serial_engine(tmp_path):
    text = (
        TINY.replace("rounds: 3", "rounds: 4").replace(
            "max_samples: 80", "max_samples: 80\n  splits: {train: 0.6, val: 0.2, test: 0.2}"
        )
        + SWEEP
        + (f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\ncheckpoint: {{dir: '{tmp_path}/ck'}}\n")
    )
    path = write_scenario(tmp_path, text)
    out = {}
    said = {}
    for name, extra in (("ray", ("--set", "resources.hosts=3")), ("serial", ("--engine", "serial"))):
        said[name] = raysim(
            "run", path, "-q", "--concurrent", "1", "--summary", str(tmp_path / f"{name}.json"), *extra
        ).stderr
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())["variants"]
    # hosts started (Ray itself by the sweep, before its runs): the first run's, FedBN's (other
    # CPUs) and pFedHN's (the parked ones have FedBN's shape); the other twelve took the last run's.
    # Host 0 runs in the driver's process, so each run has two actors
    boots = [ln.split("raysim: ")[-1] for ln in said["ray"].splitlines() if "host actor" in ln]
    three = "2 host actors (host 0 in this process) ..."
    assert boots == (
        [f"starting {three}"]
        + [f"reusing the previous run's {three}"] * 5
        + [f"starting {three}"] * 2
        + [f"reusing the previous run's {three}"] * 7
    )
    assert sorted(out["ray"]) == sorted(out["serial"]) and len(out["ray"]) == 15
    for variant, serial in out["serial"].items():
        on_ray = out["ray"][variant]
        assert on_ray["final"] == serial["final"], variant
        # (a private variant logs no train_loss)
        assert [h.get("train_loss") for h in on_ray["history"]] == [h.get("train_loss") for h in serial["history"]], (
            variant
        )
        assert serial["final"]["accuracy"] > 0.5, variant  # binary labels: they learned something
        assert serial["final"]["val_accuracy"] != serial["final"]["accuracy"], variant
        assert serial["final"]["val_best_round"] in (1, 2, 3, 4), variant
    # the adaptive bound, moved by the server's noisy count, reached the Ray hosts round by round
    bounds = [h["dp_clip"] for h in out["ray"]["dp-adaptive"]["history"]]
    assert bounds == [h["dp_clip"] for h in out["serial"]["dp-adaptive"]["history"]] and len(set(bounds)) == 4
    assert [h["upload_bytes"] for h in out["ray"]["topk-ef"]["history"]] == [
        h["upload_bytes"] for h in out["serial"]["topk-ef"]["history"]
    ]
    eps = [h["dp_epsilon"] for h in out["ray"]["dp-sgd"]["history"]]
    assert eps == [h["dp_epsilon"] for h in out["serial"]["dp-sgd"]["history"]] and 0 < eps[0] < eps[-1]
