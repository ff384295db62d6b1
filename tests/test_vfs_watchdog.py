"""``vfs.watchdog``: a worker stuck on a lock of the kernel's is abandoned, one that moves or waits on
the mount's own requests is not. In this process, with plain functions for the worker and for whether
the mount is busy; ``test_vfs_fail_closed`` shows it on a real mount."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable

import pytest
import trio

from scopefs.vfs import kernel, watchdog
from scopefs.vfs.errors import ANSWERING, guarded
from scopefs.vfs.kernel import Kernel
from scopefs.vfs.watchdog import Outcome, Progress, let_go, watched


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "STALL_S", 0.5)
    monkeypatch.setattr(watchdog, "HARD_STALL_S", 30.0)
    monkeypatch.setattr(watchdog, "SAMPLE_S", 0.02)
    monkeypatch.setattr(watchdog, "_abandoned", [])


def _run(work: Callable[[Progress], bool], busy: Callable[[], bool]) -> Outcome:
    return trio.run(watched, work, busy)


def _waits(release: threading.Event) -> Callable[[Progress], bool]:
    return lambda progress: release.wait(60)


def _a_waiting_worker(busy: Callable[[], bool]) -> Outcome:
    """The outcome for a worker that waits until told, told once it is known."""
    release = threading.Event()
    try:
        return _run(_waits(release), busy)
    finally:
        release.set()


def test_a_worker_that_waits_while_the_mount_is_idle_is_abandoned() -> None:
    assert _a_waiting_worker(lambda: False) is Outcome.STUCK


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
    assert _a_waiting_worker(lambda: True) is Outcome.STUCK


def test_a_worker_that_keeps_dropping_is_not() -> None:
    def work(progress: Progress) -> bool:
        for _ in range(30):  # 1.5 s in all, each step a tenth of STALL_S (a loaded machine starves threads)
            time.sleep(0.05)
            progress.ended += 1
        return True
    assert _run(work, lambda: False) is Outcome.DONE


def _slept(seconds: float) -> bool:
    """A worker's work that takes ``seconds`` and drops everything."""
    time.sleep(seconds)
    return True


def test_idleness_counts_only_if_it_lasts() -> None:
    """Busy for a moment in every fifth of STALL_S is never idle for STALL_S."""
    started = time.monotonic()
    assert _run(lambda progress: _slept(1.5),
                lambda: (time.monotonic() - started) % 0.1 < 0.05) is Outcome.DONE


def test_a_loop_held_is_not_a_mount_idle() -> None:
    """The loop held longer than STALL_S (a long call on it): the worker may not have run meanwhile."""
    async def main() -> Outcome:
        async with trio.open_nursery() as nursery:
            async def hold() -> None:
                await trio.sleep(0.1)
                time.sleep(0.8)  # noqa: ASYNC251 - the loop held, on purpose
            nursery.start_soon(hold)
            return await watched(lambda progress: _slept(1.0), lambda: False)
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


def test_the_server_closes_its_session_only_once_every_abandoned_worker_returned() -> None:
    release = threading.Event()
    try:
        assert _run(_waits(release), lambda: False) is Outcome.STUCK
        assert not let_go(0.1)
    finally:
        release.set()
    assert let_go(5.0)


def test_a_drop_waits_on_no_slot_of_the_shared_thread_limiter() -> None:
    """Every slot of the default limiter taken (reads on workers, or abandoned drops): a drop still runs."""
    async def main() -> Outcome:
        shared = trio.to_thread.current_default_thread_limiter()
        shared.total_tokens = 1
        async with shared:
            return await watched(lambda progress: True, lambda: False)
    assert trio.run(main) is Outcome.DONE


@pytest.mark.parametrize(("waiting", "answering", "dropping", "serving", "busy"), [
    (None, 0, 0, True, True),  # the kernel's count unreadable: never idle
    (0, 0, 0, True, False),
    (1, 0, 0, True, True),  # a request queued in the kernel
    (0, 1, 0, True, True),  # one it does not count (a mapping's written pages), being answered
    (1, 1, 1, True, False),  # the handler of the one request waits on a drop itself: it holds no lock of it
    (2, 1, 1, True, True),
    (1, 2, 1, True, True),
    (3, 0, 0, False, False),  # the loop stopped: nothing queued will be answered
])
def test_a_mount_is_busy_while_a_request_waits_that_is_not_itself_waiting_on_a_drop(
        monkeypatch: pytest.MonkeyPatch, waiting: int | None, answering: int, dropping: int, serving: bool,
        busy: bool) -> None:
    monkeypatch.setattr(kernel, "requests_waiting", lambda connection: waiting)
    monkeypatch.setattr(ANSWERING, "count", answering)
    state = types.SimpleNamespace(connection="7", answering=serving, _handlers_dropping=dropping)
    assert Kernel.busy(state) is busy  # type: ignore[arg-type]


@pytest.mark.parametrize(("answering", "dropping", "refreshing", "besides_refreshing", "busy"), [
    (2, 0, 2, True, False),  # both handlers wait on the refresh whose drop this is: they hold none of its pages
    (2, 0, 2, False, True),  # for the worker's drops they count: a rename's handler leaves its folder locked
    (3, 0, 2, True, True),  # a third request is being answered, and may hold a page
    (2, 1, 1, True, False),  # one waits on a drop, the other on the refresh
])
def test_handlers_waiting_on_a_refresh_leave_the_mount_idle_only_for_that_refresh_s_drop(
        monkeypatch: pytest.MonkeyPatch, answering: int, dropping: int, refreshing: int,
        besides_refreshing: bool, busy: bool) -> None:
    monkeypatch.setattr(kernel, "requests_waiting", lambda connection: answering)  # the kernel counts the same
    monkeypatch.setattr(ANSWERING, "count", answering)
    state = types.SimpleNamespace(connection="7", answering=True, _handlers_dropping=dropping,
                                  _handlers_refreshing=refreshing)
    assert Kernel.busy(state, besides_refreshing=besides_refreshing) is busy  # type: ignore[arg-type]


def test_a_handler_is_told_from_a_background_task() -> None:
    """Only a request's handler counts among those waiting on a refresh (``MountState``): a background
    task waiting on one holds no request of the kernel's."""
    seen: list[bool] = []

    @guarded
    async def handler() -> None:
        seen.append(ANSWERING.in_handler())

    async def main() -> None:
        seen.append(ANSWERING.in_handler())
        await handler()
        seen.append(ANSWERING.in_handler())
    trio.run(main)
    assert seen == [False, True, False] and ANSWERING.count == 0
