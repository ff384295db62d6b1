"""Waking a mount when its catalogs change, instead of polling them ten times a second.

Every change that can alter a view is a commit to ``state.sqlite`` or to a
cell's ``catalog.sqlite``, and every commit appends to that database's
write-ahead log with ``write(2)``, which inotify reports on the directory
that holds it. So a mount sleeps until one of those directories reports a
change, and then asks the catalog (``MountState.sync``) what it was.

Every process that writes those databases is on this host: SQLite's
write-ahead log works only between processes that share memory, so a home
on a network filesystem is not supported, and inotify sees every commit.
What it cannot tell is time passing: ``vfs.follow`` wakes when the next
policy entry or role membership of the view expires, and every
``FOLLOW_S`` as a net, and polls every ``POLL_S`` if inotify is
unavailable. A queue overflow reads as a change. A wake-up that was not
about this view costs one cheap ``refresh``. 100 idle mounts then wake a
few times a second between them, not 3,000 times.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
from pathlib import Path

import trio

log = logging.getLogger("scopefs.vfs")

IN_MODIFY = 0x002
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_MASK = IN_MODIFY | IN_MOVED_TO | IN_CREATE | IN_DELETE
_READ = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class CatalogWatch:
    """An inotify descriptor on the directories of the databases one view reads."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._watched: set[Path] = set()

    @classmethod
    def open(cls) -> CatalogWatch | None:
        """A new watch, or None where inotify is unavailable (the mount then polls)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.warning("no inotify (%s): the mount polls the catalog", errno.errorcode.get(ctypes.get_errno(), "?"))
            return None
        return cls(fd)

    def watch(self, directories: set[Path]) -> tuple[bool, bool]:
        """Watch each of ``directories`` not watched yet: (all are watched, one was just added).

        A commit that landed before a watch was added was reported to
        nobody, so after adding one the caller must look at the catalog
        once before it sleeps on the watch.
        """
        ok, added = True, False
        for directory in directories - self._watched:
            if _libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK) < 0:
                ok = False
                continue
            self._watched.add(directory)
            added = True
        return ok, added

    async def changed(self) -> None:
        """Return once something changed in a watched directory since the last call (events drained)."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            if self._drain():
                return

    def _drain(self) -> bool:
        got = False
        while True:
            try:
                data = os.read(self._fd, _READ)
            except BlockingIOError:
                return got
            if not data:
                return got
            got = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
