"""What the command line prints: people get lines, ``--json`` gets one object.

Text lines carry names, paths and snippets that other people wrote (a group
member's note, say), so every one goes through ``printable``: no control
byte, line separator or bidi override from a note ever reaches the
operator's terminal raw or splits one line of output into two. ``--json``
needs no such care, ``json.dumps`` escapes them already.

Writing stdout can fail (a full disk, a closed pipe): that is
``OutputLost``, which ``main`` reports once, on stderr (``lost_output``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from scopefs.catalog.printable import printable


class OutputLost(Exception):
    """stdout does not take what we print (a full disk, a closed pipe)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(os.strerror(cause.errno) if cause.errno else cause.__class__.__name__)
        self.closed_pipe = isinstance(cause, BrokenPipeError)


@contextlib.contextmanager
def _stdout() -> Iterator[None]:
    """Turn a failed write to stdout into ``OutputLost``, told apart from storage errors."""
    try:
        yield
    except OSError as exc:
        raise OutputLost(exc) from exc


def emit(as_json: bool, payload: dict[str, Any], lines: list[str] | None = None) -> None:
    """Print ``payload`` as one JSON object, or ``lines`` (escaped by ``printable``) for people."""
    with _stdout():
        if as_json:
            sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
        else:
            for line in lines if lines is not None else [f"{k}: {v}" for k, v in payload.items()]:
                sys.stdout.write(printable(line) + "\n")
        sys.stdout.flush()


def write_bytes(data: bytes) -> None:
    """Raw bytes to stdout (a note's content, which is the reader's to display), flushed."""
    with _stdout():
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def write_text(text: str) -> None:
    """Our own text (help) to stdout as it is, flushed."""
    with _stdout():
        sys.stdout.write(text)
        sys.stdout.flush()


def _to_stderr(text: str) -> None:
    """Best effort: with stderr gone too, there is nowhere left to report anything."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(text)
        sys.stderr.flush()


def drop_stdout() -> None:
    """Point stdout's descriptor at /dev/null after it failed.

    What is still buffered for it is then discarded at exit, instead of
    failing again in the interpreter's last flush (a second report, or a
    traceback) after ours.
    """
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        finally:
            os.close(null)


def lost_output(exc: OutputLost) -> int:
    """Exit code 1 for a stdout that failed: quietly for a closed pipe (the
    reader left, as ``head`` does), else one line on stderr."""
    drop_stdout()
    if not exc.closed_pipe:
        _to_stderr(f"scopefs: cannot write the output: {exc}\n")
    return 1


def fail(as_json: bool, exit_code: int, message: str, reason: str | None = None) -> int:
    """One line on stderr (and one JSON object on stdout with --json)."""
    line = " ".join(str(message).split())  # exactly one line, whatever the message held
    _to_stderr(f"scopefs: {printable(line)}\n")
    if as_json:
        body: dict[str, Any] = {"error": line, "exit_code": exit_code}
        if reason is not None:
            body["reason"] = reason
        try:
            with _stdout():
                sys.stdout.write(json.dumps(body, sort_keys=True) + "\n")
                sys.stdout.flush()
        except OutputLost:
            drop_stdout()  # the line on stderr already said what went wrong
    return exit_code
