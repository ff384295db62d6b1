"""Sessions: subjects per DESIGN.md §4, stamped once, and the
views each subject gets through the CLI (items 6 and 9)."""

from __future__ import annotations

from typing import Any

import apsw
import pytest

from tests.conftest import ACCOUNT, ALICE_FACT, CHANNEL, CHANNEL_FACT, Result, Scenario, snapshot, table_dump
from tests.mountkit import wait_until


def _open(scenario: Scenario, *args: str) -> dict[str, Any]:
    return scenario.cli.j("session", "open", "--agent", scenario.agent, *args)


def test_subjects_by_opening(scenario: Scenario) -> None:
    service = scenario.cli.j("principal", "add", "nightly", "--kind", "service")["principal_id"]
    cases = [
        (("--dm", "--channel", CHANNEL, "--account", ACCOUNT, "--sender", "never-bound-9"),
         ("ambiguous", None, "unbound")),
        (("--shared-main",), ("ambiguous", None, "shared-main")),
        (("--group", "--conversation", scenario.conversation), ("conversation", scenario.conversation, None)),
        (("--service", service), ("service", service, None)),
    ]
    for args, (kind, principal, reason) in cases:
        opened = _open(scenario, *args)
        shown = (opened["subject"], opened["subject_principal_id"], opened["subject_reason"])
        assert shown == (kind, principal, reason)


def test_service_needs_a_service_principal(scenario: Scenario) -> None:
    result = scenario.cli("session", "open", "--agent", "main", "--service", scenario.alice)
    assert result.code == 2


