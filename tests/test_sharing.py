"""Sharing on purpose through the command line: publisher grants, publish, projections.

Every check runs the installed ``scopefs`` on a real home. Reading
``agent-shared/`` or a role store never implies writing it; a publisher's
copy and a projection's copy are reviewed (a preview that changes
nothing), immutable revisions with lineage; a projection reaches exactly
one audience and is gone from every new read once revoked or expired.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import apsw
import pytest

from scopefs.catalog.errors import Conflict, Denied
from scopefs.catalog.home import Home
from scopefs.writer.publish import publish
from scopefs.writer.steps import Step, set_hook
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    BOB_FACT,
    CHANNEL,
    Cli,
    Scenario,
    diff_snapshots,
    snapshot,
)
from tests.mountkit import catalog, wait_until

SOURCE = "private/notes/allergy.md"
AUDIT_ONLY = ("audit",)  # a refusal or a preview may add audit rows, nothing else


def _grant(s: Scenario, principal: str, scope: str = "agent-shared") -> str:
    return str(s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", principal, "--scope", scope)
               ["grant_id"])


def _role(s: Scenario, name: str, *members: str) -> str:
    role = str(s.cli.j("role", "add", name)["role_id"])
    for member in members:
        s.cli.j("member", "add", f"role:{name}", member)  # a role is named by its name or its id
    return role


def _other_group(s: Scenario, members: tuple[str, ...] = ()) -> tuple[str, str]:
    conv = s.cli.j("conversation", "add", "--agent", s.agent, "--channel", CHANNEL, "--account", ACCOUNT,
                   "--conversation", "tg-chat-other-5550001")["conversation_id"]
    for member in members:
        s.cli.j("member", "add", conv, member)
    return conv, str(s.cli.j("session", "open", "--agent", s.agent, "--group", "--conversation", conv)["session_id"])


def _service_session(s: Scenario) -> str:
    service = s.cli.j("principal", "add", "cron", "--kind", "service")["principal_id"]
    return str(s.cli.j("session", "open", "--agent", s.agent, "--service", service)["session_id"])


def _project(s: Scenario, to: str, *more: str, session: str | None = None, path: str = SOURCE) -> dict[str, Any]:
    return s.cli.j("project", session or s.alice_session, path, "--to", to, "--purpose", "so the group knows",
                   *(more or ("--expires", "7d")), "--yes")


def _unchanged(cli: Cli, call: list[str], *, code: int, stdin: bytes | None = None) -> str:
    before = snapshot(cli.home, skip_tables=AUDIT_ONLY)
    result = cli(*call, stdin=stdin)
    assert result.code == code, (call, result.code, result.err)
    assert diff_snapshots(before, snapshot(cli.home, skip_tables=AUDIT_ONLY)) == []
    return result.err


# -- publisher authority -----------------------------------------------------------

def test_publishing_needs_a_grant_and_reading_never_implies_it(scenario: Scenario) -> None:
    s = scenario
    err = _unchanged(s.cli, ["publish", s.alice_session, SOURCE, "--to", "agent-shared", "--yes"], code=3)
    assert "not-publisher" in err
    _grant(s, s.alice)
    # A grant to Alice is no grant to anybody else, nor to a group she is in.
    for session in (s.bob_session, s.group_session):
        path = SOURCE if session == s.bob_session else "channel/offsite.md"
        assert "not-publisher" in _unchanged(s.cli, ["publish", session, path, "--to", "agent-shared", "--yes"],
                                             code=3)
    # Holding publisher authority still writes nothing by placement: agent-shared/ stays read-only.
    for session in (s.alice_session, s.bob_session, s.group_session):
        _unchanged(s.cli, ["write", session, "agent-shared/x.md"], stdin=b"x", code=3)


def test_publish_previews_then_writes_an_immutable_copy_with_lineage(scenario: Scenario) -> None:
    s = scenario
    grant = _grant(s, s.alice)
    before = snapshot(s.cli.home, skip_tables=AUDIT_ONLY)
    preview = s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "ref/allergy.md")
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=AUDIT_ONLY)) == []
    assert preview["published"] is False
    shown = preview["preview"]
    assert (shown["source"], shown["source_revision"], shown["bytes"]) == (SOURCE, 1, len(ALICE_FACT))
    assert shown["target_path"] == "agent-shared/ref/allergy.md"
    assert shown["first_lines"] == [ALICE_FACT.decode().rstrip("\n")]
    text = s.cli("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "ref/allergy.md")
    assert "preview only" in text.text and "agent-shared/ref/allergy.md" in text.text

    done = s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "ref/allergy.md", "--yes")
    assert done["published"] is True
    for session in (s.alice_session, s.bob_session, s.group_session, _service_session(s)):
        assert s.cli("read", session, "agent-shared/ref/allergy.md", check=True).out == ALICE_FACT
    # The source moves on; the published copy does not.
    s.cli.j("write", s.alice_session, SOURCE, stdin=b"changed\n")
    assert s.cli("read", s.bob_session, "agent-shared/ref/allergy.md", check=True).out == ALICE_FACT
    with catalog(s.cli.home) as conn:
        source_rev = conn.execute("SELECT v.revision_id FROM revisions v JOIN resources r USING (resource_id)"
                                  " WHERE r.path = 'notes/allergy.md' AND v.revision_no = 1"
                                  " AND v.session_id = ?", (s.alice_session,)).fetchall()[0][0]
        row = conn.execute("SELECT parent_revision_id, relation FROM lineage_edges WHERE child_revision_id = ?",
                           (done["revision_id"],)).fetchall()
        origin = conn.execute("SELECT trust_origin, actor_id FROM revisions WHERE revision_id = ?",
                              (done["revision_id"],)).fetchall()
    assert row == [(source_rev, "publish")]
    assert origin == [("publish", s.alice)]
    conn = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ops = conn.execute("SELECT decision FROM audit WHERE operation = 'publish' AND revision_id = ?",
                           (done["revision_id"],)).fetchall()
    finally:
        conn.close()
    assert ops == [("allow",)]
    # Revoking the grant stops the next publish; what was published stays.
    s.cli.j("grant", "revoke", grant)
    assert "not-publisher" in _unchanged(
        s.cli, ["publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "ref/allergy.md", "--yes"], code=3)
    assert s.cli("read", s.bob_session, "agent-shared/ref/allergy.md", check=True).out == ALICE_FACT


def test_role_publishers_write_the_role_store_members_read_it(scenario: Scenario) -> None:
    s = scenario
    _role(s, "finance", s.bob)
    _grant(s, s.alice, "role:finance")
    # A role grant is not an agent-shared grant.
    assert "not-publisher" in _unchanged(s.cli, ["publish", s.alice_session, SOURCE, "--to", "agent-shared",
                                                 "--yes"], code=3)
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "role:finance", "--as", "budget.md", "--yes")
    assert s.cli("read", s.bob_session, "roles/finance/budget.md", check=True).out == ALICE_FACT
    # Alice publishes into it but is no member: she cannot read it back, and nobody else sees it.
    for session in (s.alice_session, s.group_session):
        assert s.cli("read", session, "roles/finance/budget.md").code == 3
    _unchanged(s.cli, ["write", s.bob_session, "roles/finance/budget.md"], stdin=b"x", code=3)


def test_a_publisher_never_replaces_another_publishers_copy(scenario: Scenario) -> None:
    s = scenario
    _grant(s, s.alice)
    _grant(s, s.bob)
    name = "ref/allergy.md"
    published = "agent-shared/" + name
    first = s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", name, "--yes")
    # Bob holds a grant for the same store, which makes him no owner of Alice's copy. His preview writes
    # nothing and does not look at the name; his publish is refused, audited, and changes nothing else.
    preview = s.cli.j("publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", name)
    assert preview["published"] is False
    err = _unchanged(s.cli, ["publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", name, "--yes"],
                     code=3)
    assert "name-taken" in err
    assert s.cli("read", s.group_session, published, check=True).out == ALICE_FACT
    denied = s.cli.j("audit", "--agent", s.agent, "--reason", "name-taken")["rows"]
    assert [(e["operation"], e["decision"]) for e in denied] == [("publish", "deny")]
    # Another name is free; Alice replaces her own copy, even from another note of her store.
    s.cli.j("publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", "ref/peanuts.md", "--yes")
    s.cli.j("write", s.alice_session, "private/notes/other.md", stdin=b"walnuts too\n")
    again = s.cli.j("publish", s.alice_session, "private/notes/other.md", "--to", "agent-shared", "--as", name,
                    "--yes")
    assert again["resource_id"] == first["resource_id"] and again["revision"] == 2
    assert s.cli("read", s.group_session, published, check=True).out == b"walnuts too\n"
    # Once Alice removed her own source her copy is held, unreadable for good: its name is free again.
    s.cli.j("rm", s.alice_session, "private/notes/other.md")
    assert s.cli("read", s.group_session, published).code == 3
    s.cli.j("publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", name, "--yes")
    assert s.cli("read", s.group_session, published, check=True).out == BOB_FACT


def test_a_copy_held_by_someone_elses_removal_keeps_its_name(scenario: Scenario) -> None:
    """Bob cannot free Alice's name by removing a note of his that hers was derived from; Alice can, by
    retiring a note of her own that it comes from."""
    s = scenario
    _grant(s, s.alice)
    _grant(s, s.bob)
    s.cli.j("publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", "bob.md", "--yes")
    s.cli.j("write", s.alice_session, "private/mine.md", stdin=b"what I add to it\n")
    s.cli.j("derive", s.alice_session, "--from", "agent-shared/bob.md", "--from", "private/mine.md",
            "--to", "private/digest.md", stdin=b"a digest of what Bob shared, and mine\n")
    s.cli.j("publish", s.alice_session, "private/digest.md", "--to", "agent-shared", "--as", "digest.md", "--yes")
    s.cli.j("rm", s.bob_session, SOURCE)  # holds Bob's copy, Alice's digest, and her copy of it
    assert s.cli("read", s.group_session, "agent-shared/digest.md").code == 3
    s.cli.j("write", s.bob_session, "private/notes/new.md", stdin=b"mine now\n")
    taking = ["publish", s.bob_session, "private/notes/new.md", "--to", "agent-shared", "--as", "digest.md", "--yes"]
    assert "name-taken" in _unchanged(s.cli, taking, code=3)
    # Alice removes her own source of it: her copy, still active and held, holds its name no more.
    s.cli.j("rm", s.alice_session, "private/mine.md")
    s.cli.j(*taking)
    assert s.cli("read", s.group_session, "agent-shared/digest.md", check=True).out == b"mine now\n"


def test_an_expired_copy_frees_its_name(scenario: Scenario) -> None:
    s = scenario
    _grant(s, s.alice)
    _grant(s, s.bob)
    # Time enough for the publish and the refused one even on a loaded machine (CI once took over 2 s).
    until = (datetime.now(UTC) + timedelta(seconds=10)).isoformat(timespec="seconds")
    note = f"---\nvalid-until: {until}\n---\nlunch at noon\n".encode()
    s.cli.j("write", s.alice_session, "private/soon.md", stdin=note)
    s.cli.j("publish", s.alice_session, "private/soon.md", "--to", "agent-shared", "--as", "lunch.md", "--yes")
    taking = ["publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", "lunch.md", "--yes"]
    assert "name-taken" in _unchanged(s.cli, taking, code=3)
    wait_until(lambda: s.cli("read", s.group_session, "agent-shared/lunch.md").code == 3, timeout=30)
    s.cli.j(*taking)
    assert s.cli("read", s.group_session, "agent-shared/lunch.md", check=True).out == BOB_FACT


@pytest.mark.parametrize(("step", "refusal"), [(Step.STAGED, Denied), (Step.PENDING, Conflict)],
                         ids=["before-the-first-commit", "after-the-first-commit"])
def test_a_copy_published_at_the_name_while_a_publish_is_under_way_wins(
        scenario: Scenario, step: Step, refusal: type[Exception]) -> None:
    """Bob's publish found the name free; Alice publishes there meanwhile. Before his pending revision is
    recorded, that commit decides again with her copy and refuses (``name-taken``); after it, his
    activation finds the note changed (Conflict). Either way nothing of his is left and hers stands,
    and his retry is refused as taken."""
    s = scenario
    _grant(s, s.alice)
    _grant(s, s.bob)
    home = Home.open(s.cli.home)
    name = "ref/allergy.md"
    done: list[str] = []

    def alice_meanwhile(at: Step) -> None:
        if at is step and not done:
            done.append("alice")  # her own write passes here too
            publish(home, s.alice_session, SOURCE, "agent-shared", name=name, yes=True)

    set_hook(alice_meanwhile)
    try:
        with pytest.raises(refusal) as refused:
            publish(home, s.bob_session, SOURCE, "agent-shared", name=name, yes=True)
    finally:
        set_hook(None)
        home.close()
    assert done == ["alice"]
    if isinstance(refused.value, Denied):
        assert refused.value.reason == "name-taken"
    assert s.cli("read", s.group_session, "agent-shared/" + name, check=True).out == ALICE_FACT
    with catalog(s.cli.home) as conn:
        assert conn.execute("SELECT count(*) FROM revisions v JOIN resources r USING (resource_id)"
                            " WHERE r.path = ? AND v.state != 'rolled-back'", (name,)).fetchall() == [(1,)]
        assert conn.execute("SELECT count(*) FROM write_intents WHERE state = 'pending'").fetchall() == [(0,)]
    assert s.cli.j("doctor")["findings"] == []  # no file of Bob's left behind in the store or staging
    assert "name-taken" in _unchanged(s.cli, ["publish", s.bob_session, SOURCE, "--to", "agent-shared", "--as", name,
                                              "--yes"], code=3)


@pytest.mark.parametrize("call", [
    ["grant", "publisher", "--agent", "main", "--principal", "{alice}", "--scope", "role:nope"],
    ["grant", "publisher", "--agent", "nope", "--principal", "{alice}", "--scope", "agent-shared"],
    ["grant", "publisher", "--agent", "main", "--principal", "{conversation}", "--scope", "agent-shared"],
    ["grant", "publisher", "--agent", "main", "--principal", "{alice}", "--scope", "user:{bob}"],
    ["grant", "publisher", "--agent", "main", "--principal", "{alice}", "--scope", "conversation:{conversation}"],
    ["grant", "revoke", "pe_aaaaaaaaaaaaaaaaaaaaaaaaaa"],
    ["grant", "revoke", "not-a-grant"],
    ["publish", "{alice_session}", SOURCE, "--to", "private"],
    ["publish", "{alice_session}", SOURCE, "--to", "role:nope", "--yes"],
    ["publish", "{alice_session}", SOURCE, "--to", "role:\udcff", "--yes"],  # a non-UTF-8 argv byte
    ["publish", "{alice_session}", SOURCE, "--to", "conversation:{conversation}", "--yes"],
    ["publish", "{alice_session}", SOURCE, "--to", "agent-shared", "--as", "../x.md", "--yes"],
    ["member", "add", "role:nope", "{alice}"],
    ["member", "add", "role:Bad Name", "{alice}"],
    ["member", "remove", "role:nope", "{alice}"],
], ids=lambda c: " ".join(c[:2]) + ":" + c[-1])
def test_bad_sharing_input_changes_nothing(scenario: Scenario, call: list[str]) -> None:
    s = scenario
    _grant(s, s.alice)
    names = {"alice": s.alice, "bob": s.bob, "conversation": s.conversation, "alice_session": s.alice_session}
    _unchanged(s.cli, [part.format(**names) for part in call], code=2)


# -- projections -------------------------------------------------------------------

def test_a_projection_reaches_exactly_its_one_audience(scenario: Scenario) -> None:
    s = scenario
    _, other_group = _other_group(s, (s.alice,))
    before = snapshot(s.cli.home, skip_tables=AUDIT_ONLY)
    preview = s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}",
                      "--purpose", "so the group knows", "--expires", "7d")
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=AUDIT_ONLY)) == []
    shown = preview["preview"]
    assert shown["purpose"] == "so the group knows" and shown["no_expiry"] is False
    assert sorted(m["principal_id"] for m in shown["audience"]) == sorted([s.alice, s.bob])
    assert shown["target_path"] == "projections/channel/notes/allergy.md"

    made = _project(s, f"conversation:{s.conversation}")
    copy = "projections/channel/notes/allergy.md"
    assert s.cli("read", s.group_session, copy, check=True).out == ALICE_FACT
    assert [e["name"] for e in s.cli.j("ls", s.group_session, "projections/channel/notes")["entries"]] == \
        ["allergy.md"]
    # The group never reaches the private source; nobody else reaches the copy.
    assert s.cli("read", s.group_session, SOURCE).code == 3
    for session in (other_group, s.bob_session, s.alice_session, _service_session(s)):
        assert s.cli("read", session, copy).code == 3
        assert s.cli("read", session, "projections/agent-shared/notes/allergy.md").code == 3
    hits = s.cli.j("search", s.group_session, "hazelnuts")["results"]
    assert [h["path"] for h in hits] == [copy]
    assert s.cli.j("search", other_group, "hazelnuts")["results"] == []
    assert [h["path"] for h in s.cli.j("search", s.bob_session, "allergic")["results"]] == [SOURCE]
    # Editing the source never republishes: the copy stays at its revision.
    s.cli.j("write", s.alice_session, SOURCE, stdin=b"hazelnuts and walnuts now\n")
    assert s.cli("read", s.group_session, copy, check=True).out == ALICE_FACT
    listed = s.cli.j("projection", "list", "--agent", s.agent)["projections"]
    assert [(p["projection_id"], p["state"], p["target"]) for p in listed] == \
        [(made["projection_id"], "live", f"conversation:{s.conversation}")]


def test_projecting_again_replaces_the_copy_and_revoking_reports_exposures(scenario: Scenario) -> None:
    s = scenario
    first = _project(s, f"conversation:{s.conversation}")
    copy = "projections/channel/notes/allergy.md"
    s.cli("read", s.group_session, copy, check=True)  # the group was shown the first copy
    s.cli.j("write", s.alice_session, SOURCE, stdin=b"walnuts too\n")
    second = _project(s, f"conversation:{s.conversation}")
    assert second["replaced_projection_id"] == first["projection_id"]
    assert s.cli("read", s.group_session, copy, check=True).out == b"walnuts too\n"
    states = {p["projection_id"]: p["state"] for p in s.cli.j("projection", "list", "--agent", s.agent,
                                                              "--source-session", s.alice_session)["projections"]}
    assert states == {first["projection_id"]: "revoked", second["projection_id"]: "live"}

    out = s.cli.j("projection", "revoke", first["projection_id"])
    assert out["revoked"] is False and out["exposed_session_ids"] == [s.group_session]
    assert s.cli("read", s.group_session, copy, check=True).out == b"walnuts too\n"  # the old revoke is history
    out = s.cli.j("projection", "revoke", second["projection_id"])
    assert out["revoked"] is True and out["exposed_session_ids"] == [s.group_session]
    result = s.cli("read", s.group_session, copy)
    assert result.code == 3 and result.out == b""
    assert s.cli.j("ls", s.group_session, "projections/channel")["entries"] == []
    assert s.cli.j("search", s.group_session, "walnuts")["results"] == []
    assert s.cli.j("projection", "revoke", second["projection_id"])["revoked"] is False


def test_an_expired_projection_is_gone_from_every_read(scenario: Scenario) -> None:
    s = scenario
    made = _project(s, f"conversation:{s.conversation}", "--expires", "15s")  # time for the read that follows
    copy = "projections/channel/notes/allergy.md"
    assert s.cli("read", s.group_session, copy, check=True).out == ALICE_FACT
    wait_until(lambda: s.cli("read", s.group_session, copy).code == 3, timeout=45)
    assert s.cli.j("ls", s.group_session, "projections/channel")["entries"] == []
    assert s.cli.j("search", s.group_session, "hazelnuts")["results"] == []
    states = [p["state"] for p in s.cli.j("projection", "list", "--agent", s.agent)["projections"]]
    assert states == ["expired"]
    assert made["projection_id"]


def test_role_and_agent_wide_projections(scenario: Scenario) -> None:
    s = scenario
    role = _role(s, "ops", s.alice, s.bob)
    _project(s, "role:ops", "--no-expiry", "--as", "ops-allergy.md")
    assert s.cli("read", s.bob_session, "projections/roles/ops/ops-allergy.md", check=True).out == ALICE_FACT
    assert s.cli("read", s.group_session, "projections/roles/ops/ops-allergy.md").code == 3
    s.cli.j("member", "remove", role, s.bob)
    assert s.cli("read", s.bob_session, "projections/roles/ops/ops-allergy.md").code == 3
    _project(s, "agent-shared", "--expires", "1d", session=s.bob_session)
    for session in (s.alice_session, s.bob_session, s.group_session, _service_session(s)):
        assert s.cli("read", session, "projections/agent-shared/notes/allergy.md", check=True).out == BOB_FACT
    listed = s.cli.j("projection", "list", "--agent", s.agent)["projections"]
    assert [p["no_expiry"] for p in listed] == [True, False]


def test_only_the_owner_projects_into_an_audience_it_is_in(scenario: Scenario) -> None:
    s = scenario
    other_conv, _ = _other_group(s)  # Alice is not a member
    err = _unchanged(s.cli, ["project", s.alice_session, SOURCE, "--to", f"conversation:{other_conv}",
                             "--purpose", "p", "--no-expiry", "--yes"], code=3)
    assert "not-in-audience" in err
    _role(s, "ops", s.bob)
    assert "not-in-audience" in _unchanged(s.cli, ["project", s.alice_session, SOURCE, "--to", "role:ops",
                                                   "--purpose", "p", "--no-expiry", "--yes"], code=3)
    # A group, a service: nobody there owns a note on a person's behalf.
    assert "not-owner" in _unchanged(s.cli, ["project", s.group_session, "channel/offsite.md", "--to",
                                             f"conversation:{s.conversation}", "--purpose", "p", "--no-expiry",
                                             "--yes"], code=3)


@pytest.mark.parametrize("flags", [
    ["--purpose", "p"],                                           # neither expiry choice
    ["--purpose", "p", "--expires", "1d", "--no-expiry"],        # both
    ["--purpose", "", "--no-expiry"],                             # empty purpose
    ["--purpose", "   ", "--no-expiry"],
    ["--purpose", "x" * 501, "--no-expiry"],                      # too long
    ["--purpose", "a\x1bb", "--no-expiry"],                       # control characters
    ["--purpose", "p", "--expires", "0s"],                        # not in the future
    ["--purpose", "p", "--expires", "-1d"],
    ["--purpose", "p", "--expires", "soon"],
], ids=["neither", "both", "empty", "blank", "long", "control", "zero", "negative", "malformed"])
def test_bad_projection_input_changes_nothing(scenario: Scenario, flags: list[str]) -> None:
    s = scenario
    _unchanged(s.cli, ["project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", *flags,
                       "--yes"], code=2)


@pytest.mark.parametrize("target", ["conversation:p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "role:nope", "user:{bob}", "{bob}",
                                    "private", "private:{bob}", "agent-shared:x", "conversation:{alice}", "",
                                    "role:" + "r" * 300])
def test_no_target_names_a_person_or_a_private_store(scenario: Scenario, target: str) -> None:
    """No direct user-to-user sharing: every spelling of a person or a private store is refused, unchanged."""
    s = scenario
    to = target.format(bob=s.bob, alice=s.alice)
    for call in (["project", s.alice_session, SOURCE, "--to", to, "--purpose", "p", "--no-expiry", "--yes"],
                 ["publish", s.alice_session, SOURCE, "--to", to, "--yes"],
                 ["grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", to]):
        _unchanged(s.cli, call, code=2)


def test_projection_copies_count_once_in_search(scenario: Scenario) -> None:
    """The copy is the group's own result now; crowd-out stays exact with it in the view."""
    s = scenario
    _project(s, f"conversation:{s.conversation}")
    hits = s.cli.j("search", s.group_session, "fact", "--limit", "5")["results"]
    assert sorted(h["path"] for h in hits) == ["channel/offsite.md", "projections/channel/notes/allergy.md"]
    assert len({h["citation"] for h in hits}) == len(hits)


