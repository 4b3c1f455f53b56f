"""Client-level differential privacy (DP-FedAvg, raysim/federation/privacy.py): clipping and noise on
numbers checked by hand, the accountant against dp_accounting's own composition, the same run on
any number of hosts, a private run that learns, and the scenarios it refuses."""

import json
import math

import numpy as np
import pytest
import torch

from raysim import cli
from raysim.core.replies import Accumulator, Weighted
from raysim.experiment.runner import run as run_scenario
from raysim.federation import privacy
from raysim.scenario import config
from tests.conftest import ROOT, TINY, write_scenario
from tests.test_bad_inputs import run_refused


def test_clip_scales_an_update_above_the_bound_to_norm_c_and_leaves_one_below_as_it_is():
    shared = [torch.tensor([1.0, 2.0]), torch.tensor([0.5]), torch.tensor([3])]  # the last: not a float
    reply = Weighted([torch.tensor([4.0, 2.0]), torch.tensor([4.5]), torch.tensor([9])], 7.0)
    # Δ = (3, 0), (4): norm 5; clipped to 1: (0.6, 0), (0.8); the integer tensor sends nothing
    out = privacy.clip(reply, shared, 1.0, count=True, norm=True)
    assert out.norm == 5.0 and out.below == -0.5 and out.update.weight == 1.0  # every client weighs the same
    assert torch.allclose(out.update.values[0], torch.tensor([0.6, 0.0]))
    assert torch.allclose(out.update.values[1], torch.tensor([0.8]))
    assert torch.equal(out.update.values[2], torch.zeros(1))
    kept = privacy.clip(reply, shared, 10.0, count=True, norm=True)  # within the bound: b − ½ = +½
    assert kept.below == 0.5 and kept.norm == 5.0
    assert torch.equal(kept.update.values[0], torch.tensor([3.0, 0.0])) and torch.equal(
        kept.update.values[1], torch.tensor([4.0])
    )
    # by default only the clipped update leaves the host: no count, no norm
    plain = privacy.clip(reply, shared, 1.0)
    assert plain.below is None and plain.norm is None
    assert torch.equal(plain.update.values[0], out.update.values[0])


def test_a_clients_count_term_moves_the_sum_by_half_so_adaptive_epsilon_is_the_fixed_ones():
    """Andrew et al.'s Theorem 1 holds for the centred count b_k − ½ (one client moves the sum by
    ½); with raw b_k ∈ {0, 1} it moves by 1 and the two mechanisms together are weaker than z."""
    from raysim.scenario.sections import PrivacyCfg

    shared, reply = [torch.zeros(2)], Weighted([torch.tensor([3.0, 4.0])], 1.0)
    terms = {privacy.clip(reply, shared, c, count=True).below for c in (1.0, 10.0)}
    assert max(terms) - min(terms) == 1.0 and terms == {-0.5, 0.5}  # |term| = ½: add/remove moves it by ½
    cfg = PrivacyCfg(noise_multiplier=1.0, target_quantile=0.5, count_noise=0.6)
    # by hand: z_Δ = (1 − 1.2^-2)^-1/2 = 1.8091; (z_Δ^-2 + (0.6/0.5)^-2)^-1/2 = 1
    assert privacy.update_multiplier(cfg, 10) == pytest.approx(1.80907, abs=1e-5)
    assert privacy.accountant_multiplier(cfg, 10) == pytest.approx(1.0, abs=1e-12)
    # the example: raw counts (sensitivity 1) would make it (1.8091^-2 + 0.6^-2)^-1/2 = 0.569,
    # ε ≈ 26 against 7.9 at q = 0.1, 100 rounds, δ = 1e-5
    raw = (privacy.update_multiplier(cfg, 10) ** -2 + 0.6**-2) ** -0.5
    assert raw == pytest.approx(0.5695, abs=1e-4)
    assert privacy.epsilon(100, 100, 10, 1.0, 1e-5, "poisson") == pytest.approx(7.9, abs=0.1)
    assert privacy.epsilon(100, 100, 10, raw, 1e-5, "poisson") == pytest.approx(26, abs=1.5)
    assert privacy.accountant_multiplier(PrivacyCfg(noise_multiplier=1.3), 10) == 1.3  # fixed C: z


