"""Asking the disk for a listed folder's small artifacts before the tool that listed it reads them.

Why: a cold ``grep -r`` reads note after note, and each READ opens its
note's artifact and reads it from the disk before it can hash it and
answer. One file at a time, that is one disk round trip after another:
over the 10,000 notes of ``bench/fuse_bench.py`` it was half of a cold
``grep -r`` (3.3 s, and 1.7 s with the artifacts already in memory;
``bench/RESULTS.md``, issue 14 fifth step). The kernel lists a folder
(READDIR; a warm listing is answered from its own cache and never gets
here) just before a tool walks it, so the listing is the moment to ask
for the folder's artifacts: ``posix_fadvise(WILLNEED)`` queues their
reads and returns, the disk serves them together, and the READs that
follow find them in memory.

Nothing is read into this process and nothing is served from here: a
READ still opens, checks and hashes its artifact (``vfs.content``), and
only finds the pages cached. So a name this thread opens by mistake (a
store swapped under the mount, say) costs a wasted read, never a byte
served. It is best effort: listings that come faster than the thread
keeps up are dropped, and an error skips the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading

from scopefs.catalog.artifacts import check_locator
from scopefs.catalog.errors import ScopefsError
from scopefs.catalog.fsafe import open_regular

log = logging.getLogger("scopefs.vfs")

AHEAD_BYTES = 256 << 10  # only notes up to this size: a large one is read ahead by the kernel anyway
AHEAD_NOTES = 1024  # per listing: a folder of 100,000 notes costs no more than one of 1,024
WAITING = 8  # listings queued for the thread; more are dropped

Place = tuple[int, str]  # a store directory's descriptor (held by ``Artifacts``), an artifact's name in it


class ReadAhead:
    """One thread that asks for the artifacts of listed folders, started on the first listing.

    The store descriptors it is given belong to ``Artifacts``, which
    calls ``close`` (and so waits for the thread) before closing them.
    """

    def __init__(self) -> None:
        self._waiting: queue.Queue[list[Place] | None] = queue.Queue(maxsize=WAITING)
        self._thread: threading.Thread | None = None

    def want(self, places: list[Place]) -> None:
        """Ask for ``places`` soon (the caller filtered them by size); never blocks."""
        if not places:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scopefs-readahead", daemon=True)
            self._thread.start()
        with contextlib.suppress(queue.Full):
            self._waiting.put_nowait(places[:AHEAD_NOTES])

    def close(self) -> None:
        """Stop the thread; no descriptor given to ``want`` is used once this returns."""
        if self._thread is None:
            return
        while True:  # make room for the end: drop what still waits
            try:
                self._waiting.put_nowait(None)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._waiting.get_nowait()
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while (places := self._waiting.get()) is not None:
            for dir_fd, name in places:
                try:
                    _ask(dir_fd, name)
                except Exception as exc:  # noqa: BLE001 - a file skipped, never the thread ended
                    log.warning("a read-ahead was skipped (%s)", type(exc).__name__)


def _ask(dir_fd: int, name: str) -> None:
    """Open ``name`` the way a READ does (a well-formed locator, right below the store, not crossing a
    mount, a single-link regular file: ``open_regular``) and ask for its first ``AHEAD_BYTES``."""
    try:
        fd, info = open_regular(dir_fd, check_locator(name))
    except (OSError, ScopefsError):
        return
    try:
        os.posix_fadvise(fd, 0, min(info.st_size, AHEAD_BYTES), os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
