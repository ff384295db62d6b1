"""Audit: every allow and deny is recorded with operation,
subject kind, store, revision, reason and time, and never content, a path a
user chose, a query or a raw provider id."""

from __future__ import annotations

import time
from typing import Any

import apsw
import pytest

from scopefs.catalog.audit import AuditBacklog, AuditEvent, drain_quietly, record_many
from scopefs.catalog.db import BUSY_TIMEOUT_MS
from scopefs.catalog.errors import Denied, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.reasons import Reason
from scopefs.catalog.searchstats import SearchStat, record_search
from scopefs.writer.transaction import write_note
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    BOB_SENDER,
    CHANNEL_FACT,
    GROUP_CONVERSATION,
    Scenario,
    table_dump,
)

STABLE_REASONS = {r.value for r in Reason}
COLUMNS = ("audit_id", "event_id", "at", "agent_id", "session_id", "operation", "subject_kind", "actor_id",
           "store_id", "revision_id", "decision", "reason")


def _audit(scenario: Scenario) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, row, strict=True)) for row in table_dump(scenario.cli.home / "state.sqlite")["audit"]]


def test_allows_and_denies_are_recorded_with_ids(scenario: Scenario) -> None:
    cli = scenario.cli
    start = len(_audit(scenario))
    assert cli("read", scenario.alice_session, "private/notes/allergy.md").code == 0
    assert cli("read", scenario.group_session, "private/notes/allergy.md").code == 3
    assert cli("write", scenario.alice_session, "agent-shared/x.md", stdin=b"nope").code == 3
    assert cli("write", scenario.bob_session, "private/notes/allergy.md", stdin=b"Bob v2\n").code == 0
    rows = _audit(scenario)[start:]
    by_kind = [(r["operation"], r["decision"], r["reason"], r["subject_kind"]) for r in rows]
    assert by_kind == [
        ("read", "allow", "allowed", "user"),
        ("read", "deny", "outside-view", "conversation"),
        ("append", "deny", "default-deny", "user"),
        ("replace", "allow", "allowed", "user"),
    ]
    read_allow, _, _, write_allow = rows
    for row in (read_allow, write_allow):
        assert row["store_id"].startswith("st_") and row["revision_id"].startswith("v_")
        assert row["session_id"] and row["at"] > 0 and row["agent_id"] == "main"
    assert write_allow["event_id"].startswith("ev_")  # came through the outbox
    assert write_allow["actor_id"] == scenario.bob
    assert all(r["reason"] in STABLE_REASONS for r in _audit(scenario))


def test_writes_reach_the_shared_audit_through_the_outbox(scenario: Scenario) -> None:
    catalog = table_dump(scenario.cli.home / "agents" / "main" / "catalog.sqlite")
    assert catalog["audit_outbox"] == []  # delivered rows leave the outbox
    assert catalog["write_intents"] == []  # and finished intents their table: neither grows with every write
    shared = {r["event_id"] for r in _audit(scenario) if r["event_id"]}
    assert len(shared) >= 3  # the scenario's writes, each through the outbox


def test_audit_holds_no_content_paths_or_raw_ids(scenario: Scenario) -> None:
    cli = scenario.cli
    cli("read", scenario.alice_session, "private/notes/allergy.md")
    cli("read", scenario.group_session, "private/notes/allergy.md")
    cli("read", scenario.bob_session, "private/no-such-secret-path.md")
    forbidden = [ALICE_FACT, BOB_FACT, CHANNEL_FACT, b"hazelnut", b"peanut", b"Lisbon", b"allergy", b"offsite",
                 b"no-such-secret-path", ALICE_SENDER.encode(), BOB_SENDER.encode(), ACCOUNT.encode(),
                 GROUP_CONVERSATION.encode(), b"Alice", b"Bob"]
    for row in _audit(scenario):
        blob = repr(row).encode()
        for needle in forbidden:
            assert needle not in blob, (needle, row)
    outbox = table_dump(cli.home / "agents" / "main" / "catalog.sqlite")["audit_outbox"]
    for entry in outbox:
        for needle in forbidden:
            assert needle not in repr(entry).encode(), (needle, entry)
    # The shared database as a whole holds no content or paths either.
    raw = b"".join(p.read_bytes() for p in cli.home.glob("state.sqlite*"))
    for needle in (b"hazelnut", b"peanut", b"Lisbon", b"allergy", b"offsite", b"no-such-secret-path"):
        assert needle not in raw


def test_a_backlog_holds_what_a_locked_state_database_would_make_wait(scenario: Scenario) -> None:
    """Under an ``AuditBacklog`` (a mount's catalog calls) a refusal's audit and an outbox drain wait
    briefly for another process's lock, keep what they could not write, and the refusal still stands."""
    home = Home.open(scenario.cli.home)
    holder = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    backlog = AuditBacklog(wait_ms=50)
    start = len(_audit(scenario))
    try:
        write_note(home, scenario.bob_session, "private/notes/later.md", b"drained later\n", durable=False)
        holder.execute("BEGIN IMMEDIATE")
        try:
            began = time.monotonic()
            with backlog.active(), pytest.raises(Denied):
                write_note(home, scenario.alice_session, "agent-shared/x.md", b"nope")
            with backlog.active():
                drain_quietly(home.state(), home.catalog("main"), "main")
            assert time.monotonic() - began < BUSY_TIMEOUT_MS / 1000  # neither waited the busy timeout
        finally:
            holder.execute("ROLLBACK")
        events, dropped = backlog.take()
        cells = backlog.take_drains()
        assert dropped == 0
        assert [(e.operation, e.decision, e.session_id) for e in events] == [
            ("append", "deny", scenario.alice_session)]
        assert cells == {"main"}
        assert len(_audit(scenario)) == start  # nothing reached the audit while locked
        record_many(home.state(), events)  # what the mount's next tick does
        drain_quietly(home.state(), home.catalog("main"), "main")
        rows = _audit(scenario)[start:]
        assert ("append", "deny") in {(r["operation"], r["decision"]) for r in rows}
        assert ("append", "allow") in {(r["operation"], r["decision"]) for r in rows}  # the drained save
    finally:
        holder.close()
        home.close()


def test_a_full_backlog_drops_refusal_rows_and_fails_a_search(scenario: Scenario) -> None:
    """The backlog is bounded (code in a sandbox can make refusals at will): past its limit a refusal's
    row is counted, not held, and a search, whose rows audit what it exposes, fails instead."""
    home = Home.open(scenario.cli.home)
    holder = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    backlog = AuditBacklog(wait_ms=20, limit=2)
    event = AuditEvent("search", "allow", Reason.ALLOWED, agent_id="main", session_id=scenario.alice_session)
    try:
        holder.execute("BEGIN IMMEDIATE")
        try:
            with backlog.active():
                for _ in range(3):
                    with pytest.raises(Denied):
                        write_note(home, scenario.alice_session, "agent-shared/x.md", b"nope")
                with pytest.raises(StorageError):
                    record_search(home.state(), [event], SearchStat(1, 1, 0))
        finally:
            holder.execute("ROLLBACK")
        held, dropped = backlog.take()
        assert (len(held), dropped) == (2, 2)  # the third refusal's row, and the search's
        with backlog.active():  # the lock is free: a search writes its rows at once, nothing is held
            record_search(home.state(), [event], SearchStat(1, 1, 0))
        assert backlog.take() == ([], 0)
    finally:
        holder.close()
        home.close()
