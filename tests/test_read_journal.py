"""A killed mount loses no read's audit: the reads' journal (``catalog.readjournal``).

A mount records its reads' exposures a second or a few after serving them.
Real mounts whose server cannot write ``state.sqlite`` (its batches are put
back, as under a long lock) are SIGKILLed after serving reads; ``scopefs
audit`` must then find every one, once. A live mount's journal is never
taken from it. The journal itself is checked against real files: a batch
that was committed before its file went is not counted twice, and a torn
or foreign line is skipped.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from scopefs.catalog.audit import AuditEvent
from scopefs.catalog.exposures import Exposed, record_batch
from scopefs.catalog.home import Home
from scopefs.catalog.readjournal import FOLDER, RUN_ID, ReadJournal, replay
from tests.conftest import ALICE_FACT, Scenario, db_copy
from tests.mountkit import patched_server, view_servers, wait_until

NOTE = "private/notes/allergy.md"
NEVER_RECORDED = """
import scopefs.vfs.catalog_ops as _ops
from scopefs.catalog.errors import StorageError

def _locked(*_args, **_kwargs):
    raise StorageError("state.sqlite held for the test")

_ops.record_reads = _locked  # every batch is put back, as while another process holds the lock
"""


def _exposures(s: Scenario, session: str) -> list[tuple[Any, ...]]:
    with db_copy(s.cli.home / "state.sqlite") as conn:
        return conn.execute("SELECT revision_id, run_id FROM exposures WHERE session_id = ?", (session,)).fetchall()


def _read_audit(s: Scenario, session: str) -> list[tuple[Any, ...]]:
    with db_copy(s.cli.home / "state.sqlite") as conn:
        return conn.execute("SELECT revision_id, decision FROM audit WHERE operation = 'read' AND session_id = ?",
                            (session,)).fetchall()


def _revision(s: Scenario, session: str, path: str) -> str:
    return str(s.cli.j("history", session, path)["revisions"][0]["revision_id"])


def _journal_files(s: Scenario) -> list[str]:
    folder = s.cli.home / FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_killed_mount_loses_no_read_audit(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    where = tmp_path / "mnt"
    where.mkdir()
    revision = _revision(s, s.alice_session, NOTE)
    with patched_server(s.cli.home, s.alice_session, where, NEVER_RECORDED):
        assert (where / NOTE).read_bytes() == ALICE_FACT
        time.sleep(2.5)  # a quiet tick or two: the mount tried to record the read, and could not
        assert _exposures(s, s.alice_session) == []
        [server] = view_servers(where, patched=True)
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not view_servers(where, patched=True))
    assert any(name.endswith(".jsonl") for name in _journal_files(s))
    s.cli("audit", "--session", s.alice_session, check=True)  # replays before it answers
    assert _exposures(s, s.alice_session) == [(revision, RUN_ID)]
    assert _read_audit(s, s.alice_session) == [(revision, "allow")]
    assert _journal_files(s) == []
    s.cli("audit", check=True)  # nothing left to replay: nothing counted twice
    assert len(_exposures(s, s.alice_session)) == 1 and len(_read_audit(s, s.alice_session)) == 1


def test_a_live_mounts_journal_is_left_to_it(scenario: Scenario, tmp_path: Path) -> None:
    """While its server lives, nobody else records its reads (they would be recorded twice); once it ended
    without recording them (its last flush failed too), the next replay does."""
    s = scenario
    where = tmp_path / "mnt"
    where.mkdir()
    revision = _revision(s, s.alice_session, NOTE)
    with patched_server(s.cli.home, s.alice_session, where, NEVER_RECORDED):
        assert (where / NOTE).read_bytes() == ALICE_FACT
        s.cli("audit", check=True)
        assert _exposures(s, s.alice_session) == []
        assert any(name.endswith(".jsonl") for name in _journal_files(s))
    s.cli("audit", "exposures", "--agent", s.agent, "--revision", revision, check=True)
    assert _exposures(s, s.alice_session) == [(revision, RUN_ID)]
    assert _journal_files(s) == []


def test_a_mount_that_records_its_reads_leaves_no_journal(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    where = tmp_path / "mnt"
    where.mkdir()
    with patched_server(s.cli.home, s.alice_session, where, ""):
        assert (where / NOTE).read_bytes() == ALICE_FACT
        wait_until(lambda: len(_exposures(s, s.alice_session)) == 1, timeout=10)
        assert not any(name.endswith(".jsonl") for name in _journal_files(s))  # its batch is committed
    assert _journal_files(s) == []  # and the lock goes with a clean end
    assert len(_exposures(s, s.alice_session)) == 1


def test_a_committed_batch_is_not_counted_twice_and_bad_lines_are_skipped(scenario: Scenario) -> None:
    """The mount committed the batch and died before removing its file: the replay skips those lines. A
    line torn by the kill, or one that is not ours, is skipped too; the rest is recorded."""
    s = scenario
    home = Home.open(s.cli.home)
    try:
        journal = ReadJournal(home)
        session, agent = s.alice_session, s.agent
        events = [AuditEvent("read", "allow", "allowed", agent_id=agent, session_id=session,
                             subject_kind="user", revision_id=f"v_{n:026d}") for n in range(3)]
        rows = [Exposed(e.revision_id or "", f"r_{n:026d}") for n, e in enumerate(events)]
        for event, row in zip(events, rows, strict=True):
            journal.append(event, row)
        files = journal.take()
        record_batch(home.state(), session_id=session, agent_id=agent, run_id=RUN_ID, operation="read",
                     exposed=rows[:2], at=[e.at for e in events[:2]], audit=events[:2])  # two were committed
        with open(s.cli.home / FOLDER / files[0], "ab") as torn:
            torn.write(b'{"agent_id":"main","session_id":"' + session.encode() + b'","revision_id":"v_1"\n')
            torn.write(b'{"at": 1, "agent_id": "../x", "session_id": "s", "revision_id": "v", "resource_id": "r"}\n')
            torn.write(b'{"agent_id": "main", "session_id": "s_' + b"9" * 26 + b'", "revision_id": "v_')
        journal.close()  # ended without saying the batch was recorded: the file stays, the lock is free
        assert replay(home) == 1
        assert replay(home) == 0
        assert sorted(r[0] for r in _exposures(s, session)) == [r.revision_id for r in rows]
        assert sorted(r[0] for r in _read_audit(s, session)) == [r.revision_id for r in rows]
        assert _journal_files(s) == []
    finally:
        home.close()
