"""MLflow tracking in a helper process, beside a run that has not imported MLflow yet.

Importing MLflow and its SQL store, opening the store and creating the run cost about 2 to 3
s of one core (import 1.2 s and 0.9 s, the store 0.7 s, 1.75 s for a new database). The
serial engine runs every host in the command's process, so a tracking thread there would
hold the GIL against the hosts' data loading and rounds for those seconds. A process of its
own does the same work on another core: the ``raysim run`` command starts it first thing
(``prestart``, before PyTorch loads), the run builds its hosts and starts its rounds meanwhile,
and the run's calls (``log_round``, ``flush``, ``note_checkpoint``, ``log_summary``,
``finish``) go to the ``raysim.results.tracking.Tracker`` there over a pipe, in order. A new run's
rounds do not wait for the run to exist (``started``): its id is first needed at the first
checkpoint, and the runner takes the helper's answer after each round (``check``), so a store
that refuses the run stops it with the store's error. A resumed run waits (``ready``): the
helper checks it can be resumed. The run's record is the same either way; where MLflow is
imported already (a sweep's parent run, a notebook's second run, the tests), runs track in a
thread as before (``wanted``).

The helper ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C reaches the whole process group, and
a closed terminal or SSH session the session's): the run decides, and marks its MLflow run
KILLED or FAILED through ``finish`` as it would itself. If the run's process dies without a word
(a SIGKILL, the kernel's OOM killer, or, in a Ray cluster, its node's Ray stopped under it: Ray
ends a driver whose raylet is gone at once, as ``ray down`` does), the helper sees its pipe
close: it writes the rounds the run had logged, marks the run KILLED and prints the way to
resume it, as the run would have (``_orphaned``). Only when both processes die (a kill of the
process group, a power loss) is the run left RUNNING with the run's own pid as its driver, for
the next run on the store to mark FAILED (``Tracker.reap``). What the helper prints comes back
to the run's standard error.

The command's runs always track here; a run started from Python (``raysim.run``, a sweep, a
notebook), where MLflow is imported already, tracks in a thread of its own process.
"""

from __future__ import annotations

import importlib.abc
import os
import subprocess
import sys
from multiprocessing.connection import Connection, Pipe
from typing import Any

from raysim.scenario.config import RunSpec


def wanted() -> bool:
    """Whether a run in this process should track through a helper: MLflow not imported yet."""
    return "mlflow" not in sys.modules


_REPLIES = {"flush", "note_checkpoint", "log_summary", "finish"}
# the helper's scheduling priority (added to its niceness): on a machine with fewer cores than a
# starting run has busy processes (2 cores: the driver importing PyTorch, Ray's daemons, then a
# host actor importing it too), MLflow's import in the helper took a core from Ray's start.
# Nothing waits on the helper then (a new run's rounds do not wait for its MLflow run); what
# waits on it (``flush`` at a checkpoint, ``finish``) leaves the cores idle for it. Measured:
# ``bench/tiny.yaml`` whole process 11.8 s at 0, 11.0 s at 10 (median of 8 alternated pairs)
NICE = 10


def _serve(
    conn,
    spec: RunSpec,
    resume: str | None,
    verbose: bool,
    tags: dict | None,
    driver_pid: int,
    resume_command: str | None,
) -> None:
    """The helper: a Tracker, then its calls from the pipe until ``finish`` or the pipe closes."""
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            from raysim.results.tracking import Tracker

            tracker = Tracker(spec, resume, verbose, tags, driver_pid=driver_pid)
            if resume_command:
                tracker.note_resume(resume_command.format(run_id=tracker.run_id))
    except BaseException as e:  # noqa: BLE001 - raised in the run's process
        _send(conn, "error", e, said.getvalue())
        return
    _send(conn, "ok", (tracker.run_id, tracker.uri), said.getvalue())
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):  # the run's process is gone, without ``finish``
            _orphaned(tracker, spec, resume_command)
            return
        try:
            out = getattr(tracker, op)(*args)
            reply = ("ok", out)
        except BaseException as e:  # noqa: BLE001 - raised in the run's process
            reply = ("error", e)
        if op in _REPLIES:
            _send(conn, *reply, "")
        if op == "finish":
            # the run is ended and every write committed: leave without MLflow's exit handlers
            # (about half a second, which the run would wait for)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


ORPHANED = "its process ended without finishing it (killed, the OOM killer, or its Ray node stopped under it, as `ray down` does)"


