"""Content being written in a mount, before (or instead of) a commit.

A draft holds the bytes a tool is writing: a note's next revision until
``close`` or ``fsync`` commits it, or a scratch file's whole life. It is an
anonymous memory file, so nothing half-written ever has a name on disk,
and it dies with the mount server.
"""

from __future__ import annotations

import hashlib
import io
import os
import time

from scopefs.catalog.errors import BadInput

MAX_DRAFT_BYTES = 1 << 30  # the writer's own limit: refuse early rather than at commit


class Draft:
    def __init__(self, initial: bytes = b"", *, source_resource: str | None = None) -> None:
        # The resource whose content this draft was loaded from: while it
        # holds that content, it is readable only while the view shows it.
        self.source_resource = source_resource
        self.fd = os.memfd_create("scopefs-draft", os.MFD_CLOEXEC)
        self.size = 0
        self.dirty = False
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
        if offset + len(data) > MAX_DRAFT_BYTES:
            raise BadInput(f"note is larger than {MAX_DRAFT_BYTES} bytes")
        written = os.pwrite(self.fd, data, offset)
        self.size = max(self.size, offset + written)
        self._touch()
        return written

    def truncate(self, size: int) -> None:
        if size > MAX_DRAFT_BYTES:
            raise BadInput(f"note is larger than {MAX_DRAFT_BYTES} bytes")
        os.ftruncate(self.fd, size)
        self.size = size
        if size == 0:
            self.source_resource = None  # nothing of the loaded note is left
        self._touch()

    def _touch(self) -> None:
        self.dirty = True
        self.mtime_ns = time.time_ns()

    def sha256(self) -> str:
        digest = hashlib.sha256()
        offset = 0
        while offset < self.size:
            chunk = os.pread(self.fd, min(1 << 20, self.size - offset), offset)
            if not chunk:
                break
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def reader(self) -> io.BufferedReader:
        """A fresh file object over the whole content (for the writer to stage)."""
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)  # its own offset
        return io.BufferedReader(io.FileIO(fd, "rb", closefd=True))
