"""A mount's view is not held up by its own audit writes while another process holds ``state.sqlite``.

A mount records its reads (and delivers its saves' audit rows) into
``state.sqlite`` once a second, on the catalog thread its view refreshes run
on. Another process holding that database's writer lock (a slow durable
commit, a drain, a checkpoint) used to make that write wait up to the busy
timeout (10 s), and every refresh behind it: a new revision took 6.7 s to
show (``bench/refresh_under_lock.py``). The audit writes now give up after
``AUDIT_WAIT_MS`` and are tried again at the next tick, and nothing is lost:
once the lock goes, the reads made meanwhile are recorded.

The audit writes catalog calls make themselves on that thread (a search's,
an integrity failure's, a refusal's, the outbox drain after an ``fsync``)
wait as briefly: what they cannot write is held in the mount's backlog
(``catalog.audit.AuditBacklog``) and recorded at a later tick.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import apsw

from scopefs.catalog.db import BUSY_TIMEOUT_MS
from scopefs.catalog.home import Home
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario, artifact_path, sqlite_int
from tests.mountkit import Mounts, errno_of, mounts, wait_until  # noqa: F401

SECOND = b"A second note, read while the state database is locked (canary L0ck)\n"
NEW = b"First private fact, revised while the state database is locked (canary R3v1)\n"


def exposed_revisions(state: apsw.Connection, session_id: str) -> set[str]:
    return {str(row[0]) for row in state.execute("SELECT revision_id FROM exposures WHERE session_id = ?",
                                                 (session_id,))}


def delivered_saves(state: apsw.Connection, session_id: str) -> int:
    """Audit rows that came through an outbox (saves), for this session."""
    return sqlite_int(state.execute("SELECT count(*) FROM audit WHERE event_id IS NOT NULL AND session_id = ?",
                             (session_id,)).fetchall()[0][0])


def mounted_after_writing(scenario: Scenario, mounts: Mounts, name: str,  # noqa: F811
                          data: bytes) -> tuple[str, Path, Path, apsw.Connection]:
    """Write Alice's note ``name``, mount her session, read her fact through it and wait until that read
    is recorded (no audit write pending): the new revision, the mount, the fact's path there, and a
    connection to the state database for the test to take its lock with."""
    session = scenario.alice_session
    revision = scenario.cli.j("write", session, f"private/notes/{name}", stdin=data)["revision_id"]
    where = mounts.mount(session, "alice")
    note = where / "private" / "notes" / "allergy.md"
    assert note.read_bytes() == ALICE_FACT
    holder = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    holder.set_busy_timeout(10_000)
    wait_until(lambda: exposed_revisions(holder, session), timeout=10)
    return revision, where, note, holder


def test_a_new_revision_shows_while_another_process_holds_the_state_lock(scenario: Scenario,
                                                                          mounts: Mounts) -> None:  # noqa: F811
    session = scenario.alice_session
    second, where, note, holder = mounted_after_writing(scenario, mounts, "second.md", SECOND)
    saves_before = delivered_saves(holder, session)
    holder.execute("BEGIN IMMEDIATE")  # another process's long write: the writer lock is taken
    try:
        # Both audit writes of the mount's next ticks are now due: a read's, and a save's outbox row.
        assert (where / "private" / "notes" / "second.md").read_bytes() == SECOND
        (where / "private" / "notes" / "saved.md").write_bytes(b"saved through the mount while locked\n")
        # Three ticks pass: the mount tries both writes and finds the lock taken (the read's waits for
        # a tick without new reads first: ``Follow._reads_streaming``).
        time.sleep(3.2)
        home = Home.open(scenario.cli.home)
        try:
            write_note(home, session, "private/notes/allergy.md", NEW, durable=False)  # the agent's catalog only
        finally:
            home.close()
        # Within the mount's ordinary wake, not when the lock goes (it is held until after this).
        wait_until(lambda: note.read_bytes() == NEW, timeout=8)
    finally:
        holder.execute("ROLLBACK")
    # And nothing is lost: the read and the save held back are recorded once the lock goes.
    wait_until(lambda: second in exposed_revisions(holder, session), timeout=10)
    wait_until(lambda: delivered_saves(holder, session) > saves_before, timeout=10)
    holder.close()


THIRD = b"A third note, tampered with while the state database is locked (canary T4mp)\n"
TAMPERED = b"bytes nobody wrote through scopefs\n"


def audited(state: apsw.Connection, session_id: str, operation: str, decision: str) -> set[str]:
    """Revision ids of this session's audit rows with this operation and decision."""
    return {str(row[0]) for row in state.execute(
        "SELECT revision_id FROM audit WHERE session_id = ? AND operation = ? AND decision = ?",
        (session_id, operation, decision))}


def test_a_search_and_an_integrity_failure_under_the_lock_hold_up_no_view(scenario: Scenario,
                                                                         mounts: Mounts) -> None:  # noqa: F811
    session = scenario.alice_session
    third, where, note, holder = mounted_after_writing(scenario, mounts, "third.md", THIRD)
    assert not audited(holder, session, "search", "allow")
    tamper = artifact_path(scenario.cli.home, scenario.alice, "notes/third.md")
    holder.execute("BEGIN IMMEDIATE")  # another process's long write: the writer lock is taken
    try:
        started = time.monotonic()
        found = (where / ".search" / "hazelnuts").read_bytes()  # a search: its audit rows are due
        assert b"allergy.md" in found
        fd = os.open(tamper, os.O_WRONLY)
        try:
            os.pwrite(fd, TAMPERED, 0)
            os.ftruncate(fd, len(TAMPERED))
        finally:
            os.close(fd)
        assert errno_of(lambda: (where / "private" / "notes" / "third.md").read_bytes()) == errno.EIO
        # Each waited briefly for the lock: neither waited the busy timeout.
        assert time.monotonic() - started < BUSY_TIMEOUT_MS / 1000
        home = Home.open(scenario.cli.home)
        try:
            write_note(home, session, "private/notes/allergy.md", NEW, durable=False)  # the agent's catalog only
        finally:
            home.close()
        wait_until(lambda: note.read_bytes() == NEW, timeout=8)  # within the ordinary wake, lock still held
    finally:
        holder.execute("ROLLBACK")
    # Nothing is lost: the search's exposures and the integrity failure are recorded once the lock goes.
    wait_until(lambda: audited(holder, session, "search", "allow"), timeout=10)
    wait_until(lambda: third in audited(holder, session, "read", "error"), timeout=10)
    holder.close()
