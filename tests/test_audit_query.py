"""``scopefs audit`` (the filtered query), ``audit impact`` and ``audit prune``.

Real homes, the installed command line. The audit is read back by its own
columns only: no content, query or snippet can appear, because none is
stored; these tests check the output for every fact and raw provider id of
the scenario anyway.
"""

from __future__ import annotations

import apsw

from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    BOB_SENDER,
    CHANNEL_FACT,
    GROUP_CONVERSATION,
    Scenario,
    snapshot,
    sqlite_int,
)
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

SECRETS = [ALICE_FACT.strip(), BOB_FACT.strip(), CHANNEL_FACT.strip(), b"hazelnuts", b"Lisbon",
           ALICE_SENDER.encode(), BOB_SENDER.encode(), ACCOUNT.encode(), GROUP_CONVERSATION.encode()]


def _activity(s: Scenario) -> None:
    s.cli("read", s.alice_session, "private/notes/allergy.md", check=True)
    s.cli("read", s.group_session, "channel/offsite.md", check=True)
    assert s.cli("read", s.alice_session, "channel/offsite.md").code == 3
    assert s.cli("read", s.group_session, "private/notes/allergy.md").code == 3
    s.cli("search", s.alice_session, "hazelnuts allergic", check=True)


def test_filters_select_rows_and_print_no_content(scenario: Scenario) -> None:
    s = scenario
    _activity(s)
    everything = s.cli.j("audit", "--limit", "10000")["rows"]
    assert len(everything) >= 7 and [r["at_us"] for r in everything] == sorted((r["at_us"] for r in everything),
                                                                                reverse=True)
    denied = s.cli.j("audit", "--decision", "deny")["rows"]
    assert len(denied) == 2 and {r["reason"] for r in denied} == {"outside-view"}
    assert {r["session_id"] for r in denied} == {s.alice_session, s.group_session}
    reads = s.cli.j("audit", "--op", "read", "--decision", "allow")["rows"]
    assert {(r["session_id"], r["operation"]) for r in reads} == {(s.alice_session, "read"), (s.group_session, "read")}
    mine = s.cli.j("audit", "--session", s.alice_session)["rows"]
    assert mine and {r["session_id"] for r in mine} == {s.alice_session}
    assert {r["operation"] for r in mine} >= {"read", "search", "append"}
    assert s.cli.j("audit", "--reason", "outside-view", "--agent", s.agent)["count"] == 2
    assert s.cli.j("audit", "--agent", "other")["count"] == 0
    assert s.cli.j("audit", "--since", "1h")["count"] == len(everything)
    assert s.cli.j("audit", "--since", "2099-01-01")["count"] == 0
    assert s.cli.j("audit", "--since", "2000-01-01T00:00:00Z")["count"] == len(everything)
    assert s.cli.j("audit", "--limit", "1")["count"] == 1
    assert set(everything[0]) == {"audit_id", "at_us", "agent_id", "session_id", "operation", "subject_kind",
                                  "actor_id", "store_id", "revision_id", "decision", "reason"}
    text = s.cli("audit", "--limit", "10000")
    assert text.code == 0 and len(text.out.splitlines()) == len(everything)
    for out in (text.out, s.cli("--json", "audit", "--limit", "10000").out):
        for secret in SECRETS:
            assert secret not in out, secret


def test_unknown_values_are_bad_input_naming_the_valid_ones_and_change_nothing(scenario: Scenario) -> None:
    s = scenario
    _activity(s)
    before = snapshot(s.cli.home)
    cases = {("--op", "frobnicate"): "valid: append", ("--decision", "maybe"): "valid: allow, deny, error",
             ("--reason", "because"): "outside-view", ("--since", "yesterday"): "duration",
             ("--since", "2026-13-45"): "date", ("--limit", "0"): "--limit", ("--session", "x"): "session"}
    for args, said in cases.items():
        for as_json in ((), ("--json",)):
            bad = s.cli(*as_json, "audit", *args)
            assert bad.code == 2, args
            assert said in bad.err and len(bad.err.strip().splitlines()) == 1, (args, bad.err)
    for command in (["audit", "prune", "--older-than", "soon"], ["audit", "prune", "--older-than", "0d", "--yes"],
                    ["audit", "impact", "--principal", "p_nobody"], ["audit", "bogus"]):
        assert s.cli(*command).code == 2, command
    assert snapshot(s.cli.home) == before


def test_audit_exposures_still_works_beside_the_query(scenario: Scenario) -> None:
    s = scenario
    _activity(s)
    found = s.cli.j("audit", "exposures", "--agent", s.agent, "--path-of", s.alice_session, "private/notes/allergy.md")
    assert {e["session_id"] for e in found["exposures"]} == {s.alice_session}


