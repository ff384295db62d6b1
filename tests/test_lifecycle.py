"""The lifecycle of derived memory: derivations, lineage holds, release, forgetting, validity, exposures.

Every check runs the installed ``scopefs`` on a real home and reads the
outcome back the way a session would (``read``, ``ls``, ``search``), so a
descendant that outlives its source, a forgotten claim that comes back, or
an expired note that still shows fails here.
"""

from __future__ import annotations

import json
from typing import Any

import apsw
import pytest

from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    CHANNEL,
    CHANNEL_FACT,
    MIKE1_SENDER,
    Cli,
    Result,
    Scenario,
    diff_snapshots,
    snapshot,
)
from tests.mountkit import catalog

SOURCE = "private/notes/allergy.md"
SUMMARY = b"Summary: Alice avoids hazelnuts when ordering lunch for the team\n"


def _derive(s: Scenario, session: str, to: str, *sources: str, content: bytes = SUMMARY,
            kind: str = "summary") -> Result:
    args = ["derive", session, "--to", to, "--kind", kind]
    for source in sources:
        args += ["--from", source]
    return s.cli(*args, stdin=content)


def _readable(s: Scenario, session: str, path: str) -> bool:
    return s.cli("read", session, path).code == 0


def _listed(s: Scenario, session: str, folder: str) -> list[str]:
    result = s.cli("--json", "ls", session, folder)
    return [] if result.code != 0 else [e["name"] for e in result.json()["entries"]]


def _search_paths(s: Scenario, session: str, query: str) -> list[str]:
    return [r["path"] for r in s.cli.j("search", session, query, "--mode", "words")["results"]]


def _rows(cli: Cli, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with catalog(cli.home) as conn:
        return conn.execute(sql, args).fetchall()


def test_a_private_plus_shared_derivation_is_private_with_lineage(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("write", s.alice_session, "private/notes/lunch.md", stdin=b"Lunch is on Fridays at noon for everyone\n")
    out = s.cli.j("derive", s.alice_session, "--from", SOURCE, "--from", "private/notes/lunch.md",
                  "--to", "private/summaries/lunch.md", "--kind", "digest", stdin=SUMMARY)
    assert out["kind"] == "digest" and len(out["sources"]) == 2
    assert s.cli("read", s.alice_session, "private/summaries/lunch.md").out == SUMMARY
    edges = _rows(s.cli, "SELECT relation FROM lineage_edges WHERE child_revision_id = ?", out["revision_id"])
    assert sorted(edges) == [("derive",), ("derive",)]
    origin = _rows(s.cli, "SELECT trust_origin FROM revisions WHERE revision_id = ?", out["revision_id"])
    assert origin == [("derived",)]
    assert not _readable(s, s.bob_session, "private/summaries/lunch.md")


def test_a_derivation_never_widens_by_naming_a_broader_store(scenario: Scenario) -> None:
    """The target must be inside every source's audience: a member may keep a channel digest privately, a
    non-member may not, and a private note never reaches a channel by naming it."""
    s = scenario
    ok = _derive(s, s.group_session, "channel/digest.md", "channel/offsite.md")
    assert ok.code == 0, ok.err
    member = _derive(s, s.alice_session, "private/summaries/offsite.md", f"{s.group_session}:channel/offsite.md")
    assert member.code == 0, member.err
    mike = s.cli.j("session", "open", "--agent", s.agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                   "--sender", MIKE1_SENDER)["session_id"]
    before = snapshot(s.cli.home, skip_tables=("audit",))
    outsider = _derive(s, mike, "private/summaries/offsite.md", f"{s.group_session}:channel/offsite.md")
    assert outsider.code == 3 and "mixed-audience" in outsider.err
    widening = _derive(s, s.group_session, "channel/leak.md", f"{s.alice_session}:{SOURCE}")
    assert widening.code == 3 and "mixed-audience" in widening.err
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=("audit",))) == []
    assert not _readable(s, s.group_session, "channel/leak.md")


