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

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog import readjournal
from scopefs.catalog.audit import AuditEvent
from scopefs.catalog.exposures import Exposed, record_batch
from scopefs.catalog.home import Home
from scopefs.catalog.readjournal import FOLDER, REPLAYING, RUN_ID, ReadJournal, replay
from tests.conftest import ALICE_FACT, READ_JOURNALS, Scenario, db_copy
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
    assert FOLDER == READ_JOURNALS  # the snapshots of ``tests.conftest`` leave it out with the audit
    folder = s.cli.home / FOLDER
    return sorted(p.name for p in folder.iterdir() if p.name != REPLAYING) if folder.exists() else []


@contextlib.contextmanager
def _read_unrecorded(s: Scenario, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A mount of Alice's session that cannot record its reads, after it served ``NOTE``: (mount point,
    the note's revision). The read's line is in the journal by the time the read returned."""
    where = tmp_path / "mnt"
    where.mkdir()
    revision = _revision(s, s.alice_session, NOTE)
    with patched_server(s.cli.home, s.alice_session, where, NEVER_RECORDED):
        assert (where / NOTE).read_bytes() == ALICE_FACT
        journals = [p for p in (s.cli.home / READ_JOURNALS).iterdir() if p.suffix == ".jsonl"]
        assert [revision.encode() in p.read_bytes() for p in journals] == [True]
        yield where, revision
    assert _exposures(s, s.alice_session) == []  # nothing recorded it: the journal is all there is


def test_a_killed_mount_loses_no_read_audit(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    with _read_unrecorded(s, tmp_path) as (where, revision):
        [server] = view_servers(where, patched=True)
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not view_servers(where, patched=True))
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
    with _read_unrecorded(s, tmp_path) as (_where, revision):
        s.cli("audit", check=True)
        assert _exposures(s, s.alice_session) == []
    s.cli("audit", "exposures", "--agent", s.agent, "--revision", revision, check=True)
    assert _exposures(s, s.alice_session) == [(revision, RUN_ID)]
    assert _journal_files(s) == []


def test_a_mount_that_records_its_reads_leaves_no_journal(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    where = tmp_path / "mnt"
    where.mkdir()
    with patched_server(s.cli.home, s.alice_session, where, ""):
        assert (where / NOTE).read_bytes() == ALICE_FACT
        wait_until(lambda: len(_exposures(s, s.alice_session)) == 1  # its batch is committed, then its file goes
                   and not any(name.endswith(".jsonl") for name in _journal_files(s)), timeout=10)
    assert _journal_files(s) == []  # and the lock goes with a clean end
    assert len(_exposures(s, s.alice_session)) == 1


def test_a_committed_batch_is_not_counted_twice_and_bad_lines_are_skipped(scenario: Scenario, home: Home) -> None:
    """The mount committed the batch and died before removing its file: the replay skips those lines. A
    line torn by the kill, or one that is not ours, is skipped too; the rest is recorded."""
    s = scenario
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
        torn.write(b'{"at": 2, "pad": "' + b"x" * 5000 + b'"}\n')  # over MAX_LINE: skipped whole
        torn.write(b'{"agent_id": "main", "session_id": "s_' + b"9" * 26 + b'", "revision_id": "v_')
    journal.close()  # ended without saying the batch was recorded: the file stays, the lock is free
    assert replay(home) == 1
    assert replay(home) == 0
    assert sorted(r[0] for r in _exposures(s, session)) == [r.revision_id for r in rows]
    assert sorted(r[0] for r in _read_audit(s, session)) == [r.revision_id for r in rows]
    assert _journal_files(s) == []


@pytest.fixture
def home(scenario: Scenario) -> Iterator[Home]:
    """The scenario's home, opened in this process (for the journal's own functions)."""
    opened = Home.open(scenario.cli.home)
    try:
        yield opened
    finally:
        opened.close()


def _dead_journal(home: Home, session: str, agent: str, count: int) -> list[Exposed]:
    """A journal of ``count`` reads whose mount ended without recording them (its lock is free)."""
    journal = ReadJournal(home)
    rows = [Exposed(f"v_{n:026d}", f"r_{n:026d}") for n in range(count)]
    for row in rows:
        journal.append(AuditEvent("read", "allow", "allowed", agent_id=agent, session_id=session,
                                  subject_kind="user", revision_id=row.revision_id), row)
    journal.given_up(journal.take())
    journal.close()
    return rows


def test_two_replays_at_once_record_a_journal_once(scenario: Scenario, home: Home) -> None:
    """Two mounts starting together after a crash (or an audit beside a mount's start) both replay: one
    records the journal, the other finds it taken or gone; neither fails."""
    s = scenario
    rows = _dead_journal(home, s.alice_session, s.agent, 200)
    counts: list[int] = []
    errors: list[BaseException] = []

    together = threading.Barrier(4)

    def one_replay() -> None:
        other = Home.open(s.cli.home)
        try:
            together.wait(timeout=30)
            counts.append(replay(other))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=one_replay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sum(counts) == len(rows)
    assert len(_exposures(s, s.alice_session)) == len(rows)
    assert _journal_files(s) == []


def test_a_given_up_batch_outlives_later_batches_and_long_journals_are_read_in_pieces(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, home: Home) -> None:
    s = scenario
    monkeypatch.setattr(readjournal, "REPLAY_BATCH", 7)
    pieces: list[int] = []
    record = readjournal._record

    def counted(into: Home, lines: list[dict[str, Any]]) -> int:
        pieces.append(len(lines))
        return record(into, lines)

    monkeypatch.setattr(readjournal, "_record", counted)
    journal = ReadJournal(home)
    event = AuditEvent("read", "allow", "allowed", agent_id=s.agent, session_id=s.alice_session,
                       subject_kind="user", revision_id="v_" + "1" * 26)
    journal.append(event, Exposed("v_" + "1" * 26, "r_" + "1" * 26))
    journal.given_up(journal.take())  # its batch dropped unrecorded (the mount's last flush failed)
    for n in range(20):
        journal.append(AuditEvent("read", "allow", "allowed", agent_id=s.agent, session_id=s.alice_session,
                                  revision_id=f"v_{n:026d}"), Exposed(f"v_{n:026d}", f"r_{n:026d}"))
    journal.done(journal.take())  # a later batch, committed: only its own file goes
    assert len([n for n in _journal_files(s) if n.endswith(".jsonl")]) == 1
    journal.close()
    assert replay(home) == 1
    assert _exposures(s, s.alice_session) == [("v_" + "1" * 26, RUN_ID)]
    rows = _dead_journal(home, s.alice_session, s.agent, 20)
    pieces.clear()
    assert replay(home) == len(rows)
    assert pieces == [7, 7, 6]


def test_a_file_written_after_the_first_look_is_replayed_with_its_journal(scenario: Scenario, home: Home) -> None:
    """A mount may write another file between a replay's listing and its death: the replay lists the
    token's files again once it holds the dead mount's lock, so none is left behind without its lock."""
    s = scenario
    rows = _dead_journal(home, s.alice_session, s.agent, 3)
    dir_fd = os.open(s.cli.home / FOLDER, os.O_RDONLY | os.O_DIRECTORY)
    try:
        [token] = [name.removesuffix(".lock") for name in os.listdir(dir_fd) if name.endswith(".lock")]
        assert readjournal._replay_one(home, dir_fd, token) == len(rows)
    finally:
        os.close(dir_fd)
    assert _journal_files(s) == []


def test_a_line_of_nested_brackets_or_an_impossible_time_is_skipped(scenario: Scenario, home: Home) -> None:
    s = scenario
    rows = _dead_journal(home, s.alice_session, s.agent, 1)
    [name] = [n for n in _journal_files(s) if n.endswith(".jsonl")]
    with open(s.cli.home / FOLDER / name, "ab") as journal:
        journal.write(b"[" * 1500 + b"\n")
        journal.write(b'{"at": ' + str(10**30).encode() + b', "agent_id": "main", "session_id": "s_'
                      + b"1" * 26 + b'", "revision_id": "v_' + b"2" * 26 + b'", "resource_id": "r_'
                      + b"2" * 26 + b'"}\n')
    assert replay(home) == len(rows)


def test_doctor_names_what_stopped_mounts_left_and_fix_records_it(scenario: Scenario, home: Home) -> None:
    s = scenario
    live = ReadJournal(home)  # this process's, and alive: never counted, never taken
    live.append(AuditEvent("read", "allow", "allowed", agent_id=s.agent, session_id=s.bob_session,
                           revision_id="v_" + "7" * 26), Exposed("v_" + "7" * 26, "r_" + "7" * 26))
    rows = _dead_journal(home, s.alice_session, s.agent, 4)
    found = s.cli("--json", "doctor")
    assert found.code == 0, found.err  # a notice: nothing is wrong with any artifact
    assert found.json()["read_journals"] == {"waiting": 1, "recorded": None}
    assert _exposures(s, s.alice_session) == []  # looking changes nothing
    fixed = s.cli.j("doctor", "--fix")
    assert fixed["read_journals"] == {"waiting": 1, "recorded": len(rows)}
    assert s.cli.j("doctor")["read_journals"] == {"waiting": 0, "recorded": None}
    assert _exposures(s, s.bob_session) == []  # the live journal stays its mount's
    live.close()
