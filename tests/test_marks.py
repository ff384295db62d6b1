"""Marks: a mount woken by a commit tells a read being recorded from a change to any view.

Every serving mount records its reads in ``state.sqlite`` once a second,
and every other mount wakes for that commit. ``catalog.marks`` lets the
woken mount skip reading its whole view when only the journal (audit,
exposures, search statistics) moved. These tests hold the other half: any
commit to a table a view is read from, and any commit to a catalog, makes
the next sync read the view whole, so a revocation is never answered by a
mark.
"""

from __future__ import annotations

import re
import time

import apsw
import pytest
import trio

from scopefs.catalog import groups, identity
from scopefs.catalog.audit import AuditEvent, record
from scopefs.catalog.exposures import Exposed, record_batch
from scopefs.catalog.home import Home
from scopefs.catalog.marks import mark
from scopefs.catalog.reasons import Reason
from scopefs.catalog.schema import ensure_schema
from scopefs.catalog.schema.state import STATE_SCHEMA
from scopefs.catalog.visible import VisibleView, build
from scopefs.vfs import currency
from scopefs.vfs.fs import ScopeFS
from scopefs.writer.transaction import write_note
from tests.conftest import Scenario
from tests.inprocesskit import Tool, no_kernel, run_alice_mount

JOURNAL = {"audit", "exposures", "search_stats", "audit_prunes"}
COUNTS = "UPDATE view_generation SET generation = generation + 1"


def _triggers_by_table() -> dict[str, set[str]]:
    conn = apsw.Connection(":memory:")
    ensure_schema(conn, STATE_SCHEMA)
    found: dict[str, set[str]] = {}
    for table, sql in conn.execute("SELECT tbl_name, sql FROM sqlite_schema WHERE type = 'trigger'"):
        event = re.match(r"CREATE TRIGGER \w+ AFTER (INSERT|UPDATE|DELETE) ON (\w+)", sql)
        if event is not None and COUNTS in sql:
            assert event.group(2) == table
            found.setdefault(table, set()).add(event.group(1))
    return found


def test_every_table_outside_the_journal_counts_the_view_generation() -> None:
    """A table added to ``state.sqlite`` later must count too, or a mount could miss a change to it."""
    conn = apsw.Connection(":memory:")
    ensure_schema(conn, STATE_SCHEMA)
    tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    counted = _triggers_by_table()
    for table in tables - JOURNAL - {"view_generation"}:
        assert counted.get(table) == {"INSERT", "UPDATE", "DELETE"}, f"{table} does not count the view generation"
    assert not (counted.keys() & JOURNAL), "a journal write would wake every mount into a whole refresh"


def _alice_home(scenario: Scenario) -> Home:
    """A process's home with the databases a mount of Alice's reads already open."""
    home = Home.open(scenario.cli.home)
    build(home, scenario.alice_session)
    assert home.open_catalogs()
    return home


def test_the_journal_leaves_the_mark_and_every_other_commit_moves_it(scenario: Scenario) -> None:
    mine, other = _alice_home(scenario), Home.open(scenario.cli.home)
    try:
        before = mark(mine)
        record(other.state(), AuditEvent("read", "allow", "allowed", agent_id=scenario.agent))
        record_batch(other.state(), session_id=scenario.bob_session, agent_id=scenario.agent, run_id="mount",
                     operation="read", exposed=[Exposed("revision-x", "resource-x")],
                     audit=[AuditEvent("read", "allow", "allowed")])
        assert mark(mine).same_as(before)

        assert groups.remove_member(other.state(), scenario.conversation, scenario.bob)  # another process
        after_member = mark(mine)
        assert not after_member.same_as(before)

        write_note(other, scenario.bob_session, "private/notes/more.md", b"more\n")  # a catalog commit
        after_write = mark(mine)
        assert not after_write.same_as(after_member)

        write_note(mine, scenario.alice_session, "private/notes/mine.md", b"mine\n")  # this very connection
        assert not mark(mine).same_as(after_write)

        again = Home.open(scenario.cli.home)  # other connections: never the same, even with nothing committed
        try:
            build(again, scenario.alice_session)
            assert not mark(again).same_as(mark(mine))
        finally:
            again.close()
    finally:
        mine.close()
        other.close()


def usable(view: VisibleView) -> bool:
    """``view.usable`` read afresh: mypy would keep an ``assert`` on it narrowed across an ``await``."""
    return view.usable


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_woken_mount_answers_the_journal_by_its_mark_and_a_revocation_by_reading(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Journal commits are answered by the mark; the revocation right after them is read and applied."""
    # The net that reads a view whole every few seconds would change the counts on a slow machine.
    monkeypatch.setattr(currency, "FULL_REFRESH_S", 3600.0)
    async def script(fs: ScopeFS, tool: Tool) -> None:
        mount = fs.mount
        await mount.sync()
        whole, by_mark = mount.currency.refreshes
        other = Home.open(scenario.cli.home)
        try:
            for _ in range(3):
                record_batch(other.state(), session_id=scenario.bob_session, agent_id=scenario.agent,
                             run_id="mount", operation="read", exposed=[Exposed("revision-x", "resource-x")],
                             audit=[AuditEvent("read", "allow", "allowed")])
                await mount.sync()
            assert mount.currency.refreshes == [whole, by_mark + 3]
            assert mount.view.usable
            assert identity.revoke_binding(other.state(), scenario.alice_binding)
        finally:
            other.close()
        await mount.sync()
        assert mount.currency.refreshes == [whole + 1, by_mark + 3]
        assert not usable(mount.view) and mount.view.problem is Reason.IDENTITY_REVOKED
        tool.check("the revocation")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_commit_that_fails_makes_the_next_refresh_read_the_view_whole(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a failed commit did before it failed may have changed what a view is read from: the next
    refresh reads the view whole, not by the mark taken before the commit."""
    monkeypatch.setattr(currency, "FULL_REFRESH_S", 3600.0)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        mount = fs.mount
        await mount.sync()
        await mount.sync(since=time.monotonic_ns())
        whole, by_mark = mount.currency.refreshes
        assert by_mark >= 1  # nothing moved: answered by the mark

        def failing_commit() -> None:
            raise OSError("injected: the commit failed")
        with pytest.raises(OSError):
            await mount.commit_and_sync(failing_commit)
        await mount.sync(since=time.monotonic_ns())
        assert mount.currency.refreshes == [whole + 1, by_mark]

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_mark_never_outlives_an_expiry_or_the_net(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's view changes when a projection into it ends (no commit says so), and every view is
    read whole at least every ``FULL_REFRESH_S`` however quiet its databases are."""
    scenario.cli.j("project", scenario.alice_session, "private/notes/allergy.md", "--to",
                   f"conversation:{scenario.conversation}", "--purpose", "the offsite menu", "--expires", "7d",
                   "--yes")
    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.group_session, build(home, scenario.group_session))

    async def script() -> None:
        mount = fs.mount
        await mount.sync()
        await mount.sync()
        whole, by_mark = mount.currency.refreshes
        assert by_mark >= 1  # nothing moved: answered by the mark
        until = mount.view.valid_until
        assert until is not None  # the projection's end
        monkeypatch.setattr(currency, "now_us", lambda: until)
        await mount.sync()
        assert mount.currency.refreshes == [whole + 1, by_mark]
        monkeypatch.undo()
        monkeypatch.setattr(currency, "FULL_REFRESH_S", 0.0)
        await mount.sync()
        assert mount.currency.refreshes == [whole + 2, by_mark]

    try:
        trio.run(script)
    finally:
        fs.artifacts.close()
        home.close()
