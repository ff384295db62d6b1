"""A mount's read audit waits while reads keep coming, but never more than ``DEFER_S`` (``vfs.follow``).

Each read a mount verifies is later written as an exposure row (at a random
place in an index of every exposure) and looked up in the search index.
Done every second in the middle of a cold ``grep -r``, that bookkeeping
took the disk and a CPU from the reads it records, so it waits for a tick
without new reads, unless the oldest read waiting is ``DEFER_S`` old. The
decision is checked tick by tick on its own, and both halves are seen
from the state database through a real mount: reads that never pause are
recorded anyway, and reads that pause are recorded at the next quiet tick.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import apsw
import pytest

from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.vfs.follow import DEFER_S, TICK_S, Follow
from scopefs.writer.transaction import write_note
from tests.conftest import Scenario, sqlite_int
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

NOTES = 60
READ_EVERY_S = 0.25  # several new reads in every tick: the reads never pause for one


@dataclass
class PendingReads:
    """What ``Follow._reads_streaming`` asks of ``vfs.reads.Reads``."""

    exposed_count: int = 0
    oldest: int | None = None

    def oldest_exposure_us(self) -> int | None:
        return self.oldest


def test_the_decision_tick_by_tick() -> None:
    reads = PendingReads()
    follow = Follow(None, reads, None, None)  # type: ignore[arg-type]  # only the reads are asked
    assert not follow._reads_streaming()  # nothing read
    reads.exposed_count, reads.oldest = 10, now_us()
    assert follow._reads_streaming()  # new reads since the last tick: wait
    reads.exposed_count = 20
    assert follow._reads_streaming()
    assert not follow._reads_streaming()  # a tick without new reads: record them now
    reads.exposed_count += 5
    reads.oldest = now_us() - int(DEFER_S * 1_000_000)  # the oldest waited long enough (or was put back)
    assert not follow._reads_streaming()
    reads.exposed_count += 5
    reads.oldest = now_us()
    assert follow._reads_streaming()


@pytest.fixture
def state(scenario: Scenario) -> Iterator[apsw.Connection]:
    conn = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    conn.set_busy_timeout(10_000)
    try:
        yield conn
    finally:
        conn.close()


def exposed(state: apsw.Connection, session_id: str) -> int:
    return sqlite_int(state.execute("SELECT count(*) FROM exposures WHERE session_id = ?",
                                    (session_id,)).fetchall()[0][0])


def test_reads_that_never_pause_are_recorded_within_the_bound(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                              state: apsw.Connection) -> None:
    session = scenario.alice_session
    home = Home.open(scenario.cli.home)
    try:
        for i in range(NOTES):
            write_note(home, session, f"private/stream/n{i:03d}.md", f"note {i} of a stream\n".encode(),
                       durable=False)
    finally:
        home.close()
    where = mounts.mount(session, "alice")
    before = exposed(state, session)
    # The first read waits at most DEFER_S, and for the tick after that: a bound with room for a slow tick.
    bound = DEFER_S + 5 * TICK_S
    assert bound < NOTES * READ_EVERY_S
    started = time.monotonic()
    for i in range(NOTES):  # each a note this mount has not read yet
        assert (where / "private" / "stream" / f"n{i:03d}.md").read_bytes() == f"note {i} of a stream\n".encode()
        if exposed(state, session) > before or time.monotonic() - started > bound:
            break
        time.sleep(READ_EVERY_S)
    assert exposed(state, session) > before, f"no read was recorded within {bound} s while the reads kept coming"


def test_reads_that_pause_are_recorded_at_the_next_quiet_tick(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                             state: apsw.Connection) -> None:
    session = scenario.alice_session
    where = mounts.mount(session, "alice")
    before = exposed(state, session)
    assert (where / "private" / "notes" / "allergy.md").read_bytes()
    wait_until(lambda: exposed(state, session) > before, timeout=10)