def test_two_peoples_private_notes_are_mixed_audience_and_quarantined(scenario: Scenario) -> None:
    s = scenario
    result = _derive(s, s.alice_session, "private/summaries/both.md", SOURCE, f"{s.bob_session}:{SOURCE}",
                     content=b"Both of them avoid nuts of some kind at lunch\n")
    assert result.code == 3 and "mixed-audience" in result.err
    for session in (s.alice_session, s.bob_session, s.group_session):
        assert not _readable(s, session, "private/summaries/both.md")
        assert "both.md" not in str(s.cli("--json", "search", session, "avoid nuts lunch").out)
    quarantined = _rows(s.cli, "SELECT d.revision_id FROM derivations d WHERE d.state = 'quarantined'")
    assert len(quarantined) == 1
    parents = _rows(s.cli, "SELECT count(*) FROM lineage_edges WHERE child_revision_id = ?", quarantined[0][0])
    assert parents == [(2,)]


def test_a_quarantine_note_cannot_be_a_source(scenario: Scenario) -> None:
    """Postbox and quarantine resources are ineligible for derivation until a review changes their state."""
    s = scenario
    s.cli.j("postbox", "enable", s.alice)
    handle = s.cli.j("message", "add", s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", ALICE_SENDER)["message_handle"]
    s.cli.j("deposit", s.group_session, handle, stdin=b"Deposited: Alice likes green tea in the afternoon\n")
    [entry] = s.cli.j("ls", s.alice_session, f"postbox/{s.conversation}")["entries"]
    result = _derive(s, s.alice_session, "private/summaries/tea.md", f"postbox/{s.conversation}/{entry['name']}")
    assert result.code == 3
    assert not _readable(s, s.alice_session, "private/summaries/tea.md")


def test_a_chain_of_three_and_fan_in_are_held_when_a_source_goes(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("write", a, "private/notes/work.md", stdin=b"Alice works on the billing service this quarter\n")
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d1.md", stdin=b"Level one summary of the allergy note\n")
    s.cli.j("derive", a, "--from", "private/d1.md", "--to", "private/d2.md",
            stdin=b"Level two summary built from level one\n")
    s.cli.j("derive", a, "--from", "private/d2.md", "--to", "private/d3.md",
            stdin=b"Level three summary built from level two\n")
    s.cli.j("derive", a, "--from", "private/d1.md", "--from", "private/notes/work.md", "--to", "private/fan.md",
            stdin=b"Fan-in summary of level one and the work note\n")
    s.cli.j("derive", a, "--from", "private/notes/work.md", "--to", "private/other.md",
            stdin=b"Unrelated summary of the work note only\n")
    for path in ("private/d1.md", "private/d2.md", "private/d3.md", "private/fan.md", "private/other.md"):
        assert _readable(s, a, path)
    assert s.cli("rm", a, SOURCE).code == 0
    for path in ("private/d1.md", "private/d2.md", "private/d3.md", "private/fan.md"):
        assert not _readable(s, a, path), path
        assert s.cli("read", a, path).code == s.cli("read", a, "private/never-was.md").code
    assert _readable(s, a, "private/other.md")
    assert sorted(_listed(s, a, "private")) == ["notes", "other.md"]
    assert _search_paths(s, a, "level") == []
    assert _rows(s.cli, "SELECT count(*) FROM lineage_holds") == [(4,)]
    assert _rows(s.cli, "SELECT count(*) FROM search_chunks c JOIN lineage_holds h USING (revision_id)") == [(0,)]


def test_release_makes_a_held_note_independent_and_keeps_the_lineage(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    first = s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d1.md", stdin=b"A reviewed digest of lunches\n")
    s.cli.j("rm", a, SOURCE)
    assert not _readable(s, a, "private/d1.md")
    assert s.cli("lineage", "release", s.bob_session, "private/d1.md").code in (2, 3)  # not Bob's note
    out = s.cli.j("lineage", "release", a, "private/d1.md")
    assert s.cli("read", a, "private/d1.md").out == b"A reviewed digest of lunches\n"
    assert _rows(s.cli, "SELECT held_revision_id FROM lineage_releases WHERE revision_id = ?",
                 out["revision_id"]) == [(first["revision_id"],)]
    assert _rows(s.cli, "SELECT count(*) FROM lineage_holds WHERE revision_id = ?", first["revision_id"]) == [(1,)]
    assert _rows(s.cli, "SELECT count(*) FROM lineage_edges WHERE child_revision_id = ?", out["revision_id"]) == [(0,)]
    assert s.cli("lineage", "release", a, "private/d1.md").code == 2  # nothing held any more


def test_re_deriving_a_held_note_writes_it_anew(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("write", a, "private/notes/b.md", stdin=b"Another note about the team calendar\n")
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d.md", stdin=b"Old digest of the allergy\n")
    s.cli.j("rm", a, SOURCE)
    assert not _readable(s, a, "private/d.md")
    s.cli.j("derive", a, "--from", "private/notes/b.md", "--to", "private/d.md", stdin=b"New digest of the calendar\n")
    assert s.cli("read", a, "private/d.md").out == b"New digest of the calendar\n"


def test_revoking_a_projection_holds_what_the_group_derived_from_it(scenario: Scenario) -> None:
    s = scenario
    projection = s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}",
                         "--purpose", "lunch planning", "--no-expiry", "--yes")["projection_id"]
    s.cli.j("derive", s.group_session, "--from", "projections/channel/notes/allergy.md", "--to", "channel/menu.md",
            stdin=b"Menu plan: no hazelnut desserts at the offsite\n")
    assert _readable(s, s.group_session, "channel/menu.md")
    s.cli.j("projection", "revoke", projection)
    assert not _readable(s, s.group_session, "channel/menu.md")
    assert _readable(s, s.group_session, "channel/offsite.md")


def test_forget_dry_run_and_apply_share_one_report_and_the_claim_stays_out(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d1.md", stdin=b"Digest: avoid hazelnuts for Alice\n")
    before = snapshot(s.cli.home, skip_tables=("audit",))
    preview = s.cli.j("forget", a, SOURCE, "--dry-run")
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=("audit",))) == []
    done = s.cli.j("forget", a, SOURCE)
    assert preview["dry_run"] is True and done["dry_run"] is False
    strip = ("dry_run", "forget_id")
    assert {k: v for k, v in preview.items() if k not in strip} == {k: v for k, v in done.items() if k not in strip}
    assert [(n["path"], n["relation"]) for n in done["forgotten"]] == \
        [(SOURCE, "named"), ("private/d1.md", "descendant")]
    assert done["claims"] >= 2 and done["refusals"] == []
    assert not _readable(s, a, SOURCE) and not _readable(s, a, "private/d1.md")
    # The same claim, through any door: another session, a derivation, a reworded copy, a deposit.
    for session, path in ((a, "private/again.md"), (s.group_session, "channel/again.md")):
        result = s.cli("write", session, path, stdin=b"first private fact:  ALLERGIC to hazelnuts (canary A1c3)\n")
        assert result.code == 3 and "forgotten" in result.err
    s.cli.j("write", a, "private/notes/new.md", stdin=b"Something new that was never forgotten\n")
    refused = _derive(s, a, "private/d3.md", "private/notes/new.md", content=ALICE_FACT)
    assert refused.code == 3 and "forgotten" in refused.err
    # Neither the rejection list nor the audit holds the text.
    raw = b"".join(p.read_bytes() for p in s.cli.home.rglob("*.sqlite*") if p.is_file())
    assert b"hazelnuts" not in raw and b"A1c3" not in raw
    # Physical bytes are gone too, and doctor is content.
    assert s.cli("doctor").code == 0


def test_forget_refuses_what_it_will_not_touch(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("write", a, "private/notes/b.md", stdin=b"Alice prefers window seats on long flights\n")
    s.cli.j("derive", a, "--from", SOURCE, "--from", "private/notes/b.md", "--to", "private/mixed.md",
            stdin=b"Mixed digest: hazelnut-free meals and window seats\n")
    projection = s.cli.j("project", a, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "menu",
                         "--no-expiry", "--yes")["projection_id"]
    s.cli.j("derive", s.group_session, "--from", "projections/channel/notes/allergy.md", "--to", "channel/menu.md",
            stdin=b"Menu: no hazelnut desserts this time\n")
    report = s.cli.j("forget", a, SOURCE, "private/notes/nothing-here.md", "--dry-run")
    reasons = sorted(r["reason"] for r in report["refusals"])
    assert reasons == ["mixed-lineage", "outside-view"]  # the group's digest of the copy is held, never named
    # Alice's own projection of the note is hers to forget with it.
    assert [(n["path"], n["relation"]) for n in report["forgotten"]] == \
        [(SOURCE, "named"), (f"projection:{projection}", "copy")]
    s.cli.j("forget", a, SOURCE)
    # Refused descendants are still held by their lineage: nobody reads them.
    assert not _readable(s, a, "private/mixed.md")
    assert not _readable(s, s.group_session, "projections/channel/notes/allergy.md")
    assert not _readable(s, s.group_session, "channel/menu.md")
    assert _readable(s, a, "private/notes/b.md")
    [listed] = s.cli.j("projection", "list", "--agent", s.agent)["projections"]
    assert listed["state"] == "revoked"
    artifacts = b"".join(p.read_bytes() for p in (s.cli.home / "agents").rglob("*")
                         if p.is_file() and "memory-scopes" in str(p))
    assert b"A1c3" not in artifacts


def test_forget_outside_the_writable_roots_is_refused_whole(scenario: Scenario) -> None:
    s = scenario
    result = s.cli("--json", "forget", s.group_session, "channel/offsite.md", "agent-shared/x.md", "--dry-run")
    assert result.code == 0
    report = result.json()
    assert [n["path"] for n in report["forgotten"]] == ["channel/offsite.md"]
    only_refused = s.cli("--json", "forget", s.bob_session, SOURCE.replace("allergy", "none"))
    assert only_refused.code == 3 and only_refused.json()["forgotten"] == []
    assert s.cli("read", s.group_session, "channel/offsite.md").out == CHANNEL_FACT


def test_valid_until_denies_read_list_and_search_before_any_cleanup(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("write", a, "private/notes/trip.md", "--valid-until", "2020-01-01",
            stdin=b"Alice is travelling to Porto next week\n")
    assert not _readable(s, a, "private/notes/trip.md")
    assert "trip.md" not in _listed(s, a, "private/notes")
    assert _search_paths(s, a, "travelling Porto") == []
    s.cli.j("write", a, "private/notes/plan.md", "--valid-until", "30d", stdin=b"Alice plans a Porto trip\n")
    data = s.cli("read", a, "private/notes/plan.md").out
    assert data.startswith(b"---\nvalid-until: ") and data.endswith(b"Alice plans a Porto trip\n")
    # Front matter written by hand counts the same; superseded-by denies at once.
    s.cli.j("write", a, "private/notes/old.md", stdin=b"---\nsuperseded-by: notes/plan.md\n---\nOld plan text here\n")
    assert not _readable(s, a, "private/notes/old.md")
    # Writing anew renews it.
    s.cli.j("write", a, "private/notes/trip.md", stdin=b"Alice is back from Porto now\n")
    assert s.cli("read", a, "private/notes/trip.md").out == b"Alice is back from Porto now\n"
    bad = s.cli("write", a, "private/notes/x.md", "--valid-until", "yesterday-ish", stdin=b"text\n")
    assert bad.code == 2
    doctor = s.cli("--json", "doctor")
    assert doctor.code == 0
    expired = [f for f in doctor.json()["findings"] if f["kind"] == "expired-note"]
    assert len(expired) == 1  # old.md, superseded; trip.md was renewed


def test_exposures_name_the_sessions_that_saw_a_revision(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("read", s.alice_session, SOURCE)
    s.cli("read", s.alice_session, SOURCE)
    s.cli.j("search", s.alice_session, "hazelnuts", "--mode", "words")
    out = s.cli.j("audit", "exposures", "--agent", s.agent, "--path-of", s.alice_session, SOURCE)
    seen = {(e["session_id"], e["operation"]) for e in out["exposures"]}
    assert seen == {(s.alice_session, "read"), (s.alice_session, "search")}
    revision = out["revisions"][0]
    again = s.cli.j("audit", "exposures", "--agent", s.agent, "--revision", revision)
    assert {e["session_id"] for e in again["exposures"]} == {s.alice_session}
    assert s.bob_session not in str(again)
    assert s.cli("audit", "exposures", "--agent", s.agent, "--path-of", s.bob_session, "private/x/none.md").code == 2


@pytest.mark.parametrize("content", [b"", b"   \n"])
def test_empty_derivations_are_bad_input(scenario: Scenario, content: bytes) -> None:
    s = scenario
    assert _derive(s, s.alice_session, "private/d.md", SOURCE, content=content).code == 2


def test_bob_fact_is_untouched_by_alices_forget(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("forget", s.alice_session, SOURCE)
    assert s.cli("read", s.bob_session, SOURCE).out == BOB_FACT
    conn = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert conn.execute("SELECT count(*) FROM audit WHERE operation = 'forget'").fetchall() == [(1,)]
    finally:
        conn.close()


def test_the_gateway_api_derives_and_forgets_within_its_own_session(scenario: Scenario) -> None:
    """``derive`` and ``forget`` through the API: bound to the capability's session, never another's."""
    from scopefs.api.service import Service
    from scopefs.catalog.home import Home
    from tests.test_api_service import Clock, _call, _dm, _ok, _refused

    s = scenario
    home = Home.open(s.cli.home)
    try:
        clock = Clock()
        service = Service(home, clock=clock)
        alice = _dm(service, ALICE_SENDER)
        out = _ok(_call(service, clock, alice, "derive", **{"from": [SOURCE], "to": "private/d.md",
                                                            "content": "Digest of the lunch allergy"}))
        assert out["kind"] == "summary" and out["sources"][0]["path"] == SOURCE
        _refused(_call(service, clock, alice, "derive", **{"from": [f"{s.bob_session}:{SOURCE}"],
                                                          "to": "private/e.md", "content": "x y z w"}), "bad-input")
        preview = _ok(_call(service, clock, alice, "forget", paths=[SOURCE], dry_run=True))
        assert [n["relation"] for n in preview["forgotten"]] == ["named", "descendant"]
        done = _ok(_call(service, clock, alice, "forget", paths=[SOURCE]))
        assert done["forget_id"] and not done["dry_run"]
        _refused(_call(service, clock, alice, "write", path="private/back.md", content=ALICE_FACT.decode()),
                 "denied", "forgotten")
        captured = _ok(_call(service, clock, alice, "write", path="private/cap.md", origin="capture",
                             content="[Replying to: Bob]\nAlice moved the standup to Wednesdays\n"))
        assert captured["size"] > 0
        assert s.cli("read", s.alice_session, "private/cap.md").out == b"Alice moved the standup to Wednesdays\n"
    finally:
        home.close()


# -- regressions from the independent review ------------------------------------------------------


def test_a_long_compaction_chain_is_held_at_any_depth(scenario: Scenario) -> None:
    """A note re-derived from itself 80 times (a compaction loop): removing the first source holds it."""
    from scopefs.catalog.home import Home
    from scopefs.writer.derive import derive

    s = scenario
    home = Home.open(s.cli.home)
    try:
        derive(home, s.alice_session, [SOURCE], "private/sum.md", b"Summary level zero of the allergy\n")
        for level in range(1, 81):
            derive(home, s.alice_session, ["private/sum.md"], "private/sum.md",
                   f"Summary level {level} of the allergy note\n".encode())
    finally:
        home.close()
    assert _readable(s, s.alice_session, "private/sum.md")
    s.cli.j("rm", s.alice_session, SOURCE)
    assert not _readable(s, s.alice_session, "private/sum.md")
    assert _search_paths(s, s.alice_session, "summary level") == []


def _project_and_digest(s: Scenario) -> str:
    projection = s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}",
                         "--purpose", "menu", "--no-expiry", "--yes")["projection_id"]
    s.cli.j("derive", s.group_session, "--from", "projections/channel/notes/allergy.md", "--to", "channel/digest.md",
            stdin=b"Digest text\n<!-- scopefs:human:start -->\nAlice: hazelnuts, strictly (canary HB1)\n"
                  b"<!-- scopefs:human:end -->\n")
    return str(projection)


def test_a_held_notes_bytes_never_flow_into_a_new_revision(scenario: Scenario) -> None:
    s = scenario
    projection = _project_and_digest(s)
    s.cli.j("projection", "revoke", projection)
    assert not _readable(s, s.group_session, "channel/digest.md")
    s.cli.j("derive", s.group_session, "--from", "channel/offsite.md", "--to", "channel/digest.md",
            stdin=b"New digest\n<!-- scopefs:human:start -->\n<!-- scopefs:human:end -->\n")
    s.cli.j("write", s.group_session, "channel/digest.md", "--origin", "capture",
            stdin=b"Captured\n<!-- scopefs:human:start -->\n<!-- scopefs:human:end -->\n")
    assert b"HB1" not in s.cli("read", s.group_session, "channel/digest.md").out


def test_the_audience_cannot_release_what_a_revoked_projection_held(scenario: Scenario) -> None:
    s = scenario
    projection = _project_and_digest(s)
    s.cli.j("projection", "revoke", projection)
    refused = s.cli("lineage", "release", s.group_session, "channel/digest.md")
    assert refused.code == 3 and "not-owner" in refused.err
    assert not _readable(s, s.group_session, "channel/digest.md")
    # Hidden and missing look alike to a session that cannot see the note.
    assert s.cli("lineage", "release", s.bob_session, SOURCE).err == \
        s.cli("lineage", "release", s.bob_session, "private/notes/none.md").err.replace("none.md", "allergy.md") \
        or s.cli("lineage", "release", s.bob_session, SOURCE).code == 2


def test_a_digest_of_a_role_note_cannot_be_published_or_projected_wider(scenario: Scenario) -> None:
    s = scenario
    role = s.cli.j("role", "add", "ops")["role_id"]
    s.cli.j("member", "add", role, s.alice)
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "role:ops")
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "agent-shared")
    s.cli.j("write", s.alice_session, "private/plan.md", stdin=b"Layoffs are planned for March (canary OPS9)\n")
    s.cli.j("publish", s.alice_session, "private/plan.md", "--to", "role:ops", "--yes")
    s.cli.j("derive", s.alice_session, "--from", "roles/ops/plan.md", "--to", "private/digest.md",
            stdin=b"Digest: reductions in the spring\n")
    published = s.cli("publish", s.alice_session, "private/digest.md", "--to", "agent-shared", "--yes")
    assert published.code == 3 and "mixed-audience" in published.err
    projected = s.cli("project", s.alice_session, "private/digest.md", "--to", f"conversation:{s.conversation}",
                      "--purpose", "p", "--no-expiry", "--yes")
    assert projected.code == 3 and "mixed-audience" in projected.err
    assert s.cli("publish", s.alice_session, "private/digest.md", "--to", "role:ops", "--yes").code == 0


def test_a_digest_of_a_projection_lasts_no_longer_than_it(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "menu",
            "--expires", "1d", "--yes")
    s.cli.j("derive", s.group_session, "--from", "projections/channel/notes/allergy.md", "--to", "channel/d.md",
            stdin=b"Group digest of a projected note\n")
    rows = _rows(s.cli, "SELECT x.valid_until, p.expires_at FROM revision_validity x, projections p"
                        " WHERE x.revision_id = (SELECT revision_id FROM derivations)")
    assert len(rows) == 1 and rows[0][0] == rows[0][1]
    # Projecting again (after an edit) revokes the old projection: what was made from its copy is held.
    s.cli.j("write", s.alice_session, SOURCE, stdin=b"Alice: hazelnuts and almonds now\n")
    s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "menu",
            "--expires", "1d", "--yes")
    assert not _readable(s, s.group_session, "channel/d.md")