def test_the_server_adds_noise_of_std_z_times_c_to_the_sum_and_divides_by_the_sampled_count():
    # three clients' clipped updates summed by the reduction, as hosts and server do
    acc = Accumulator()
    for delta, norm in ((0.25, 0.5), (0.5, 2.0), (0.5, 3.5)):
        acc.add(privacy.ClippedUpdate(Weighted([torch.full((20000,), delta)], 1.0), 0.5 - float(norm > 0.5), norm))
    reduced = acc.result()
    shared = [torch.ones(20000)]
    k, bound, z = 4, 0.5, 2.0  # K = 4 sampled: a fixed denominator, whoever replied
    quiet, metrics = privacy.privatize(reduced, shared, k, bound, 0.0, seed=0, round_=3)
    assert torch.equal(quiet.mean()[0], torch.full((20000,), 1 + 1.25 / 4))  # 1 + (0.25 + 0.5 + 0.5) / 4
    assert metrics == {"dp_clipped": float(np.float32(2 / 3)), "dp_update_norm": 2.0}  # in float32
    plain = Accumulator()
    plain.add(privacy.ClippedUpdate(Weighted([torch.full((20000,), 0.25)], 1.0)))
    assert privacy.privatize(plain.result(), shared, k, bound, 0.0, seed=0, round_=3)[1] == {}  # nothing exact
    noisy, _ = privacy.privatize(reduced, shared, k, bound, z, seed=0, round_=3)
    noise = (noisy.values[0] - 1) * k - 1.25  # back to the noise on the sum
    assert abs(float(noise.mean())) < 0.03 and abs(float(noise.std()) - z * bound) < 0.02  # std z·C = 1
    again, _ = privacy.privatize(reduced, shared, k, bound, z, seed=0, round_=3)
    other, _ = privacy.privatize(reduced, shared, k, bound, z, seed=0, round_=4)
    assert torch.equal(again.values[0], noisy.values[0]) and not torch.equal(other.values[0], noisy.values[0])


def test_epsilon_grows_with_rounds_falls_with_noise_and_the_poisson_statement_is_the_smaller():
    eps = [privacy.epsilon(r, 1000, 10, 1.0, 1e-5, "sampled") for r in (1, 10, 100)]
    assert eps[0] < eps[1] < eps[2]
    assert privacy.epsilon(100, 1000, 10, 2.0, 1e-5, "sampled") < eps[2]
    # replacing a client moves the sum by up to 2C, adding one by C: the literature's figure is smaller
    assert privacy.epsilon(100, 1000, 10, 1.0, 1e-5, "poisson") < eps[2]
    # Abadi et al.'s MNIST setting (q = 0.01, σ = 4, 10 000 steps, δ = 1e-5): about 1.04 by RDP
    # (their moments accountant said 1.26, a looser bound)
    assert privacy.epsilon(10000, 10000, 100, 4.0, 1e-5, "poisson") == pytest.approx(1.035, abs=0.005)
    assert math.isinf(privacy.epsilon(10, 100, 10, 0.0, 1e-5, "sampled"))
    assert privacy.default_delta(100) == pytest.approx(100**-1.1)


def test_supported_methods_are_those_that_reply_with_the_averaged_model():
    import raysim.algorithms as algorithms

    fits = {n for n, a in algorithms.REGISTRY.items() if a.averages_one_model()}
    assert {"fedavg", "fedprox", "ditto", "apfl"} <= fits
    assert not fits & {"scaffold", "fedem", "ifca", "fedbn", "local", "feddyn", "pfedme"}


DIGITS = ROOT / "scenarios" / "quickstart.yaml"


def private_run(tmp_path, name, *overrides):
    sc = config.load(
        DIGITS,
        [
            "rounds=30",
            "eval.every=10",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
            f"checkpoint.dir={tmp_path}/ck",
            "checkpoint.every=0",
            *overrides,
        ],
    )
    return run_scenario(sc, engine="serial", progress=False)


def test_dp_fedavg_learns_digits_logs_epsilon_each_round_and_noise_costs_accuracy(tmp_path):
    clip_only = private_run(tmp_path, "c", "privacy.clip=0.5", "privacy.noise_multiplier=0")
    private = private_run(tmp_path, "p", "privacy.clip=0.5", "privacy.noise_multiplier=3")
    drowned = private_run(tmp_path, "d", "privacy.clip=0.5", "privacy.noise_multiplier=20")
    acc = {n: s["final"]["accuracy"] for n, s in (("clip", clip_only), ("dp", private), ("drowned", drowned))}
    # 10 classes: chance is 0.1 (here, seed 0: 0.86 clipped only, 0.72 at ε 16, 0.20 at z = 20)
    assert acc["clip"] > 0.8 and acc["dp"] > 0.6
    assert acc["dp"] < acc["clip"] - 0.05 and acc["drowned"] < 0.35
    hist = private["history"]
    n = 50  # all 50 clients train, 25 a round
    want = [privacy.epsilon(h["round"], n, 25, 3.0, n**-1.1, "sampled") for h in hist]
    assert [h["dp_epsilon"] for h in hist] == pytest.approx(want, rel=1e-12)
    # nothing computed exactly from the clients' training data is logged beside the private model
    assert not any({"train_loss", "dp_clipped", "dp_update_norm"} & set(h) for h in hist), hist[-1]
    assert "dp_epsilon" not in clip_only["history"][-1]  # no noise: no guarantee to report


