"""Named parameter groups (raysim/core/groups.py) and batch norm's running statistics as client
state (raysim/core/norm.py): which indices each group names on small models, the scenario's
``model.head`` override and its errors, and the loop leaving non-trainable tensors to the
forward pass."""

import pytest
import torch
from torch import nn

from raysim import cli
from raysim.core.data import ClientData, Context
from raysim.core.forward import params_of
from raysim.core.groups import groups_of
from raysim.core.loop import Settings, Supervised, Trainer, make_job
from raysim.core.norm import BatchNorm1d
from raysim.core.tasks import TASKS
from raysim.models import LSTMParams, MLPParams, mlp, next_char_lstm
from tests.conftest import TINY, write_scenario


def test_an_mlp_has_its_last_linear_layer_as_head_and_the_rest_as_body():
    g = groups_of(mlp(MLPParams((6, 5)), (4,), 3))  # Flatten, Linear 4-6, ReLU, Linear 6-5, ReLU, Linear 5-3
    assert g.names == ("1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias")
    assert g.head == (4, 5) and g.body == (0, 1, 2, 3) and g.stats == ()
    assert g.layers == {"1": (0, 1), "3": (2, 3), "5": (4, 5)}
    assert g.of("3") == (2, 3) and g.of("3.bias") == (3,) and g.of("all") == tuple(range(6))
    assert g.mask("head") == (False, False, False, False, True, True)


def test_the_head_override_takes_a_layer_count_or_names():
    model = mlp(MLPParams((6, 5)), (4,), 3)
    assert groups_of(model, 2).head == (2, 3, 4, 5) and groups_of(model, 2).body == (0, 1)
    assert groups_of(model, ["3", "5"]).head == (2, 3, 4, 5)
    assert groups_of(model, ["5.weight"]).head == (4,)  # a single parameter: the bias is body
    assert groups_of(model, 3).body == ()  # all head: allowed, a split method refuses it
    with pytest.raises(ValueError, match=r"model.head: 'fc' is not a layer or parameter of the model; layers: 1, 3, 5"):
        groups_of(model, ["fc"])
    with pytest.raises(ValueError, match=r"model.head: 4 layers; the model has 3 layers with parameters"):
        groups_of(model, 4)


def test_a_module_names_its_own_head_and_lstm_layers_group_by_module():
    lstm = next_char_lstm(LSTMParams(hidden=4, layers=2), (5,), 7, 7)
    g = groups_of(lstm)
    assert [g.names[i] for i in g.head] == ["out.weight", "out.bias"]
    assert len(g.of("lstm")) == 8 and g.of("embed") == (0,)
    object.__setattr__(lstm, "raysim_head", ("lstm", "out"))
    assert groups_of(lstm).body == (0,)


def test_pick_and_merge_replace_exactly_the_groups_tensors():
    g = groups_of(mlp(MLPParams((6,)), (4,), 3))
    params = [torch.full((1,), float(i)) for i in range(4)]
    assert [float(t) for t in g.pick(params, "head")] == [2.0, 3.0]
    merged = g.merge(params, "body", [torch.tensor([-1.0]), torch.tensor([-2.0])])
    assert [float(t) for t in merged] == [-1.0, -2.0, 2.0, 3.0]
    assert merged[2] is params[2]
    with pytest.raises(ValueError, match="1 tensors for a group of 2"):
        g.merge(params, "head", [params[0]])


def test_the_scenarios_model_head_is_checked_at_validation(tmp_path, capsys):
    path = write_scenario(tmp_path, TINY.replace("model: {name: linear}", "model: {name: mlp, hidden: [8]}"))
    assert cli.main(["validate", path, "--set", 'model.head=["1"]']) == 0
    capsys.readouterr()
    assert cli.main(["validate", path, "--set", 'model.head=["fc"]']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"raysim: {path}: model.head: 'fc' is not a layer or parameter of the model; layers: 1, 3"]


def _bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _client(cid, x, y):
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


def test_running_statistics_are_a_group_that_the_loop_never_trains_and_the_forward_pass_updates():
    model = _bn_model()
    g = groups_of(model)
    assert [g.names[i] for i in g.stats] == ["1.running_mean", "1.running_var"]
    assert g.stats[0] in g.body  # the body's statistics travel with the body
    trainer = Trainer(model, "never")
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)) * 2 + 1
    y = torch.tensor([0, 1] * 4)
    start = params_of(model)
    # one full batch, one step: the running mean moves by momentum 0.1 towards the batch mean of
    # the BN layer's input, and the weight decay (which would shrink any trained tensor) leaves it alone
    settings = Settings(lr=0.5, epochs=1, batch_size=8, weight_decay=0.5)
    ctx = Context(0, 1, 0, torch.Generator().manual_seed(2))
    (fit,) = trainer.fit([make_job(start, _client(0, x, y), ctx, settings, Supervised(TASKS["classification"]))])
    h = x @ start[0].T + start[1]
    assert torch.allclose(fit.params[2 + 2], 0.9 * start[4] + 0.1 * h.mean(0), atol=1e-6)
    assert torch.allclose(fit.params[2 + 3], 0.9 * start[5] + 0.1 * h.var(0, unbiased=True), atol=1e-5)
    assert not torch.equal(fit.params[0], start[0])  # the weights did train
    # the scratch model's own statistics are untouched: every client keeps its own
    assert torch.equal(model[1].running_mean, torch.zeros(4))
    # evaluation uses the job's statistics
    out = trainer.outputs([fit.params], x)[0]
    model.eval()
    with torch.no_grad():
        ref = torch.func.functional_call(model, dict(zip(g.names, fit.params)), (x,))
    assert torch.equal(out, ref)
    model[1].running_mean.data.fill_(5.0)
    assert torch.equal(trainer.outputs([list(fit.params)], x)[0], out)