def test_a_groups_forget_never_names_a_members_private_digest(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("derive", s.alice_session, "--from", f"{s.group_session}:channel/offsite.md", "--to",
            "private/offsite.md", stdin=b"My own note of the offsite city\n")
    report = s.cli.j("forget", s.group_session, "channel/offsite.md", "--dry-run")
    assert report["refusals"] == [] and [n["path"] for n in report["forgotten"]] == ["channel/offsite.md"]
    assert "v_" not in json.dumps(report["refusals"])


def test_a_removed_note_can_still_be_forgotten_by_its_path(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("rm", s.alice_session, SOURCE)
    report = s.cli.j("forget", s.alice_session, SOURCE)
    assert [(n["path"], n["relation"]) for n in report["forgotten"]] == [(SOURCE, "removed")]
    assert s.cli("write", s.alice_session, "private/back.md", stdin=ALICE_FACT).code == 3
    assert s.cli("--json", "forget", s.alice_session, SOURCE).code == 3  # nothing left to forget there


def test_release_needs_every_ancestor_in_the_notes_own_store(scenario: Scenario) -> None:
    s = scenario
    g = s.group_session
    s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}", "--purpose", "menu",
            "--expires", "1d", "--yes")
    s.cli.j("write", g, "channel/tmp.md", stdin=b"Scratch note of the group for the menu\n")
    s.cli.j("derive", g, "--from", "projections/channel/notes/allergy.md", "--from", "channel/tmp.md",
            "--to", "channel/d.md", stdin=b"Digest of the menu and the projected allergy\n")
    s.cli.j("rm", g, "channel/tmp.md")
    refused = s.cli("lineage", "release", g, "channel/d.md")
    assert refused.code == 3 and "not-owner" in refused.err


