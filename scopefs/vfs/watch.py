"""Waking a mount when its catalogs or artifacts change, instead of polling them.

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

The same kind of watch on the store directories of the artifacts behind
the kernel's cached pages names each artifact written, renamed, removed
or changed in its attributes (``ARTIFACT_EVENTS``), so that its pages are
looked at again at once (``vfs.reads``) instead of at the next turn of the
slow sweep of every cached inode.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import struct
from pathlib import Path

import trio

log = logging.getLogger("scopefs.vfs")

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
CATALOG_EVENTS = IN_MODIFY | IN_MOVED_TO | IN_CREATE | IN_DELETE
ARTIFACT_EVENTS = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
_READ = 64 * 1024
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name

_libc = ctypes.CDLL(None, use_errno=True)


class DirectoryWatch:
    """An inotify descriptor on some directories: the databases' of one view, or its artifacts' stores."""

    def __init__(self, fd: int, events: int) -> None:
        self._fd = fd
        self._events = events
        self._watched: set[Path] = set()

    @classmethod
    def open(cls, events: int = CATALOG_EVENTS) -> DirectoryWatch | None:
        """A new watch, or None where inotify is unavailable (the mount then polls)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.warning("no inotify (%s): the mount polls instead", errno.errorcode.get(ctypes.get_errno(), "?"))
            return None
        return cls(fd, events)

    def watch(self, directories: set[Path]) -> tuple[bool, bool]:
        """Watch each of ``directories`` not watched yet: (all are watched, one was just added).

        A commit that landed before a watch was added was reported to
        nobody, so after adding one the caller must look at the catalog
        once before it sleeps on the watch.
        """
        ok, added = True, False
        for directory in directories - self._watched:
            if _libc.inotify_add_watch(self._fd, os.fsencode(directory), self._events) < 0:
                ok = False
                continue
            self._watched.add(directory)
            added = True
        return ok, added

    async def changed(self) -> None:
        """Return once something changed in a watched directory since the last call (events drained)."""
        await self.changed_names()

    async def changed_names(self) -> set[str] | None:
        """The names that changed in the watched directories since the last call (None: the kernel's
        queue overflowed, so anything may have), once there is at least one."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            chunks = self._drain()
            if chunks:
                return _names(chunks)

    def _drain(self) -> list[bytes]:
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(self._fd, _READ)
            except BlockingIOError:
                return chunks
            if not data:
                return chunks
            chunks.append(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _names(chunks: list[bytes]) -> set[str] | None:
    """The names the events in ``chunks`` are about; None if one says events were lost."""
    names: set[str] = set()
    for data in chunks:
        at = 0
        while at + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            if mask & IN_Q_OVERFLOW:
                return None
            name = data[at + _EVENT.size:at + _EVENT.size + length].split(b"\0", 1)[0]
            if name:
                names.add(os.fsdecode(name))
            at += _EVENT.size + length
    return names
