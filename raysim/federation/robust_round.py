"""One round at a server with Byzantine clients and a robust rule: the clients' replies, each on
its own, turned into the reply the method aggregates.

The path (``RobustRound.reduce``), for a method whose replies are models trained from what the
server sent (``Algorithm.takes_robust``):

1. The replies are summed as on the pre-summed path (one ``Accumulator``, client-id order): the
   structure and every leaf that is not a model keep their plain sums.
2. Each ``Weighted`` of the reply is a *part* (the whole model for FedAvg, the shared body for
   FedRep, component m for FedEM, cluster s for IFCA). For each part, the clients that sent it with
   a positive weight give their updates U_k = θ_k − θ (θ the part's entry of
   ``Algorithm.update_origin``), a (K, d) float64 matrix over the floating-point tensors, rows in
   client-id order.
3. The adversary's step (``raysim.federation.attacks``): the malicious rows replaced by the crafted
   updates, the omniscient attacks reading the honest rows; a backdoor's rows boosted by γ (model
   replacement, ``poisoning.boost``: by default n/(m·η), n the round's clients, m its attackers, η
   the server's learning rate, so that the m attackers together replace the model as the paper's
   one attacker does with n/η; m boosting by n/η each would overshoot m times). This is the attackers' simulation: the rule below sees only U.
4. The defence (``raysim.federation.robust``), after its pre-aggregator, gives the aggregate update
   a; the part's summed leaf becomes W·(θ + a) with W its summed weight, so the method's
   ``aggregate`` (which takes the mean Σ w θ_k / Σ w) receives θ + a, and nothing else of it
   changes. Without a defence the rule is ``mean``: FedAvg's average of the (crafted) updates.

Memory at the server: the K replies (float64) and U, 2·K·d floats for one part at a time; a rule's
own working memory beyond them is in ``robust``'s table (``chunk`` bounds the coordinate-wise ones).

A part with fewer clients than the round (IFCA's clusters) assumes f scaled to its count,
⌈f·K_p/K⌉; where the rule still cannot run on it (Krum on 3 clients), that part takes the
coordinate-wise median, counted in ``defence_fallbacks``. An attack whose limits a part does not
meet (ALIE with one honest client) leaves that part's attackers' own updates, counted in
``attack_skipped``.

What is checkpointed (``state``): centered clipping's previous aggregate per part and Mimic's state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from raysim import rng
from raysim.core import server_opt
from raysim.core.replies import Accumulator, ByKey, Weighted
from raysim.federation import attacks, poisoning, robust
from raysim.federation.adversary import expected_malicious, malicious_ids

Path = tuple  # a part's place in a reply: () the reply itself, (i,) a list's i-th, (k,) a ByKey's key k


def parts(reply: Any, path: Path = ()) -> Iterator[tuple[Path, Weighted]]:
    """The ``Weighted`` leaves of a reply with their paths (lists, tuples and ByKey descended)."""
    if isinstance(reply, Weighted):
        yield path, reply
    elif isinstance(reply, ByKey):
        for k in sorted(reply):
            yield from parts(reply[k], (*path, k))
    elif isinstance(reply, (list, tuple)):
        for i, x in enumerate(reply):
            yield from parts(x, (*path, i))


def at(tree: Any, path: Path) -> Any:
    """The entry of ``tree`` at ``path`` (None where the reply has no such part)."""
    for step in path:
        if isinstance(tree, dict):
            if step not in tree:
                return None
            tree = tree[step]
        else:
            tree = tree[step]
    return tree


def replaced(reply: Any, new: dict[Path, Weighted], path: Path = ()) -> Any:
    """``reply`` with the leaves at ``new``'s paths replaced."""
    if path in new:
        return new[path]
    if isinstance(reply, ByKey):
        return ByKey({k: replaced(v, new, (*path, k)) for k, v in reply.items()})
    if isinstance(reply, (list, tuple)):
        return type(reply)(replaced(x, new, (*path, i)) for i, x in enumerate(reply))
    return reply


def _key(path: Path) -> str:
    return "/".join(map(str, path)) or "model"


