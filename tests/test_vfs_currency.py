"""The rules of ``vfs.currency`` alone, on a clock the test moves: when a failing catalog empties the
view, when a mount is suspended and when it may read again.

The same rules are shown on mounts in ``test_vfs_draft_lifetime.py``,
``test_vfs_fail_closed.py`` and ``test_marks.py``; here the clock is the
test's, so a boundary is checked where it lies, at no cost.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scopefs.catalog.marks import Mark
from scopefs.vfs import currency
from scopefs.vfs.currency import FAIL_CLOSED_S, Currency


class Clock:
    """``time.monotonic`` as ``vfs.currency`` reads it, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)


def failing(record: Currency) -> bool:
    """``record.failing`` read afresh: mypy would keep an ``assert`` on it narrowed across a call."""
    return record.failing


def suspended(record: Currency) -> bool:
    """``record.suspended`` read afresh, for the same reason."""
    return record.suspended


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(currency, "time", SimpleNamespace(monotonic=moved.monotonic))
    return moved


def test_failures_empty_the_view_only_once_the_first_of_them_is_fail_closed_s_old(clock: Clock) -> None:
    record = Currency()
    clock.now += 3600  # a quiet hour since the last read: it does not count
    first = clock.ns()
    clock.now += 0.25
    assert not record.failed(first, wrote=False)
    assert record.failing and not record.suspended
    clock.now = first / 1e9 + FAIL_CLOSED_S  # exactly FAIL_CLOSED_S after the first failure began: not yet
    assert not record.failed(clock.ns(), wrote=False)
    clock.now += 0.25
    assert record.failed(clock.ns(), wrote=False)
    record.read(whole=True)  # a success starts the count again
    assert not failing(record)
    began = clock.ns()
    clock.now += 0.25
    assert not record.failed(began, wrote=False)


def test_one_failure_slower_than_fail_closed_s_empties_the_view_at_once(clock: Clock) -> None:
    record = Currency()
    began = clock.ns()
    clock.now += FAIL_CLOSED_S + 0.01
    assert record.failed(began, wrote=False)


def test_a_failure_after_a_write_suspends_until_a_view_is_applied(clock: Clock) -> None:
    record = Currency()
    record.failed(clock.ns(), wrote=True)
    assert record.suspended
    record.failed(clock.ns(), wrote=False)  # a later failure with no write keeps it suspended
    assert record.suspended
    record.read(whole=True)
    assert suspended(record)  # read, not yet applied: the view applied still lacks the write
    record.applied(clock.ns(), None, object())  # type: ignore[arg-type]  # only kept, never read here
    assert not suspended(record) and not failing(record)


def test_a_suspended_mount_reads_again_only_retry_s_after_the_last_failure(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(currency, "RETRY_S", 0.125)  # a binary fraction: the sums below are exact
    record = Currency()
    record.failed(clock.ns(), wrote=True)
    assert not record.may_retry
    clock.now += 0.0625
    record.failed(clock.ns(), wrote=False)  # the follower's read failed too: counted from this one
    clock.now += 0.0625
    assert not record.may_retry
    clock.now += 0.0625  # exactly RETRY_S after the last failure
    assert record.may_retry


def test_a_view_covers_what_was_asked_before_its_refresh_began(clock: Clock) -> None:
    record = Currency()
    asked = clock.ns()
    assert not record.covers(asked)
    clock.now += 0.001
    record.applied(clock.ns(), None, object())  # type: ignore[arg-type]  # only kept, never read here
    assert record.covers(asked)
    assert not record.covers(clock.ns())  # a refresh that began at the very moment asked is not after it


def test_a_failed_call_forgets_the_mark_so_the_next_refresh_reads_whole(clock: Clock) -> None:
    """A commit or a refresh that failed may have written: the view is not trusted by its mark after."""
    record = Currency()
    view: Any = SimpleNamespace(valid_until=None, access=SimpleNamespace(evidence_until=None))
    state: Any = object()  # a mark compares its connections by identity only
    record.applied(clock.ns(), Mark(state, 7, ()), view)
    assert record.unmoved(Mark(state, 7, ()), view)
    assert not record.unmoved(Mark(state, 8, ()), view)  # a commit came since
    record.forget_mark()
    assert not record.unmoved(Mark(state, 7, ()), view)
