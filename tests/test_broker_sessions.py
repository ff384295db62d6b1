"""The broker's own sessions (``catalog.broker_sessions``): marked, never served, closed when their run is gone.

Real homes, the installed ``scopefs`` and real processes: an admin command's
session is traced to the command and the operator's uid, a session whose run
was SIGKILLed before it could close it is refused by every mount, read,
write and delegation, and ``doctor --fix`` closes it while leaving a live
run's session alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from tests.conftest import Scenario, db_copy, diff_snapshots, snapshot, sqlite_int, sqlite_str
from tests.crashkit import catalog_path
from tests.test_sharing import SOURCE, _grant

OPEN_AND_WAIT = """
import sys, time
from pathlib import Path
from scopefs.catalog.broker_sessions import open_broker_session
from scopefs.catalog.home import Home
session = open_broker_session(Home.open(Path(sys.argv[1])), sys.argv[2], "migrate")
print(session.session_id, flush=True)
time.sleep(600)
"""


class Run:
    """A process that opened a broker session for its run and is still going."""

    def __init__(self, home: Path, agent: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", OPEN_AND_WAIT, str(home), agent],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.session_id = self.proc.stdout.readline().strip()
        assert self.session_id.startswith("s_"), self.session_id

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        if run.proc.poll() is None:
            run.kill()


def _doctor(s: Scenario, *args: str) -> list[dict[str, Any]]:
    result = s.cli("--json", "doctor", "--agent", s.agent, *args)
    assert result.code == 0, result.err  # a notice fails nothing
    return [f for f in result.json()["findings"] if f["kind"] == "broker-session"]


def _closed(s: Scenario, session_id: str) -> bool:
    with db_copy(catalog_path(s.cli.home)) as conn:
        rows = conn.execute("SELECT closed_at FROM sessions WHERE session_id = ?", (session_id,)).fetchall()
    return rows[0][0] is not None


def test_an_admin_command_acts_through_its_own_session_traced_to_the_operator(scenario: Scenario) -> None:
    s = scenario
    _grant(s, s.alice)
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    s.cli.j("unpublish", "--agent", s.agent, "agent-shared/menu.md", "--yes")
    with db_copy(s.cli.home / "state.sqlite") as state:
        sessions = {sqlite_str(row[0]) for row in state.execute(
            "SELECT session_id FROM audit WHERE operation = 'unpublish' AND decision = 'allow'")}
    assert len(sessions) == 1
    (session_id,) = sessions
    with db_copy(catalog_path(s.cli.home)) as conn:
        row = conn.execute("SELECT b.command, b.unix_uid, b.run_mark, s.subject_kind, s.subject_reason,"
                           " s.closed_at FROM broker_sessions b JOIN sessions s USING (session_id)"
                           " WHERE session_id = ?", (session_id,)).fetchall()
    assert len(row) == 1
    command, uid, mark, kind, reason, closed_at = row[0]
    assert (command, sqlite_int(uid), kind, reason) == ("unpublish", os.getuid(), "ambiguous", "shared-main")
    with open("/proc/self/loginuid") as own:  # the login uid sudo keeps, or none (4294967295)
        login = int(own.read())
    assert s.cli.j("session", "brokers", "--agent", s.agent)["sessions"][0]["login_uid"] == (
        None if login == 2**32 - 1 else login)
    assert closed_at is not None  # closed when the run ended
    assert sqlite_str(mark).count("/") == 2  # boot/pid/start: which run, never a provider id
    assert _doctor(s) == []  # a run that ended closed its session: nothing to report
    rows = s.cli.j("audit", "--session", session_id)  # the admin may still ask what it did
    assert {r["operation"] for r in rows["rows"]} >= {"unpublish"}
    (listed,) = s.cli.j("session", "brokers", "--agent", s.agent)["sessions"]  # and which command and uid it was
    assert (listed["session_id"], listed["command"], listed["unix_uid"], listed["running"]) == (
        session_id, "unpublish", os.getuid(), False)


def test_a_killed_run_leaves_a_session_nothing_can_use_and_doctor_closes_it(
        scenario: Scenario, runs: list[Run], tmp_path: Path) -> None:
    s = scenario
    killed, live = Run(s.cli.home, s.agent), Run(s.cli.home, s.agent)
    runs += [killed, live]
    killed.kill()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    before = snapshot(s.cli.home)
    try:
        for session_id in (killed.session_id, live.session_id):
            refusals = [
                s.cli("mount", session_id, str(mountpoint)),
                s.cli("write", session_id, "agent-shared/x.md", stdin=b"x\n"),
                s.cli("write", session_id, "private/x.md", stdin=b"x\n"),
                s.cli("session", "open", "--agent", s.agent, "--child-of", session_id, "--cap", "agent-shared/**"),
                s.cli("ls", session_id, "agent-shared"),
                s.cli("read", session_id, "agent-shared/x.md"),
                s.cli("search", session_id, "menu"),
                s.cli("session", "close", session_id),  # doctor --fix closes it once its run is gone
                s.cli("derive", s.alice_session, "--from", f"{session_id}:agent-shared/x.md", "--to",
                      "private/d.md", stdin=b"d\n"),
            ]
            for result in refusals:
                assert result.code == 2, result.err
                assert "operator command's own" in result.err, result.err
        assert not os.path.ismount(mountpoint)
    finally:
        if os.path.ismount(mountpoint):  # only when the refusal failed: leave no mount behind
            subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
    assert diff_snapshots(before, snapshot(s.cli.home)) == []  # refusals change nothing

    found = _doctor(s)
    assert [(f["ref_id"], f["action"], f["notice"]) for f in found] == [(killed.session_id, None, True)]
    assert "doctor --fix" in found[0]["hint"]
    fixed = _doctor(s, "--fix")
    assert [(f["ref_id"], f["action"]) for f in fixed] == [(killed.session_id, "closed")]
    assert _closed(s, killed.session_id)
    assert not _closed(s, live.session_id)  # its run is still going: its session stays its own
    assert _doctor(s) == []
    listed = {b["session_id"]: b for b in s.cli.j("session", "brokers", "--agent", s.agent)["sessions"]}
    assert listed[live.session_id]["running"] and listed[live.session_id]["closed_at"] is None
    assert not listed[killed.session_id]["running"] and listed[killed.session_id]["closed_at"] is not None
    live.kill()
    assert [f["ref_id"] for f in _doctor(s)] == [live.session_id]


def test_doctor_closes_a_session_whose_run_died_before_indexing_it(scenario: Scenario) -> None:
    # The run commits its session and the broker row, then dies before the home's index names the session:
    # a session load_session cannot find, which doctor --fix must still close (by the catalog alone).
    code = ("import os, sys\nfrom pathlib import Path\nfrom scopefs.catalog import broker_sessions\n"
            "from scopefs.catalog.home import Home\n"
            "broker_sessions.index_session = lambda home, record: os._exit(0)\n"
            "broker_sessions.open_broker_session(Home.open(Path(sys.argv[1])), sys.argv[2], 'unpublish')\n")
    subprocess.run([sys.executable, "-c", code, str(scenario.cli.home), scenario.agent], check=True, timeout=60)
    with db_copy(catalog_path(scenario.cli.home)) as conn:
        (session_id,) = [sqlite_str(row[0]) for row in conn.execute("SELECT session_id FROM broker_sessions")]
    assert scenario.cli("session", "close", session_id).code == 2  # unknown to the index: refused as any
    assert [(f["ref_id"], f["action"]) for f in _doctor(scenario, "--fix")] == [(session_id, "closed")]
    assert _closed(scenario, session_id)
    assert _doctor(scenario) == []


def test_the_catalog_marks_only_a_new_open_shared_main_session_and_never_unmarks_it(
        scenario: Scenario, runs: list[Run]) -> None:
    s = scenario
    run = Run(s.cli.home, s.agent)
    runs.append(run)
    conn = apsw.Connection(str(catalog_path(s.cli.home)))
    try:
        insert = ("INSERT INTO broker_sessions (session_id, agent_id, command, unix_uid, run_mark, opened_at)"
                  " SELECT session_id, agent_id, 'migrate', 0, 'b/1/1', created_at FROM sessions WHERE session_id = ?")
        for session_id in (s.alice_session, s.group_session, run.session_id):  # a user's, a group's, marked already
            with pytest.raises(apsw.ConstraintError):
                conn.execute(insert, (session_id,))
        with pytest.raises(apsw.ConstraintError):
            conn.execute("UPDATE broker_sessions SET unix_uid = 12345 WHERE session_id = ?", (run.session_id,))
        with pytest.raises(apsw.ConstraintError):
            conn.execute("DELETE FROM broker_sessions WHERE session_id = ?", (run.session_id,))
        conn.execute("INSERT INTO sessions (session_id, agent_id, subject_kind, subject_reason, created_at)"
                     " VALUES ('s_old', ?, 'ambiguous', 'shared-main', 5)", (s.agent,))
        with pytest.raises(apsw.ConstraintError):  # an older shared-main session cannot be marked after the fact
            conn.execute(insert.replace("created_at FROM", "created_at + 1 FROM"), ("s_old",))
        conn.execute(insert, ("s_old",))  # with the time it was opened at, the same insert is accepted
    finally:
        conn.close()
