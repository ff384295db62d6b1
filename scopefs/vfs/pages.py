"""The kernel's page cache of a mount: emptying it for sure.

``invalidate_inode`` drops an inode's pages; it talks to the kernel
directly, not through a request, and may block on pages locked by a READ
that this server has yet to answer. So it never runs on the trio thread: a
drop that must finish before an answer runs on a worker and is awaited.
Nothing is ever stored into the cache ahead of a READ (``vfs.reads``).
"""

from __future__ import annotations

import errno
import logging

import pyfuse3

log = logging.getLogger("scopefs.vfs")


# ENOENT: the kernel does not know the inode; ENODEV, ENOTCONN: the connection is gone, and the
# kernel has nothing of this mount left to drop through it.
GONE = (errno.ENOENT, errno.ENODEV, errno.ENOTCONN)


def drop_pages(ino: int) -> None:
    """Drop the kernel's pages (and attributes) of ``ino`` now; a file's on a worker.

    A file's not from the trio thread: a page locked by a READ in flight
    would wait for this loop to answer it. A folder's pages (its cached
    listing) are held only while the kernel copies an answer in, so those
    may go from any thread (``MountState._apply``).
    """
    try:
        pyfuse3.invalidate_inode(ino, attr_only=False)
    except OSError as exc:
        if exc.errno not in GONE:
            log.warning("pages of an inode were not dropped (%s)", errno.errorcode.get(exc.errno or 0, "?"))


def drop_pages_of(inos: list[int]) -> None:
    """``drop_pages`` for each of ``inos``, in one trip to a worker."""
    for ino in inos:
        drop_pages(ino)