def test_an_owner_may_share_a_digest_of_her_own_notes_and_copies_keep_validity(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "agent-shared")
    s.cli.j("write", a, "private/trip.md", "--valid-until", "3d", stdin=b"Alice travels to Porto next week\n")
    s.cli.j("derive", a, "--from", SOURCE, "--from", "private/trip.md", "--to", "private/sum.md",
            stdin=b"Summary: Alice avoids hazelnuts and travels to Porto\n")
    out = s.cli.j("publish", a, "private/sum.md", "--to", "agent-shared", "--yes")
    assert _readable(s, s.bob_session, "agent-shared/sum.md")
    rows = _rows(s.cli, "SELECT x.valid_until FROM revision_validity x WHERE x.revision_id = ?", out["revision_id"])
    source = _rows(s.cli, "SELECT min(valid_until) FROM revision_validity")
    assert rows and rows[0][0] == source[0][0]  # the copy runs out when its sources do


def test_a_capture_over_a_derived_note_stays_derived(scenario: Scenario) -> None:
    s = scenario
    projection = _project_and_digest(s)
    s.cli.j("write", s.group_session, "channel/digest.md", "--origin", "capture",
            stdin=b"Rewritten digest\n<!-- scopefs:human:start -->\n<!-- scopefs:human:end -->\n")
    assert b"HB1" in s.cli("read", s.group_session, "channel/digest.md").out  # the human block was kept...
    s.cli.j("projection", "revoke", projection)
    assert not _readable(s, s.group_session, "channel/digest.md")  # ...and goes with the projection
    # A person's plain edit of a derived note is still the derived note.
    projection = _project_and_digest(s)
    s.cli.j("write", s.group_session, "channel/digest.md", stdin=b"Hand-edited digest text\n")
    s.cli.j("projection", "revoke", projection)
    assert not _readable(s, s.group_session, "channel/digest.md")


