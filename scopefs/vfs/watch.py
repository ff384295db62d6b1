"""Waking a mount when its catalogs or artifacts change, instead of polling them.

Every change that can alter a view is a commit to ``state.sqlite`` or to a
cell's ``catalog.sqlite``, and every commit appends to that database's
write-ahead log with ``write(2)``, which inotify reports on the directory
that holds it. So a mount sleeps until one of those directories reports a
change, and then asks the catalog (``MountState.sync``) what it was.
Only the logs count (``commit_events``): every connection is in WAL mode
(``catalog.db.connect`` refuses any other), so a commit never writes the
database file itself, and what does write it, a checkpoint copying
committed pages back, changes nothing a view shows. Counted, checkpoints
woke every mount hundreds of times during one mount's ``grep -r`` (the
exposures it records fill the log of ``state.sqlite``). A database or log
made, moved in or removed (a restore) still counts.

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
from collections.abc import Awaitable, Callable
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
_LOG_SUFFIX = "-wal"  # SQLite's write-ahead log beside each database: where every commit is written
_DATABASE_SUFFIXES = (".sqlite", ".sqlite" + _LOG_SUFFIX)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


def commit_events(mask: int, name: str) -> bool:
    """Whether an event in a directory of databases may be a commit (see the module docstring)."""
    if mask & IN_MODIFY:
        return name.endswith(_LOG_SUFFIX)
    return name.endswith(_DATABASE_SUFFIXES)


_libc = ctypes.CDLL(None, use_errno=True)


class _Group:
    """What one reader of the watch waits for: the names that changed in its directories."""

    def __init__(self) -> None:
        self.keep: Callable[[int, str], bool] | None = None  # which events count (None: all of them)
        self.names: set[str] | None = set()  # None: events were lost, so anything may have changed
        self.pending = False
        self.wakeup = trio.Event()

    def add(self, name: str | None) -> None:
        if name is None:
            self.names = None
        elif self.names is not None and name:
            self.names.add(name)
        self.pending = True
        self.wakeup.set()

    def take(self) -> set[str] | None:
        names, self.names, self.pending = self.names, set(), False
        self.wakeup = trio.Event()
        return names


class DirectoryWatch:
    """One inotify descriptor per mount, on groups of directories that report apart.

    One descriptor, not one per purpose: the kernel allows a user 128
    inotify instances (``fs.inotify.max_user_instances``), and a gateway
    runs a hundred mounts as one user; a mount that cannot get one polls.
    ``run`` is the one task that reads the descriptor and hands each event
    to the group whose directory it came from (``changed``).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._groups: dict[str, _Group] = {}
        self._by_wd: dict[int, _Group] = {}
        self._watched: dict[str, set[Path]] = {}

    @classmethod
    def open(cls) -> DirectoryWatch | None:
        """A new watch, or None where inotify is unavailable (the mount then polls)."""
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.warning("no inotify (%s): the mount polls instead", errno.errorcode.get(ctypes.get_errno(), "?"))
            return None
        return cls(fd)

    def _group(self, group: str) -> _Group:
        return self._groups.setdefault(group, _Group())

    def watch(self, group: str, directories: set[Path], events: int,
              keep: Callable[[int, str], bool] | None = None) -> tuple[bool, bool]:
        """Watch each of ``directories`` not watched yet for ``group``: (all are watched, one was just added).

        ``keep(mask, name)``: which of the events wake ``group`` (None: all).
        A commit that landed before a watch was added was reported to
        nobody, so after adding one the caller must look at the catalog
        once before it sleeps on the watch.
        """
        found, watched = self._group(group), self._watched.setdefault(group, set())
        found.keep = keep
        ok, added = True, False
        for directory in directories - watched:
            wd = _libc.inotify_add_watch(self._fd, os.fsencode(directory), events)
            if wd < 0:
                ok = False
                continue
            self._by_wd[wd] = found
            watched.add(directory)
            added = True
        return ok, added

    async def changed(self, group: str) -> set[str] | None:
        """The names that changed in ``group``'s directories since the last call (None: the kernel's
        queue overflowed, so anything may have), once there is at least one."""
        found = self._group(group)
        while not found.pending:
            await found.wakeup.wait()
        return found.take()

    def consume(self, group: str) -> bool:
        """Whether anything was reported to ``group`` since it last looked; forgets it. Never waits."""
        found = self._group(group)
        if not found.pending:
            return False
        found.take()
        return True

    async def run(self, quiet: Callable[[], Awaitable[None]] | None = None) -> None:
        """Read the descriptor for as long as the mount lives; closes it when cancelled.

        ``quiet``: awaited once the descriptor has something to read, before reading it; what is
        reported meanwhile is read with it in one go (the kernel merges repeated events on one name
        while they are unread)."""
        try:
            while True:
                await trio.lowlevel.wait_readable(self._fd)
                if quiet is not None:
                    await quiet()
                chunks = self._drain()
                if chunks:
                    self._hand_out(chunks)
        finally:
            self.close()

    def _hand_out(self, chunks: list[bytes]) -> None:
        for wd, mask, name in _events(chunks):
            if mask & IN_Q_OVERFLOW:
                for group in self._groups.values():
                    group.add(None)
                continue
            found = self._by_wd.get(wd)
            if found is not None and (found.keep is None or found.keep(mask, name)):
                found.add(name)

    def _drain(self) -> list[bytes]:
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(self._fd, _READ)
            except BlockingIOError:
                return chunks
            except OSError:  # closed under us: the mount is going
                return chunks
            if not data:
                return chunks
            chunks.append(data)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _events(chunks: list[bytes]) -> list[tuple[int, int, str]]:
    """(watch descriptor, mask, name) of each event in ``chunks``."""
    found = []
    for data in chunks:
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size:at + _EVENT.size + length].split(b"\0", 1)[0]
            found.append((wd, mask, os.fsdecode(name)))
            at += _EVENT.size + length
    return found
