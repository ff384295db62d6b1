"""The kernel's page cache of a mount: emptying it for sure.

``invalidate_inode`` drops an inode's pages; it talks to the kernel
directly, not through a request, and may block on pages locked by a READ
that this server has yet to answer. So a drop never runs on the trio
thread: one that must finish before an answer runs on a worker and is
awaited. Only ``list_again``, which drops attributes and takes no page
lock, runs there. Nothing is ever stored into the cache ahead of a READ
(``vfs.reads``).
"""

from __future__ import annotations

import errno
import logging

import pyfuse3

from scopefs.vfs.watchdog import Progress

log = logging.getLogger("scopefs.vfs")


# ENOENT: the kernel does not know the inode; ENODEV, ENOTCONN: the connection is gone, and the
# kernel has nothing of this mount left to drop through it.
GONE = (errno.ENOENT, errno.ENODEV, errno.ENOTCONN)


def list_again(ino: int) -> None:
    """Make the kernel ask for folder ``ino``'s listing at its next listing from the start; any thread.

    Only the folder's attributes go, which takes no page lock. The next
    listing from the start (an ``opendir``, a ``rewinddir``) fetches them
    (``auto_inval_data``: libfuse's default, which neither pyfuse3 nor our
    patch changes), finds the mtime moved (``Node.listing_version``) and
    drops the cached listing itself. A listing that goes on from an offset
    is not checked that way, nor is any listing if that flag were off: so
    a folder that lost a name has its pages dropped too, on the worker,
    right after, where a refusal fails the mount closed (``vfs.follow``;
    ``Layers._listings_changed`` says why one that only gained names
    does not).
    """
    _invalidate(ino, attr_only=True)


def _invalidate(ino: int, *, attr_only: bool) -> bool:
    try:
        pyfuse3.invalidate_inode(ino, attr_only=attr_only)
    except OSError as exc:
        if exc.errno not in GONE:
            what = "attributes" if attr_only else "pages"
            log.warning("%s of an inode were not dropped (%s)", what, errno.errorcode.get(exc.errno or 0, "?"))
            return False
    return True


def drop_pages_of(inos: list[int], progress: Progress) -> bool:
    """Drop the kernel's pages (and attributes) of each of ``inos``, in one trip to a worker, never
    from the trio thread; False if the kernel refused one.

    The kernel locks a page while a READ that this loop must answer fills
    it, and a folder's listing page while it copies the listing out to a
    caller, whose buffer may be a mapping of a note of this same mount
    (a page fault there is such a READ): dropping either waits for it.
    A lock held by something else is ``vfs.watchdog``'s to notice.
    """
    dropped = True
    for ino in inos:
        dropped = _invalidate(ino, attr_only=False) and dropped
        progress.ended += 1
    return dropped
