"""``scopefs unpublish``: an admin takes a note out of ``agent-shared/`` or a role's store.

The seed's scenario, real SQLite and the installed ``scopefs``: a note
Alice published, and a summary Bob derived from it, before and after; what
stays on disk; that a preview and every refusal change nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from scopefs.catalog.home import Home
from scopefs.writer import admin
from scopefs.writer.unpublish import unpublish
from tests.conftest import ALICE_FACT, Scenario, artifact_path, db_copy, diff_snapshots, snapshot, sqlite_int
from tests.crashkit import catalog_path
from tests.test_sharing import SOURCE, _grant, _role

SHARED = "agent-shared/menu.md"
SUMMARY = b"Summary: the team menu avoids hazelnuts\n"


def _audit(s: Scenario, operation: str) -> list[tuple[Any, ...]]:
    with db_copy(s.cli.home / "state.sqlite") as conn:
        return conn.execute("SELECT decision, revision_id FROM audit WHERE operation = ?", (operation,)).fetchall()


def _count(s: Scenario, sql: str) -> int:
    with db_copy(catalog_path(s.cli.home)) as conn:
        return sqlite_int(conn.execute(sql).fetchall()[0][0])


def test_an_admin_unpublishes_a_copy_and_what_was_derived_from_it_is_held(scenario: Scenario) -> None:
    s = scenario
    _grant(s, s.alice)
    published = s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    s.cli.j("derive", s.bob_session, "--from", SHARED, "--to", "private/menu-summary.md", "--kind", "summary",
            stdin=SUMMARY)
    copy = artifact_path(s.cli.home, "", "menu.md")
    assert copy.read_bytes() == ALICE_FACT
    claims = _count(s, "SELECT count(*) FROM rejected_claims")

    before = snapshot(s.cli.home)
    preview = s.cli("--json", "unpublish", "--agent", s.agent, SHARED)
    assert preview.code == 0, preview.err
    assert preview.json()["applied"] is False and preview.json()["derived_revisions_held"] == 1
    assert diff_snapshots(before, snapshot(s.cli.home)) == []

    done = s.cli.j("unpublish", "--agent", s.agent, SHARED, "--yes")
    assert done["applied"] is True and [n["path"] for n in done["notes"]] == [SHARED]
    assert done["derived_revisions_held"] == 1
    for session in (s.alice_session, s.bob_session, s.group_session):
        assert s.cli("read", session, SHARED).code == 3
    assert s.cli("read", s.bob_session, "private/menu-summary.md").code == 3  # held with its source
    assert not copy.exists()  # the copy's bytes left the disk
    assert s.cli("read", s.alice_session, SOURCE, check=True).out == ALICE_FACT  # her own note stays
    assert [row[0] for row in _audit(s, "unpublish")] == ["allow"]
    assert _count(s, "SELECT count(*) FROM rejected_claims") == claims
    # Nothing was said against the fact: she may publish it again, and it reaches everyone again.
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    assert s.cli("read", s.bob_session, SHARED, check=True).out == ALICE_FACT
    assert published["revision_id"] != s.cli.j("history", s.bob_session, SHARED)["revisions"][0]["revision_id"]


def test_a_role_note_is_unpublished_for_its_members(scenario: Scenario) -> None:
    s = scenario
    _role(s, "finance", s.bob)
    _grant(s, s.alice, "role:finance")
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "role:finance", "--as", "budget.md", "--yes")
    assert s.cli("read", s.bob_session, "roles/finance/budget.md", check=True).out == ALICE_FACT
    s.cli.j("unpublish", "--agent", s.agent, "roles/finance/budget.md", "--yes")
    assert s.cli("read", s.bob_session, "roles/finance/budget.md").code == 3


def test_unpublish_refuses_what_is_not_a_published_note_and_changes_nothing(scenario: Scenario) -> None:
    s = scenario
    _grant(s, s.alice)
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    before = snapshot(s.cli.home)
    for paths in ([SOURCE], ["agent-shared"], ["agent-shared/nosuch.md"], ["roles/nosuch/x.md"], ["roles/x.md"],
                  ["../agent-shared/menu.md"], ["channel/x.md"], [SHARED, "agent-shared/nosuch.md"]):
        result = s.cli("unpublish", "--agent", s.agent, *paths, "--yes")
        assert result.code == 2, (paths, result.err)
        assert result.err.count("\n") == 1, (paths, result.err)
    assert s.cli("unpublish", "--agent", "nosuchagent", SHARED, "--yes").code == 2
    assert diff_snapshots(before, snapshot(s.cli.home)) == []
    assert s.cli("read", s.bob_session, SHARED, check=True).out == ALICE_FACT


def test_the_held_count_is_what_the_forget_held(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob derives again while the admin's unpublish is under way (after its notes were found, before its
    transaction): the count it reports is the one its forget held, taken inside that transaction."""
    s = scenario
    _grant(s, s.alice)
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    s.cli.j("derive", s.bob_session, "--from", SHARED, "--to", "private/one.md", "--kind", "summary", stdin=SUMMARY)
    planned = admin.forget_plan

    def plan_while_bob_derives(*args: Any) -> Any:
        s.cli.j("derive", s.bob_session, "--from", SHARED, "--to", "private/two.md", "--kind", "summary",
                stdin=SUMMARY)  # a real second process, before the forget takes the writer lock
        return planned(*args)

    monkeypatch.setattr(admin, "forget_plan", plan_while_bob_derives)
    holds = _count(s, "SELECT count(*) FROM lineage_holds")
    done = unpublish(Home.open(s.cli.home), s.agent, [SHARED], yes=True)
    assert done.forget_id is not None and done.held == 2
    assert _count(s, "SELECT count(*) FROM lineage_holds") - holds == 2  # what it reports is what it held
    for derived in ("private/one.md", "private/two.md"):
        assert s.cli("read", s.bob_session, derived).code == 3  # both held with their source