def test_role_notes_reach_only_the_roles_members_in_search(scenario: Scenario) -> None:
    s = scenario
    _role(s, "finance", s.bob)
    _grant(s, s.alice, "role:finance")
    s.cli.j("write", s.alice_session, "private/budget.md", stdin=b"Quarterly budget cap (canary F1n4)\n")
    s.cli.j("publish", s.alice_session, "private/budget.md", "--to", "role:finance", "--yes")
    assert [h["path"] for h in s.cli.j("search", s.bob_session, "quarterly budget")["results"]] == \
        ["roles/finance/budget.md"]
    assert [h["path"] for h in s.cli.j("search", s.alice_session, "quarterly budget")["results"]] == \
        ["private/budget.md"]
    assert s.cli.j("search", s.group_session, "quarterly budget")["results"] == []


def test_the_gateway_api_has_no_way_to_share_or_grant(scenario: Scenario) -> None:
    """Sharing is the owner's and the operator's, never a capability holder's: no such API operation exists."""
    import secrets

    from scopefs.api.service import Service
    from scopefs.catalog.clock import now_us
    from scopefs.catalog.home import Home
    from tests.conftest import ALICE_SENDER

    home = Home.open(scenario.cli.home)
    try:
        service = Service(home)
        opened = service.handle({"op": "open", "agent": "main", "chat": "direct", "channel": CHANNEL,
                                 "account": ACCOUNT, "sender": ALICE_SENDER})
        capability = opened["result"]["capability"]
        for op, args in (("grant", {"principal": scenario.bob, "scope": "agent-shared"}),
                         ("publish", {"path": SOURCE, "to": "agent-shared"}),
                         ("project", {"path": SOURCE, "to": f"conversation:{scenario.conversation}"}),
                         ("share", {"path": SOURCE, "to": scenario.bob}),
                         ("policy", {"effect": "allow", "capability": "read", "principal": scenario.bob})):
            before = snapshot(scenario.cli.home, skip_tables=AUDIT_ONLY)
            answer = service.handle({"op": op, "capability": capability, "nonce": secrets.token_urlsafe(16),
                                     "ts": now_us(), "args": args})
            assert answer["ok"] is False and answer["error"]["code"] == "bad-input", (op, answer)
            assert diff_snapshots(before, snapshot(scenario.cli.home, skip_tables=AUDIT_ONLY)) == []
    finally:
        home.close()


