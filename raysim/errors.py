"""Exit codes, and an error as the one line the command prints."""

from __future__ import annotations

import re
import traceback

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class BadInput(Exception):
    """An error in what the user gave (a scenario, a file, an argument, a run id): its message is
    the one line the command prints, and the exit code is 2. Each reader's own error (the
    scenario's, a trace's, a dataset's, a report's) is one of these."""


class ScenarioError(BadInput, ValueError):
    """Invalid scenario, override, data or argument; the message is one line naming file and
    key. A ValueError, so that ``except ValueError`` catches it too (the command: exit 2)."""


class RunsFailed(Exception):
    """Some runs of a sweep failed, each already reported; one line, exit 1."""


def explain(e: BaseException, verbose: bool = False) -> tuple[int, str]:
    """An error as (exit code, one line): bad input (2), interrupted (130; 143 when a SIGTERM
    stopped it), or a failure during the run (1; with ``verbose`` its traceback is printed
    first)."""
    if isinstance(e, KeyboardInterrupt):
        from raysim.signals import terminated

        return (EXIT_TERMINATED, "terminated (SIGTERM)") if terminated() else (EXIT_INTERRUPTED, "interrupted")
    cause = _root_cause(e)  # a Ray task's error is also an instance of its cause, with Ray's text
    if isinstance(cause, BadInput):
        return EXIT_INPUT, str(cause)
    if isinstance(e, RunsFailed):
        return EXIT_FAILED, str(e)
    if verbose:
        traceback.print_exception(e)
    msg = str(cause).strip().splitlines()
    at = raised_at(str(e)) if cause is not e else None  # Ray's text of the host's traceback
    return EXIT_FAILED, (
        f"run failed: {type(cause).__name__}: {msg[-1] if msg else ''}"
        + (f" (raised on a Ray host at {at})" if at else "")
        + ("" if verbose else " (rerun with -v for the traceback)")
    )


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)


def raised_at(text: str) -> str | None:
    """Where a traceback in ``text`` (Python's format, which Ray's error of a task or of an actor's
    creation quotes from the process it ran in) says its exception was raised: the innermost
    frame, ``FILE:LINE, in FUNCTION``; None when the text quotes no traceback."""
    frames = _FRAME.findall(text)
    if not frames:
        return None
    file, line, function = frames[-1]
    return f"{file}:{line}, in {function}"


def _root_cause(e: BaseException) -> BaseException:
    """Unwrap Ray's task errors to the user's exception where Ray keeps it."""
    inner = getattr(e, "cause", None)
    if isinstance(inner, BaseException):
        return _root_cause(inner)
    return e
