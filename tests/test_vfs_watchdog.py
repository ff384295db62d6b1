"""``vfs.watchdog``: a worker stuck on a lock of the kernel's is abandoned, one that moves or waits on
the mount's own requests is not. In this process, with plain functions for the worker and for whether
the mount is busy; ``test_vfs_fail_closed`` shows it on a real mount."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import trio

from scopefs.vfs import watchdog
from scopefs.vfs.watchdog import Outcome, Progress, watched


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "STALL_S", 0.5)
    monkeypatch.setattr(watchdog, "HARD_STALL_S", 30.0)
    monkeypatch.setattr(watchdog, "SAMPLE_S", 0.02)


def _run(work: Callable[[Progress], bool], busy: Callable[[], bool]) -> Outcome:
    return trio.run(watched, work, busy)


def _waits(let_go: threading.Event) -> Callable[[Progress], bool]:
    return lambda progress: let_go.wait(60)


def test_a_worker_that_waits_while_the_mount_is_idle_is_abandoned() -> None:
    let_go = threading.Event()
    try:
        assert _run(_waits(let_go), lambda: False) is Outcome.STUCK
    finally:
        let_go.set()


def test_a_worker_waiting_while_a_request_of_the_mount_waits_is_not() -> None:
    """Its lock is held for a request the mount is answering: it ends with the answer."""
    answered = threading.Event()

    def work(progress: Progress) -> bool:
        time.sleep(1.5)  # three STALL_S
        answered.set()
        return True
    assert _run(work, lambda: not answered.is_set()) is Outcome.DONE


def test_however_busy_the_mount_a_worker_that_never_moves_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "HARD_STALL_S", 1.0)
    let_go = threading.Event()
    try:
        assert _run(_waits(let_go), lambda: True) is Outcome.STUCK
    finally:
        let_go.set()


def test_a_worker_that_keeps_dropping_is_not() -> None:
    def work(progress: Progress) -> bool:
        for _ in range(15):  # 1.5 s in all, each step a fifth of STALL_S
            time.sleep(0.1)
            progress.ended += 1
        return True
    assert _run(work, lambda: False) is Outcome.DONE


def test_idleness_counts_only_if_it_lasts() -> None:
    """Busy for a moment in every fifth of STALL_S is never idle for STALL_S."""
    started = time.monotonic()
    assert _run(lambda progress: time.sleep(1.5) is None,
                lambda: (time.monotonic() - started) % 0.1 < 0.05) is Outcome.DONE


def test_a_loop_held_is_not_a_mount_idle() -> None:
    """The loop held longer than STALL_S (a long call on it): the worker may not have run meanwhile."""
    async def main() -> Outcome:
        async with trio.open_nursery() as nursery:
            async def hold() -> None:
                await trio.sleep(0.1)
                time.sleep(0.8)  # noqa: ASYNC251 - the loop held, on purpose
            nursery.start_soon(hold)
            return await watched(lambda progress: time.sleep(1.0) is None, lambda: False)
    assert trio.run(main) is Outcome.DONE


def test_a_refusal_or_a_failure_is_refused() -> None:
    assert _run(lambda progress: False, lambda: False) is Outcome.REFUSED

    def fails(progress: Progress) -> bool:
        raise RuntimeError("the worker failed")
    assert _run(fails, lambda: False) is Outcome.REFUSED


def test_a_mount_that_stops_lets_a_moving_worker_end() -> None:
    """Cancelled from outside (the mount stopping), the worker is waited for, not abandoned."""
    ended = threading.Event()

    def work(progress: Progress) -> bool:
        time.sleep(0.2)
        ended.set()
        return True

    async def main() -> Outcome | None:
        with trio.move_on_after(0.05):
            return await watched(work, lambda: False)
        return None

    assert trio.run(main) is Outcome.DONE
    assert ended.is_set()