class RobustRound:
    """The adversary and the defence of a run, with their state across rounds."""

    def __init__(self, sc: Any, train_ids: np.ndarray):
        self.sc = sc
        self.train_ids = np.asarray(train_ids)
        self.malicious = set(malicious_ids(sc, train_ids).tolist())
        adv, dfc = sc.adversary, sc.defence
        self.attack = None if adv is None else adv.attack
        self.rule = "mean" if dfc is None else dfc.rule.name
        self.rule_params = None if dfc is None else dfc.rule.params
        self.pre = None if dfc is None else dfc.preaggregate
        self.chunk = None if dfc is None else dfc.chunk
        self.center: dict[str, torch.Tensor] = {}  # centered clipping's previous aggregate, per part
        self.mimic: dict[str, attacks.MimicState] = {}
        self.server_lr = server_opt.server_lr(sc.server) if sc.server.optimizer != "none" else 1.0

    # -- the round ---------------------------------------------------------------------------
    def f(self, k: int) -> int:
        """The Byzantine clients the rule assumes in a round of k clients."""
        dfc = self.sc.defence
        if dfc is not None and dfc.f is not None:
            return dfc.f
        return expected_malicious(self.sc.adversary, k, len(self.train_ids))

    @property
    def root_id(self) -> int | None:
        """The id FLTrust's root set trains under (one past the last client), or None without it."""
        return self.sc.data.clients if self.rule == "fltrust" else None

    def reduce(
        self, r: int, replies: dict[int, Accumulator], origin: Any, root: Accumulator | None = None
    ) -> tuple[Any, dict[str, float]]:
        """The reply the method aggregates from each client's own (``replies``: {cid: its
        Accumulator}), and the round's metrics (``malicious``, ``attack_*``, ``detection_*``);
        ``root``: FLTrust's reply trained on the server's root set, whose update is g_0."""
        root_tree = root.result() if root is not None else None
        cids = sorted(replies)
        total = Accumulator()
        for c in cids:
            total.merge(replies[c])
        summed = total.result()
        each = {c: replies[c].result() for c in cids}
        K = len(cids)
        f = self.f(K)
        stats: dict[str, list[float]] = {}
        flagged: list[bool] = []
        bad: list[bool] = []
        new: dict[Path, Weighted] = {}
        for path, leaf in parts(summed):
            rows = [c for c in cids if (p := at(each[c], path)) is not None and p.weight > 0]
            if not rows:
                continue
            base = at(origin, path) if origin is not None else None
            U, w, floats = self._updates([at(each[c], path) for c in rows], base, leaf)
            mal = torch.tensor([c in self.malicious for c in rows])
            U = self._attack(r, path, U, mal, rows, K, f, stats)
            g0 = None
            if root_tree is not None and (lf := at(root_tree, path)) is not None and lf.weight > 0:
                g0 = self._updates([lf], base, leaf)[0][0]
            agg, kept = self._defend(
                r, path, U, w, max(0, math.ceil(f * len(rows) / K)) if K else 0, base, floats, stats, g0
            )
            if kept is not None:
                flagged += (~kept).tolist()
                bad += mal.tolist()
            new[path] = self._leaf(leaf, agg, base, floats)
        metrics = {"malicious": float(sum(c in self.malicious for c in cids))}
        metrics.update({k: float(np.mean(v)) for k, v in stats.items()})
        if flagged:
            precision, recall = attacks.detection(~torch.tensor(flagged), torch.tensor(bad))
            metrics.update(
                {
                    k: v
                    for k, v in (("detection_precision", precision), ("detection_recall", recall))
                    if not math.isnan(v)
                }
            )
            metrics["flagged"] = float(sum(flagged))
        return replaced(summed, new), metrics

    @staticmethod
    def _updates(leaves: list[Weighted], base, summed: Weighted) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        """(U (K, d) float64 of the floating-point tensors, the weights, which tensors are floating)."""
        floats = [
            v.is_floating_point() if base is None else base[i].is_floating_point() for i, v in enumerate(summed.values)
        ]
        sizes = [v.numel() for v, fl in zip(summed.values, floats) if fl]
        U = torch.empty(len(leaves), sum(sizes), dtype=torch.float64)
        for k, leaf in enumerate(leaves):
            off = 0
            for i, (v, fl) in enumerate(zip(leaf.values, floats)):
                if not fl:
                    continue
                row = U[k, off : off + v.numel()]
                torch.div(v.reshape(-1), leaf.weight, out=row)
                if base is not None:
                    row.sub_(base[i].reshape(-1))
                off += v.numel()
        return U, torch.tensor([lf.weight for lf in leaves], dtype=torch.float64), floats

    @staticmethod
    def _leaf(summed: Weighted, agg: torch.Tensor, base, floats: list[bool]) -> Weighted:
        """The part's summed leaf whose mean is θ + a (the non-floating tensors' sums kept)."""
        W = summed.weight
        values, off = [], 0
        for i, (v, fl) in enumerate(zip(summed.values, floats)):
            if not fl:
                values.append(v)
                continue
            a = agg[off : off + v.numel()].reshape(v.shape)
            off += v.numel()
            values.append(W * (a if base is None else base[i].to(torch.float64) + a))
        return Weighted(values, W)

    def _attack(self, r, path, U, mal, rows, K, f, stats) -> torch.Tensor:
        m = int(mal.sum())
        if self.attack is None or m == 0:
            return U
        name, p = self.attack.name, self.attack.params
        if name in poisoning.DATA_ATTACKS:
            gamma = getattr(p, "gamma", 1.0)
            if gamma is None:  # the m attackers of the round together replace the model: n/(m·η) each
                gamma = K / (m * self.server_lr)
            if gamma != 1.0:
                U = U.clone()
                U[mal] = poisoning.boost(U[mal], gamma)
                stats.setdefault("attack_gamma", []).append(gamma)
            return U
        attack = attacks.ATTACKS[name]
        if attack.check(p, U.shape[0], m):
            stats.setdefault("attack_skipped", []).append(1.0)
            return U
        honest = [c for c, b in zip(rows, mal.tolist()) if not b]
        key = _key(path)
        crafted = attack(
            U[~mal],
            U[mal],
            p,
            rng.torch_generator(self.sc.seed, "attack", r, *path),
            aggregator=self._simulated(r, path, max(f, m)),
            state=self.mimic.get(key),
            ids=honest,
        )
        if crafted.state is not None:
            self.mimic[key] = crafted.state
        for k, v in crafted.info.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                stats.setdefault(f"attack_{k}", []).append(float(v))
        U = U.clone()
        U[mal] = crafted.updates.to(U)
        return U

    def _simulated(self, r, path, f):
        """The defence Fang's attack on Krum simulates: the run's rule where it flags clients, else
        Krum, with f the attackers' count at least."""
        spec = robust.DEFENCES[self.rule]
        rule = self.rule if spec.flags and not spec.needs_root else "krum"  # (FLTrust's g_0 is the server's)
        params = self.rule_params if rule == self.rule else None

        def kept(U: torch.Tensor):
            w = torch.ones(U.shape[0], dtype=torch.float64)
            g = rng.torch_generator(self.sc.seed, "attack_simulated", r, *path)
            return robust.aggregate(rule, U, w, f, params, generator=g, chunk=self.chunk).kept

        return kept

    def _defend(self, r, path, U, w, f, base, floats, stats, root=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rule's aggregate of U and which rows it kept (None: a rule that flags no one)."""
        key = _key(path)
        g = rng.torch_generator(self.sc.seed, "defence", r, *path)
        rule, params = self.rule, self.rule_params
        groups = None
        X, weights = U, w
        if self.pre is not None and not robust.PREAGGREGATORS[self.pre.name].check(U.shape[0], f, self.pre.params):
            mixed = robust.preaggregate(self.pre.name, U, w, f, self.pre.params, generator=g, chunk=self.chunk)
            X, weights, groups = mixed.updates, mixed.weights, mixed.groups
        if robust.DEFENCES[rule].check(X.shape[0], f, params) or (robust.DEFENCES[rule].needs_root and root is None):
            stats.setdefault("defence_fallbacks", []).append(1.0)
            rule, params = "median", None
        model = None
        if base is not None:
            model = torch.cat([t.reshape(-1).to(torch.float64) for t, fl in zip(base, floats) if fl])
        verdict = robust.aggregate(
            rule,
            X,
            weights,
            f,
            params,
            generator=g,
            center=self.center.get(key),
            root=root if robust.DEFENCES[rule].needs_root else None,
            model=model,
            chunk=self.chunk,
        )
        if robust.DEFENCES[rule].uses_center:
            self.center[key] = verdict.aggregate.clone()
        kept = verdict.kept
        if kept is not None and groups is not None:  # a bucket's verdict is its clients'
            each = torch.zeros(U.shape[0], dtype=torch.bool)
            for j, g_rows in enumerate(groups):
                if bool(kept[j]):
                    each[list(g_rows)] = True
            kept = each
        return verdict.aggregate, kept

    # -- checkpoints -------------------------------------------------------------------------
    def state(self) -> dict:
        out: dict[str, Any] = {"center": dict(self.center)}
        out["mimic"] = {
            k: {
                "mu": s.mu,
                "z": s.z,
                "target": -1 if s.target is None else int(s.target),
                "rounds": int(s.rounds),
            }
            for k, s in self.mimic.items()
        }
        return out

    def load(self, st: dict) -> None:
        self.center = dict(st.get("center", {}))
        self.mimic = {
            k: attacks.MimicState(v["mu"], v["z"], None if int(v["target"]) < 0 else int(v["target"]), int(v["rounds"]))
            for k, v in st.get("mimic", {}).items()
        }
