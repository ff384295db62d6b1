"""The admin's review of the quarantine: ``quarantine release`` and ``quarantine purge``.

A real migration (``tests.migratekit``'s legacy tree, the seed's scenario)
fills the quarantine with what it could not give a person; ``derive`` files
a mixed-audience summary there, and ``doctor --fix`` a tampered artifact.
Every check goes through the installed ``scopefs`` and real SQLite files:
who can read a released note, what a purge leaves on disk, that a preview
or a refusal changes nothing, and that no byte of content reaches the
output or the audit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog.errors import Denied
from scopefs.catalog.home import Home
from scopefs.catalog.identity import revoke_binding
from scopefs.writer.quarantine_review import release
from scopefs.writer.steps import Step, set_hook
from tests.conftest import Scenario, artifact_path, db_copy, diff_snapshots, snapshot
from tests.crashkit import catalog_path
from tests.migratekit import CANARIES, GROUP_TRANSCRIPT, build_layout
from tests.test_lifecycle import SOURCE, _derive
from tests.test_migrate import _args
from tests.test_tampered_recovery import _quarantine, _tamper


@pytest.fixture
def migrated(scenario: Scenario, tmp_path: Path) -> list[dict[str, Any]]:
    """The scenario after a migration without an owner: what ``quarantine list`` calls migrated."""
    ws, state = build_layout(tmp_path / "legacy")
    digest = scenario.cli.j(*_args(scenario, ws, state, owner=False))["plan_digest"]
    scenario.cli.j(*_args(scenario, ws, state, "--apply", "--confirm", digest, owner=False))
    found: list[dict[str, Any]] = scenario.cli.j("quarantine", "list", "--agent", scenario.agent)["migrated"]
    assert len(found) >= 2, "the layout quarantines too little: the tests show nothing"
    return found


def _catalog_rows(s: Scenario, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with db_copy(catalog_path(s.cli.home)) as conn:
        return conn.execute(sql, args).fetchall()


def _audit(s: Scenario, operation: str) -> list[tuple[Any, ...]]:
    with db_copy(s.cli.home / "state.sqlite") as conn:
        return conn.execute("SELECT decision, revision_id, session_id FROM audit WHERE operation = ?",
                            (operation,)).fetchall()


def _artifact(s: Scenario, revision_id: str) -> Path:
    [(locator,)] = _catalog_rows(s, "SELECT locator FROM revisions WHERE revision_id = ?", revision_id)
    [found] = list((s.cli.home / "agents" / s.agent / "memory-scopes").rglob(str(locator)))
    return found


def _store_of(s: Scenario, revision_id: str) -> tuple[Any, ...]:
    [row] = _catalog_rows(s, "SELECT t.scope_kind, t.audience_id FROM revisions v JOIN resources r USING"
                             " (resource_id) JOIN stores t ON t.store_id = r.store_id WHERE v.revision_id = ?",
                          revision_id)
    return row


def _listed(s: Scenario) -> dict[str, Any]:
    found: dict[str, Any] = s.cli.j("quarantine", "list", "--agent", s.agent)
    return found


def _no_content(*outputs: bytes) -> None:
    for out in outputs:
        assert not any(canary in out for canary in CANARIES), out


def test_a_migrated_note_is_released_to_its_owner_once(scenario: Scenario, migrated: list[dict[str, Any]]) -> None:
    s = scenario
    note = migrated[0]
    [(sha256,)] = _catalog_rows(s, "SELECT content_sha256 FROM revisions WHERE revision_id = ?", note["revision_id"])
    args = ("quarantine", "release", "--agent", s.agent, note["path"], "--owner", s.alice, "--as", "legacy/kept.md")

    before = snapshot(s.cli.home)
    preview = s.cli("--json", *args)
    assert preview.code == 0, preview.err
    assert preview.json()["released"] is False and preview.json()["as"] == "legacy/kept.md"
    assert diff_snapshots(before, snapshot(s.cli.home)) == []  # a preview writes nothing, not even an audit row

    quarantined_bytes = _artifact(s, note["revision_id"])
    done = s.cli("--json", *args, "--yes")
    assert done.code == 0, done.err
    assert done.json()["released"] is True
    read = s.cli("read", s.alice_session, "private/legacy/kept.md", check=True).out
    assert hashlib.sha256(read).hexdigest() == sha256 and len(read) == note["size"]
    copy = done.json()["new_revision_id"]
    assert _store_of(s, copy) == ("user", s.alice)  # her private store, which no one else's view holds
    [(origin,)] = _catalog_rows(s, "SELECT trust_origin FROM revisions WHERE revision_id = ?", copy)
    assert origin == "migration"
    # A move: the quarantined text left with it, so her forget of the copy is the end of it.
    assert not quarantined_bytes.exists()
    assert _catalog_rows(s, "SELECT count(*) FROM forgotten_revisions WHERE revision_id = ?",
                         note["revision_id"]) == [(1,)]
    # Released once: the quarantine no longer holds it, and a second release finds nothing.
    assert note["path"] not in [m["path"] for m in _listed(s)["migrated"]]
    again = s.cli(*args, "--yes")
    assert again.code == 2 and "no such note in the quarantine" in again.err
    [(decision, revision_id, session_id)] = _audit(s, "quarantine-release")
    assert (decision, revision_id) == ("allow", note["revision_id"]) and session_id
    _no_content(preview.out, done.out, done.err.encode())


def test_a_release_to_agent_shared_reaches_everyone_read_only(scenario: Scenario,
                                                              migrated: list[dict[str, Any]]) -> None:
    s = scenario
    note = migrated[1]
    done = s.cli.j("quarantine", "release", "--agent", s.agent, note["path"], "--to", "agent-shared", "--as",
                   "legacy/reference.md", "--yes")
    assert _store_of(s, done["new_revision_id"])[0] == "agent-shared"
    for session in (s.alice_session, s.bob_session, s.group_session):
        assert len(s.cli("read", session, "agent-shared/legacy/reference.md", check=True).out) == note["size"]
    assert s.cli("write", s.bob_session, "agent-shared/legacy/reference.md", stdin=b"mine now\n").code == 3


def test_a_release_to_a_role_reaches_its_members_only(scenario: Scenario, migrated: list[dict[str, Any]]) -> None:
    s = scenario
    role = s.cli.j("role", "add", "finance")["role_id"]
    s.cli.j("member", "add", "role:finance", s.bob)
    done = s.cli.j("quarantine", "release", "--agent", s.agent, migrated[0]["path"], "--to", "role:finance",
                   "--as", "legacy/ledger.md", "--yes")
    assert _store_of(s, done["new_revision_id"]) == ("role", role)
    assert len(s.cli("read", s.bob_session, "roles/finance/legacy/ledger.md", check=True).out) == migrated[0]["size"]
    assert s.cli("read", s.alice_session, "roles/finance/legacy/ledger.md").code == 3


def test_a_group_transcript_is_released_to_its_conversation_only(scenario: Scenario,
                                                                  migrated: list[dict[str, Any]]) -> None:
    s = scenario
    [note] = [m for m in migrated if m["path"].endswith("/s-group.jsonl")]
    done = s.cli.j("quarantine", "release", "--agent", s.agent, note["path"], "--to",
                   f"conversation:{s.conversation}", "--as", "legacy/team.jsonl", "--yes")
    assert _store_of(s, done["new_revision_id"]) == ("channel", s.conversation)
    assert s.cli("read", s.group_session, "channel/legacy/team.jsonl", check=True).out == GROUP_TRANSCRIPT


def test_a_release_never_overwrites_and_bad_input_changes_nothing(scenario: Scenario,
                                                                  migrated: list[dict[str, Any]]) -> None:
    s = scenario
    path = migrated[0]["path"]
    s.cli.j("write", s.alice_session, "private/legacy/taken.md", stdin=b"Alice wrote this herself\n")
    base = ("quarantine", "release", "--agent", s.agent, path, "--yes")
    refused = {
        "occupied": (*base, "--owner", s.alice, "--as", "legacy/taken.md"),
        "a folder there": (*base, "--owner", s.alice, "--as", "legacy"),
        "below a note": (*base, "--owner", s.alice, "--as", "legacy/taken.md/under.md"),
        "no destination": base,
        "two destinations": (*base, "--owner", s.alice, "--to", "agent-shared"),
        "unknown principal": (*base, "--owner", "p_" + "0" * 26),
        "an unknown role": (*base, "--to", "role:nosuchrole"),
        "an unknown conversation": (*base, "--to", "conversation:p_" + "0" * 26),
        "not in quarantine": ("quarantine", "release", "--agent", s.agent, "migration/no/such.md", "--owner",
                              s.alice, "--yes"),
        "a path that climbs": ("quarantine", "release", "--agent", s.agent, "../" + path, "--owner", s.alice),
        "a bad --as": (*base, "--owner", s.alice, "--as", "/etc/passwd"),
        "unknown agent": ("quarantine", "release", "--agent", "nosuchagent", path, "--owner", s.alice),
    }
    before = snapshot(s.cli.home)
    for why, args in refused.items():
        result = s.cli(*args)
        assert result.code == 2, (why, result.err)
        assert result.err.count("\n") == 1, (why, result.err)
    assert diff_snapshots(before, snapshot(s.cli.home)) == []
    assert s.cli("read", s.alice_session, "private/legacy/taken.md", check=True).out == b"Alice wrote this herself\n"


def test_a_mixed_audience_derivation_is_never_released_but_can_be_purged(scenario: Scenario) -> None:
    """Releasing it would give one person's private fact to another: the quarantine is there to stop that."""
    s = scenario
    made = _derive(s, s.alice_session, "private/summaries/both.md", SOURCE, f"{s.bob_session}:{SOURCE}",
                   content=b"Both of them avoid nuts of some kind at lunch\n")
    assert made.code == 3 and "mixed-audience" in made.err
    listed = _listed(s)
    assert listed["migrated"] == [] and [d["path"][:8] for d in listed["derived"]] == ["derived/"]
    path = listed["derived"][0]["path"]
    for destination in (("--owner", s.alice), ("--to", "agent-shared")):
        result = s.cli("quarantine", "release", "--agent", s.agent, path, *destination, "--yes")
        assert result.code == 2 and "only a note the migration quarantined" in result.err
    [(revision_id,)] = _catalog_rows(s, "SELECT v.revision_id FROM revisions v JOIN resources r USING"
                                        " (resource_id) WHERE r.path = ?", path)
    summary = _artifact(s, str(revision_id))
    s.cli.j("quarantine", "purge", "--agent", s.agent, path, "--yes")
    assert _catalog_rows(s, "SELECT count(*) FROM resources r JOIN stores t USING (store_id)"
                            " WHERE t.scope_kind = 'quarantine' AND r.state = 'live'") == [(0,)]
    assert not summary.exists()
    assert [row[:2] for row in _audit(s, "quarantine-purge")] == [("allow", None)]