@pytest.mark.parametrize("disguise", [
    b"---\n" + ALICE_FACT + b"---\n",
    b"---\nnote: " + ALICE_FACT + b"---\n",
    ALICE_FACT.replace(b"hazelnuts", "hazel\u00adnuts".encode()),
    ALICE_FACT.replace(b"allergic", "aller\u200bgic".encode()),
    ALICE_FACT.replace(b"allergic", "\u0430llergic".encode()),  # a Cyrillic a
    b"Reminder\n\nsuperseded-by: First private fact: allergic to hazelnuts (canary A1c3)\n",
    "First private fact: aller\ufe0fgic to hazelnuts (canary A1c3)\n".encode(),
    b"**Fact:** First private fact: allergic to hazelnuts (canary A1c3)\n",
    b"Fact:First private fact: allergic to hazelnuts (canary A1c3)\n",
    b"Fact - First private fact: allergic to hazelnuts (canary A1c3)\n",
    b"A: B: C: D: First private fact: allergic to hazelnuts (canary A1c3)\n",
    "First private fact: allergic to hazelnuts (can\u0585ry A1c3)\n".replace("\u0585", "\u0251").encode(),
], ids=["front-matter", "front-matter-key", "soft-hyphen", "zero-width-space", "look-alike",
        "body-superseded", "variation-selector", "bold-label", "no-space", "dash", "four-labels", "latin-alpha"])
