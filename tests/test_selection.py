"""Server-driven selection and per-group messages through the engine: an algorithm picks who
trains in which group; each host receives the shared part and only its clients' groups' parts."""

from dataclasses import dataclass

import pytest
import torch

import raysim.algorithms as algorithms
from raysim import rng
from raysim.algorithms.base import Algorithm, LocalTraining, Message, PerClient
from raysim.engine.serial import message_nbytes, parts_for, serial_driver
from raysim.scenario import config
from tests.conftest import TINY, write_scenario


@dataclass(frozen=True)
class EchoHyper(LocalTraining):
    pass


class GroupEcho(Algorithm):
    """Selects every third candidate into group cid % 3 from round 1 on (round 0: the scenario's
    draw, group 0); each group's part is a tensor holding its group id. Clients echo what they
    saw, keyed by client id."""

    name = "group-echo"
    Hyper = EchoHyper

    def init_server(self, rng):
        return {}

    def select(self, server, round_, sampled, candidates, rng):
        if round_ == 0:
            return super().select(server, round_, sampled, candidates, rng)
        return {int(c): int(c) % 3 for c in candidates if rng.random() < 0.5}

    def message(self, server, round_):
        return Message(torch.tensor([100.0]), {g: torch.tensor([float(g)]) for g in range(3)})

    def aggregate(self, server, reduced, round_):
        return dict(reduced or {})

    def train(self, state, received, data, ctx):
        part = None if received.part is None else float(received.part)
        return state, PerClient({ctx.cid: (ctx.group, part, float(received.shared))}), 0.0

    def evaluate(self, state, received, data, ctx):
        return {}


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(algorithms.REGISTRY, GroupEcho.name, GroupEcho)


def test_selection_decides_who_trains_and_in_which_group(tmp_path, echo):
    sc = config.load(write_scenario(tmp_path, TINY), ["algorithm={name: group-echo}", "rounds=2"])
    d = serial_driver(sc, 2)
    d.step()
    assert all(v == (0, 0.0, 100.0) for v in d.server_state.values())  # default: group 0
    assert len(d.server_state) == 6  # the scenario's 50 %
    d.step()
    seen = d.server_state
    g = rng.generator(sc.seed, "select", 1)  # the engine's derived draw for round 1
    expect = [c for c in range(12) if g.random() < 0.5]
    assert sorted(seen) == expect
    for c, (group, part, shared) in seen.items():
        assert group == c % 3 and part == float(c % 3) and shared == 100.0
    assert d.history[-1]["clients"] == len(expect)


def test_a_host_gets_only_the_parts_its_clients_need():
    msg = Message(torch.zeros(10), {0: torch.zeros(4), 1: torch.zeros(2), 2: torch.zeros(1)})
    by_host = [{0: 0, 2: 2, 4: 1}, {3: 0}, {}]
    assert sorted(parts_for(msg, by_host[0])) == [0, 1, 2] and sorted(parts_for(msg, by_host[1])) == [0]
    assert parts_for(msg, by_host[2]) == {}
    # bytes down: the shared part to the 2 busy hosts (2 x 40), parts 0+1+2 to host 0 (28), part 0 to host 1 (16)
    assert message_nbytes(msg, by_host) == 2 * 40 + 28 + 16
