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


def drop_listing(ino: int) -> None:
    """Drop the kernel's cached listing of the folder ``ino`` now, from any thread (see ``MountState._apply``)."""
    try:
        pyfuse3.invalidate_inode(ino, attr_only=False)
    except OSError:
        pass  # the kernel does not hold this folder (ENOENT), or the connection is gone