def test_a_forgotten_claim_cannot_come_back_in_other_disguises(scenario: Scenario, disguise: bytes) -> None:
    s = scenario
    s.cli.j("forget", s.alice_session, SOURCE)
    again = s.cli("write", s.group_session, "channel/back.md", stdin=disguise)
    assert again.code == 3 and "forgotten" in again.err


def test_forget_keeps_a_released_revision_of_a_descendant(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d.md", stdin=b"A digest Alice reviewed and kept\n")
    s.cli.j("rm", a, SOURCE)
    s.cli.j("lineage", "release", a, "private/d.md")
    report = s.cli.j("forget", a, SOURCE)
    assert [(n["path"], n["relation"], n["revisions"]) for n in report["forgotten"]] == \
        [(SOURCE, "removed", 1), ("private/d.md", "descendant", 1)]
    assert s.cli("read", a, "private/d.md").out == b"A digest Alice reviewed and kept\n"


def test_forgetting_never_touches_another_persons_revision_of_a_shared_copy_name(scenario: Scenario) -> None:
    s = scenario
    for who in (s.alice, s.bob):
        s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", who, "--scope", "agent-shared")
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "x.md", "--yes")
    # Alice removes her source: her copy is held by her own removal, so its name is free for Bob.
    s.cli.j("rm", s.alice_session, SOURCE)
    bobs = b"Bob keeps the team calendar on the shared drive every week\n"
    s.cli.j("write", s.bob_session, "private/notes/team.md", stdin=bobs)
    s.cli.j("publish", s.bob_session, "private/notes/team.md", "--to", "agent-shared", "--as", "x.md", "--yes")
    report = s.cli.j("forget", s.alice_session, SOURCE)
    assert [(n["relation"], n["revisions"]) for n in report["forgotten"]] == [("removed", 1), ("copy", 1)]
    assert s.cli("read", s.group_session, "agent-shared/x.md").out == bobs
    assert s.cli("write", s.bob_session, "private/notes/team2.md", stdin=bobs).code == 0


