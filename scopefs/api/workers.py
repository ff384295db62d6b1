"""The homes a server's workers run requests on: one ``Home`` per request in flight.

A ``Home`` holds apsw connections for one thread at a time (``catalog.home``),
so a server that answers several requests at once gives each its own: a
pool of up to ``size`` homes of the same state directory, each with its own
connections. SQLite's WAL lets their readers run side by side; writers take
turns at ``BEGIN IMMEDIATE`` (with the busy timeout), and the artifact
writes under them take the per-agent writer lock as separate processes
would: ``scopefs.writer.lock`` opens the lock file anew for every take
(and recovery's probe of a staged file opens that file anew), so two
threads never share the open file description a ``flock`` belongs to,
and one thread's lock excludes another's (``tests/test_api_workers.py``).

A request leases a home for its whole run and gives it back; a home is
never used by two requests at once, though it may serve requests on
different threads one after the other (the lease hands it over under the
pool's lock). Homes are opened on first need, up to ``size``, and the
most recently returned one is lent next (its page cache is warm).
``close`` closes every home, those lent out as they come back; a lease
after it fails. What must be one for the whole process (the replay
window, per-capability quotas) is the service's, never a home's.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from scopefs.catalog.errors import BadInput, StorageError
from scopefs.catalog.home import Home

MAX_WORKERS = 64


def default_workers() -> int:
    """Requests run at once by default: one per CPU, at least 2 and at most 4.

    Two, so that a request waiting for a lock or the disk (a write behind
    ``doctor --fix``, a busy catalog) does not hold up every other session.
    Not many more: the work of a request is mostly Python under one
    interpreter lock, so threads add no throughput (measured on 2 CPUs:
    1, 2 and 4 workers within noise, 8 slower; ``bench/RESULTS.md``),
    only CPU spent contending, and a home's connections and caches each.
    """
    return max(2, min(4, os.cpu_count() or 1))


def check_workers(workers: object) -> int:
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise BadInput(f"--workers must be 1 to {MAX_WORKERS}")
    return workers


class WorkerHomes:
    """Up to ``size`` homes like ``first`` (same root, same SQLite VFS), each lent to one request at a time."""

    def __init__(self, first: Home, size: int = 1) -> None:
        self.size = check_workers(size)
        self._root, self._vfs = first.root, first.vfs
        self._cond = threading.Condition()
        self._free: list[Home] = [first]  # a stack: the last one returned is lent next
        self._opened = 1
        self._closed = False

    def _take(self) -> Home:
        with self._cond:
            while True:
                if self._closed:
                    raise StorageError("the server is stopping")
                if self._free:
                    return self._free.pop()
                if self._opened < self.size:
                    self._opened += 1  # reserved; opened outside the lock
                    break
                self._cond.wait()
        try:
            return Home.open(self._root, vfs=self._vfs)  # connections come lazily, on the home's first use
        except BaseException:
            with self._cond:
                self._opened -= 1
                self._cond.notify()
            raise

    def _give_back(self, home: Home) -> None:
        with self._cond:
            if not self._closed:
                self._free.append(home)
                self._cond.notify()
                return
        home.close()  # lent out when the pool closed: closed by the thread that used it last

    @contextlib.contextmanager
    def lease(self) -> Iterator[Home]:
        """A home for this request alone, until the block ends."""
        home = self._take()
        try:
            yield home
        finally:
            self._give_back(home)

    def close(self) -> None:
        """Close every home not lent out now, and each lent one as it comes back; no lease after this."""
        with self._cond:
            self._closed = True
            free, self._free = self._free, []
            self._cond.notify_all()
        for home in free:
            home.close()
