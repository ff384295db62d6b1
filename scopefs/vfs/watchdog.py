"""Waiting on the kernel's caches without being held by them for good.

Dropping a page or a name waits for the kernel's lock on it. The kernel
holds some of those for this server's own requests, from the moment it
queues one until the answer arrives (a ``READ``'s pages, for a large
note's whole verification; a rename's folder, while its commit waits for
the catalog), and such a wait ends. A lock held by anything else may be
held for good: a process that copies a cached listing of this mount into
a mapping of a file whose server stopped holds that listing's page until
that server answers. Every name and page queued behind it would stay in
the kernel's caches, served, past every bound.

So a worker that drops nothing for ``STALL_S`` while no request of this
mount is waiting is stuck: it is abandoned where it waits, and the mount
fails closed. Waiting means counted by the kernel (read from the FUSE
control filesystem: queued, being answered, or read ahead in the
background) or being answered by a handler (``errors.ANSWERING``: the
kernel leaves out what it sends whatever happens, a mapping's written
pages), not counting handlers that wait on a drop themselves (nor, for
the drop a refresh of the view makes, the handlers that wait on that
refresh: ``Kernel.busy``). A client that keeps the mount busy puts
that off, for ``HARD_STALL_S`` at most. A gap between two looks counts
as busy: the loop was held, the worker may not have run. Nothing can
free the abandoned thread but the holder, or the abort of the connection
that failing closed brings (the lock was held for a request of this mount
after all): the server closes its session only once every abandoned
thread has let go (``let_go``), and an unmount waits for one that never
does in the kernel.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

log = logging.getLogger("scopefs.vfs")

STALL_S = 5.0  # how long a worker may drop nothing while the mount is idle before it counts as stuck
HARD_STALL_S = 60.0  # how long it may drop nothing however busy the mount is (a request that never ends)
SAMPLE_S = 0.1  # how often the mount's idleness is looked at while a worker waits


_abandoned: list[threading.Event] = []  # set once each worker abandoned so far has returned


class Outcome(enum.Enum):
    DONE = "done"  # the kernel dropped (or no longer held) everything asked
    REFUSED = "refused"  # the kernel refused to drop something, or the worker failed
    STUCK = "stuck"  # the worker waited on a lock no request of this mount holds


@dataclass
class Progress:
    """What a worker has finished, for ``watched`` to see it move: written by the worker alone."""

    ended: int = 0


async def watched(work: Callable[[Progress], bool], busy: Callable[[], bool]) -> Outcome:
    """Run ``work`` (True if the kernel took everything) on a worker, abandoned if it is stuck.

    ``busy`` says whether a request of this mount is waiting; it is asked
    every ``SAMPLE_S`` while the worker runs, and only a worker that ended
    nothing through ``STALL_S`` of continuous idleness, or through
    ``HARD_STALL_S``, counts as stuck. Shielded: a mount that is stopping
    lets a worker that moves end (the connection closes after it).
    """
    progress = Progress()
    done: list[bool] = []
    returned = threading.Event()
    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                seen = progress.ended
                moved = idle_since = sampled = trio.current_time()
                while True:
                    await trio.sleep(SAMPLE_S)
                    now = trio.current_time()
                    if progress.ended != seen:
                        seen, moved, idle_since = progress.ended, now, now
                    elif busy() or now - sampled > STALL_S / 5:  # a long gap: this loop was held, not idle
                        idle_since = now
                    sampled = now
                    if now - idle_since >= STALL_S or now - moved >= HARD_STALL_S:
                        nursery.cancel_scope.cancel()  # the worker is abandoned where it waits
                        return
            nursery.start_soon(watch)
            done.append(await trio.to_thread.run_sync(_guarded, work, progress, returned, abandon_on_cancel=True,
                                                      limiter=trio.CapacityLimiter(1)))  # never waits on a
            # slot (the clock runs), nor keeps one of the shared limiter's once abandoned
            nursery.cancel_scope.cancel()
    if not done:
        _abandoned.append(returned)
        log.error("a drop from the kernel's caches is stuck: the mount fails closed")
        return Outcome.STUCK
    if not done[0]:
        log.error("the kernel kept pages or names it was told to drop: the mount fails closed")
        return Outcome.REFUSED
    return Outcome.DONE


def let_go(timeout: float) -> bool:
    """Whether every worker abandoned so far has returned, waiting ``timeout`` at most in all: libfuse's
    session may be closed only then (one still inside would use it freed)."""
    deadline = time.monotonic() + timeout
    return all(returned.wait(max(0.0, deadline - time.monotonic())) for returned in _abandoned)


def _guarded(work: Callable[[Progress], bool], progress: Progress, returned: threading.Event) -> bool:
    try:
        return work(progress)
    except Exception as exc:  # noqa: BLE001 - a worker that failed dropped what it may not have: refused
        log.error("a drop from the kernel's caches failed (%s)", type(exc).__name__)
        return False
    finally:
        returned.set()