def test_forget_reaches_removed_descendants_and_copies_of_descendants(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "agent-shared")
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d.md",
            stdin=b"Removed digest: no hazelnut cake for Alice\n")
    s.cli.j("rm", a, "private/d.md")
    s.cli.j("derive", a, "--from", SOURCE, "--to", "private/d2.md",
            stdin=b"Shared digest: the lunch order has no hazelnut cake\n")
    s.cli.j("publish", a, "private/d2.md", "--to", "agent-shared", "--yes")
    report = s.cli.j("forget", a, SOURCE)
    assert sorted(n["relation"] for n in report["forgotten"]) == ["copy", "descendant", "named", "removed-descendant"]
    artifacts = b"".join(p.read_bytes() for p in (s.cli.home / "agents").rglob("*")
                         if p.is_file() and "memory-scopes" in str(p))
    assert b"hazelnut cake" not in artifacts
    assert s.cli("write", s.group_session, "channel/x.md",
                 stdin=b"Removed digest: no hazelnut cake for Alice\n").code == 3


def test_forgetting_a_short_generic_line_bans_nothing_else(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("write", s.alice_session, "private/notes/day.md",
            stdin=b"title: Weekly team notes\n\n## Notes from today\n\nSee you tomorrow morning.\n\nDate: 2026-12-02\n")
    s.cli.j("forget", s.alice_session, "private/notes/day.md")
    for line in (b"# Weekly team notes\n", b"Bye all, see you tomorrow morning.\n", b"Meeting Date: 2026-12-02\n"):
        assert s.cli("write", s.bob_session, "private/notes/mine.md", stdin=line).code == 0, line
