"""What the saves made through one mount still owe, paid between requests.

A close commits its revision and returns (DESIGN §6, issue 14's second
decision): it does not wait for the disk, the search index or the state
database. Three debts stay behind, each paid later in one batch rather
than once per save:

* **durability**: revisions committed without a sync are made durable by
  one ``syncfs`` every ``WRITEBACK_S`` (``write_back``; ``writer.unsynced``);
* **search rows**: a store saved to is caught up once no save came for
  ``INDEX_IDLE_S``, ``INDEX_STEP`` revisions at a time, so that a save
  never waits behind the whole queue (``index``);
* **audit delivery**: the outbox rows the commits wrote are drained into
  the state database (``drain``).

``vfs.follow`` pays them on its ticks and at unmount; ``Commits.save``
records each save's (``saved``), and the follower adds the outboxes other
catalog calls could not drain (``drain_later``). A debt whose payment
fails stays owed.
"""

from __future__ import annotations

import time

import trio

from scopefs.catalog.db import BUSY_TIMEOUT_MS
from scopefs.catalog.index import catch_up
from scopefs.vfs import catalog_ops
from scopefs.vfs.mount import MountState
from scopefs.writer import unsynced

INDEX_IDLE_S = 0.5  # how long no save committed here before the index catches up with the saves made here
INDEX_STEP = 8  # revisions indexed per catalog call while catching up: a save arriving waits for one step
# at most (about 3 ms a note of 1-4 KiB here, so some 25 ms; 32 made saves after a burst wait up to 80 ms)


class Owed:
    """The cells and stores that saves made here left a sync, search rows or audit rows to."""

    def __init__(self, mount: MountState) -> None:
        self._mount = mount
        self._undrained: set[str] = set()  # cells whose outbox holds audit rows of saves made here
        self._unsynced: set[str] = set()  # cells with revisions committed here without a sync
        self._unindexed: dict[str, set[str]] = {}  # cell -> its stores with revisions saved here without search rows
        self._last_commit = 0.0  # time.monotonic() of the last save committed here

    def saved(self, cell_agent: str, store_id: str, *, durable: bool) -> None:
        """A save committed a revision to ``store_id`` of the cell ``cell_agent`` (synced if ``durable``).

        Its store is queued by the commit's own store id, not by the view's
        note: a refresh that failed after the commit leaves a new note out
        of the view, and its store would never be caught up (idle or at
        unmount)."""
        if not durable:
            self._undrained.add(cell_agent)
            self._unsynced.add(cell_agent)
        self._unindexed.setdefault(cell_agent, set()).add(store_id)
        self._last_commit = time.monotonic()

    async def write_back(self) -> None:
        """Make the closes committed here so far durable in one ``syncfs`` (``writer.unsynced``)."""
        cells, self._unsynced = self._unsynced, set()
        if not cells:
            return
        try:
            started = await trio.to_thread.run_sync(unsynced.write_back, self._mount.home)
            await self._mount.catalog(catalog_ops.forget_before, self._mount.home, cells, started)
        except BaseException:
            self._unsynced |= cells
            raise

    async def index(self, *, everything: bool = False) -> None:
        """Make the search rows of the saves committed here (``catalog.index.catch_up``), once no save
        came for ``INDEX_IDLE_S``, a step at a time so that a save never waits behind the whole queue;
        ``everything`` at unmount. A search made meanwhile catches its stores up itself."""
        mount = self._mount
        while self._unindexed and (everything or time.monotonic() - self._last_commit >= INDEX_IDLE_S):
            cell, stores = next(iter(self._unindexed.items()))
            working = frozenset(stores)
            # Only the stores saved to here: another scope's queue is not this mount's to work (nor to wait for).
            taken = await mount.catalog(catch_up, mount.home, cell, working,
                                        limit=None if everything else INDEX_STEP)
            if everything or taken < INDEX_STEP:
                stores -= working  # a save meanwhile may have named another store: it stays queued here
                if not stores:
                    self._unindexed.pop(cell, None)

    def drain_later(self, cells: set[str]) -> None:
        """Have the next ``drain`` deliver these cells' outboxes too (a drain made by a catalog call
        could not: ``catalog.audit.AuditBacklog``)."""
        self._undrained |= cells

    async def drain(self, *, wait_ms: int = BUSY_TIMEOUT_MS) -> bool:
        """Deliver the audit rows of the saves made here since the last drain; False if some stay in the
        outbox for the next drain (a database stayed locked for ``wait_ms``, or failed)."""
        cells, self._undrained = self._undrained, set()
        if not cells:
            return True
        try:
            left = await self._mount.catalog(catalog_ops.drain, self._mount.home, cells, wait_ms=wait_ms)
        except BaseException:
            self._undrained |= cells
            raise
        self._undrained |= left
        return not left
