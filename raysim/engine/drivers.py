"""The driver a scenario needs: the server's round driver, the asynchronous server (FedBuff,
FedAsync) when its fleet aggregates asynchronously, or the gossip scheduler when the scenario
has a topology."""

from __future__ import annotations

from raysim.engine.driver import RoundDriver, Transport
from raysim.scenario.config import Scenario


def make_driver(sc: Scenario, transport: Transport, source=None) -> RoundDriver:
    if sc.systems is not None and sc.systems.aggregation != "sync":
        from raysim.engine.asynchronous import AsyncDriver

        return AsyncDriver(sc, transport, source)
    if sc.topology is None:
        return RoundDriver(sc, transport, source)
    # imported here: the graph libraries (networkx, scipy.sparse) cost every process that
    # loads the engine (each host actor) a third of a second, and only gossip needs them
    from raysim.engine.gossip import GossipDriver

    return GossipDriver(sc, transport, source)
