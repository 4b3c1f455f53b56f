"""A host: many clients' data shards and persistent states in one long-lived process.

The same class runs in-process (serial engine) and as a Ray actor (ray_engine wraps it), so
both engines execute identical code. A host runs its clients' steps in client-id order through
``raysim.core.loop.drive``, which trains the jobs all of them yield in one vectorized pass, and
sums their replies locally; it sends one partial sum per round.

Decentralized, a host also keeps each of its clients' copy of the server state and mixes the
shared parameters with the neighbours' (``gossip_*``). Where the method gives the step of all
its clients at once (``Algorithm.train_rows``: D-SGD, decentralized FedProx), the host keeps
its clients' models as one matrix (a row per client) and trains, exchanges and mixes rows: no
Python object per client, the same numbers.

The process's device and memory (``pick_device``, ``deterministic_cuda``,
``release_freed_memory``) are in ``host_process``; their names are importable from here too.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.algorithms.base import Received
from raysim.core import mixing
from raysim.core.data import Block, ClientData, Context, pack
from raysim.core.loop import drive
from raysim.core.loop import pool as loop_pool
from raysim.core.replies import Accumulator, PerClient, reduce
from raysim.engine import checkpoint
from raysim.engine.host_process import deterministic_cuda, pick_device, release_freed_memory
from raysim.engine.trees import state_to_tree, to_device, tree_to_state
from raysim.federation import adversary, compression, privacy, robust_gossip
from raysim.scenario.build import make_algorithm
from raysim.scenario.config import Scenario, make_source, split_unseen

ROWS = True  # the host-level path where the method has one (tests switch it off to compare)


class Host:
    def __init__(
        self, sc: Scenario, cids: list[int], device: str | None = None, threads: int | None = None, source=None
    ):
        """Host ``cids`` of scenario ``sc``; ``source`` is the driver's prepared data source (its
        partition made once, there), built here when not given."""
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        self.sc = sc
        self.cids = sorted(cids)
        self._mine = set(self.cids)
        self.device = torch.device(device) if device else pick_device(sc.resources.gpus_per_host)
        if self.device.type == "cuda":
            deterministic_cuda()
        self.source = source if source is not None else make_source(sc)
        self.algo = make_algorithm(sc, self.source)
        self.algo.warm_up(self.source.input_shape, self.device)
        self._data: dict[int, ClientData] = {}
        self.states: dict[int, Any] = {}
        # compression state per client (communication): error feedback's remainder, or with a topology
        # CHOCO-gossip's public copy x̂ of its model; written to checkpoints as "residual"
        self.residuals: dict[int, torch.Tensor] = {}
        # decentralized: each client's copy of the server state, its message to its neighbours
        # this round, and its row of W in force
        self.servers: dict[int, Any] = {}
        self._server_type: type | None = None
        self._flat: dict[int, torch.Tensor] = {}
        self._half: dict[int, torch.Tensor] = {}  # CHOCO-gossip: the models after the local step
        self._honest: dict[int, torch.Tensor] = {}  # malicious nodes' own parameters (they send others)
        self._rows = mixing.Rows({})
        self._gossip = False
        # with train_rows: the clients' models as rows of one matrix (self.cids' order)
        self._F: torch.Tensor | None = None
        self._template = None  # a server state: the shapes of the rows' parameters
        self._block = None  # (cids, Block) while the trained clients stay the same
        # the scenario's adversary: the malicious clients' ranks (their data poisoned as they load)
        # and the honest clients' triggered test inputs that score a backdoor
        self._rank: dict[int, int] = {}
        self._triggered: dict[int, ClientData | None] = {}
        if sc.adversary is not None:
            self._rank = {int(c): i for i, c in enumerate(adversary.malicious_ids(sc, split_unseen(sc)[0]))}

    # -- data and state ----------------------------------------------------------------------
    def data(self, cid: int) -> ClientData:
        d = self._data.get(cid)
        if d is None:
            # one past the last client: FLTrust's root set, which the server trains on (robust_round)
            d = self.source.root_set(cid) if cid == self.sc.data.clients else self.source.client(cid)
            if cid in self._rank:  # a malicious client trains on its poisoned data
                d = adversary.poisoned(self.sc, d, self.source.num_classes, self._image_shape(), self._rank[cid])
            d = self._data[cid] = d.to(self.device)
        return d

    def _image_shape(self):
        return getattr(self.source, "image_shape", None) or self.source.input_shape

    def _backdoor_scores(self, round_: int, cids: list[int], states, received, groups) -> dict[int, float]:
        """Each honest client's attack success rate: the share of its triggered test inputs (of
        classes other than the target) its model labels the target (``adversary.triggered``)."""
        if self.sc.adversary is None:
            return {}
        todo = []
        for c in cids:
            if c in self._rank:
                continue
            if c not in self._triggered:
                self._triggered[c] = adversary.triggered(self.sc, self.data(c), self._image_shape())
            if self._triggered[c] is not None:
                todo.append(c)
        calls = [
            self.algo.evaluations(
                states[c], received[c], self._triggered[c], self.context(round_, c, "eval", groups[c]), False
            )
            for c in todo
        ]
        metric = self.algo.task.metric
        return {c: float(m[metric]) for c, (m, _) in zip(todo, self._drive(calls))}

    def state(self, cid: int) -> Any:
        if cid == self.sc.data.clients:  # FLTrust's root set trains afresh each round (nothing to checkpoint)
            self.states.pop(cid, None)
        if cid not in self.states:
            self.states[cid] = to_device(
                self.algo.init_client(cid, rng.generator(self.sc.seed, "client_init", cid)), self.device
            )
        return self.states[cid]

    def context(self, round_: int, cid: int, purpose: str, group: int = 0, work: float = 1.0) -> Context:
        g = rng.torch_generator(self.sc.seed, purpose, round_, cid)
        return Context(round_, self.sc.rounds, cid, g, self.device, group, work)

    def prefetch(self) -> None:
        """At host start, load the shards of the clients every round trains (all of them with
        full participation or a topology), so rounds only train. With sampling, a client's
        shard is loaded when it is first sampled or evaluated: 100 000 registered clients start
        in seconds and a round loads only the newcomers among its sampled clients."""
        s = self.sc.sampling
        every_round = self.sc.topology is not None or (
            s.count >= self.sc.data.clients if s.count is not None else s.fraction >= 1.0
        )
        if every_round:
            packed = pack([self.data(cid) for cid in self.cids])
            self._data.update(zip(self.cids, packed))
            release_freed_memory()

    def num_samples(self) -> dict[int, int]:
        return {c: self.source.num_samples(c) for c in self.cids}

    def _drive(self, calls: list) -> list:
        return drive(calls, self.algo.trainer(self.device).fit)

    def _received(self, shared: Any, parts: dict[int, Any], group: int) -> Received:
        return Received(shared, parts.get(group))

    # -- a round -------------------------------------------------------------------------------
    def stats(self, round_: int, message: Any, cids: list[int]) -> Accumulator:
        """Statistics for the server's preparation phase: each client's ``client_stats``."""
        received = Received(to_device(message, self.device))
        cids = sorted(cids)
        results = self._drive(
            [
                self.algo.client_stats(self.state(c), received, self.data(c), self.context(round_, c, "stats"))
                for c in cids
            ]
        )
        acc = Accumulator()
        for cid, (state, reply) in zip(cids, results):
            self.states[cid] = state
            acc.add(reply)
        return acc

    def train(
        self,
        round_: int,
        shared: Any,
        parts: dict[int, Any],
        groups: dict[int, int],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ) -> tuple[Accumulator | dict[int, Accumulator], PerClient, float]:
        """Train the clients of ``groups`` ({cid: group}) on the shared part and their group's
        part; return (sum of replies, loss per client, seconds); ``each``: each client's reply
        on its own ({cid: its Accumulator}), for a server that weighs them one by one
        (asynchronous aggregation); ``work``: the share of its steps a straggler has time for;
        ``clip``: privacy's clipping bound this round (adaptive clipping; default the scenario's)."""
        t0 = time.perf_counter()
        shared, parts = to_device(shared, self.device), to_device(parts, self.device)
        cids = sorted(groups)
        work = work or {}
        calls = [
            self.algo.train(
                self.state(c),
                self._received(shared, parts, groups[c]),
                self.data(c),
                self.context(round_, c, "train", groups[c], work.get(c, 1.0)),
            )
            for c in cids
        ]
        acc = {} if each else Accumulator()
        losses = PerClient()
        dp, comm = self.sc.privacy, self.sc.communication
        for cid, (state, reply, loss) in zip(cids, self._drive(calls)):
            self.states[cid] = state
            if (
                dp is not None and dp.level == "client"
            ):  # the update leaves the client clipped (raysim/federation/privacy.py)
                reply = privacy.clip(
                    reply,
                    shared,
                    dp.clip if clip is None else clip,
                    count=dp.target_quantile is not None or dp.debug_exact_metrics,
                    norm=dp.debug_exact_metrics,
                )
            if comm is not None:  # ... or compressed (raysim/federation/compression.py)
                reply, remainder = compression.upload(
                    reply, shared, comm, self.residuals.get(cid), self.sc.seed, round_, cid
                )
                if remainder is not None:
                    self.residuals[cid] = remainder
            if each:
                acc[cid] = Accumulator()
                acc[cid].add(reply)
            else:
                acc.add(reply)
            losses[cid] = privacy.reported_loss(float(loss), self.data(cid).num_train, dp)
        release_freed_memory(collect=False)
        return acc, losses, time.perf_counter() - t0

    def evaluate(
        self, round_: int, shared: Any, parts: dict[int, Any], groups: dict[int, int], unseen: list[int] = ()
    ) -> dict[int, tuple[dict[str, float], int, list[float] | None, dict[str, float] | None, int]]:
        """Each client's metrics, test size, estimated weights of the cluster models, validation
        metrics (None: not scored, ``eval.validation`` off or an empty validation split) and
        validation size. ``unseen`` clients never trained: they personalize first (not kept),
        and that one personalized state is scored on both splits. Decentralized
        (``self.servers``), each client is scored with the message of its own copy of the
        server state."""
        shared, parts = to_device(shared, self.device), to_device(parts, self.device)
        cids = sorted(groups)
        received = {
            c: self._own_message(round_, c) if self._gossip else self._received(shared, parts, groups[c]) for c in cids
        }
        unseen = sorted(set(unseen))
        personal = dict(
            zip(
                unseen,
                self._drive(
                    [
                        self.algo.personalize(
                            received[c], self.data(c), self.context(round_, c, "personalize", groups[c])
                        )
                        for c in unseen
                    ]
                ),
            )
        )
        states = {c: personal[c] if c in personal else self.state(c) for c in cids}
        val = self.sc.eval.validation is not False  # auto: wherever a client has a validation split
        calls = [
            self.algo.evaluations(states[c], received[c], self.data(c), self.context(round_, c, "eval", groups[c]), val)
            for c in cids
        ]
        out = {}
        asr = self._backdoor_scores(round_, cids, states, received, groups)
        for c, (m, vm) in zip(cids, self._drive(calls)):
            if c in asr:
                m = {**m, "attack_success_rate": asr[c]}
            imp = self.algo.importance(states[c])
            d = self.data(c)
            out[c] = (m, d.num_test, None if imp is None else [float(v) for v in imp], vm, d.num_val)
        release_freed_memory(collect=False)
        return out

    # -- decentralized (gossip) ----------------------------------------------------------------
    def _server(self, cid: int) -> Any:
        """Client ``cid``'s copy of the server state (with rows: views of its row)."""
        if self._F is None:
            return self.servers[cid]
        flat = self._F[self._pos[cid]]
        return self.algo.with_shared(self._template, mixing.unflatten(self.algo.shared(self._template), flat))

    def _own_message(self, round_: int, cid: int) -> Received:
        msg = self.algo.message(self._server(cid), round_)
        return Received(msg.shared, msg.groups.get(0))

    def gossip_init(self, server: Any) -> dict[int, int]:
        """Every hosted client starts from its own copy of the initial server state; returns
        each client's number of training samples (for sample-weighted mixing)."""
        server = to_device(server, self.device)
        self._server_type = type(server)
        self._gossip = True
        byzantine = self.sc.adversary is not None or self.sc.defence is not None  # node by node (robust_gossip)
        if (
            ROWS
            and self.algo.has_rows()
            and self.algo.trainer(self.device).across
            and self.sc.communication is None
            and not byzantine
        ):
            self._template = server
            self._pos = {c: k for k, c in enumerate(self.cids)}
            flat = mixing.flatten(self.algo.shared(server))
            self._F = flat.unsqueeze(0).repeat(len(self.cids), 1)
        else:
            for cid in self.cids:
                self.servers[cid] = self.algo.with_shared(
                    server, [[t.clone() for t in g] for g in self.algo.shared(server)]
                )
        if self.sc.communication is not None:  # CHOCO-gossip: the public copies start at the initial model
            flat = mixing.flatten(self.algo.shared(server))
            self.residuals = {cid: flat.clone() for cid in self.cids}
        return {cid: self.data(cid).num_train for cid in self.cids}

    def gossip_train(
        self, round_: int, cids: list[int], outbox: dict[int, list[int]]
    ) -> tuple[dict[int, Any], PerClient, float]:
        """Each client's local step as its own server (message from its copy, aggregate of its
        own reply). The flattened shared parameters stay here for this host's mixing;
        ``outbox[h]`` lists the clients whose parameters host h needs, and the return holds
        one bundle per such host (nothing else leaves): {cid: parameters}, or with rows
        (ids, one row each)."""
        t0 = time.perf_counter()
        cids = sorted(cids)
        if self._F is not None:
            return self._train_rows(round_, cids, outbox, t0)
        calls = [
            self.algo.train(self.state(c), self._own_message(round_, c), self.data(c), self.context(round_, c, "train"))
            for c in cids
        ]
        losses = PerClient()
        self._flat, self._half, self._honest = {}, {}, {}
        comm = self.sc.communication
        for cid, (state, reply, loss) in zip(cids, self._drive(calls)):
            self.states[cid] = state
            before = mixing.flatten(self.algo.shared(self.servers[cid])) if cid in self._rank else None
            # the reply reduces on the CPU (float64 sums): the aggregate comes back to the host's device
            self.servers[cid] = to_device(self.algo.aggregate(self.servers[cid], reduce([reply]), round_), self.device)
            self._flat[cid] = mixing.flatten(self.algo.shared(self.servers[cid]))
            if before is not None:  # a malicious node keeps its honest parameters and sends crafted ones
                self._honest[cid] = self._flat[cid]
                self._flat[cid] = robust_gossip.sent(self.sc, round_, cid, before, self._flat[cid])
            if comm is not None:  # CHOCO: the public copy moves by the compressed difference, and is sent
                self._half[cid] = self._flat[cid]
                self._flat[cid] = self.residuals[cid] = compression.gossip_estimate(
                    self._flat[cid], self.residuals[cid], comm, self.sc.seed, round_, cid
                )
            losses[cid] = (float(loss), self.data(cid).num_train)  # gossip runs without privacy
        bundles = {h: {j: self._flat[j] for j in wanted} for h, wanted in outbox.items() if wanted}
        return bundles, losses, time.perf_counter() - t0

    def _rows_block(self, round_: int, cids: list[int]) -> Block:
        if self._block is None or self._block[0] != cids:
            shards = [self.data(c) for c in cids]
            pooled = loop_pool([d.train_x for d in shards], [d.train_y for d in shards])
            self._block = (cids, pooled, [d.num_train for d in shards])
        _, (x, y, starts), ns = self._block
        seeds = rng.torch_seeds(self.sc.seed, "train", round_, cids)
        return Block(cids, x, y, starts, ns, round_, self.sc.rounds, seeds, self.device)

    def _train_rows(self, round_: int, cids: list[int], outbox: dict[int, list[int]], t0: float):
        pos = torch.tensor([self._pos[c] for c in cids], dtype=torch.long, device=self._F.device)
        every = len(cids) == len(self.cids)
        F = self._F if every else self._F.index_select(0, pos)
        template = self.algo.shared(self._template)
        params = [
            p.reshape(len(cids), *t.shape)
            for p, t in zip(F.split([t.numel() for g in template for t in g], dim=1), (t for g in template for t in g))
        ]
        block = self._rows_block(round_, cids)
        trained, loss = self.algo.train_rows(params, block)
        new = torch.cat([p.reshape(len(cids), -1) for p in trained], dim=1).to(F.dtype)
        if every:
            self._F = new
        else:
            self._F[pos] = new
        self._trained = (cids, new)
        losses = PerClient(zip(cids, zip(loss, block.ns)))
        at = {c: k for k, c in enumerate(cids)}
        bundles = {}
        for h, wanted in outbox.items():
            if wanted:
                ids = np.asarray(wanted, dtype=np.int64)
                bundles[h] = (ids, new.index_select(0, torch.as_tensor([at[j] for j in wanted], device=new.device)))
        return bundles, losses, time.perf_counter() - t0

    def gossip_mix(self, inbox: list[Any], rows) -> Accumulator:
        """θ_i <- Σ_j W_ij θ_j for each hosted client i; ``rows``: this host's rows of W
        (``mixing.Rows``: {i: [(j, W_ij)]} or the scheduler's arrays; None: the rows last sent,
        while W stays the same), kept as one sparse matrix. Returns the sum of the mixed
        parameters (for the mean the consensus distance needs)."""
        if rows is not None:
            self._rows = mixing.Rows(rows)
        if self._F is not None:
            cids, own = self._trained
            ids = [np.asarray(cids, dtype=np.int64)] + [np.asarray(b[0], dtype=np.int64) for b in inbox]
            mats = [own] + [to_device(torch.as_tensor(b[1]), self.device) for b in inbox]
            mixed = self._rows.mix_arrays(np.concatenate(ids), torch.cat(mats) if len(mats) > 1 else own)
            if self._rows.cids == self.cids:
                self._F = mixed
            elif self._rows.cids:
                self._F[torch.tensor([self._pos[c] for c in self._rows.cids], device=self._F.device)] = mixed
        else:
            sources = dict(self._flat)
            for bundle in inbox:
                sources.update({j: to_device(m, self.device) for j, m in bundle.items()})
            if self.sc.adversary is not None or self.sc.defence is not None:
                mine = {c: self._honest.get(c, self._flat[c]) for c in self._rows.cids}
                mixed = robust_gossip.robust_mix(self.sc, self._rows, sources, mine)
            else:
                mixed = self._rows.mix(sources)
            if self.sc.communication is not None:  # CHOCO: x_i + γ (Σ_j w_ij x̂_j − x̂_i)
                step = self.sc.communication.gossip_step
                mixed = (
                    torch.stack(
                        [
                            self._half[c] + step * (m - self.residuals[c])
                            if c in self._half
                            else mixing.flatten(self.algo.shared(self.servers[c]))
                            for c, m in zip(self._rows.cids, mixed.unbind(0))
                        ]
                    )
                    if self._rows.cids
                    else mixed
                )
            for cid, flat in zip(self._rows.cids, mixed.unbind(0)):
                template = self.algo.shared(self.servers[cid])
                self.servers[cid] = self.algo.with_shared(self.servers[cid], mixing.unflatten(template, flat))
            self._flat = {}
        self._mixed = (self._rows.cids, mixed)
        acc = Accumulator()
        if self._rows.cids:
            acc.add_rows(mixed)
        return acc

    def consensus(self, mean: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """‖θ_k − θ̄‖² per group of shared parameters, per hosted client (from the parameters
        just mixed, all rows at once): (client ids, distances (clients, groups))."""
        mean = mean.to(self.device)
        cids, mixed = getattr(self, "_mixed", (None, None))
        if cids != self.cids:
            cids = self.cids
            if self._F is not None:
                mixed = self._F
            else:
                mixed = torch.stack([mixing.flatten(self.algo.shared(self.servers[c])) for c in cids]) if cids else None
        if not cids:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0))
        sizes = mixing.group_sizes(self.algo.shared(self._server(cids[0])))
        return np.asarray(cids, dtype=np.int64), mixing.squared_distances_rows(mixed, mean, sizes)

    # -- checkpoints ---------------------------------------------------------------------------
    def get_states(self) -> dict[int, Any]:
        out = {}
        for cid in self.cids:
            state = self.states.get(cid)
            if self._F is not None:  # a row's views would carry the whole matrix: copies
                server = [t.clone() for t in self._server(cid)]
            else:
                server = self.servers.get(cid)
            residual = self.residuals.get(cid)
            if state is not None or server is not None or residual is not None:
                out[cid] = {"state": state_to_tree(state), "server": state_to_tree(server)}
                if residual is not None:
                    out[cid]["residual"] = residual
        return out

    def set_states(self, trees: dict[int, Any]) -> None:
        cls = self.algo.ClientState
        self.states = {}
        self.residuals = {}
        for cid, tree in trees.items():
            cid = int(cid)
            if cid not in self._mine:
                continue
            if tree.get("residual") is not None:
                self.residuals[cid] = tree["residual"]
            if tree["state"] is not None:
                self.states[cid] = to_device(tree_to_state(cls, tree["state"]), self.device)
            if tree["server"] is not None:
                server = to_device(tree_to_state(self._server_type, tree["server"]), self.device)
                if self._F is not None:
                    self._F[self._pos[cid]] = mixing.flatten(self.algo.shared(server))
                else:
                    self.servers[cid] = server

    def write_states(self, folder: str, path: str, token: str, head: dict) -> tuple[dict | None, Any]:
        """Write this host's clients' states to ``path`` (in checkpoint folder ``folder``;
        ``head``: ``checkpoint.header``); returns (its manifest entry, None), or (None, the
        states) when this process does not see the folder (the server writes them)."""
        trees = self.get_states()
        if checkpoint.visible(folder, token):
            return checkpoint.write_host(path, head, trees), None
        return None, trees

    def read_states(self, folder: str, doc: dict, token: str, given: dict[int, Any] | None = None) -> bool:
        """Restore this host's clients from the host files of manifest ``doc`` that hold them
        (each verified and read whole, this host's clients kept), or from ``given``; False when
        this process does not see the folder (the server reads them and calls again with
        ``given``). A client the manifest lists is never started afresh: a state missing from
        its file raises ``checkpoint.CheckpointError``."""
        if given is None:
            if not checkpoint.visible(folder, token):
                return False
            given = checkpoint.read_clients(folder, doc, self.cids)
        self.set_states(given)
        return True

    def ping(self) -> bool:
        return True
