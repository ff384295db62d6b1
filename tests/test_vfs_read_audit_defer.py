"""A mount's read audit waits while reads keep coming, but never more than a few ticks (``vfs.follow``).

Each read a mount verifies is later written as an exposure row (at a random
place in an index of every exposure) and looked up in the search index.
Done every second in the middle of a cold ``grep -r``, that bookkeeping
took the disk and a CPU from the reads it records, so it waits for a tick
without new reads, for at most ``DEFER_TICKS`` in a row. Both halves are
seen here from the state database: reads that never pause are recorded
anyway, and reads that pause are recorded at the next quiet tick.
"""

from __future__ import annotations

import time

import apsw

from scopefs.catalog.home import Home
from scopefs.vfs.follow import DEFER_TICKS, TICK_S
from scopefs.writer.transaction import write_note
from tests.conftest import Scenario
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

NOTES = 60
READ_EVERY_S = 0.25  # several new reads in every tick: the reads never pause for one


def exposed(state: apsw.Connection, session_id: str) -> int:
    return int(state.execute("SELECT count(*) FROM exposures WHERE session_id = ?", (session_id,)).fetchall()[0][0])


def test_reads_that_never_pause_are_recorded_within_the_bound(scenario: Scenario,
                                                              mounts: Mounts) -> None:  # noqa: F811
    session = scenario.alice_session
    home = Home.open(scenario.cli.home)
    try:
        for i in range(NOTES):
            write_note(home, session, f"private/stream/n{i:03d}.md", f"note {i} of a stream\n".encode(),
                       durable=False)
    finally:
        home.close()
    where = mounts.mount(session, "alice")
    state = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    before = exposed(state, session)
    started = time.monotonic()
    recorded_while_reading = False
    for i in range(NOTES):  # 15 s of reads, each of a note this mount has not read yet
        assert (where / "private" / "stream" / f"n{i:03d}.md").read_bytes() == f"note {i} of a stream\n".encode()
        if exposed(state, session) > before:
            recorded_while_reading = True
            break
        time.sleep(READ_EVERY_S)
    assert recorded_while_reading, "no read was recorded while the reads kept coming"
    # The wait is bounded by the ticks, not by the reads: a functional bound with room for a slow machine.
    assert time.monotonic() - started < NOTES * READ_EVERY_S
    assert DEFER_TICKS * TICK_S < NOTES * READ_EVERY_S / 2


def test_reads_that_pause_are_recorded_at_the_next_quiet_tick(scenario: Scenario,
                                                             mounts: Mounts) -> None:  # noqa: F811
    session = scenario.alice_session
    where = mounts.mount(session, "alice")
    state = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    before = exposed(state, session)
    assert (where / "private" / "notes" / "allergy.md").read_bytes()
    wait_until(lambda: exposed(state, session) > before, timeout=10)