def test_conversation_of_another_agent_is_unknown_here(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("agent", "add", "other")
    result = cli("session", "open", "--agent", "other", "--group", "--conversation", scenario.conversation)
    assert result.code == 2


def test_conversation_add_is_idempotent_per_tuple(scenario: Scenario) -> None:
    from tests.conftest import GROUP_CONVERSATION
    again = scenario.cli.j("conversation", "add", "--agent", "main", "--channel", CHANNEL, "--account", ACCOUNT,
                           "--conversation", GROUP_CONVERSATION)
    assert again == {"conversation_id": scenario.conversation, "created": False}


@pytest.mark.parametrize("sql", [
    "UPDATE sessions SET subject_kind = 'user'",
    "UPDATE sessions SET subject_principal_id = subject_principal_id",
    "UPDATE sessions SET binding_id = NULL",
    "UPDATE sessions SET subject_reason = 'unbound'",
    "UPDATE sessions SET subject_revision = subject_revision + 1",
    "UPDATE sessions SET agent_id = agent_id",
    "DELETE FROM sessions",
    "INSERT OR REPLACE INTO sessions SELECT * FROM sessions",
])
def test_the_database_refuses_to_change_a_subject(scenario: Scenario, sql: str) -> None:
    db = scenario.cli.home / "agents" / "main" / "catalog.sqlite"
    before = snapshot(scenario.cli.home)
    conn = apsw.Connection(str(db))
    with pytest.raises(apsw.ConstraintError):
        conn.execute(sql)
    conn.close()
    assert snapshot(scenario.cli.home) == before


def test_roots_of_each_view(scenario: Scenario) -> None:
    cli = scenario.cli
    service = cli.j("principal", "add", "nightly", "--kind", "service")["principal_id"]
    service_session = _open(scenario, "--service", service)["session_id"]
    ambiguous = _open(scenario, "--shared-main")["session_id"]

    def roots(session: str) -> list[str]:
        return [e["name"] for e in cli.j("ls", session)["entries"]]

    assert roots(scenario.alice_session) == ["agent-shared", "postbox", "private", "projections"]
    assert roots(scenario.group_session) == ["agent-shared", "channel", "postbox", "projections"]
    assert roots(service_session) == ["agent", "agent-shared", "projections"]
    assert roots(ambiguous) == ["agent-shared"]


def test_read_only_roots_and_ambiguous_sessions_refuse_writes(scenario: Scenario) -> None:
    cli = scenario.cli
    ambiguous = [_open(scenario, "--shared-main")["session_id"],
                 _open(scenario, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                       "--sender", "unbound-77")["session_id"]]
    cases = [(scenario.alice_session, "agent-shared/x.md"), (scenario.group_session, "agent-shared/x.md"),
             (scenario.group_session, "projections/channel/x.md"), (scenario.alice_session, "postbox/x.md")]
    cases += [(s, "agent-shared/x.md") for s in ambiguous]
    cases += [(s, "private/x.md") for s in ambiguous]
    for session, path in cases:
        before = snapshot(cli.home, skip_tables=("audit",))
        result = cli("--json", "write", session, path, stdin=b"should not land")
        assert result.code == 3, (session, path, result.err)
        assert result.json()["reason"] in ("default-deny", "outside-view")
        assert snapshot(cli.home, skip_tables=("audit",)) == before


def test_group_sees_channel_only(scenario: Scenario) -> None:
    cli = scenario.cli
    assert cli("read", scenario.group_session, "channel/offsite.md").out == CHANNEL_FACT
    for path in ("private/notes/allergy.md", "roles/x/y.md", "agent/x.md"):
        result = cli("read", scenario.group_session, path)
        assert result.code == 3 and result.out == b""


def test_group_actor_needs_fresh_membership(scenario: Scenario) -> None:
    cli = scenario.cli
    outsider = cli.j("principal", "add", "Eve", "--kind", "human")["principal_id"]
    ok = cli("write", scenario.group_session, "channel/by-alice.md", "--actor", scenario.alice, stdin=b"hi\n")
    assert ok.code == 0
    for actor in (outsider,):
        result = cli("--json", "read", scenario.group_session, "channel/offsite.md", "--actor", actor)
        assert result.code == 3 and result.json()["reason"] == "membership-stale"
    cli.j("member", "remove", scenario.conversation, scenario.bob)
    result = cli("--json", "write", scenario.group_session, "channel/by-bob.md", "--actor", scenario.bob, stdin=b"x")
    assert result.code == 3 and result.json()["reason"] == "membership-stale"
    # Long enough for the read that follows on a loaded machine (a command starts in 0.3 s or more).
    cli.j("member", "add", scenario.conversation, outsider, "--expires", "15s")
    assert cli("read", scenario.group_session, "channel/offsite.md", "--actor", outsider).code == 0

    def refused() -> Result | None:
        read = cli("--json", "read", scenario.group_session, "channel/offsite.md", "--actor", outsider)
        return read if read.code == 3 else None

    stale = wait_until(refused, timeout=30)
    assert stale is not None and stale.json()["reason"] == "membership-stale"
    # The conversation subject itself is unchanged by who speaks.
    assert cli("read", scenario.group_session, "channel/offsite.md").out == CHANNEL_FACT


def test_dm_actor_must_be_the_subject(scenario: Scenario) -> None:
    result = scenario.cli("--json", "read", scenario.alice_session, "private/notes/allergy.md", "--actor", scenario.bob)
    assert result.code == 3 and result.json()["reason"] == "invalid-context" and result.out.count(b"hazelnut") == 0
    ok = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md", "--actor", scenario.alice)
    assert ok.out == ALICE_FACT


def test_role_roots_follow_fresh_membership(scenario: Scenario) -> None:
    cli = scenario.cli
    role = cli.j("role", "add", "finance")["role_id"]
    cli.j("member", "add", role, scenario.alice, "--expires", "20s")  # for the listings that follow, loaded or not
    names = [e["name"] for e in cli.j("ls", scenario.alice_session)["entries"]]
    assert "roles" in names
    assert [e["name"] for e in cli.j("ls", scenario.alice_session, "roles")["entries"]] == ["finance"]
    # Never in a group, whoever is a member.
    assert "roles" not in [e["name"] for e in cli.j("ls", scenario.group_session)["entries"]]
    # Nor for Bob, who has no membership.
    assert "roles" not in [e["name"] for e in cli.j("ls", scenario.bob_session)["entries"]]
    wait_until(lambda: "roles" not in [e["name"] for e in cli.j("ls", scenario.alice_session)["entries"]], timeout=50)
    # A stale root, a root never held and a root that does not exist look
    # alike: nobody learns which roles exist (the audit keeps the reason).
    stale = cli("--json", "ls", scenario.alice_session, "roles/finance")
    never = cli("--json", "ls", scenario.bob_session, "roles/finance")
    missing = cli("--json", "ls", scenario.bob_session, "roles/no-such-role")
    assert stale.code == never.code == missing.code == 3
    assert stale.out == never.out == missing.out and stale.json()["reason"] == "outside-view"
    audit = table_dump(cli.home / "state.sqlite")["audit"]
    assert any(r[4] == scenario.alice_session and r[11] == "membership-stale" for r in audit)


def test_replace_cannot_swap_a_live_binding(scenario: Scenario) -> None:
    """INSERT OR REPLACE on the live lookup key would silently rebind."""
    conn = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    with pytest.raises(apsw.ConstraintError):
        conn.execute("INSERT OR REPLACE INTO identity_bindings (binding_id, lookup_key, principal_id, adapter,"
                     " assurance, verification, created_by, created_at)"
                     " SELECT 'b_x', lookup_key, ?, adapter, assurance, verification, created_by, created_at"
                     " FROM identity_bindings WHERE binding_id = ?", (scenario.bob, scenario.alice_binding))


@pytest.mark.parametrize("sql", [
    "INSERT OR REPLACE INTO revisions SELECT * FROM revisions",
    "INSERT OR REPLACE INTO stores SELECT * FROM stores",
    "INSERT OR REPLACE INTO resources SELECT * FROM resources",
    "UPDATE revisions SET content_sha256 = content_sha256",
    "UPDATE revisions SET state = 'pending' WHERE state = 'active'",
    "DELETE FROM revisions",
    "UPDATE stores SET audience_id = 'p_x'",
])
def test_catalog_rows_are_immutable_where_they_must_be(scenario: Scenario, sql: str) -> None:
    conn = apsw.Connection(str(scenario.cli.home / "agents" / "main" / "catalog.sqlite"))
    with pytest.raises(apsw.ConstraintError):
        conn.execute(sql)


def test_an_ambiguous_session_accepts_no_actor(scenario: Scenario) -> None:
    """Nobody is verified there; a claimed actor would only forge attribution."""
    ambiguous = _open(scenario, "--shared-main")["session_id"]
    result = scenario.cli("--json", "ls", ambiguous, "--actor", scenario.alice)
    assert result.code == 3 and result.json()["reason"] == "invalid-context"