def test_impact_lists_what_a_removed_member_and_a_revoked_binding_were_exposed_to(scenario: Scenario) -> None:
    s = scenario
    _activity(s)  # the group read channel/offsite.md while Bob was a member
    s.cli("read", s.bob_session, "private/notes/allergy.md", check=True)
    s.cli.j("member", "remove", s.conversation, s.bob)
    s.cli.j("binding", "revoke", s.bob_binding)
    s.cli.j("write", s.group_session, "channel/after.md", stdin=b"written after Bob left\n")
    s.cli("read", s.group_session, "channel/after.md", check=True)  # Bob was gone: not his exposure
    found = s.cli.j("audit", "impact", "--principal", s.bob)
    by_session = {x["session_id"]: x for x in found["sessions"]}
    assert set(by_session) == {s.bob_session, s.group_session}
    assert by_session[s.bob_session]["subject_kind"] == "user" and by_session[s.bob_session]["via"] == "subject"
    assert by_session[s.bob_session]["binding_id"] == s.bob_binding
    assert by_session[s.bob_session]["until_us"] is not None  # the binding's revocation
    group = by_session[s.group_session]
    assert group["subject_kind"] == "conversation" and group["via"] == "membership"
    assert group["until_us"] is not None and group["membership_id"].startswith("m")
    revisions = _revisions(s)
    assert group["revision_ids"] == [revisions["channel/offsite.md"]]
    assert revisions["channel/after.md"] not in found["revision_ids"]
    assert set(found["revision_ids"]) == {revisions["channel/offsite.md"], revisions[("bob", "private")]}
    text = s.cli("audit", "impact", "--principal", s.bob)
    assert text.code == 0 and b"2 session(s), 2 distinct revision(s) exposed" in text.out
    for out in (text.out, s.cli("--json", "audit", "impact", "--principal", s.bob).out):
        for secret in SECRETS:
            assert secret not in out
    # Mike never saw anything.
    assert s.cli.j("audit", "impact", "--principal", s.mike1) == {"principal_id": s.mike1, "sessions": [],
                                                                  "revision_ids": [], "pruned_before_us": None}


def test_impact_counts_a_mount_read_made_just_before_the_removal(scenario: Scenario,
                                                                 mounts: Mounts) -> None:  # noqa: F811
    """A mount records its reads about once a second; each row keeps the read's own time, not the flush's,
    so a read in the last second before a member's removal stays inside the membership's window."""
    from scopefs.catalog.clock import now_us

    s = scenario
    where = mounts.mount(s.group_session)
    assert (where / "channel" / "offsite.md").read_bytes() == CHANNEL_FACT
    read_by = now_us()
    s.cli.j("member", "remove", s.conversation, s.bob)
    state = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = wait_until(lambda: state.execute("SELECT at FROM exposures WHERE session_id = ? AND run_id = 'mount'",
                                                (s.group_session,)).fetchall())
        assert len(rows) == 1 and sqlite_int(rows[0][0]) <= read_by  # the read's time, not the later flush
    finally:
        state.close()
    group = {x["session_id"]: x for x in s.cli.j("audit", "impact", "--principal", s.bob)["sessions"]}
    assert group[s.group_session]["revision_ids"] == [_revisions(s)["channel/offsite.md"]]
    mounts.umount(where)