def one_host_and_three(tmp_path, privacy_section: str) -> dict:
    """TINY (4 rounds) with ``privacy_section`` on the serial engine's 1 host and 3: the summaries,
    after checking their final metrics and train losses are the same."""
    text = TINY.replace("rounds: 3", "rounds: 4") + (
        f"tracking: {{uri: 'sqlite:///{tmp_path}/m.db'}}\ncheckpoint: {{every: 0, dir: '{tmp_path}/ck'}}\n"
        f"privacy: {privacy_section}\n"
    )
    path = write_scenario(tmp_path, text)
    out = {}
    for hosts in (1, 3):
        summary = tmp_path / f"h{hosts}.json"
        assert (
            cli.main(
                [
                    "run",
                    path,
                    "--engine",
                    "serial",
                    "-q",
                    "--set",
                    f"resources.hosts={hosts}",
                    "--summary",
                    str(summary),
                ]
            )
            == 0
        )
        out[hosts] = json.loads(summary.read_text())
    assert out[1]["final"] == out[3]["final"]

    def logged(h):  # every metric but the timings and the bytes between hosts and server
        return {k: v for k, v in h.items() if not k.endswith("_seconds") and not k.startswith("bytes_")}

    assert [logged(h) for h in out[1]["history"]] == [logged(h) for h in out[3]["history"]]
    return out


def test_a_private_run_is_the_same_on_one_host_or_three_every_logged_metric_included(tmp_path):
    out = one_host_and_three(tmp_path, "{clip: 0.05, noise_multiplier: 0.7, debug_exact_metrics: true}")
    last = out[1]["history"][-1]
    assert last["dp_clipped"] > 0 and last["dp_update_norm"] > 0  # the bound bites: clipping is exercised
    assert math.isinf(last["dp_epsilon"]) and 0 < last["dp_epsilon_model"] < math.inf  # ε says it is debugging
    assert all(math.isfinite(h["train_loss"]) for h in out[1]["history"])


@pytest.mark.parametrize(
    "extra,key,says",
    [
        (
            "algorithm: {name: scaffold, lr: 0.1}",
            "algorithm.name",
            "does not reply with the one model the server averages",
        ),
        ("topology: {kind: ring}", "privacy", "leave the topology out"),
        ("systems: {dropout: 0.1}", "privacy", "leave systems out"),
        ("algorithm: {name: fedavg, lr: 0.1, track_variance: true}", "algorithm.track_variance", "leave it false"),
    ],
)
def test_privacy_is_refused_where_its_guarantee_would_not_hold(tmp_path, capsys, extra, key, says):
    text = TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}\n", "")
    if "topology" in extra:
        text = text.replace("sampling: {fraction: 0.5}\n", "")
    if "algorithm" not in extra:
        text += "algorithm: {name: fedavg, lr: 0.1}\n"
    path = write_scenario(tmp_path, text + extra + "\nprivacy: {clip: 1.0}\n")
    line = run_refused(capsys, tmp_path, path)
    assert f": {key}: " in line and says in line, line


def test_privacy_options_are_checked_by_name_and_range(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY + "privacy: {clip: 0, noise_multiplier: 1.0}\n")
    line = run_refused(capsys, tmp_path, path)
    assert "privacy.clip" in line, line
    path = write_scenario(tmp_path, TINY + "privacy: {clip: 1.0, accounting: gdp}\n")
    line = run_refused(capsys, tmp_path, path)
    assert "privacy.accounting" in line and "sampled" in line and "poisson" in line, line
    np.testing.assert_equal(
        config.load(write_scenario(tmp_path, TINY + "privacy: {}\n")).privacy, config.PrivacyCfg(accounting="sampled")
    )


