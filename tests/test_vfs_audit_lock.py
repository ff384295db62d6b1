"""A mount's view is not held up by its own audit writes while another process holds ``state.sqlite``.

A mount records its reads (and delivers its saves' audit rows) into
``state.sqlite`` once a second, on the catalog thread its view refreshes run
on. Another process holding that database's writer lock (a slow durable
commit, a drain, a checkpoint) used to make that write wait up to the busy
timeout (10 s), and every refresh behind it: a new revision took 6.7 s to
show (``bench/refresh_under_lock.py``). The audit writes now give up after
``AUDIT_WAIT_MS`` and are tried again at the next tick, and nothing is lost:
once the lock goes, the reads made meanwhile are recorded.
"""

from __future__ import annotations

import time

import apsw

from scopefs.catalog.home import Home
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

SECOND = b"A second note, read while the state database is locked (canary L0ck)\n"
NEW = b"First private fact, revised while the state database is locked (canary R3v1)\n"


def exposed_revisions(state: apsw.Connection, session_id: str) -> set[str]:
    return {str(row[0]) for row in state.execute("SELECT revision_id FROM exposures WHERE session_id = ?",
                                                 (session_id,))}


def delivered_saves(state: apsw.Connection, session_id: str) -> int:
    """Audit rows that came through an outbox (saves), for this session."""
    return int(state.execute("SELECT count(*) FROM audit WHERE event_id IS NOT NULL AND session_id = ?",
                             (session_id,)).fetchall()[0][0])


def test_a_new_revision_shows_while_another_process_holds_the_state_lock(scenario: Scenario,
                                                                          mounts: Mounts) -> None:  # noqa: F811
    session = scenario.alice_session
    second = scenario.cli.j("write", session, "private/notes/second.md", stdin=SECOND)["revision_id"]
    where = mounts.mount(session, "alice")
    note = where / "private" / "notes" / "allergy.md"
    assert note.read_bytes() == ALICE_FACT
    holder = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    holder.set_busy_timeout(10_000)
    wait_until(lambda: exposed_revisions(holder, session), timeout=10)  # that read is recorded: none pending
    saves_before = delivered_saves(holder, session)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write: the writer lock is taken
    try:
        # Both audit writes of the mount's next ticks are now due: a read's, and a save's outbox row.
        assert (where / "private" / "notes" / "second.md").read_bytes() == SECOND
        (where / "private" / "notes" / "saved.md").write_bytes(b"saved through the mount while locked\n")
        time.sleep(2.2)  # two ticks pass: the mount tries both writes and finds the lock taken
        home = Home.open(scenario.cli.home)
        try:
            write_note(home, session, "private/notes/allergy.md", NEW, durable=False)  # the agent's catalog only
        finally:
            home.close()
        # Within the mount's ordinary wake, not when the lock goes (it is held until after this).
        wait_until(lambda: note.read_bytes() == NEW, timeout=3)
    finally:
        holder.execute("ROLLBACK")
    # And nothing is lost: the read and the save held back are recorded once the lock goes.
    wait_until(lambda: second in exposed_revisions(holder, session), timeout=10)
    wait_until(lambda: delivered_saves(holder, session) > saves_before, timeout=10)
    holder.close()