def test_a_publisher_publishes_only_its_own_notes(scenario: Scenario) -> None:
    """Never a note it only reads: another person's projection, a role note, agent-shared itself, a deposit."""
    s = scenario
    _role(s, "ops", s.alice, s.bob)
    _grant(s, s.alice)
    _grant(s, s.bob, "role:ops")
    s.cli.j("project", s.bob_session, SOURCE, "--to", "role:ops", "--purpose", "for on-call", "--expires", "1d",
            "--as", "bob.md", "--yes")
    s.cli.j("publish", s.bob_session, SOURCE, "--to", "role:ops", "--as", "runbook.md", "--yes")
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "alice.md", "--yes")
    s.cli.j("postbox", "enable", s.alice)
    handle = s.cli.j("message", "add", s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", "tg-sender-alice-8410023317")["message_handle"]
    assert s.cli("deposit", s.group_session, handle, stdin=b"a deposit\n").code == 0
    deposit = next(e["name"] for e in s.cli.j("ls", s.alice_session, f"postbox/{s.conversation}")["entries"])
    for path in ("projections/roles/ops/bob.md", "roles/ops/runbook.md", "agent-shared/alice.md",
                 f"postbox/{s.conversation}/{deposit}"):
        assert s.cli("read", s.alice_session, path).code == 0, path  # she may read each...
        err = _unchanged(s.cli, ["publish", s.alice_session, path, "--to", "agent-shared", "--as", "again.md",
                                 "--yes"], code=3)
        assert "not-owner" in err, path  # ...and, publisher though she is, copies none of them out
        err = _unchanged(s.cli, ["project", s.alice_session, path, "--to", f"conversation:{s.conversation}",
                                 "--purpose", "p", "--no-expiry", "--as", "again.md", "--yes"], code=3)
        assert "not-owner" in err, path


def test_expired_and_foreign_projections_crowd_nothing_out_of_a_search(scenario: Scenario) -> None:
    """200 nearer copies in the group's own projection store, all expired, plus 200 live ones addressed to
    another conversation: the group's results, order, scores and shape are byte for byte what they were."""
    import time as clock

    from scopefs.catalog.home import Home
    from scopefs.writer.projections import Expiry, project
    from tests.test_search import ALLOWED, NEAR, _modes

    s = scenario
    for i, text in enumerate(ALLOWED):
        s.cli.j("write", s.group_session, f"channel/camp/{i}.md", stdin=text)
    query = "lantern battery"
    alone = _modes(s.cli, s.group_session, query)
    other_conv, other_group = _other_group(s, (s.alice,))
    s.cli.j("write", s.alice_session, "private/near.md", stdin=NEAR)
    home = Home.open(s.cli.home)
    try:
        soon = Expiry.choose(1_000_000, False)  # a second from now
        for i in range(200):
            project(home, s.alice_session, "private/near.md", f"conversation:{s.conversation}", purpose="p",
                    expiry=soon, name=f"near/{i}.md", yes=True)
            project(home, s.alice_session, "private/near.md", f"conversation:{other_conv}", purpose="p",
                    expiry=Expiry.choose(None, True), name=f"near/{i}.md", yes=True)
    finally:
        home.close()
    clock.sleep(max(0.0, (soon.at or 0) / 1e6 - clock.time()) + 0.1)
    seen = [h["path"] for h in s.cli.j("search", other_group, query, "--limit", "100")["results"]]
    assert len(seen) == 100 and all(p.startswith("projections/channel/near/") for p in seen)  # they do outrank
    assert _modes(s.cli, s.group_session, query) == alone
