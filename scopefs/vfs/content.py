"""Serving a revision's bytes only after they matched the catalog's hash.

Every open resolves the artifact again (``openat2``, no symlinks, one
link, a regular file on the store's device) and compares it with what was
verified before. Hashing is skipped only when the file is provably the one
already verified: same device, inode, size, mtime and ctime. Any write,
truncate, chmod or replacement changes ctime or the inode, and ctime
cannot be set back from user space, so a tampered artifact is hashed
again and refused. A verification is remembered only for files whose
ctime is older than the verification by more than the timestamp
granularity; a change in the same clock tick as the hash is never
trusted (git's "racy clean" problem).

Reads from an open handle re-check the stamp before every ``pread``, so
bytes written into the artifact after the open are refused too.

A large file is hashed in chunks, and the caller may ask for each chunk
(``sink``) as it is hashed, to hand it on (the mount stores it in the
kernel's page cache). Those chunks are not verified yet: the verdict comes
only when the open returns, and the caller must keep them from every reader
until then (see ``vfs.handles``). The hashing and the comparison are
``catalog.artifacts.verify``'s, the same the command line's reader uses.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from scopefs.catalog.artifacts import mismatch, open_artifact_stat, open_store_dir, verify
from scopefs.catalog.digests import Sink
from scopefs.catalog.errors import ScopefsError
from scopefs.catalog.home import Home
from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.readahead import AHEAD_BYTES, ReadAhead

RACY_NS = 2_000_000_000  # a ctime this close to the verification is not trusted
KEEP_OPEN = 1024  # verified artifacts kept open for cheap re-opens
RETRY_HASHED = 10_000  # verified revisions kept for another indexing attempt after a failed one
WHOLE_BYTES = 256 << 10  # files up to this size are hashed from one read whose bytes are kept


@dataclass(frozen=True)
class Stamp:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, fd: int) -> Stamp:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Artifacts:
    """Verified access to one agent's artifacts, with a memory of what was verified.

    Verified files stay open (up to ``KEEP_OPEN``): a later open of the same
    revision is one ``fstat`` of the kept descriptor, which must still be the
    only link (an unlink or a replacement drops it to zero) with an unchanged
    stamp, and a ``dup`` for the caller. Anything else opens and checks the
    file afresh.
    """

    def __init__(self, home: Home) -> None:
        self._home = home
        self._store_fds: dict[tuple[str, str], int] = {}  # (cell, path key) -> store directory
        self._verified: dict[str, Stamp] = {}  # revision id -> stamp of the file that hashed right
        self._kept: OrderedDict[str, int] = OrderedDict()  # revision id -> open fd of that file
        # (cell, revision) whose hash matched since ``take_hashed``: appended from worker threads
        # too (one append is atomic), read on the trio thread.
        self._hashed: list[tuple[str, str]] = []
        self._ahead = ReadAhead()
        self._store_lock = threading.Lock()

    def close(self) -> None:
        self._ahead.close()  # first: it uses the store descriptors closed next
        for fd in [*self._store_fds.values(), *self._kept.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._store_fds.clear()
        self._kept.clear()

    def _store_fd(self, cell: str, path_key: str) -> int:
        with self._store_lock:  # worker threads (large files) open stores too: one descriptor per store
            fd = self._store_fds.get((cell, path_key))
            if fd is None:
                fd = self._store_fds[(cell, path_key)] = open_store_dir(self._home, cell, path_key)
            return fd

    def place(self, note: VisibleNote) -> tuple[int, str] | None:
        """Where ``note``'s artifact is (its store's descriptor, its locator), None if the store is gone."""
        try:
            return self._store_fd(note.cell, note.path_key), note.locator
        except (ScopefsError, OSError):  # missing, unsafe or malformed: the READ will say so
            return None

    def read_ahead(self, notes: list[VisibleNote]) -> None:
        """Have the disk read the small artifacts of ``notes`` soon (a folder is being listed:
        ``vfs.readahead`` says why); returns at once. The caller bounds ``notes`` (``AHEAD_NOTES``)."""
        self._ahead.want([place for note in notes
                          if 0 < note.size <= AHEAD_BYTES and (place := self.place(note)) is not None])

    def needs_hash(self, note: VisibleNote) -> bool:
        """Whether opening ``note`` will hash it (so the caller can move that to a thread)."""
        return note.revision_id not in self._verified

    def _from_kept(self, note: VisibleNote) -> tuple[int, Stamp] | None:
        fd = self._kept.get(note.revision_id)
        if fd is None:
            return None
        st = os.fstat(fd)
        stamp = Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if st.st_nlink == 1 and self._verified.get(note.revision_id) == stamp:
            self._kept.move_to_end(note.revision_id)
            return os.dup(fd), stamp
        self._drop(note.revision_id)
        return None

    def _drop(self, revision_id: str) -> None:
        fd = self._kept.pop(revision_id, None)
        if fd is not None:
            os.close(fd)

    def open(self, note: VisibleNote, *, keep: bool = True,
             sink: Sink | None = None) -> tuple[int, Stamp, bytes | None]:
        """An fd (the caller's to close) whose content matches the catalog, its stamp,
        and, when this open hashed a small file, the verified bytes themselves
        (so the mount can hand them to the kernel's page cache at once).

        ``keep=False`` leaves the kept descriptors alone: worker threads
        (hashing large files) pass it, so only the trio thread ever touches
        them and no descriptor is closed under another thread's feet.

        ``sink``, if given, receives each chunk of a large file as it is
        hashed (never a byte past the catalog's size). It is called only if
        this open hashes; the chunks are verified only if the open returns.
        """
        kept = self._from_kept(note) if keep else None
        if kept is not None:
            return (*kept, None)
        verified: bytes | None = None
        fd, st = open_artifact_stat(self._store_fd(note.cell, note.path_key), note.locator)
        try:
            stamp = Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if self._verified.get(note.revision_id) != stamp:
                self._verified.pop(note.revision_id, None)
                if stamp.size != note.size:
                    raise mismatch()  # known without reading a byte
                started = time.time_ns()
                if note.size <= WHOLE_BYTES:
                    verified = verify(fd, note.size, note.sha256, keep=note.size)
                else:
                    verify(fd, note.size, note.sha256, sink=sink)
                if Stamp.of(fd) != stamp:
                    raise mismatch()  # changed while it was hashed
                self._hashed.append((note.cell, note.revision_id))
                if started - stamp.ctime_ns > RACY_NS:
                    self._verified[note.revision_id] = stamp
            if keep and note.revision_id in self._verified and note.revision_id not in self._kept:
                self._kept[note.revision_id] = os.dup(fd)
                while len(self._kept) > KEEP_OPEN:
                    os.close(self._kept.popitem(last=False)[1])
        except BaseException:
            os.close(fd)
            raise
        return fd, stamp, verified

    def take_hashed(self) -> list[tuple[str, str]]:
        """The revisions hashed and matched since the last call (``vfs.follow`` indexes them again
        if a search had retired their rows)."""
        taken, self._hashed = self._hashed, []
        return taken

    def hashed_again(self, hashed: list[tuple[str, str]]) -> None:
        """Put back what ``take_hashed`` gave when it could not be handled (at most ``RETRY_HASHED``)."""
        self._hashed[:0] = hashed[:RETRY_HASHED]

    def read(self, fd: int, stamp: Stamp, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``, refused if the file changed since it was verified."""
        data = os.pread(fd, size, offset)
        if Stamp.of(fd) != stamp:  # checked after the read: a rewrite during it is caught too
            self._verified.clear()  # the trio thread drops the kept descriptors when it next opens
            raise mismatch()  # changed after it was verified
        return data

    def read_all(self, note: VisibleNote, *, keep: bool = True) -> bytes:
        fd, stamp, _ = self.open(note, keep=keep)
        try:
            data = self.read(fd, stamp, 0, note.size + 1)
        finally:
            os.close(fd)
        if len(data) != note.size:
            raise mismatch()
        return data


def stamps_now(places: list[tuple[int, str] | None]) -> list[Stamp | None]:
    """The stamp of each artifact as it is now (None: gone, not a single link, or no store); on a worker."""
    found: list[Stamp | None] = []
    for place in places:
        try:
            if place is None:
                raise FileNotFoundError
            st = os.stat(place[1], dir_fd=place[0], follow_symlinks=False)
        except OSError:
            found.append(None)
            continue
        found.append(Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                     if st.st_nlink == 1 else None)
    return found
