"""The kernel's side of one mount: its connection, the drops the server sends it, and when to cut it.

The kernel caches names, attributes and pages of the view and answers
from them without asking (``README``'s boundary section). What leaves the
view must leave those caches, in order: queued for the invalidation worker
(``queue``, ``forget_pages``), or dropped before the caller goes on
(``drop_pages_now``). A drop waits for the kernel's lock on what it drops,
and may wait for good (``vfs.watchdog``); whether the mount is *busy*
while it waits decides that. When the kernel refuses a drop, or one is
stuck, the connection is cut (``fail_closed``): nothing it cached may
then be served.

Apart from ``MountState`` because none of it reads the view: it counts
requests, holds the worker's queue and knows the connection.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyfuse3
import trio

from scopefs.vfs.abort import abort, connection_of, requests_waiting
from scopefs.vfs.errors import ANSWERING
from scopefs.vfs.inodes import Node
from scopefs.vfs.layers import Invalidation
from scopefs.vfs.pages import drop_pages_of
from scopefs.vfs.watchdog import Outcome, watched

# Set in a handler's task while it is counted in ``Kernel._handlers_refreshing``: counted once.
_COUNTED_AS_REFRESHING = contextvars.ContextVar("scopefs_counted_as_refreshing", default=False)


@dataclass(frozen=True, eq=False)
class Queued:
    """An invalidation waiting for the worker, and the node whose pages it drops (``Node.invalidating``)."""

    item: Invalidation
    node: Node | None


class Kernel:
    """One mount's connection to the kernel, and the drops queued for it."""

    def __init__(self) -> None:
        self.mountpoint: str | None = None  # set once mounted (``vfs.server``): to abort its connection
        # its FUSE connection's number, looked up once mounted: failing closed then asks no file system
        self.connection: str | None = None
        self.abandoned = False  # a worker was left stuck in the kernel (``vfs.watchdog``): never close the session
        self.answering = True  # until the server's loop stops: requests still waiting then get no answer
        self._handlers_dropping = 0  # handlers waiting in ``drop_pages_now``: requests that hold no lock of a drop
        # Handlers that may wait on a refresh of the view (``waiting_on_refresh``): none holds a lock of
        # the pages a refresh drops (``MountState._withdrawn_then_applied``).
        self._handlers_refreshing = 0
        # What the invalidation worker sends (``vfs.follow``), with the node whose counts it keeps.
        self._invalidations, self.invalidations = trio.open_memory_channel[Queued](math.inf)

    def queue(self, item: Invalidation, node: Node | None) -> None:
        """Queue ``item`` for the invalidation worker; ``node``: the one whose pages it drops."""
        if node is not None:
            node.invalidations_queued += 1  # until its sending begins, READs keep to the revision it had
        self._invalidations.send_nowait(Queued(item, node))

    def forget_pages(self, node: Node) -> None:
        """The kernel must drop ``node``'s pages and attributes (queued for the invalidation worker).

        Not queued again while one of ``node``'s is queued and not begun
        (``Node.invalidating``): every item queued with a node drops all of
        its inode's pages, and that one begins after this call, so it drops
        whatever the caller changed too. A refused commit asked three times
        in a row (the refusal, the commit, a truncation by path). An item
        that never begins (an unexpected error stopped its batch, or its
        worker was abandoned stuck) would leave the node skipped for good,
        but both fail the mount closed (``fail_closed``): nothing is served
        after.
        """
        node.forget_pages()
        if not node.invalidating:
            self.queue(Invalidation(node.ino), node)

    @contextlib.contextmanager
    def waiting_on_refresh(self) -> Iterator[None]:
        """Count the calling handler (if it is one, and once) among those that may wait on a refresh
        in this block: the drop a refresh makes before its view is applied waits on no lock of theirs
        (``MountState._withdrawn_then_applied``). Also around a wait for a commit, which refreshes (a
        node's ``commit_lock``), and around a rename's whole handler, which holds folder locks only."""
        if not ANSWERING.in_handler() or _COUNTED_AS_REFRESHING.get():
            yield
            return
        counted = _COUNTED_AS_REFRESHING.set(True)
        self._handlers_refreshing += 1
        try:
            yield
        finally:
            self._handlers_refreshing -= 1
            _COUNTED_AS_REFRESHING.reset(counted)

    def busy(self, *, besides_refreshing: bool = False) -> bool:
        """Whether a request of this mount is waiting, in the kernel or in a handler, besides the handlers
        that wait on a drop themselves (``vfs.watchdog``); True if the kernel's count cannot be read. Never
        once the loop stopped answering: a drop waiting on a lock held for a request then waits for good.

        ``besides_refreshing``: the handlers that wait on a refresh do not count either. Only for the
        drop a refresh makes before its view is applied (``MountState._withdrawn_then_applied``): they
        wait on it, and hold no lock of the pages it drops. The invalidation worker's drops may wait on
        theirs (a rename's folder, while its handler waits on the refresh that queued the drop)."""
        if not self.answering:
            return False
        waiting = requests_waiting(self.connection)
        waiting_on_drops = self._handlers_dropping + (self._handlers_refreshing if besides_refreshing else 0)
        return waiting is None or max(waiting, ANSWERING.count) > waiting_on_drops

    async def drop_pages_now(self, nodes: Iterable[Node], *, in_handler: bool = False,
                             for_refresh: bool = False) -> None:
        """Drop the kernel's pages of ``nodes`` and return once they are gone (not queued); if the kernel
        refuses, or the drop is stuck (``vfs.watchdog``), the mount fails closed. ``in_handler``: the
        caller is a request's handler, which waits on the drop rather than holding its lock.
        ``for_refresh``: the caller is a refresh, on which handlers may wait (``busy``).

        On a worker: an invalidation can wait on a page that a READ in
        flight holds, and this loop answers that READ meanwhile.
        """
        inos = []
        for node in nodes:  # a folder's pages are its cached listing
            node.forget_pages()
            inos.append(node.ino)
        if not inos:
            return
        self._handlers_dropping += in_handler
        try:
            busy = functools.partial(self.busy, besides_refreshing=for_refresh)
            outcome = await watched(functools.partial(drop_pages_of, inos), busy)
        finally:
            self._handlers_dropping -= in_handler
        if outcome is not Outcome.DONE:
            self.fail_closed(outcome)

    def fail_closed(self, outcome: Outcome) -> None:
        """The kernel kept something it was told to drop, or a drop is stuck: end the connection
        (``vfs.abort``)."""
        self.abandoned = self.abandoned or outcome is Outcome.STUCK
        if self.mountpoint is None:
            return  # not mounted: no kernel holds anything of this view
        if not abort(self.connection or connection_of(self.mountpoint)):
            pyfuse3.terminate()  # at least stop answering; the caches go with the unmount
