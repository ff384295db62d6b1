"""The kernel's page cache of a mount: filling it while a revision is verified, emptying it for sure.

``notify_store`` puts bytes into the kernel's cache for an inode and
``invalidate_inode`` drops them; both talk to the kernel directly, not
through a request, and both may block on pages locked by a READ that this
server has yet to answer. So neither runs on the trio thread: a stream
runs on the storer thread of ``content.hash_streamed``, and a drop that
must finish before an answer runs on a worker and is awaited.
"""

from __future__ import annotations

import errno
import logging

import pyfuse3
import trio

log = logging.getLogger("scopefs.vfs")


class PageStream:
    """Chunks of a revision being hashed, stored in the kernel's page cache as
    they come (``notify_store``), so that once the hash matched the open can
    answer ``keep_cache`` and the reader's first pass sends no READ at all.

    Called on one thread at a time (the storer of ``hash_streamed``); the
    trio thread looks at it only after the hash returned, which joins that
    thread first. A store that fails (the kernel forgot the inode, say)
    stops the stream: the open then answers without ``keep_cache`` and the
    reads go to the server as before.
    """

    def __init__(self, ino: int, size: int) -> None:
        self.ino = ino
        self.size = size
        self.stored = 0  # bytes stored from offset 0 on, in order, without a gap
        self.failed = False
        self.settled = trio.Event()  # set when the open that streams has answered or failed

    def __call__(self, offset: int, chunk: bytes) -> None:
        if self.failed:
            return
        if offset != self.stored:  # chunks come in order; anything else is not a whole revision
            self.failed = True
            return
        try:
            pyfuse3.notify_store(self.ino, offset, chunk)
        except OSError:
            self.failed = True  # it may still have stored part of the chunk: ``touched`` says so
            return
        self.stored += len(chunk)

    @property
    def touched(self) -> bool:
        """Whether the kernel may hold pages this stream stored."""
        return self.stored > 0 or self.failed

    @property
    def complete(self) -> bool:
        """Whether every byte of the revision was stored (the open may keep the cache)."""
        return not self.failed and self.stored == self.size


def drop_pages(ino: int) -> None:
    """Drop the kernel's pages (and attributes) of ``ino`` now; on a worker.

    Not from the trio thread: a page locked by a READ in flight would wait
    for this loop to answer it.
    """
    try:
        pyfuse3.invalidate_inode(ino, attr_only=False)
    except OSError as exc:
        # ENOENT: the kernel does not know the inode; ENODEV, ENOTCONN: the connection is gone, and the
        # kernel has nothing of this mount left to drop through it.
        if exc.errno not in (errno.ENOENT, errno.ENODEV, errno.ENOTCONN):
            log.warning("pages of an inode were not dropped (%s)", errno.errorcode.get(exc.errno or 0, "?"))


def drop_pages_of(inos: list[int]) -> None:
    """``drop_pages`` for each of ``inos``, in one trip to a worker."""
    for ino in inos:
        drop_pages(ino)
