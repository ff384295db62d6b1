"""The per-agent writer lock: shared for writers, exclusive for recovery.

A pending intent is either in flight (its writer holds the shared lock) or
abandoned by a crash (no one holds it: the kernel drops flock locks when a
process dies, SIGKILL included). Recovery takes the lock exclusively, so it
can never mistake a live transaction for a crashed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def shared(path: Path) -> Iterator[None]:
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive(path: Path, *, wait: bool) -> Iterator[bool]:
    """Yields True if the lock is held; False if ``wait`` is off and it is busy."""
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
