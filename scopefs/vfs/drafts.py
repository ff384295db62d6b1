"""Content being written in a mount, before (or instead of) a commit.

A draft holds the bytes a tool is writing: a note's next revision until
``close`` or ``fsync`` commits it, or a scratch file's whole life. It is an
anonymous memory file, so nothing half-written ever has a name on disk,
and it dies with the mount server.
"""

from __future__ import annotations

import io
import os
import time
from typing import BinaryIO

from scopefs.catalog.artifacts import check_size, verify
from scopefs.catalog.errors import IntegrityError


class Draft:
    def __init__(self, initial: bytes = b"", *, source_resource: str | None = None) -> None:
        # The resource whose content this draft was loaded from: while it
        # holds that content, it is readable only while the view shows it.
        self.source_resource = source_resource
        self.fd = os.memfd_create("scopefs-draft", os.MFD_CLOEXEC)
        self.size = 0
        self.dirty = False
        # A commit of it was refused (``Commits._refused``): its bytes are not read back, by this
        # mount's READs either, until what it holds is committed or the draft is let go.
        self.refused = False
        # The writer's handle the settle kept it for after a failed commit (``Writers.keep``), until
        # what it holds is committed: once that writer's sandbox is dismissed, nothing commits it.
        self.kept_for: object | None = None
        self.mtime_ns = time.time_ns()
        if initial:
            os.pwrite(self.fd, initial, 0)
            self.size = len(initial)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    def write(self, offset: int, data: bytes) -> int:
        check_size(offset + len(data))  # refused at the write(2) that crosses the limit, not at close
        written = os.pwrite(self.fd, data, offset)
        self.size = max(self.size, offset + written)
        self._touch()
        return written

    def truncate(self, size: int) -> None:
        check_size(size)
        os.ftruncate(self.fd, size)
        self.size = size
        if size == 0:
            self.source_resource = None  # nothing of the loaded note is left,
            self.refused = False  # nor of what a commit refused,
            self.kept_for = None  # nor of what a writer kept for a dismissed sandbox wrote
        self._touch()

    def _touch(self) -> None:
        self.dirty = True
        self.mtime_ns = time.time_ns()

    def holds(self, size: int, sha256: str) -> bool:
        """Whether this draft is byte for byte that content (a save that changed nothing)."""
        if size != self.size:
            return False
        try:
            verify(self.fd, size, sha256)
        except IntegrityError:
            return False
        return True

    def reader(self) -> BinaryIO:
        """A fresh file object over the whole content (for the writer to stage).

        The writer reads it on the catalog thread while WRITEs may still
        land here. An empty draft is read as empty, whatever comes after:
        the commit of an empty note (``touch``'s, or the one a folder's
        fsync makes) must not show a byte a process writes meanwhile. Those
        writes leave the draft dirty, for the close that follows them.
        """
        if self.size == 0:
            return io.BytesIO(b"")
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)  # its own offset
        return io.BufferedReader(io.FileIO(fd, "rb", closefd=True))
