"""What a mount does between requests: follow the catalog, settle removals, send the kernel invalidations.

Other sessions write, rename, revoke and expire while this mount serves;
the mount notices by reading the catalog's change log and the session's
evidence (``MountState.sync``) whenever one of its databases changes
(``vfs.watch``), when the next policy entry or role membership expires
(nothing else about a view changes with time alone), and at least every
``FOLLOW_S`` (every ``POLL_S`` where inotify is unavailable); the kernel learns what changed from invalidations sent
here, on their own thread, never from a request handler (an invalidation
can wait on a page that a READ in flight has locked, and that READ waits
on this loop). Writers nobody closed are committed and removals whose
grace period ended are tombstoned, every ``POLL_S`` while there are any;
once a second the artifacts behind cached pages are looked at again, the
audit is written in batches, and revisions verified here are indexed
again if a search had retired their rows (those last two wait, a few
seconds at most, while reads keep coming: ``_reads_streaming``). An idle mount wakes a few
times a second, so a hundred of them leave the CPUs to the ones in use.
A failure of one round is logged by type and the next round tries again:
nothing in here may end the mount.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyfuse3
import trio

from scopefs.catalog.clock import now_us
from scopefs.catalog.db import BUSY_TIMEOUT_MS, CATALOG_FAILURES, checkpoint
from scopefs.catalog.index import index_again
from scopefs.catalog.readjournal import RUN_ID as JOURNAL_RUN_ID
from scopefs.vfs import catalog_ops
from scopefs.vfs.absences import NO_INODE
from scopefs.vfs.commits import Commits
from scopefs.vfs.kernel import Queued
from scopefs.vfs.lean import Thrift
from scopefs.vfs.mount import AUDIT_WAIT_MS, MountState
from scopefs.vfs.pages import GONE
from scopefs.vfs.reads import RECHECK_S, Reads
from scopefs.vfs.removals import Removals
from scopefs.vfs.watch import ARTIFACT_EVENTS, CATALOG_EVENTS, DirectoryWatch, commit_events
from scopefs.vfs.watchdog import Outcome, Progress, watched

log = logging.getLogger("scopefs.vfs")

POLL_S = 0.1  # how often pending writers and removals are settled, and the catalog looked at without inotify
WAKE_GRACE_S = 0.02  # after an inotify wake, how long a save of this mount has to refresh the view itself
LATE_LOOK_S = 1.0  # after the last report, when to read once more (a commit whose fsync was slow: ``_follow``)
FOLLOW_S = 5.0  # the longest the catalog goes unread when nothing woke the mount and nothing expires: a net
TICK_S = RECHECK_S  # the artifact recheck, the audit batch, the reindex
IDLE_SETTLE_S = 10.0  # how long the settling task sleeps when nothing waits and nothing woke it
QUIET_PATIENCE_S = 0.02  # how long the watch waits for the catalog thread to be idle before reading reports
DEFER_S = 4.0  # how long the reads' bookkeeping waits at most while reads keep coming (``_reads_streaming``)
CHECKPOINT_TRIES = 3  # ticks a checkpoint after a write is tried, until one copies the whole log
WRITEBACK_S = 30.0  # how often what closes committed without a sync is made durable (the kernel's own pace)


class Follow:
    """The background tasks of one mount, and what it settles once the kernel let go."""

    def __init__(self, mount: MountState, reads: Reads, removals: Removals, commits: Commits) -> None:
        self._mount = mount
        self._reads = reads
        self._removals = removals
        self._commits = commits
        self._watch: DirectoryWatch | None = None  # the mount's one inotify descriptor (``start``)
        self._thrift = Thrift()
        self._checkpoint_tries = 0  # checkpoints still to try after this mount's last write (``checkpoint``)
        self._exposed_seen = 0  # ``Reads.exposed_count`` at the last tick

    async def start(self, nursery: trio.Nursery) -> None:
        self._watch = DirectoryWatch.open()
        if self._watch is not None:
            nursery.start_soon(self._watch.run, functools.partial(self._mount.catalog_quiet, QUIET_PATIENCE_S))
        nursery.start_soon(self._follow)
        nursery.start_soon(self._settle)
        nursery.start_soon(self._watch_artifacts)
        nursery.start_soon(self._every, TICK_S, self._tick)
        nursery.start_soon(self._every, WRITEBACK_S, self._commits.owed.write_back)
        nursery.start_soon(self._invalidate)

    async def _follow(self) -> None:
        """``MountState.sync`` whenever a database of the view changed, a policy entry or role membership
        expires, or ``FOLLOW_S`` passed (``POLL_S`` without inotify).

        inotify reports a commit's ``write(2)``s, and the commit becomes
        visible a moment later (after its fsync, in SQLite's shared-memory
        index, which inotify does not see). So every read a wake caused is
        followed by one more ``POLL_S`` later, which also covers whatever
        was reported meanwhile: while commits keep coming (another mount's
        reads record thousands of exposures a second, each commit reported
        many times), a mount reads the catalog once per ``POLL_S``, not once
        per report. And once ``LATE_LOOK_S`` after the last report, a last
        read: a commit whose fsync took longer than the first two looks
        (a slow disk) still shows within a second of being visible.
        """
        mount = self._mount
        watch = self._watch
        look_again = False
        late_look: float | None = None  # time.monotonic() of the last read a report asked for
        while True:
            failed = mount.refresh_failed
            if failed.is_set():  # the failure that set it is ``failing`` now, read below
                failed = mount.refresh_failed = trio.Event()
            watching, added = (watch.watch("catalog", self._directories(), CATALOG_EVENTS, commit_events)
                               if watch is not None else (False, False))
            # While a refresh fails: soon again, for the view to resume, or be emptied in FAIL_CLOSED_S.
            soon = mount.suspended or (mount.failing and mount.view.usable)  # (emptied: no hurry)
            wait = FOLLOW_S if watching and not soon else POLL_S
            if added:  # what was committed since the view was read reached no watch: look now
                wait = 0.0
            for until in (mount.view.valid_until, mount.view.access.evidence_until):
                wait = min(wait, _seconds_until(until))
            if look_again:
                assert watch is not None
                await trio.sleep(min(wait, POLL_S))
                look_again = watch.consume("catalog")  # reported meanwhile: this read covers it, one more follows
                if look_again:
                    late_look = time.monotonic() + LATE_LOOK_S
                await self._round(mount.sync)
                continue
            if late_look is not None:
                wait = min(wait, max(0.0, late_look - time.monotonic()))
            with trio.move_on_after(wait):
                look_again = await _reported_or_failed(watch if watching else None, failed)
            since = time.monotonic_ns()
            if look_again:
                late_look = time.monotonic() + LATE_LOOK_S
                # Most wakes are this mount's own saves, which refresh the view themselves as soon
                # as they commit: give them a moment, and do not read the catalog again if one did.
                await trio.sleep(WAKE_GRACE_S)
            elif late_look is not None and time.monotonic() >= late_look:
                late_look = None  # this is that last read
            await self._round(functools.partial(mount.sync, since=since))

    async def _watch_artifacts(self) -> None:
        """Look again at once at each cached artifact inotify says changed (``Reads.recheck_named``).

        Without inotify, or for a store whose watch could not be added,
        the sweep of ``Reads.recheck`` still finds every change, in turn.
        """
        watch = self._watch
        if watch is None:
            return
        while True:
            watch.watch("artifacts", self._reads.store_directories(), ARTIFACT_EVENTS)
            changed, names = False, None
            with trio.move_on_after(FOLLOW_S):  # then watch the stores cached meanwhile too
                names = await watch.changed("artifacts")
                changed = True
            if changed:
                await self._round(functools.partial(self._reads.recheck_named, names))

    def _directories(self) -> set[Path]:
        """Where the databases this view reads live: the state database, and each cell's catalog."""
        home = self._mount.home
        access = self._mount.view.access
        return {home.root, *(home.agent_dir(access.in_cell(cell).agent_id) for cell in access.cells())}

    async def _settle(self) -> None:
        """Every ``POLL_S`` while writers or removals wait; asleep (until one is made) otherwise."""
        mount = self._mount
        while True:
            if self._commits.writers.pending or self._removals.pending:
                await trio.sleep(POLL_S)
            else:  # everything that makes a writer or a removal sets ``settle_wanted``; the timeout is a net
                with trio.move_on_after(IDLE_SETTLE_S):
                    await mount.settle_wanted.wait()
                mount.settle_wanted = trio.Event()
                continue
            await self._round(self._commits.writers.settle)
            await self._round(self._removals.settle)

    async def _tick(self) -> None:
        await self._round(self._reads.recheck)
        streaming = self._reads_streaming()
        await self._round(functools.partial(self.flush_audit, reads=not streaming))
        if not streaming:
            await self._round(self.index_verified)
        await self._round(self._commits.owed.index)
        await self._round(self.checkpoint)
        if self._thrift.due():  # last: an index round just done is not "quiet", the next look may be
            # SQLite's page caches first: they are most of what a woken mount grew by.
            await self._round(functools.partial(self._mount.catalog, self._mount.home.release_memory))
            self._thrift.give_back()

    def _reads_streaming(self) -> bool:
        """Whether the reads' bookkeeping waits this tick: new reads came since the last, and the oldest
        read not yet recorded is less than ``DEFER_S`` old.

        Each read verified makes two catalog writes later: its exposure row
        (inserted at a random place in an index of every exposure) and a
        look at its search rows (``index_verified``). Done every second
        while a cold ``grep -r`` streams, they take the disk and a CPU from
        the reads they record: 0.25 of its 1.9 s over 10,000 notes
        (``bench/RESULTS.md``, issue 14 ninth step). Waiting for the first
        quiet tick does the same work once the reads pause, and at most
        ``DEFER_S`` later than before. The age, not a count of ticks,
        bounds it: rows put back after a failed write are as old as their
        reads, so a locked database does not add a deferral to its delay.
        """
        count = self._reads.exposed_count
        oldest = self._reads.oldest_exposure_us()
        fresh = oldest is None or 0 <= now_us() - oldest < DEFER_S * 1_000_000  # a clock set back: flush
        streaming = count != self._exposed_seen and fresh
        self._exposed_seen = count
        return streaming

    async def shutdown(self) -> None:
        """After the kernel let go: commit what writers left open, settle removals and the audit batch."""
        try:
            await self._commits.writers.settle(everything=True)
        except Exception as exc:  # noqa: BLE001 - the removals and the audit still settle
            log.warning("writes left open were not all committed (%s)", type(exc).__name__)
        await self._removals.settle(everything=True)
        await self.flush_audit(patient=True)
        await self._round(self.index_verified)  # a read deferred it (``_reads_streaming``): its rows come back
        await self._round(functools.partial(self._commits.owed.index, everything=True))
        await self._round(self._commits.owed.write_back)
        self._reads.drop_readers()
        self._reads.close_journal()  # after the last flush: what it could not record stays for ``replay``
        self._mount.artifacts.close()

    async def flush_audit(self, *, patient: bool = False, reads: bool = True) -> None:
        """The read exposures of the last second (unless not ``reads``: ``_reads_streaming``), and the
        outbox rows of the saves made meanwhile.

        Both are writes to ``state.sqlite`` on the catalog thread, where the
        view's refreshes queue behind them. Another process holding that
        database's writer lock (a slow durable commit, a drain, a checkpoint)
        made such a write wait up to ``BUSY_TIMEOUT_MS``, and every refresh
        with it: a new revision took 6.7 s to show (``bench/RESULTS.md``,
        issue 14 seventh step). So they wait at most ``AUDIT_WAIT_MS`` and
        are tried again at the next tick: the save rows stay in the outbox,
        the read rows here. The same holds for the audit writes the catalog
        calls make themselves (a refusal's, a search's, an integrity
        failure's, the outbox drain after an ``fsync``): they wait as briefly
        and hold what stayed locked out in the mount's backlog, delivered
        here (``catalog.audit.AuditBacklog``, bounded). Only the last flush
        (``patient``) waits as long as any write would. Whatever is taken
        for a write is put back if that write is cancelled (the unmount
        cancels the ticks before the last flush).
        """
        wait_ms = BUSY_TIMEOUT_MS if patient else AUDIT_WAIT_MS
        backlog = self._mount.audit_backlog
        self._commits.owed.drain_later(backlog.take_drains())
        try:
            if not await self._commits.owed.drain(wait_ms=wait_ms):
                log.warning("save audit not drained yet: the rows wait in the outbox")
        except Exception as exc:  # noqa: BLE001 - the rows stay in the outbox: the next round, or doctor
            log.warning("save audit not drained (%s)", type(exc).__name__)
        held, dropped = backlog.take()
        if dropped:
            log.warning("%d audit rows not recorded: state.sqlite stayed locked and the backlog was full", dropped)
        if held:  # refusals, errors and searches the catalog calls could not audit at once
            await self._deliver("held audit rows", functools.partial(
                catalog_ops.record_events, self._mount.home, held, wait_ms=wait_ms),
                functools.partial(backlog.keep, held), patient=patient)
        if not reads:
            return
        batch, exposed, journal_files = self._reads.take_exposures()
        if batch:
            access = self._mount.view.access
            await self._deliver("read audit batch", functools.partial(  # one commit: every other mount wakes once
                catalog_ops.record_reads, self._mount.home, wait_ms=wait_ms,
                session_id=access.session.session_id, agent_id=access.session.agent_id, run_id=JOURNAL_RUN_ID,
                operation="read", exposed=exposed, at=[event.at for event in batch],  # each read's own time
                audit=batch), functools.partial(self._reads.keep_exposures, batch, exposed), patient=patient,
                then=functools.partial(self._reads.recorded, journal_files),
                dropped=functools.partial(self._reads.unrecorded, journal_files))

    async def _deliver(self, what: str, write: Callable[[], None], put_back: Callable[[], None], *,
                       patient: bool, then: Callable[[], None] | None = None,
                       dropped: Callable[[], None] | None = None) -> None:
        """``write`` on the catalog thread, then ``then``; ``put_back`` what it took if the write may succeed
        at a later flush: locked or failing storage (nothing was written), unless this is the last flush, or
        the unmount's cancel (the last flush, which follows, writes it). ``dropped`` if it is given up."""
        try:
            await self._mount.catalog(write)
        except CATALOG_FAILURES as exc:
            if patient:  # the mount is going: there is no next tick
                log.warning("%s not recorded (%s)", what, type(exc).__name__)
                if dropped is not None:
                    dropped()
            else:
                put_back()
                log.warning("%s not recorded yet (%s)", what, type(exc).__name__)
        except Exception as exc:  # noqa: BLE001
            log.warning("%s not recorded (%s)", what, type(exc).__name__)
            if dropped is not None:
                dropped()
        except BaseException:
            put_back()
            raise
        else:
            if then is not None:
                then()

    async def checkpoint(self) -> None:
        """Copy the write-ahead logs of the databases this mount wrote to since the last tick into the
        databases, on a thread of its own (``catalog.db.checkpoint``): not in a commit on the catalog
        thread, where a save's close or the view's refresh would wait for its two disk syncs."""
        mount = self._mount
        if mount.wrote:
            mount.wrote = False
            self._checkpoint_tries = CHECKPOINT_TRIES
        if not self._checkpoint_tries:
            return
        self._checkpoint_tries -= 1
        failed = await trio.to_thread.run_sync(functools.partial(
            checkpoint, mount.home.database_paths(), vfs=mount.home.vfs))
        if not failed:
            self._checkpoint_tries = 0
        # else: not copied whole (frames another mount's read still uses, say): the next tick tries again,
        # a few times only, so that a mount that wrote once does not open connections every second after
        # it; the log's automatic checkpoint (WAL_BACKSTOP_PAGES) bounds what is left.

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

    @classmethod
    async def _every(cls, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(seconds)
            await cls._round(work)

    @staticmethod
    async def _round(work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - a background failure must not end the mount
            log.warning("background %s failed (%s)", getattr(work, "__name__", "task"), type(exc).__name__)

    async def _invalidate(self) -> None:
        """Send invalidations from their own thread, never from a handler, all that are queued
        in one trip; if the kernel refuses one, or one is stuck (``vfs.watchdog``), the mount fails
        closed (``vfs.abort``)."""
        channel = self._mount.kernel.invalidations
        async for item in channel:
            batch = [item]
            while True:
                try:
                    batch.append(channel.receive_nowait())
                except trio.WouldBlock:
                    break
            outcome = await watched(functools.partial(_send_invalidations, batch), self._mount.kernel.busy)
            if outcome is not Outcome.DONE:
                self._mount.kernel.fail_closed(outcome)


def _seconds_until(when_us: int | None) -> float:
    """How long to sleep for an expiry at ``when_us``: a millisecond past it, so that it has passed when
    the mount looks; ``POLL_S`` for one already past (the refresh that should have applied it failed)."""
    if when_us is None:
        return FOLLOW_S
    left = (when_us - now_us()) / 1e6
    return left + 0.001 if left > 0 else POLL_S


def _send_invalidations(batch: list[Queued], progress: Progress) -> bool:
    """Send ``batch`` (``vfs.watchdog`` sees each one end); False if the kernel refused one for any
    reason but ``GONE``.

    Each node learns that its invalidation has begun before the kernel
    starts it (``Node.invalidating``): from then on, its ``READ``s serve the
    revision the view shows. The count is this thread's alone to write.
    """
    sent = True
    for queued in batch:
        item = queued.item
        if queued.node is not None:
            queued.node.invalidations_begun += 1
        try:
            if item.ino != NO_INODE:
                pyfuse3.invalidate_inode(item.ino)
        except OSError as exc:
            sent = sent and exc.errno in GONE
        finally:
            if queued.node is not None:
                queued.node.invalidations_ended += 1
        if item.parent_ino is not None and item.name is not None:
            try:
                pyfuse3.invalidate_entry(item.parent_ino, item.name.encode())
            except OSError as exc:
                sent = sent and exc.errno in GONE
        progress.ended += 1
    return sent


async def _reported_or_failed(watch: DirectoryWatch | None, failed: trio.Event) -> bool:
    """Wait for a report of the catalogs' folders (True) or for a refresh to fail (False).

    A refresh a request asked for (a lookup's, a save's) can fail while
    the follower sleeps for ``FOLLOW_S``; a save's own commit is reported,
    but a lookup's failed read is not, and the mount would stay failing,
    or suspended and serving nothing, until the net woke the follower.
    """
    reported = False
    async with trio.open_nursery() as nursery:
        async def on_report(changes: DirectoryWatch) -> None:
            nonlocal reported
            await changes.changed("catalog")
            reported = True
            nursery.cancel_scope.cancel()

        async def on_failure() -> None:
            await failed.wait()
            nursery.cancel_scope.cancel()

        if watch is not None:
            nursery.start_soon(on_report, watch)
        nursery.start_soon(on_failure)
    return reported