def test_purge_forgets_a_quarantined_note_with_its_bytes_and_keeps_its_claims(
        scenario: Scenario, migrated: list[dict[str, Any]]) -> None:
    s = scenario
    note = migrated[0]
    [(locator,)] = _catalog_rows(s, "SELECT locator FROM revisions WHERE revision_id = ?", note["revision_id"])
    on_disk = list((s.cli.home / "agents" / s.agent / "memory-scopes").rglob(str(locator)))
    assert len(on_disk) == 1
    claims_before = _catalog_rows(s, "SELECT count(*) FROM rejected_claims")

    before = snapshot(s.cli.home)
    preview = s.cli("--json", "quarantine", "purge", "--agent", s.agent, note["path"])
    assert preview.code == 0 and preview.json()["applied"] is False, preview.err
    assert diff_snapshots(before, snapshot(s.cli.home)) == []

    done = s.cli.j("quarantine", "purge", "--agent", s.agent, note["path"], "--yes")
    assert done["applied"] is True and done["forget_id"]
    assert not on_disk[0].exists()  # the bytes left the disk
    assert note["path"] not in [m["path"] for m in _listed(s)["migrated"]]
    assert _catalog_rows(s, "SELECT count(*) FROM forgotten_revisions WHERE revision_id = ?",
                         note["revision_id"]) == [(1,)]
    assert _catalog_rows(s, "SELECT count(*) FROM rejected_claims") == claims_before  # ambiguous, not wrong
    assert [row[0] for row in _audit(s, "quarantine-purge")] == ["allow"]
    assert s.cli("--json", "doctor").code == 0