def _revisions(s: Scenario) -> dict[object, str]:
    conn = apsw.Connection(str(s.cli.home / "agents" / s.agent / "catalog.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        out: dict[object, str] = {}
        for path, audience, revision in conn.execute(
                "SELECT r.path, st.audience_id, v.revision_id FROM resources r JOIN stores st USING (store_id)"
                " JOIN revisions v ON v.resource_id = r.resource_id AND v.state = 'active'"):
            if audience == s.conversation:
                out[f"channel/{path}"] = revision
            elif audience == s.bob:
                out[("bob", "private")] = revision
        return out
    finally:
        conn.close()


DAY_US = 86_400_000_000


def test_prune_previews_then_removes_only_what_is_older_and_records_itself(scenario: Scenario) -> None:
    s = scenario
    _activity(s)
    state = apsw.Connection(str(s.cli.home / "state.sqlite"))
    try:
        ids = [r[0] for r in state.execute("SELECT audit_id FROM audit ORDER BY audit_id")]
        old_ids, new_ids = ids[: len(ids) // 2], ids[len(ids) // 2:]
        state.execute("UPDATE audit SET at = at - 30 * ? WHERE audit_id IN (SELECT value FROM json_each(?))",
                      (DAY_US, str(old_ids)))
        row = state.execute("SELECT session_id, agent_id, revision_id, resource_id, at FROM exposures"
                            " WHERE session_id = ? LIMIT 1", (s.alice_session,)).fetchall()[0]
        insert = ("INSERT INTO exposures (receipt_id, session_id, agent_id, run_id, operation, revision_id,"
                  " resource_id, at) VALUES ('r', ?, ?, ?, 'read', ?, ?, ?)")
        state.execute(insert, (row[0], row[1], "ended-run", row[2], row[3], sqlite_int(row[4]) - 30 * DAY_US))
        state.execute(insert, (row[0], row[1], "ended-run", row[2], row[3], sqlite_int(row[4]) - 29 * DAY_US))
        # A run that began long ago and is still going: none of its rows may go.
        state.execute(insert, (row[0], row[1], "live-run", row[2], row[3], sqlite_int(row[4]) - 30 * DAY_US))
        state.execute(insert, (row[0], row[1], "live-run", row[2], row[3], row[4]))
        exposures_before = sqlite_int(state.execute("SELECT count(*) FROM exposures").fetchall()[0][0])
    finally:
        state.close()
    s.cli("session", "close", s.alice_session, check=True)  # only a closed session's runs have ended
    before = snapshot(s.cli.home)
    preview = s.cli.j("audit", "prune", "--older-than", "7d")
    assert preview["applied"] is False
    assert (preview["audit_rows"], preview["exposure_rows"]) == (len(old_ids), 2)
    assert b"would remove" in s.cli("audit", "prune", "--older-than", "7d").out
    assert snapshot(s.cli.home) == before
    done = s.cli.j("audit", "prune", "--older-than", "7d", "--yes")
    assert done["applied"] is True and (done["audit_rows"], done["exposure_rows"]) == (len(old_ids), 2)
    state = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        left = [r[0] for r in state.execute("SELECT audit_id FROM audit WHERE operation != 'audit-prune'"
                                            " ORDER BY audit_id")]
        assert left == new_ids
        runs = [r[0] for r in state.execute("SELECT run_id FROM exposures")]
        assert "ended-run" not in runs and runs.count("live-run") == 2
        assert state.execute("SELECT count(*) FROM exposures").fetchall()[0][0] == exposures_before - 2
        prune_rows = state.execute("SELECT event_id, decision, reason FROM audit WHERE operation = 'audit-prune'"
                                   ).fetchall()
        assert prune_rows == [(done["prune_id"], "allow", "allowed")]
        assert state.execute("SELECT cutoff, audit_rows, exposure_rows FROM audit_prunes").fetchall() == [
            (done["cutoff_us"], len(old_ids), 2)]
    finally:
        state.close()
    again = s.cli.j("audit", "prune", "--older-than", "7d", "--yes")
    assert (again["audit_rows"], again["exposure_rows"]) == (0, 0)
    assert s.cli.j("audit", "--op", "audit-prune")["count"] == 2


def test_prune_keeps_every_exposure_row_of_a_session_still_open_however_idle(scenario: Scenario) -> None:
    """An idle run is not an ended one: pruning its old rows would shrink its exposure revision, and a
    receipt older than a later read could then look current again."""
    import time

    from scopefs.catalog.auditlog import prune
    from scopefs.catalog.exposures import Exposed, record
    from scopefs.catalog.home import Home

    s = scenario
    _activity(s)
    seen = [Exposed(f"v_{n}", "r_note") for n in ("one", "two", "three")]  # the table holds ids only, no FK
    home = Home.open(s.cli.home)
    try:
        def run(session: str, exposed: list[Exposed]) -> int:
            return record(home, session_id=session, agent_id=s.agent, run_id="run-1", operation="read",
                          exposed=exposed, policy_revision=None).exposure_revision

        assert run(s.alice_session, seen[:2]) == 2
        assert run(s.group_session, seen[:2]) == 2
        s.cli("session", "close", s.group_session, check=True)
        time.sleep(2.2)
        preview = prune(home, "2s", apply=False)
        done = prune(home, "2s", apply=True)
        assert preview["exposure_rows"] == done["exposure_rows"]
        kept = {r[0] for r in home.state().execute("SELECT DISTINCT session_id FROM exposures")}
        assert s.alice_session in kept and s.group_session not in kept  # the closed session's idle run went
        assert run(s.alice_session, seen[2:3]) == 3  # never shrinks: the open session's run kept its rows
    finally:
        home.close()


def test_reports_built_from_the_audit_say_from_when_they_are_complete_once_pruned(scenario: Scenario) -> None:
    """Before any prune, impact and a projection's revocation look complete and are; after one, both name the
    latest cutoff (JSON and text) instead of silently counting less."""
    s = scenario
    _activity(s)
    assert s.cli.j("audit", "impact", "--principal", s.alice)["pruned_before_us"] is None
    assert "incomplete" not in s.cli("audit", "impact", "--principal", s.alice).out.decode()
    first = s.cli.j("audit", "prune", "--older-than", "30d", "--yes")["cutoff_us"]
    latest = s.cli.j("audit", "prune", "--older-than", "7d", "--yes")["cutoff_us"]
    s.cli.j("audit", "prune", "--older-than", "60d", "--yes")  # an older cutoff later: the latest still counts
    assert first < latest
    assert s.cli.j("audit", "impact", "--principal", s.alice)["pruned_before_us"] == latest
    assert "incomplete before 20" in s.cli("audit", "impact", "--principal", s.alice).out.decode()
    projection = s.cli.j("project", s.alice_session, "private/notes/allergy.md", "--to",
                         f"conversation:{s.conversation}", "--purpose", "lunch", "--no-expiry",
                         "--yes")["projection_id"]
    revoked = s.cli.j("projection", "revoke", projection)
    assert revoked["revoked"] is True and revoked["pruned_before_us"] == latest
    again = s.cli("projection", "revoke", projection).out.decode()
    assert "already revoked" in again and "incomplete before 20" in again
