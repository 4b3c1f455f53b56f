"""The hosts as the Ray engine runs them: ``RayHost``, a ``Host`` as a Ray actor (tensors cross
the process boundary as numpy arrays, its construction's error raised by its first call), and
``DriverHost``, host 0 in the driver's process, called as an actor is (``_Call``, run by
``_run`` once the actors' calls of the same step are on their way); ``_cause``: why Ray says a
host was lost, in a few words.
"""

from __future__ import annotations

import re
from typing import Any

import ray

from raysim.engine import faults
from raysim.engine.host import Host
from raysim.engine.trees import from_numpy, to_numpy
from raysim.errors import raised_at


def _fetch(parts: dict[int, Any]) -> dict[int, Any]:
    """Per-group parts sent as {group: ref}: fetched here, on the host (Ray does not resolve
    refs inside a dict)."""
    keys = list(parts)
    return dict(zip(keys, (from_numpy(v) for v in ray.get([parts[k] for k in keys]))))


def _cause(err: BaseException) -> str:
    """Ray's several-hundred-character reason, as a few words: out of memory (Ray's memory
    monitor, with its figures), the node gone, an actor that could not be created (its class or
    arguments do not load in that process: the error and where it was raised), or the process
    dead (a SIGKILL — the kernel's OOM killer or a kill — or a crash; Ray cannot tell these
    apart)."""
    text = str(err)
    low = text.lower()
    pid, ip = re.search(r"pid[:=] ?(\d+)", text), re.search(r"ip[:=] ?([\w.:-]+)", text)
    where = f" (pid {pid.group(1)} on {ip.group(1)})" if pid and ip else ""
    if isinstance(err, ray.exceptions.OutOfMemoryError) or "low on memory" in low or "memory pressure" in low:
        figures = next(
            (ln.strip() for ln in text.splitlines() if "memory" in ln.lower() and any(c.isdigit() for c in ln)), ""
        )
        return f"out of memory{where}: {figures[:240]}" if figures else f"out of memory{where}"
    if getattr(err, "preempted", False) or re.search(r"node (has )?died|node .* (is dead|was removed)", low):
        return f"its node left the cluster{where}"
    if getattr(err, "actor_init_failed", False):  # e.g. a plugin that does not import there
        at = raised_at(text)
        last = text.strip().splitlines()[-1].strip()
        return f"its actor could not be created{where}: {last}" + (f" (raised at {at})" if at else "")
    return f"its process died{where}: killed (SIGKILL: the kernel's OOM killer or a kill) or crashed"


