"""What a mount does between requests: follow the catalog, settle removals, send the kernel invalidations.

Other sessions write, rename, revoke and expire while this mount serves;
the mount notices by polling the catalog's change log and the session's
evidence (``MountState.sync``) every ``POLL_S``, and the kernel learns what
changed from invalidations sent here, on their own thread, never from a
request handler (an invalidation can wait on a page that a READ in
flight has locked, and that READ waits on this loop). Removals whose
grace period ended are tombstoned, and the read audit is written in
batches, and revisions verified here are indexed again if a search had
retired their rows. A failure of one round is logged by type and the next round
tries again: nothing in here may end the mount.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pyfuse3
import trio

from scopefs.catalog.audit import record_many
from scopefs.catalog.index import index_again
from scopefs.vfs.commits import Commits
from scopefs.vfs.layers import Invalidation
from scopefs.vfs.mount import MountState
from scopefs.vfs.pages import GONE
from scopefs.vfs.reads import RECHECK_S, Reads
from scopefs.vfs.removals import Removals

log = logging.getLogger("scopefs.vfs")

POLL_S = 0.1  # how often the change log and the session's evidence are checked
AUDIT_FLUSH_S = 1.0


class Follow:
    """The background tasks of one mount, and what it settles once the kernel let go."""

    def __init__(self, mount: MountState, reads: Reads, removals: Removals, commits: Commits) -> None:
        self._mount = mount
        self._reads = reads
        self._removals = removals
        self._commits = commits

    async def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._every, POLL_S, self._mount.sync)
        nursery.start_soon(self._every, POLL_S, self._removals.settle)
        nursery.start_soon(self._every, POLL_S, self._commits.settle)
        nursery.start_soon(self._every, RECHECK_S, self._reads.recheck)
        nursery.start_soon(self._every, AUDIT_FLUSH_S, self.flush_audit)
        nursery.start_soon(self._every, AUDIT_FLUSH_S, self.index_verified)
        nursery.start_soon(self._invalidate)

    async def shutdown(self) -> None:
        """After the kernel let go: commit what writers left open, settle removals and the audit batch."""
        try:
            await self._commits.settle(everything=True)
        except Exception as exc:  # noqa: BLE001 - the removals and the audit still settle
            log.warning("writes left open were not all committed (%s)", type(exc).__name__)
        await self._removals.settle(everything=True)
        await self.flush_audit()
        self._reads.drop_readers()
        self._mount.artifacts.close()

    async def flush_audit(self) -> None:
        batch = self._reads.take_exposures()
        if batch:
            try:
                await self._mount.catalog(record_many, self._mount.home.state(), batch)
            except Exception as exc:  # noqa: BLE001
                log.warning("read audit batch not recorded (%s)", type(exc).__name__)

    async def index_verified(self) -> None:
        """Revisions this mount verified get their search rows back if a search had retired them
        (``catalog.index.index_again``): restoring an artifact needs no ``doctor --fix``."""
        hashed = self._mount.artifacts.take_hashed()
        if hashed:
            try:
                for cell in dict.fromkeys(c for c, _ in hashed):
                    await self._mount.catalog(index_again, self._mount.home, cell,
                                              [r for c, r in hashed if c == cell])
            except BaseException:
                self._mount.artifacts.hashed_again(hashed)  # a verified revision is not hashed twice: retry
                raise

    @staticmethod
    async def _every(seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(seconds)
            try:
                await work()
            except Exception as exc:  # noqa: BLE001 - a background failure must not end the mount
                log.warning("background %s failed (%s)", getattr(work, "__name__", "task"), type(exc).__name__)

    async def _invalidate(self) -> None:
        """Send invalidations from their own thread, never from a handler, all that are queued
        in one trip; if the kernel refuses one, the mount fails closed (``vfs.abort``)."""
        channel = self._mount.invalidations
        async for item in channel:
            batch = [item]
            while True:
                try:
                    batch.append(channel.receive_nowait())
                except trio.WouldBlock:
                    break
            sent = await trio.to_thread.run_sync(_send_invalidations, batch)
            self._mount.invalidated(batch)
            if not sent:
                log.error("the kernel kept pages or names it was told to drop: the mount fails closed")
                self._mount.fail_closed()


def _send_invalidations(items: list[Invalidation]) -> bool:
    """Send ``items``; False if the kernel refused one for any reason but ``GONE``."""
    sent = True
    for item in items:
        try:
            pyfuse3.invalidate_inode(item.ino)
        except OSError as exc:
            sent = sent and exc.errno in GONE
        if item.parent_ino is not None and item.name is not None:
            try:
                pyfuse3.invalidate_entry(item.parent_ino, item.name.encode())
            except OSError as exc:
                sent = sent and exc.errno in GONE
    return sent
