"""The driver a scenario needs: the server's round driver, or the gossip scheduler when the
scenario has a topology."""
from __future__ import annotations

from raysim.config import Scenario
from raysim.engine.driver import RoundDriver, Transport
from raysim.engine.gossip import GossipDriver


def make_driver(sc: Scenario, transport: Transport) -> RoundDriver:
    return GossipDriver(sc, transport) if sc.topology is not None else RoundDriver(sc, transport)