def test_purge_unlinks_a_tampered_copy_and_refuses_names_it_does_not_hold(scenario: Scenario) -> None:
    s = scenario
    artifact = artifact_path(s.cli.home, s.alice, "notes/allergy.md")
    _tamper(artifact)
    s.cli("doctor", "--fix")
    [copy] = _listed(s)["tampered"]
    quarantine = _quarantine(s)
    assert (quarantine / copy["name"]).exists()

    before = snapshot(s.cli.home)
    for entry in ("tampered-nosuch", ".", "..", "../catalog.sqlite", "", "x" * 300, "migration/nosuch.md"):
        result = s.cli("quarantine", "purge", "--agent", s.agent, copy["name"], entry, "--yes")
        assert result.code == 2, (entry, result.err)
    assert diff_snapshots(before, snapshot(s.cli.home)) == []  # one bad entry and nothing at all is purged

    done = s.cli.j("quarantine", "purge", "--agent", s.agent, copy["name"], "--yes")
    assert done["files"] == [{"name": copy["name"], "revision_id": copy["revision_id"]}]
    assert list(quarantine.iterdir()) == []
    [(decision, revision_id, _session)] = _audit(s, "quarantine-purge")
    assert (decision, revision_id) == ("allow", copy["revision_id"])
    assert s.cli("--json", "doctor").code == 0


