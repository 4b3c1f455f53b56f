"""A host: many clients' data shards and persistent states in one long-lived process.

The same class runs in-process (serial engine) and as a Ray actor (ray_engine wraps it), so
both engines execute identical code. Clients are trained one after another, in client-id
order, and their replies are summed locally; the host sends one partial sum per round.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from algorithms.base import ClientData, Context, PerClient, state_to_tree, tree_to_state
from raysim import rng
from raysim.config import Scenario
from raysim.engine.reduce import Accumulator
from raysim.engine.trees import to_device
from raysim.setup import make_algorithm, make_source


def pick_device(gpus: float) -> torch.device:
    if gpus > 0 and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


class Host:
    def __init__(self, sc: Scenario, cids: list[int], device: str | None = None, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        self.sc = sc
        self.cids = sorted(cids)
        self.device = torch.device(device) if device else pick_device(sc.resources.gpus_per_host)
        self.source = make_source(sc)
        self.algo = make_algorithm(sc, self.source)
        self.algo.warm_up(self.source.input_shape, self.device)
        self._data: dict[int, ClientData] = {}
        self.states: dict[int, Any] = {}
        # gossip: this round's messages of the hosted clients, and their rows of W in force
        self._messages: dict[int, Any] = {}
        self._rows: dict[int, list[tuple[int, float]]] = {}

    # -- data and state ----------------------------------------------------------------------
    def data(self, cid: int) -> ClientData:
        d = self._data.get(cid)
        if d is None:
            d = self._data[cid] = self.source.client(cid).to(self.device)
        return d

    def state(self, cid: int) -> Any:
        if cid not in self.states:
            self.states[cid] = self.algo.init_client(cid, rng.generator(self.sc.seed, "client_init", cid))
        return self.states[cid]

    def context(self, round_: int, cid: int, purpose: str) -> Context:
        g = rng.torch_generator(self.sc.seed, purpose, round_, cid)
        return Context(round_, self.sc.rounds, cid, g, self.device)

    def prefetch(self) -> None:
        """Load every hosted client's shard now (at host start), so rounds only train."""
        for cid in self.cids:
            self.data(cid)

    def num_samples(self) -> dict[int, int]:
        return {c: self.source.num_samples(c) for c in self.cids}

    # -- a round -------------------------------------------------------------------------------
    def train(self, round_: int, message: Any, cids: list[int]) -> tuple[Accumulator, PerClient, float]:
        """Train the given clients (ascending id); return (sum of replies, loss per client, seconds)."""
        t0 = time.perf_counter()
        message = to_device(message, self.device)
        acc = Accumulator()
        losses = PerClient()
        cids = sorted(cids)
        results = self.algo.train_many([self.state(c) for c in cids], message, [self.data(c) for c in cids],
                                       [self.context(round_, c, "train") for c in cids])
        for cid, (state, reply, loss) in zip(cids, results):
            self.states[cid] = state
            acc.add(reply)
            losses[cid] = (float(loss), self.data(cid).num_train)
        return acc, losses, time.perf_counter() - t0

    def evaluate(self, round_: int, message: Any, cids: list[int], unseen: list[int] = ()) -> dict[int, Any]:
        """Evaluate clients; ``unseen`` ones never trained: they personalize first (not kept)."""
        message = to_device(message, self.device)
        unseen = set(unseen)
        out = {}
        for cid in sorted(cids):
            ctx = self.context(round_, cid, "eval")
            if cid in unseen:
                state = self.algo.personalize(message, self.data(cid),
                                              self.context(round_, cid, "personalize"))
            else:
                state = self.state(cid)
            out[cid] = self.algo.evaluate(state, message, self.data(cid), ctx)
        return out

    # -- gossip (decentralized topology) ------------------------------------------------------
    def gossip_init(self, message: Any) -> dict[int, int]:
        """Every hosted client starts from its own copy of the initial shared parameters;
        returns each hosted client's number of training samples (for sample-weighted mixing)."""
        message = to_device(message, self.device)
        for cid in self.cids:
            self.states[cid] = self.algo.gossip_init(cid, message)
        return {cid: self.data(cid).num_train for cid in self.cids}

    def gossip_train(self, round_: int, cids: list[int], outbox: dict[int, list[int]]
                     ) -> tuple[dict[int, Any], PerClient, float]:
        """Local step of each client on its own parameters. The messages stay here for this
        host's own mixing; ``outbox[h]`` lists the clients whose messages host h needs, and the
        return holds one bundle {cid: message} per such host (nothing else leaves)."""
        t0 = time.perf_counter()
        losses = PerClient()
        cids = sorted(cids)
        results = self.algo.gossip_train_many([self.state(c) for c in cids], [self.data(c) for c in cids],
                                              [self.context(round_, c, "train") for c in cids])
        self._messages = {}
        for cid, (state, message, loss) in zip(cids, results):
            self.states[cid] = state
            self._messages[cid] = message
            losses[cid] = (float(loss), self.data(cid).num_train)
        bundles = {h: {j: self._messages[j] for j in wanted} for h, wanted in outbox.items() if wanted}
        return bundles, losses, time.perf_counter() - t0

    def gossip_mix(self, inbox: list[dict[int, Any]], rows: dict[int, list[tuple[int, float]]] | None
                   ) -> Accumulator:
        """θ_i <- Σ_j W_ij θ_j for each hosted client i; ``rows[i]`` lists (j, W_ij) in ascending
        j (None: the rows last sent, while W stays the same); messages come from this host's own
        clients and the bundles other hosts sent. Returns the consensus statistics after mixing."""
        if rows is not None:
            self._rows = rows
        rows = self._rows
        sources = dict(self._messages)
        for bundle in inbox:
            sources.update({j: to_device(m, self.device) for j, m in bundle.items()})
        cids = sorted(rows)
        new = self.algo.mix_many([self.states[c] for c in cids], sources, [rows[c] for c in cids])
        for cid, state in zip(cids, new):
            self.states[cid] = state
        self._messages = {}
        return self.consensus()

    def consensus(self) -> Accumulator:
        acc = Accumulator()
        for cid in self.cids:
            acc.add(self.algo.consensus_stats(self.states[cid]))
        return acc

    # -- checkpoints ---------------------------------------------------------------------------
    def get_states(self) -> dict[int, Any]:
        return {cid: state_to_tree(s) for cid, s in sorted(self.states.items()) if s is not None}

    def set_states(self, trees: dict[int, Any]) -> None:
        cls = self.algo.ClientState
        self.states = {}
        for cid, tree in trees.items():
            if cid in self.cids:
                self.states[int(cid)] = to_device(tree_to_state(cls, tree), self.device)

    def ping(self) -> bool:
        return True