def _orphaned(tracker, spec: RunSpec, resume_command: str | None) -> None:
    """The run's process is gone without ending its MLflow run: the rounds it logged written,
    the run marked KILLED (tagged ``raysim.failure`` with why) and the way to resume it
    printed, in the words the run itself uses (``resume_words``). The helper names the run's
    checkpoint folder, not a round: the run may have committed a round it had not yet told."""
    import contextlib
    import io

    run_id = tracker.run_id
    try:  # MLflow's own lines ("View run at") would meet a closed terminal (EIO) and stop it
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            tracker.client.set_tag(run_id, "raysim.failure", ORPHANED)
            tracker.finish("killed")
    except Exception as e:  # noqa: BLE001 - the store is gone too: reap marks it later
        _say([f"raysim: MLflow run {run_id}: {ORPHANED}; it could not be marked KILLED ({e})"])
        return
    folder = os.path.join(spec.checkpoints, run_id) if spec.checkpoints else None
    where = f"its checkpoints are in {folder}" if folder and os.path.isdir(folder) else NO_CHECKPOINT
    command = resume_command.format(run_id=run_id) if resume_command else None
    _say([f"raysim: MLflow run {run_id}: {ORPHANED}."] + resume_words(run_id, "KILLED", where, command))


NO_CHECKPOINT = "no checkpoint yet: resumed, it starts again from round 1 in the same MLflow run"


def resume_words(run_id: str, status: str, where: str, command: str | None) -> list[str]:
    """The lines that tell a stopped run's status, where it stands (``where``: its last
    checkpoint, or ``NO_CHECKPOINT``) and the command that continues it: the run's own
    (``runner.tell_resume``) and the helper's (``_orphaned``)."""
    lines = [f"raysim: MLflow run {run_id} marked {status}; {where}"]
    if command:
        lines.append(f"raysim: continue it with: {command}")
    return lines


def _say(lines: list[str]) -> None:
    try:  # a terminal or SSH session already closed: nobody to tell
        sys.stderr.write("".join(line + "\n" for line in lines))
        sys.stderr.flush()
    except OSError:
        pass


# top-level packages ``import mlflow`` pulls in for features the helper never calls, imported
# there only when a call needs them (``import_tracking``): pandas, for MLflow's dataset and
# evaluation modules (with it pyarrow's tables and SciPy): about 50 MB and 0.2 to 0.9 s of CPU
DEFERRED = ("pandas",)


class _Deferred(importlib.abc.MetaPathFinder):
    """While installed: the ``DEFERRED`` packages read as not installed (ModuleNotFoundError)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in DEFERRED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def import_tracking() -> None:
    """Import ``raysim.results.tracking`` (MLflow, its client and stores) with the ``DEFERRED`` packages
    read as absent, then import them normally again. MLflow imports pandas at its top level only
    to bind it in its dataset and evaluation modules, guarded as an optional package (the
    mlflow-skinny distribution has none); the calls the helper makes (create, log, tag, search
    and end runs, log and fetch artifacts) import what they use inside the call, so a call that
    does need pandas loads it then."""
    finder = _Deferred()
    sys.meta_path.insert(0, finder)
    try:
        import raysim.results.tracking  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


def _send(conn, kind: str, value: Any, said: str) -> None:
    """A reply; an exception that does not pickle, or does not unpickle (one whose ``__init__``
    takes other arguments than its ``args``, as MLflow's UnsupportedModelRegistryStoreURIException:
    the run would get a TypeError instead), goes as a RuntimeError with its text. A copy is
    made as unpickling makes one (the class called with ``args``), so it tells."""
    import copy

    try:
        if isinstance(value, BaseException):
            copy.copy(value)
        conn.send((kind, value, said))
    except Exception:  # noqa: BLE001
        conn.send((kind, RuntimeError(f"{type(value).__name__}: {value}"), said))


def _start_helper() -> tuple[Connection, subprocess.Popen]:
    """The helper process, importing MLflow at once, then waiting for its run on the pipe. A
    command of its own (``python -m raysim.results.tracker_process FD``), not multiprocessing's spawn,
    which would run the caller's main script again in the helper."""
    conn, child = Pipe()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # raysim importable there too
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.results.tracker_process", str(child.fileno())],
        pass_fds=[child.fileno()],
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )
    child.close()
    return conn, proc