def test_a_quarantined_note_that_no_longer_verifies_is_never_released(scenario: Scenario,
                                                                      migrated: list[dict[str, Any]]) -> None:
    s = scenario
    note = migrated[0]
    [(locator,)] = _catalog_rows(s, "SELECT locator FROM revisions WHERE revision_id = ?", note["revision_id"])
    [artifact] = list((s.cli.home / "agents" / s.agent / "memory-scopes").rglob(str(locator)))
    _tamper(artifact)
    result = s.cli("quarantine", "release", "--agent", s.agent, note["path"], "--owner", s.alice, "--as",
                   "legacy/kept.md", "--yes")
    assert result.code == 4, result.err
    assert s.cli("read", s.alice_session, "private/legacy/kept.md").code == 3
    assert note["path"] in [m["path"] for m in _listed(s)["migrated"]]
    assert _audit(s, "quarantine-release") == []


def test_a_binding_revoked_during_the_release_refuses_it_and_keeps_the_note(
        scenario: Scenario, migrated: list[dict[str, Any]]) -> None:
    """The preview found Alice reachable; her binding goes before the copy commits. The commit decides
    again and refuses (``identity-revoked``, exit 3 on the command line): no copy, and the quarantined
    note stays, bytes and all."""
    s = scenario
    note = migrated[0]
    home = Home.open(s.cli.home)
    revoked: list[Step] = []

    def revoke_meanwhile(at: Step) -> None:
        if at is Step.STAGED and not revoked:
            revoked.append(at)
            revoke_binding(home.state(), s.alice_binding)

    set_hook(revoke_meanwhile)
    try:
        with pytest.raises(Denied):
            release(home, s.agent, note["path"], owner=s.alice, as_path="legacy/kept.md", yes=True)
    finally:
        set_hook(None)
        home.close()
    assert revoked == [Step.STAGED]
    assert note["path"] in [m["path"] for m in _listed(s)["migrated"]]
    assert _artifact(s, note["revision_id"]).exists()
    assert _audit(s, "quarantine-release") == []
    assert _catalog_rows(s, "SELECT count(*) FROM resources WHERE path = 'legacy/kept.md'") == [(0,)]
