"""``scopefs explain``: why a path is writable, read-only, or not there, and nothing about what is hidden.

The verdict must be the evaluator's (the same decision a read, a write and
a mounted view make), and anything the session may not see must be
explained byte for byte like a path that never existed, in text and in
JSON, with the same exit code.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.explain import explain
from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from tests.conftest import ALICE_FACT, BOB_FACT, CHANNEL_FACT, Cli, Scenario, snapshot


def _both(s: Scenario, session: str, path: str) -> tuple[tuple[int, bytes, str], tuple[int, bytes, str]]:
    text = s.cli("explain", session, path)
    as_json = s.cli("--json", "explain", session, path)
    return (text.code, text.out, text.err), (as_json.code, as_json.out, as_json.err)


def test_verdicts_name_subject_store_rule_and_evidence(scenario: Scenario) -> None:
    s = scenario
    mine = s.cli.j("explain", s.alice_session, "private/notes/allergy.md")
    assert mine["verdict"] == "writable" and mine["kind"] == "note"
    assert mine["subject_kind"] == "user" and mine["store_kind"] == "user" and mine["mount_root"] == "private"
    assert mine["read_rule"].startswith("placement") and mine["write_rule"].startswith("placement")
    assert mine["revision"]["revision_no"] == 1 and mine["revision"]["valid_until_us"] is None
    binding = [e for e in mine["evidence"] if e["kind"] == "binding"]
    assert binding == [{"kind": "binding", "binding_id": s.alice_binding, "evidence_revision": 1,
                        "created_at_us": binding[0]["created_at_us"], "expires_at_us": None}]
    shared = s.cli.j("explain", s.alice_session, "agent-shared")
    assert shared["verdict"] == "read-only" and shared["kind"] == "folder"
    group = s.cli.j("explain", s.group_session, "channel/offsite.md")
    assert group["verdict"] == "writable" and group["subject_kind"] == "conversation"
    assert group["store_kind"] == "channel"
    assert {"kind": "conversation", "conversation_id": s.conversation, "expires_at_us": None} in group["evidence"]
    folder = s.cli.j("explain", s.alice_session, "private/notes")
    assert folder["verdict"] == "writable" and folder["kind"] == "folder"
    text = s.cli("explain", s.alice_session, "private/notes/allergy.md")
    assert text.code == 0 and text.out.startswith(b"private/notes/allergy.md: writable (note)\n")
    # No content: explain never opens an artifact, and prints none.
    for out in (text.out, s.cli("--json", "explain", s.alice_session, "private/notes/allergy.md").out):
        assert ALICE_FACT.strip() not in out and b"hazelnuts" not in out


def test_a_role_note_is_read_only_with_its_membership_and_expiry(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("role", "add", "eng")
    s.cli.j("member", "add", "role:eng", s.alice, "--expires", "2d")
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "role:eng")
    s.cli.j("write", s.alice_session, "private/runbook.md", stdin=b"restart the queue\n")
    s.cli.j("publish", s.alice_session, "private/runbook.md", "--to", "role:eng", "--yes")
    found = s.cli.j("explain", s.alice_session, "roles/eng/runbook.md")
    assert found["verdict"] == "read-only" and found["store_kind"] == "role"
    assert found["write_reason"] == "default-deny"
    membership = [e for e in found["evidence"] if e["kind"] == "membership"]
    assert len(membership) == 1 and membership[0]["expires_at_us"] is not None
    assert membership[0]["evidence_revision"] == 1
    # Bob is no member: for him the role's note is exactly a path that never existed.
    assert _both(s, s.bob_session, "roles/eng/runbook.md") == _both(s, s.bob_session, "roles/eng/never.md")
    s.cli.j("member", "remove", "role:eng", s.alice)
    assert _both(s, s.alice_session, "roles/eng/runbook.md") == _both(s, s.alice_session, "private/never.md")


def test_whatever_the_session_may_not_see_reads_exactly_like_a_missing_path(scenario: Scenario) -> None:
    s = scenario
    a = s.alice_session
    s.cli.j("write", a, "private/gone.md", stdin=b"soon removed\n")
    s.cli.j("rm", a, "private/gone.md")
    s.cli.j("write", a, "private/notes/stale.md", "--valid-until", "2020-01-01", stdin=b"expired fact\n")
    s.cli.j("write", a, "private/source.md", stdin=b"a source\n")
    s.cli.j("derive", a, "--from", "private/source.md", "--to", "private/summary.md", stdin=b"its summary\n")
    assert s.cli.j("explain", a, "private/summary.md")["verdict"] == "writable"
    s.cli.j("rm", a, "private/source.md")  # the summary is now held by its lineage: denied to every reader
    assert s.cli("read", a, "private/summary.md").code == 3
    missing = _both(s, a, "private/never/existed.md")
    text, as_json = missing
    assert text[0] == 0 and text[1] == b"absent: not in this session's view (no such note, or not permitted)\n"
    assert as_json[0] == 0
    hidden = ["private/gone.md",  # tombstoned
              "private/notes/stale.md",  # past its valid-until
              "private/summary.md",  # held by its lineage (lineage-deny)
              "channel/offsite.md",  # another scope's store
              "roles/eng/x.md", "projections/channel/x.md", "postbox/x.md", "agent/x.md"]
    for path in hidden:
        assert _both(s, a, path) == missing, path
    # From the group: a member's private note, by its real path.
    assert _both(s, s.group_session, "private/notes/allergy.md") == _both(s, s.group_session, "private/none.md")
    assert _both(s, s.group_session, "channel/nothing.md") == _both(s, s.group_session, "private/notes/allergy.md")
    for out in (text[1], as_json[1]):
        for secret in (BOB_FACT, CHANNEL_FACT, b"offsite", b"stale", b"gone"):
            assert secret.strip() not in out


def test_a_session_whose_evidence_is_gone_gets_one_answer_for_every_path(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("binding", "revoke", s.alice_binding)
    real = s.cli.j("explain", s.alice_session, "private/notes/allergy.md")
    assert real == {"session_id": s.alice_session, "subject_kind": "user", "verdict": "denied",
                    "reason": "identity-revoked"}
    assert _both(s, s.alice_session, "private/notes/allergy.md") == _both(s, s.alice_session, "private/nope.md")


def test_explain_changes_nothing_and_rejects_bad_input(scenario: Scenario) -> None:
    s = scenario
    before = snapshot(s.cli.home)
    s.cli.j("explain", s.alice_session, "private/notes/allergy.md")
    s.cli.j("explain", s.alice_session, "channel/offsite.md")
    for args in (["explain", s.alice_session, "../etc/passwd"], ["explain", s.alice_session, "/abs"],
                 ["explain", "s_" + "a" * 26, "private/x.md"], ["explain", "nonsense", "private/x.md"]):
        bad = s.cli(*args)
        assert bad.code == 2 and bad.out == b"" and len(bad.err.strip().splitlines()) == 1, args
    assert snapshot(s.cli.home) == before  # not even an audit row: explain exposes nothing


def test_folders_above_the_view_roots_are_folders_as_ls_shows_them(scenario: Scenario) -> None:
    """``roles/``, ``projections/`` and a child's ``private/`` above its cap are listed by the session's own
    ``ls``: explain calls each a read-only folder, and for a session without such a root they stay absent."""
    s = scenario
    s.cli.j("role", "add", "eng")
    s.cli.j("member", "add", "role:eng", s.alice)
    child = s.cli.j("session", "open", "--agent", s.agent, "--child-of", s.alice_session,
                    "--cap", "private/notes/**")["session_id"]

    def ls(session: str, path: str = "") -> list[str]:
        return [e["name"] for e in s.cli.j("ls", session, *([path] if path else []))["entries"]]

    assert "roles" in ls(s.alice_session) and ls(child) == ["private"] and ls(child, "private") == ["notes"]
    for session, path in ((s.alice_session, "roles"), (child, "private")):
        found = s.cli.j("explain", session, path)
        assert (found["verdict"], found["kind"], found["path"]) == ("read-only", "folder", path), found
        text = s.cli("explain", session, path)
        assert text.code == 0 and text.out.startswith(f"{path}: read-only (folder)\n".encode())
    assert s.cli.j("explain", child, "private/notes")["kind"] == "folder"
    # Every folder each session's ls shows at the top is one explain knows.
    for session in (s.alice_session, s.bob_session, s.group_session, child):
        for name in ls(session):
            assert s.cli.j("explain", session, name)["kind"] == "folder", (session, name)
    # Bob has no role: for him roles/ is exactly a path that never existed.
    assert "roles" not in ls(s.bob_session)
    assert _both(s, s.bob_session, "roles") == _both(s, s.bob_session, "private/never.md")
    assert _both(s, child, "agent") == _both(s, child, "private/never.md")  # outside the cap
    # The mount's own .search and .history folders are out of explain's scope (documented): absent.
    for name in (".search", ".history"):
        assert _both(s, s.alice_session, name) == _both(s, s.alice_session, "private/never.md")


# -- the verdict is the view's -------------------------------------------------

_NAMES = st.sampled_from(["notes/allergy.md", "offsite.md", "notes", "runbook.md", "never.md", "notes/never.md",
                          "gone.md", "stale.md", ""])
_ROOTS = st.sampled_from(["private", "channel", "agent-shared", "roles/eng", "postbox", "projections/channel",
                          "agent", "roles", "projections"])


@settings(max_examples=60, deadline=None)
@given(root=_ROOTS, name=_NAMES, who=st.sampled_from(["alice", "bob", "group"]))
def test_explain_agrees_with_the_mounted_picture(prepared: tuple[Scenario, Path], root: str, name: str,
                                                 who: str) -> None:
    """For random paths, explain says a note is there exactly when the mount's picture shows it."""
    s, home_path = prepared
    session = {"alice": s.alice_session, "bob": s.bob_session, "group": s.group_session}[who]
    home = Home.open(home_path)
    try:
        path = f"{root}/{name}".rstrip("/")
        found = explain(home, session, path)
        picture = build(home, session)
        parts = tuple(path.split("/"))
        shown_note = parts in picture.notes
        roots = {tuple(r.split("/")) for r in picture.access.view.roots()}
        shown_folder = any(r[: len(parts)] == parts for r in roots) or any(  # a root, or a folder above one
            n[: len(parts)] == parts and len(n) > len(parts) for n in picture.notes)
        if shown_note:
            assert found.verdict in ("writable", "read-only") and found.kind == "note"
        elif shown_folder:
            assert found.verdict in ("writable", "read-only", "deposit-only") and found.kind == "folder"
        else:
            assert found.verdict == "absent"
            assert found.as_dict() == {"session_id": session, "subject_kind": found.subject_kind,
                                       "verdict": "absent", "reason": "outside-view"}
    finally:
        home.close()


@pytest.fixture(scope="module")
def prepared(scenario_template: Scenario, tmp_path_factory: pytest.TempPathFactory) -> tuple[Scenario, Path]:
    """The scenario with a role note, a tombstone and an expired note (built once for the property test)."""
    home = tmp_path_factory.mktemp("explain") / "home"
    shutil.copytree(scenario_template.cli.home, home, symlinks=True)
    s = dataclasses.replace(scenario_template, cli=Cli(home))
    s.cli.j("role", "add", "eng")
    s.cli.j("member", "add", "role:eng", s.alice)
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "role:eng")
    s.cli.j("write", s.alice_session, "private/runbook.md", stdin=b"restart the queue\n")
    s.cli.j("publish", s.alice_session, "private/runbook.md", "--to", "role:eng", "--yes")
    s.cli.j("write", s.alice_session, "private/gone.md", stdin=b"soon removed\n")
    s.cli.j("rm", s.alice_session, "private/gone.md")
    s.cli.j("write", s.bob_session, "private/stale.md", "--valid-until", "2020-01-01", stdin=b"old\n")
    return s, home
