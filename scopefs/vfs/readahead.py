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
served. It is best effort: listings that come faster than the threads
keep up with are dropped, and an error skips the file.

Several threads (``WORKERS``) share the work, a few files at a time: what
a cold listing waits for is the disk reading each artifact's inode before
the file can even be opened, and one thread asks for one inode at a time,
so it stayed barely ahead of the ``grep`` it was meant to serve (four
threads took a cold ``grep -r`` through a mount from 2.64 s to 2.43 s,
``bench/RESULTS.md``, issue 14 seventh step). They are started by a
listing and end after ``IDLE_S`` without one, so an idle mount keeps none
(issue 14 counts each mount's resident memory).
"""

from __future__ import annotations

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
WAITING = 8  # listings' worth of files queued for the threads; more are dropped
WORKERS = 4  # threads asking at once: enough to keep the disk's queue busy, few enough for 2 cores
CHUNK = 16  # files a thread takes at a time
IDLE_S = 2.0  # a thread with nothing to ask for this long ends

Place = tuple[int, str]  # a store directory's descriptor (held by ``Artifacts``), an artifact's name in it


class ReadAhead:
    """Up to ``WORKERS`` threads that ask for the artifacts of listed folders, started by listings.

    The store descriptors it is given belong to ``Artifacts``, which
    calls ``close`` (and so waits for the threads) before closing them.
    """

    def __init__(self) -> None:
        self._waiting: queue.Queue[list[Place] | None] = queue.Queue(maxsize=WAITING * AHEAD_NOTES // CHUNK)
        self._lock = threading.Lock()  # guards ``_threads`` and ``_closed`` against the threads' own exit
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self._refused = False  # a thread could not be started once: said once, not on every listing

    def want(self, places: list[Place]) -> None:
        """Ask for ``places`` soon (the caller filtered them by size); never blocks."""
        places = places[:AHEAD_NOTES]
        with self._lock:
            if self._closed or not places:
                return
            for at in range(0, len(places), CHUNK):
                try:
                    self._waiting.put_nowait(places[at:at + CHUNK])
                except queue.Full:
                    break
            # A thread about to end for idleness is still counted here; it looks at the queue under
            # this lock before it goes (``_next``), so it sees what was just put and stays.
            while len(self._threads) < min(WORKERS, self._waiting.qsize()):
                thread = threading.Thread(target=self._run, name="scopefs-readahead", daemon=True)
                self._threads.add(thread)
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had (a limit): the listing is answered all the same
                    self._threads.discard(thread)
                    if not self._refused:
                        self._refused = True
                        log.warning("a read-ahead thread could not be started; listings are not read ahead")
                    break

    def threads(self) -> int:
        """How many threads are counted now (a thread leaves the count just before it ends)."""
        with self._lock:
            return len(self._threads)

    def close(self) -> None:
        """Stop the threads; no descriptor given to ``want`` is used once this returns."""
        with self._lock:
            self._closed = True  # no more is queued and no thread is started from now on
            threads = list(self._threads)
        while True:  # what still waits is dropped
            try:
                self._waiting.get_nowait()
            except queue.Empty:
                break
        for _ in threads:
            self._waiting.put(None)  # room for each: the queue was emptied and nothing is added
        for thread in threads:
            thread.join()

    def _next(self) -> list[Place] | None:
        """The next files to ask for; None once the thread is to end (closing, or idle and removed)."""
        while True:
            try:
                return self._waiting.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._waiting.empty():
                        self._threads.discard(threading.current_thread())  # before the lock goes: see ``want``
                        return None

    def _run(self) -> None:
        try:
            while (places := self._next()) is not None:
                for dir_fd, name in places:
                    try:
                        _ask(dir_fd, name)
                    except Exception as exc:  # noqa: BLE001 - a file skipped, never the thread ended
                        log.warning("a read-ahead was skipped (%s)", type(exc).__name__)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())


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