def test_a_private_run_crashed_after_round_two_resumes_to_the_uninterrupted_runs_numbers(tmp_path):
    from tests.test_runs import raysim, summary_of, tracked

    path = tracked(
        tmp_path,
        TINY.replace("rounds: 3", "rounds: 5")
        + "privacy: {clip: 0.05, noise_multiplier: 1.5, target_quantile: 0.5, count_noise: 2}\n",
    )
    full = summary_of(tmp_path, path, "--engine", "serial", name="full.json")
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1 and "injected failure after round 2" in proc.stderr
    failed = proc.stderr.split("--resume ")[-1].split()[0]
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", failed, name="resumed.json")
    assert resumed["final"] == full["final"]  # the noise of rounds 3..5 drawn again, the same
    keys = ("dp_epsilon", "dp_unclipped_share", "dp_clip")  # C adapted, restored
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [{k: h[k] for k in keys} for h in full["history"]]


def test_adaptive_clipping_moves_c_geometrically_towards_the_target_share_of_unclipped_updates():
    from raysim.scenario.sections import PrivacyCfg

    cfg = PrivacyCfg(clip=1.0, target_quantile=0.5, clip_lr=0.2, count_noise=1e-12)
    # 3 of K = 4 within C: b = 0.75 > γ, C shrinks by exp(-0.2 · 0.25)
    # (the hosts sum b_k − ½: 3 · ½ − ½ = 1)
    c, share = privacy.next_clip(1.0, 1.0, 4, cfg, seed=0, round_=0)
    assert share == pytest.approx(0.75) and c == pytest.approx(math.exp(-0.05))
    c, share = privacy.next_clip(2.0, -2.0, 4, cfg, seed=0, round_=0)  # all clipped: C grows
    assert c == pytest.approx(2.0 * math.exp(0.1))
    # a count noise far above K cannot overflow the step: log C moves by at most MAX_LOG_STEP
    huge = PrivacyCfg(clip=1.0, target_quantile=0.5, clip_lr=10.0, count_noise=1e9)
    c, _ = privacy.next_clip(1.0, 0.0, 4, huge, seed=0, round_=0)
    assert 0 < c < math.inf and abs(math.log(c)) == privacy.MAX_LOG_STEP
    # the count's noise takes a share of z's budget: z_Δ = (z^-2 - (2σ_b)^-2)^-1/2
    both = PrivacyCfg(noise_multiplier=1.0, target_quantile=0.5, count_noise=2.0)
    assert privacy.update_multiplier(both, 40) == pytest.approx((1 - 1 / 16) ** -0.5)
    assert privacy.update_multiplier(PrivacyCfg(noise_multiplier=1.0), 40) == 1.0  # fixed C: all of z
    assert privacy.count_std(PrivacyCfg(target_quantile=0.5), 40) == 2.0  # K/20
    with pytest.raises(ValueError, match="must exceed noise_multiplier / 2 = 1.5"):
        privacy.update_multiplier(PrivacyCfg(noise_multiplier=3.0, target_quantile=0.5, count_noise=1.0), 40)


def test_adaptive_clipping_finds_the_update_norms_from_a_c_far_below_them_and_learns_at_the_same_epsilon(tmp_path):
    extra = ["privacy.clip=0.05", "privacy.noise_multiplier=1.0", "sampling.fraction=1.0", "rounds=40"]
    fixed = private_run(tmp_path, "f", *extra)
    adaptive = private_run(tmp_path, "a", *extra, "privacy.target_quantile=0.5", "privacy.debug_exact_metrics=true")
    last = adaptive["history"][-1]
    # seed 0: C grows from 0.05 to 0.44, the mean norm being 0.42; accuracy 0.55 fixed, 0.84 adaptive
    assert 0.5 * last["dp_update_norm"] < last["dp_clip"] < 2 * last["dp_update_norm"]
    assert adaptive["final"]["accuracy"] > fixed["final"]["accuracy"] + 0.15
    # the count's noise is inside z's budget: the two sums' multiplier is z (to rounding)
    assert last["dp_epsilon_model"] == pytest.approx(fixed["history"][-1]["dp_epsilon"], rel=1e-9)
    assert all(h["dp_clip"] == 0.05 for h in fixed["history"])


def test_a_count_noise_that_leaves_the_updates_no_noise_is_refused(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY + "privacy: {noise_multiplier: 2.0, target_quantile: 0.5}\n")
    line = run_refused(capsys, tmp_path, path)  # K = 6: σ_b = 0.3 by default, below z/2 = 1
    assert "privacy.count_noise" in line and "must exceed noise_multiplier / 2 = 1" in line and "K = 6" in line, line
