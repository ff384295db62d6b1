"""The files ``create`` opened in one mount, and the writers that came without an open.

The mount answers ``open`` with ``ENOSYS`` (``vfs.fs``), so only ``create``
still hands the kernel a file handle of its own. Everything else arrives by
inode: reads are answered by ``vfs.reads`` without any handle, and the
first write or truncation of an inode makes a handle here on the writer's
behalf (``Commits.writer``), which the close that follows commits and lets
go of. Either kind of handle is what the commit machinery counts in a
node's ``opens``: the node's draft lives while one is open.

A handle remembers the sandbox that made it: writes through it stop once
that sandbox was dismissed, so a descriptor passed out of it writes
nothing more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from scopefs.vfs.inodes import Node

REVOKED = -1  # a handle's pid namespace once its sandbox was dismissed: no namespace has this number


@dataclass(eq=False)
class Handle:
    """One file open for writing: its node, and who opened it."""

    node: Node
    writable: bool = False
    wrote: bool = False  # a write() came through this handle
    pid_namespace: int | None = None  # on a sandbox's mount: the admitted pid namespace that opened it
    used: float = field(default_factory=time.monotonic)  # the last write or truncation through it
    # When the settle's commit of its writes first failed, if one did: kept for a close to hear of it
    # and tried again from ``retry_at`` on (never, for input no try can take; a refusal only once the
    # view moved from ``retry_seq``), until ``UNCOMMITTED_KEPT_S`` pass with no write (``Writers.settle``)
    kept_since: float | None = None
    retry_at: float = 0.0
    retry_seq: int | None = None


class HandleTable:
    """File handle numbers to handles."""

    def __init__(self) -> None:
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1

    def __getitem__(self, fh: int) -> Handle:
        return self._handles[fh]

    def get(self, fh: int) -> Handle | None:
        return self._handles.get(fh)

    def give(self, handle: Handle) -> int:
        """A file handle number for ``handle`` (never 0: the kernel's number for "no handle")."""
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._handles[fh] = handle
        handle.node.opens += 1
        return fh

    def revoke(self, pid_namespace: int) -> None:
        """Handles opened from ``pid_namespace`` (now dismissed) never work again.

        The kernel reuses a freed namespace's inode number for the next
        namespace it makes, so a later sandbox may be admitted under the
        same number: a handle that kept it would come back to life in a
        descriptor passed out of the old one.
        """
        for handle in self._handles.values():
            if handle.pid_namespace == pid_namespace:
                handle.pid_namespace = REVOKED

    def take(self, fh: int) -> Handle | None:
        """Remove ``fh`` (the kernel released it); the node's ``opens`` is the caller's to settle."""
        return self._handles.pop(fh, None)

    def all(self) -> list[Handle]:
        return list(self._handles.values())