class RayHost(Host):
    """A Host as a Ray actor: tensors cross the process boundary as numpy arrays.

    What the host's construction raises (a plugin's model, dataset or algorithm refusing, say)
    is raised again by its first call, ``prefetch``: Ray keeps an actor's creation error only as
    text, and reports it as the actor's death (read as a SIGKILL, the host replaced, the same
    error again), while a call's error reaches the driver as the exception itself, its type
    (a ScenarioError is still exit 2), message and traceback."""

    def __init__(self, index: int, *args, **kwargs):
        self.index = index
        self._failed: Exception | None = None
        try:
            super().__init__(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - raised again by the first call
            self._failed = e

    def prefetch(self) -> None:
        """Host's, the first call of every transport: the construction's error, if any, first."""
        if self._failed is not None:
            raise self._failed
        super().prefetch()

    def reset(self, index: int, *args, **kwargs) -> None:
        """Become host ``index`` of another run (``reuse_hosts``): everything of the previous
        run dropped, then built as a new actor would be."""
        self.__dict__.clear()
        self.__init__(index, *args, **kwargs)

    def _fault(self, phase: str, round_: int) -> None:
        if self.cids:
            faults.host_fault(phase, round_, self.index)

    def stats(self, round_: int, message: Any, cids: list[int]):
        return super().stats(round_, from_numpy(message), cids)

    def train(
        self,
        round_: int,
        shared: Any,
        parts: dict[int, Any],
        groups: dict[int, int],
        each: bool = False,
        work: dict[int, float] | None = None,
        clip: float | None = None,
    ):
        self._fault("train", round_)
        return super().train(round_, from_numpy(shared), _fetch(parts), groups, each, work, clip)

    def evaluate(self, round_: int, shared: Any, parts: dict[int, Any], groups: dict[int, int], unseen: list[int] = ()):
        self._fault("evaluate", round_)
        return super().evaluate(round_, from_numpy(shared), _fetch(parts), groups, unseen)

    def gossip_init(self, server: Any) -> dict[int, int]:
        return super().gossip_init(from_numpy(server))

    def consensus(self, mean: Any):
        return super().consensus(from_numpy(mean))

    def gossip_train(self, round_: int, cids: list[int], outbox: dict[int, list[int]]):
        """One object per host that needs some of these clients' messages, holding exactly
        those; it goes into this node's object store and only its ref leaves."""
        self._fault("gossip_train", round_)
        self._mix_round = round_
        bundles, losses, secs = super().gossip_train(round_, cids, outbox)
        return {h: ray.put(to_numpy(b)) for h, b in bundles.items()}, losses, secs

    def gossip_mix(self, inbox: list[Any], rows):
        """Fetch the bundles other hosts made for this one (peer to peer), then mix."""
        self._fault("gossip_mix", getattr(self, "_mix_round", -1))
        return super().gossip_mix([from_numpy(b) for b in ray.get(list(inbox))], rows)

    def write_states(self, folder: str, path: str, token: str, head: dict):
        """As Host's; states this process cannot write stay in its object store (a ref)."""
        entry, trees = super().write_states(folder, path, token, head)
        return entry, None if trees is None else ray.put(to_numpy(trees))

    def read_states(self, folder: str, doc: dict, token: str, given=None) -> bool:
        return super().read_states(folder, doc, token, None if given is None else from_numpy(given))


class DriverRayHost(RayHost):
    """Host 0 in the driver's process (``resources.driver_host``). It is never lost on its own:
    a fault injected into it (``raysim.engine.faults``) would kill the driver, so none is."""

    def _fault(self, phase: str, round_: int) -> None:
        pass


class _Call:
    """A call of the driver's host, run by ``_run`` once every actor's call of the same step is
    on its way (so host 0 trains while the actors do)."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def run(self):
        # as Ray does for an actor: an ObjectRef passed as an argument arrives as its value
        args = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in self.args]
        kwargs = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in self.kwargs.items()}
        return self.fn(*args, **kwargs)


class _Method:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs) -> _Call:
        return _Call(self.fn, args, kwargs)


class DriverHost:
    """The driver's host, called as an actor handle is (``host.train.remote(...)``), built at its
    first call (so the actors boot meanwhile). ``reset`` makes it another run's host 0."""

    def __init__(self, *args):
        self._args, self._host = args, None

    def _reset(self, *args) -> None:
        self._args, self._host = args, None

    def _get(self) -> DriverRayHost:
        if self._host is None:
            index, sc, cids, device, threads, source = self._args
            source = ray.get(source) if isinstance(source, ray.ObjectRef) else source
            self._host = DriverRayHost(index, sc, cids, device, threads, source)
        return self._host

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "reset":
            return _Method(self._reset)
        return _Method(lambda *args, **kwargs: getattr(self._get(), name)(*args, **kwargs))


def _kill(host) -> None:
    if not isinstance(host, DriverHost):
        ray.kill(host)  # a dead one too: no error


def _run(refs: list, timeout: float | None = None) -> list:
    """The results of one call per host: the driver's host's call run here first, then the
    actors' awaited (``ray.get``)."""
    here = {i: r.run() for i, r in enumerate(refs) if isinstance(r, _Call)}
    rest = ray.get([r for r in refs if not isinstance(r, _Call)], timeout=timeout)[::-1]
    return [here[i] if i in here else rest.pop() for i in range(len(refs))]
