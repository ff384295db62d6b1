"""Errors that cross the broker boundary, each tied to one exit code.

The command line maps these to the exit codes of DESIGN.md §7, and the FUSE
server maps them to errnos (``vfs.errors``). Keeping the mapping on the exception
means no caller can forget which class of failure it is reporting, and a
refusal never needs to carry detail about other scopes to be actionable.
"""

from __future__ import annotations

import os


class ScopefsError(Exception):
    """Base class: anything else (exit code 1)."""

    exit_code = 1


class BadInput(ScopefsError):
    """The caller's input is malformed or names nothing known (exit code 2).

    Raised before any state changes, so a bad input never leaves a trace.
    """

    exit_code = 2


class TooLarge(BadInput):
    """Content over the note size limit (exit code 2; ``EFBIG`` through a mount).

    A class of its own so that no caller has to recognise it by its message.
    """


class Denied(ScopefsError):
    """Refused by policy (exit code 3), with a stable public reason code.

    ``reason`` is what the caller may learn. It never names another scope:
    a resource that exists but is hidden and one that does not exist at all
    produce the same reason.
    """

    exit_code = 3

    def __init__(self, reason: str, message: str | None = None) -> None:
        self.reason = reason
        super().__init__(message or f"denied: {reason}")


class IntegrityError(ScopefsError):
    """An artifact is missing or does not match its catalog hash (exit 4).

    The bytes are never returned; the revision stays unavailable until
    repaired.
    """

    exit_code = 4


class Conflict(ScopefsError):
    """Another writer changed the resource first (exit code 1).

    The write changed nothing; retrying against the new revision is safe.
    """

    exit_code = 1


class StorageError(ScopefsError):
    """The filesystem or database failed (I/O error, no space); exit 1.

    Raised after the failed transaction has been cleaned up: no staged file
    remains and nothing was activated.
    """

    exit_code = 1


def storage_error(what: str, exc: OSError) -> StorageError:
    """A StorageError for a failed file operation of a write: names the
    operation and the errno's text, never a path (paths may carry names)."""
    return StorageError(f"{what}: {os.strerror(exc.errno or 0)}; nothing was written")