_PRESTARTED: tuple[Connection, subprocess.Popen] | None = None


def prestart() -> None:
    """Start the helper now, before this process imports PyTorch and loads the scenario (the
    ``raysim run`` command of a serial run does, first thing), so MLflow's imports overlap
    them; the run takes it (``TrackerProcess``). Unused, it ends with this process, or at
    ``discard``."""
    global _PRESTARTED
    if _PRESTARTED is None and wanted():
        import atexit

        _PRESTARTED = _start_helper()
        atexit.register(discard)


def discard() -> None:
    """Stop a prestarted helper no run will take: a sweep's runs track in threads (its parent
    run imports MLflow here), and a refused scenario has no run."""
    global _PRESTARTED
    if _PRESTARTED is not None:
        conn, proc = _PRESTARTED
        _PRESTARTED = None
        conn.close()
        proc.kill()
        proc.wait()


class TrackerProcess:
    """A ``Tracker`` in a helper process, with its methods; ``ready()`` waits for the run."""

    def __init__(
        self,
        sc,
        resume: str | None = None,
        verbose: bool = False,
        tags: dict | None = None,
        resume_command: str | None = None,
    ):
        global _PRESTARTED
        (self._conn, self._proc), _PRESTARTED = _PRESTARTED or _start_helper(), None
        self._conn.send((RunSpec.of(sc), resume, verbose, tags, os.getpid(), resume_command))
        self._run: tuple[str, str] | None = None
        self.failed: BaseException | None = None  # the helper's error creating the run

    @property
    def run_id(self) -> str:
        """The MLflow run's id (waits for the helper to create it)."""
        return self.ready()._run[0]

    @property
    def uri(self) -> str:
        return self.ready()._run[1]

    def _reply(self) -> Any:
        try:
            kind, value, said = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(
                f"the MLflow tracking process ended unexpectedly (exit code {self._proc.poll()})"
            ) from None
        if said:
            sys.stderr.write(said)
            sys.stderr.flush()
        if kind == "error":
            raise value
        return value

    def ready(self) -> TrackerProcess:
        """The run created (or reopened): its id and the store's URI known; the helper's error
        (a store that cannot be opened, a run that cannot be resumed) raised here."""
        if self.failed is not None:
            raise self.failed
        if self._run is None:
            try:
                self._run = self._reply()
            except BaseException as e:
                self.failed = e
                self._wait()
                raise
        return self

    def started(self) -> TrackerProcess:
        """Without waiting: the rounds may start while the helper creates the run (the calls
        queue up in the pipe); ``check`` and the first use of ``run_id`` surface its error."""
        return self

    def check(self) -> None:
        """If the helper has answered about the run, take its answer (raising its error)."""
        if self._run is None and self._conn.poll():
            self.ready()

    def _call(self, op: str, *args) -> Any:
        try:
            self._conn.send((op, args))
        except OSError:  # BrokenPipeError: the helper is gone (its reason first)
            if self._run is None:
                self.ready()
            raise RuntimeError(
                f"the MLflow tracking process ended unexpectedly (exit code {self._proc.poll()})"
            ) from None
        if op in _REPLIES:
            self.ready()  # the run's answer comes first in the pipe
            return self._reply()
        return None

    def log_round(self, record: dict) -> None:
        self._call("log_round", record)

    def flush(self) -> None:
        self._call("flush")

    def note_checkpoint(self, folder) -> None:
        self._call("note_checkpoint", str(folder))

    def note_hosts(self, nodes: dict[int, str]) -> None:
        self._call("note_hosts", dict(nodes))

    def log_summary(self, summary: dict) -> None:
        self._call("log_summary", summary)

    def finish(self, outcome: str) -> None:
        """End the run with the outcome's status (nothing to end if it was never created: its
        error has been raised already)."""
        if self.failed is not None:
            return
        try:
            self._call("finish", outcome)
        finally:
            self._wait()

    def _wait(self) -> None:
        self._conn.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run decides (see above)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlives a closed session to mark the run
    if hasattr(os, "nice"):
        os.nice(NICE)  # behind the run's own processes (see NICE)
    import_tracking()  # MLflow imported while the run loads; then its run
    _conn = Connection(int(sys.argv[1]))
    try:
        _init = _conn.recv()
    except (EOFError, OSError):  # not taken (discard, or the run's process ended first)
        sys.exit(0)
    _serve(_conn, *_init)
