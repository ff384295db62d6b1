"""Delegation (issue 16 point 8): a child session sees at most its parent's current view, inside its caps.

``scopefs session open --agent A --child-of SESSION --cap PATTERN ...``
opens a child whose view is the parent's view as of every request,
narrowed to the caps (``catalog.delegation``). Every lane is checked
through the real command line and a real mount: read, ls, search, write,
rm, and the mounted view; and the child follows its parent's evidence
(a revoked binding, a removed role membership, a closed parent) at once.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.delegation import parse_caps, restrict
from scopefs.catalog.subject import Subject, SubjectKind
from scopefs.catalog.view import RoleEvidence, memory_view
from tests.conftest import ACCOUNT, ALICE_FACT, ALICE_SENDER, CHANNEL, CHANNEL_FACT, Cli, Result, Scenario
from tests.mountkit import Mounts, catalog, errno_of, mounts, wait_until  # noqa: F401

PLAN = "private/projects/plan.md"
PLAN_TEXT = b"Project plan: ship the gadget by June (canary P1an)\n"
DIARY = "private/diary/today.md"
DIARY_TEXT = b"Diary: feeling tired today (canary D1ary)\n"
SHARED = "agent-shared/handbook.md"
SHARED_TEXT = b"Handbook: the office opens at nine (canary H4nd)\n"
ROLE_NOTE = "roles/ops/runbook.md"
ROLE_TEXT = b"Runbook: restart the pager service (canary R0le)\n"
ALLERGY = "private/notes/allergy.md"
HIDDEN = "not available in this view (no such note, or not permitted)"
# Functional bound for a mounted child to follow its parent: the mount wakes on the commit (inotify),
# typically within a tenth of a second; the margin only absorbs a loaded machine.
FOLLOW_S = 3.0


def _child(s: Scenario, parent: str, *caps: str) -> dict[str, Any]:
    args = ["session", "open", "--agent", s.agent, "--child-of", parent]
    for cap in caps:
        args += ["--cap", cap]
    return s.cli.j(*args)


def _child_id(s: Scenario, parent: str, *caps: str) -> str:
    return str(_child(s, parent, *caps)["session_id"])


def _ls(cli: Cli, session: str, path: str = "") -> list[str]:
    return [e["name"] for e in cli.j("ls", session, *([path] if path else []))["entries"]]


def _search(cli: Cli, session: str, query: str, limit: int = 10) -> list[str]:
    return [r["path"] for r in cli.j("search", session, query, "--limit", str(limit))["results"]]


def _denied(result: Result, reason: str = "outside-view") -> None:
    assert result.code == 3, (result.code, result.err)
    body = json.loads(result.out)
    assert body["reason"] == reason, body


@pytest.fixture
def world(scenario: Scenario) -> Scenario:
    """The scenario, plus notes inside and outside the caps the tests use, a role note and a shared one."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, PLAN, stdin=PLAN_TEXT)
    cli.j("write", scenario.alice_session, DIARY, stdin=DIARY_TEXT)
    cli.j("grant", "publisher", "--agent", scenario.agent, "--principal", scenario.alice, "--scope", "agent-shared")
    cli.j("write", scenario.alice_session, "private/drafts/handbook.md", stdin=SHARED_TEXT)
    cli.j("publish", scenario.alice_session, "private/drafts/handbook.md", "--to", "agent-shared",
          "--as", "handbook.md", "--yes")
    cli.j("role", "add", "ops")
    cli.j("member", "add", "role:ops", scenario.alice, "--expires", "7d")
    cli.j("grant", "publisher", "--agent", scenario.agent, "--principal", scenario.alice, "--scope", "role:ops")
    cli.j("write", scenario.alice_session, "private/drafts/runbook.md", stdin=ROLE_TEXT)
    cli.j("publish", scenario.alice_session, "private/drafts/runbook.md", "--to", "role:ops",
          "--as", "runbook.md", "--yes")
    assert cli("read", scenario.alice_session, ROLE_NOTE, check=True).out == ROLE_TEXT
    return scenario


# -- the pure narrowing ---------------------------------------------------------------

_NAMES = st.sampled_from(["private", "projects", "agent-shared", "roles", "ops", "hr", "channel", "postbox",
                          "projections", "x"])
_PATHS = st.lists(_NAMES, min_size=1, max_size=4).map(tuple)


@settings(max_examples=300, deadline=None)
@given(first=st.lists(_PATHS, min_size=1, max_size=4), second=st.lists(_PATHS, min_size=1, max_size=4),
       probes=st.lists(_PATHS, min_size=1, max_size=20))
def test_restrict_is_never_wider_and_composes(first: list[tuple[str, ...]], second: list[tuple[str, ...]],
                                              probes: list[tuple[str, ...]]) -> None:
    """What a child resolves, its parent resolves to the same mount; a child of a child is bounded by both."""
    parent = memory_view(Subject(SubjectKind.USER, "p_alice"), [RoleEvidence("r_ops", "ops", None)], 0)
    child = restrict(parent, first)
    grandchild = restrict(child, second)
    assert set(child.mounts) <= set(parent.mounts) and set(grandchild.mounts) <= set(child.mounts)
    for parts in probes:
        found = grandchild.mount_for(parts)
        if found is not None:
            assert child.mount_for(parts) == found == parent.mount_for(parts)
            assert any(parts[:len(c)] == c and len(parts) > len(c) for c in first)
            assert any(parts[:len(c)] == c and len(parts) > len(c) for c in second)
        if child.mount_for(parts) is None:
            assert grandchild.mount_for(parts) is None
    for root in grandchild.roots():
        assert parent.mount_for(tuple(root.split("/")) + ("n.md",)) is not None


def test_parse_caps_is_canonical() -> None:
    assert parse_caps(["private/projects/**", "private/projects/a", "agent-shared", "agent-shared/**"]) == (
        "agent-shared", "private/projects")


# -- opening ------------------------------------------------------------------------

def test_open_child_output_and_subject_copied(world: Scenario) -> None:
    s = world
    child = _child(s, s.alice_session, "private/projects/**", "agent-shared", "private/projects/sub")
    assert child["parent_session_id"] == s.alice_session
    assert child["caps"] == ["agent-shared", "private/projects"]  # canonical: '/**' dropped, covered caps folded
    assert child["subject"] == "user" and child["subject_principal_id"] == s.alice
    assert child["subject_reason"] is None
    assert child["session_id"] != s.alice_session
    # The stored rows: the child's subject is its parent's, and the delegation is written once.
    with catalog(s.cli.home) as conn:
        rows = conn.execute("SELECT session_id, subject_kind, subject_principal_id, binding_id FROM sessions"
                            " WHERE session_id IN (?, ?)", (s.alice_session, child["session_id"])).fetchall()
        assert len({tuple(r[1:]) for r in rows}) == 1
        for sql in ("UPDATE session_delegations SET caps = '[\"private\"]'",
                    "UPDATE session_delegations SET parent_session_id = session_id",
                    "DELETE FROM session_delegations",
                    f"INSERT INTO session_delegations VALUES ('{child['session_id']}', '{s.agent}',"
                    f" '{s.bob_session}', '[\"private\"]', 1)",
                    # a session that already has a child never becomes one (no cycle can be made)
                    f"INSERT INTO session_delegations VALUES ('{s.alice_session}', '{s.agent}',"
                    f" '{child['session_id']}', '[\"private\"]', 1)"):
            with pytest.raises(apsw.Error):
                conn.execute(sql)


@pytest.mark.parametrize("argv, why", [
    (["--child-of", "{alice}"], "--cap"),
    (["--cap", "private"], "--child-of"),
    (["--child-of", "{alice}", "--cap", "../private"], "invalid path"),
    (["--child-of", "{alice}", "--cap", "private/.."], "invalid path"),
    (["--child-of", "{alice}", "--cap", "/private"], "invalid path"),
    (["--child-of", "{alice}", "--cap", ""], "invalid path"),
    (["--child-of", "{alice}", "--cap", "private/*"], "wildcards"),
    (["--child-of", "{alice}", "--cap", "private/**/x"], "wildcards"),
    (["--child-of", "{alice}", "--cap", "priv[a]te"], "wildcards"),
    (["--child-of", "{alice}", "--dm", "--cap", "private"], "only --agent and --cap"),
    (["--child-of", "{alice}", "--key", "k1", "--cap", "private"], "only --agent and --cap"),
    (["--child-of", "s_aaaaaaaaaaaaaaaaaaaaaaaaaa", "--cap", "private"], "unknown session"),
    (["--child-of", "not-a-session", "--cap", "private"], "unknown session"),
])
def test_bad_child_openings_are_bad_input(world: Scenario, argv: list[str], why: str) -> None:
    s = world
    args = [a.replace("{alice}", s.alice_session) for a in argv]
    result = s.cli("--json", "session", "open", "--agent", s.agent, *args)
    assert result.code == 2, (result.code, result.err)
    assert why in result.err


def test_too_many_caps_and_too_deep_chains_are_refused(world: Scenario) -> None:
    s = world
    caps = [f"private/c{i}" for i in range(33)]
    args = ["session", "open", "--agent", s.agent, "--child-of", s.alice_session]
    for cap in caps:
        args += ["--cap", cap]
    assert s.cli(*args).code == 2
    chain = [s.alice_session]
    for _ in range(8):
        chain.append(_child_id(s, chain[-1], "private"))
    assert s.cli("read", chain[-1], ALLERGY, check=True).out == ALICE_FACT  # 8 levels: still bounded, still works
    result = s.cli("session", "open", "--agent", s.agent, "--child-of", chain[-1], "--cap", "private")
    assert result.code == 2 and "at most 8" in result.err


def test_a_child_whose_parent_cannot_be_found_fails_closed(world: Scenario) -> None:
    """A parent the broker cannot load (its index row lost, say) leaves the child nothing."""
    s = world
    child = _child_id(s, s.alice_session, "private")
    conn = apsw.Connection(str(s.cli.home / "state.sqlite"))
    try:
        conn.execute("DELETE FROM session_index WHERE session_id = ?", (s.alice_session,))
    finally:
        conn.close()
    _denied(s.cli("--json", "read", child, ALLERGY), "invalid-context")
    _denied(s.cli("--json", "ls", child), "invalid-context")
    assert s.cli("session", "open", "--agent", s.agent, "--child-of", s.alice_session, "--cap", "private").code == 2


def test_another_agents_session_cannot_be_a_parent(world: Scenario) -> None:
    s = world
    s.cli.j("agent", "add", "other")
    result = s.cli("session", "open", "--agent", "other", "--child-of", s.alice_session, "--cap", "private")
    assert result.code == 2 and "unknown session" in result.err


# -- what a child sees ---------------------------------------------------------------

def test_child_sees_only_capped_paths_cli(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private/projects")
    assert _ls(s.cli, child) == ["private"]
    assert _ls(s.cli, child, "private") == ["projects"]
    assert _ls(s.cli, child, "private/projects") == ["plan.md"]
    assert s.cli("read", child, PLAN, check=True).out == PLAN_TEXT
    for path in (ALLERGY, DIARY, SHARED, ROLE_NOTE, "private/projects", "private/nothing/here.md"):
        result = s.cli("--json", "read", child, path)
        _denied(result)
        assert HIDDEN in result.err
    for folder in ("private/notes", "private/diary", "agent-shared", "roles", "roles/ops", "postbox"):
        _denied(s.cli("--json", "ls", child, folder))
    # Search: only what the caps let in, however well the rest matches.
    assert _search(s.cli, s.alice_session, "canary")  # the parent finds several notes
    assert _search(s.cli, child, "canary") == [PLAN]
    assert set(_search(s.cli, child, "diary feeling tired today")) <= {PLAN}
    assert set(_search(s.cli, child, "allergic to hazelnuts")) <= {PLAN}


def test_a_whole_root_cap_and_a_cap_above_roots(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "agent-shared/**", "roles")
    assert _ls(s.cli, child) == ["agent-shared", "roles"]
    assert _ls(s.cli, child, "roles") == ["ops"]
    assert s.cli("read", child, SHARED, check=True).out == SHARED_TEXT
    assert s.cli("read", child, ROLE_NOTE, check=True).out == ROLE_TEXT
    _denied(s.cli("--json", "read", child, PLAN))
    assert sorted(_search(s.cli, child, "canary")) == sorted([SHARED, ROLE_NOTE])


def test_child_never_sees_more_than_parent(world: Scenario) -> None:
    """Caps naming another subject's roots, or nothing at all, grant nothing and tell nothing."""
    s = world
    foreign = _child_id(s, s.alice_session, "channel", "pools/team", "roles/finance", "private/projects")
    nothing = _child_id(s, s.alice_session, "zzz-none", "nope/nothing", "private/projects")
    for child in (foreign, nothing):
        assert _ls(s.cli, child) == ["private"]
        _denied(s.cli("--json", "read", child, "channel/offsite.md"))
        _denied(s.cli("--json", "ls", child, "channel"))
        assert _search(s.cli, child, "offsite Lisbon team") == []
    # The same answers whether a root exists for someone else or for nobody.
    a = s.cli("--json", "read", foreign, "channel/offsite.md")
    b = s.cli("--json", "read", nothing, "zzz-none/offsite.md")
    assert (a.code, a.out, a.err) == (b.code, b.out, b.err)
    # A group's child with a cap naming private/ sees nobody's private store.
    group_child = _child_id(s, s.group_session, "private", "channel")
    assert _ls(s.cli, group_child) == ["channel"]
    assert s.cli("read", group_child, "channel/offsite.md", check=True).out == CHANNEL_FACT
    _denied(s.cli("--json", "read", group_child, ALLERGY))
    assert _search(s.cli, group_child, "allergic hazelnuts peanuts") == []
    # Bob's child sees Bob's notes only, even capped to the same folders as Alice's.
    bob_child = _child_id(s, s.bob_session, "private")
    assert s.cli("read", bob_child, ALLERGY, check=True).out != ALICE_FACT
    _denied(s.cli("--json", "read", bob_child, PLAN))


def test_search_outside_caps_never_displaces_allowed_results(world: Scenario) -> None:
    s = world
    for i in range(40):  # better matches than the capped note, outside the caps
        s.cli.j("write", s.alice_session, f"private/diary/d{i:02d}.md",
                stdin=b"gadget gadget gadget June gadget ship ship " + str(i).encode() + b"\n")
    child = _child_id(s, s.alice_session, "private/projects")
    parent_top = _search(s.cli, s.alice_session, "ship gadget June", limit=3)
    assert any(p.startswith("private/diary/") for p in parent_top), parent_top  # they do outrank it
    assert _search(s.cli, child, "ship gadget June", limit=1) == [PLAN]
    assert _search(s.cli, child, "ship gadget June", limit=10) == [PLAN]


# -- writes ------------------------------------------------------------------------

def test_child_writes_only_inside_caps(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private/projects", "agent-shared")
    made = s.cli.j("write", child, "private/projects/new/idea.md", stdin=b"an idea\n")
    assert made["created"]
    assert s.cli("read", s.alice_session, "private/projects/new/idea.md", check=True).out == b"an idea\n"
    s.cli.j("write", child, PLAN, stdin=b"plan v2\n")
    assert s.cli("read", s.alice_session, PLAN, check=True).out == b"plan v2\n"
    _denied(s.cli("--json", "write", child, "private/elsewhere.md", stdin=b"x\n"))
    _denied(s.cli("--json", "write", child, ALLERGY, stdin=b"x\n"))
    _denied(s.cli("--json", "write", child, "private/projects", stdin=b"x\n"))  # the cap's own folder
    # agent-shared is read-only for the parent: a cap does not make it writable.
    _denied(s.cli("--json", "write", child, "agent-shared/x.md", stdin=b"x\n"), "default-deny")
    _denied(s.cli("--json", "rm", child, ALLERGY))
    assert s.cli("read", s.alice_session, ALLERGY, check=True).out == ALICE_FACT
    s.cli.j("rm", child, "private/projects/new/idea.md")
    _denied(s.cli("--json", "read", s.alice_session, "private/projects/new/idea.md"))
    # No copy outside its view: publishing (the parent holds a grant) is refused.
    _denied(s.cli("--json", "publish", child, PLAN, "--to", "agent-shared", "--as", "leak.md", "--yes"),
            "default-deny")
    _denied(s.cli("--json", "read", s.alice_session, "agent-shared/leak.md"))
    _denied(s.cli("--json", "project", child, PLAN, "--to", "agent-shared", "--purpose", "leak", "--no-expiry",
                  "--as", "leak.md", "--yes"), "default-deny")
    _denied(s.cli("--json", "read", s.alice_session, "projections/agent-shared/leak.md"))
    # Nor does it review the postbox its caps leave out (the owner's DM session does).
    _denied(s.cli("--json", "postbox", "list", child))  # as if it had no postbox/
    # A read-only parent root stays read-only below a cap too (a role store).
    role_child = _child_id(s, s.alice_session, "roles/ops")
    _denied(s.cli("--json", "write", role_child, "roles/ops/new.md", stdin=b"x\n"), "default-deny")


def test_group_child_deposits_only_with_a_postbox_cap(world: Scenario) -> None:
    s = world
    s.cli.j("postbox", "enable", s.alice, "--mode", "review")
    note = b"a deposit from a delegated run (canary D3p0)\n"
    message = ["--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER]
    no_postbox = _child_id(s, s.group_session, "channel")
    _denied(s.cli("--json", "message", "add", no_postbox, *message))  # its view has no postbox/
    handle = s.cli.j("message", "add", s.group_session, *message)["message_handle"]
    assert s.cli("deposit", no_postbox, handle, stdin=note).code == 3  # nor with its parent's handle
    with_postbox = _child_id(s, s.group_session, "postbox")
    handle = s.cli.j("message", "add", with_postbox, *message)["message_handle"]
    s.cli("deposit", with_postbox, handle, stdin=note, check=True)
    # Exactly one deposit arrived, reviewed by its owner's own DM session, not by any child of it.
    pending = s.cli.j("postbox", "list", s.alice_session)
    assert len(pending["pending"]) == 1, pending
    owner_child = _child_id(s, s.alice_session, "postbox", "private")
    assert s.cli.j("postbox", "list", owner_child)["pending"] == pending["pending"]  # reading its cap
    item = pending["pending"][0]["item_id"]
    _denied(s.cli("--json", "postbox", "approve", owner_child, item), "default-deny")
    _denied(s.cli("--json", "postbox", "reject", owner_child, item), "default-deny")


# -- following the parent ------------------------------------------------------------

def _lose(s: Scenario, how: str) -> None:
    if how == "binding-revoked":
        s.cli.j("binding", "revoke", s.alice_binding)
    elif how == "parent-closed":
        s.cli.j("session", "close", s.alice_session)
    else:
        s.cli.j("member", "remove", "role:ops", s.alice)


_LOST = {"binding-revoked": "identity-revoked", "parent-closed": "invalid-context",
         "membership-removed": "outside-view"}


@pytest.mark.parametrize("how", sorted(_LOST))
def test_child_loses_access_when_parent_does(world: Scenario, how: str) -> None:
    s = world
    child = _child_id(s, s.alice_session, "roles/ops", "private/projects")
    grandchild = _child_id(s, child, "roles")
    for session in (child, grandchild):
        assert s.cli("read", session, ROLE_NOTE, check=True).out == ROLE_TEXT
    _lose(s, how)
    for session in (child, grandchild):
        _denied(s.cli("--json", "read", session, ROLE_NOTE), _LOST[how])
        if how == "membership-removed":
            assert ROLE_NOTE not in _search(s.cli, session, "restart the pager service")
        else:
            _denied(s.cli("--json", "search", session, "restart the pager service"), _LOST[how])
    if how == "membership-removed":  # the rest of the view stays, the role is gone from it
        assert s.cli("read", child, PLAN, check=True).out == PLAN_TEXT
        assert _ls(s.cli, child) == ["private"]
        assert _ls(s.cli, grandchild) == []
        # evidence again: the current membership counts (the spec's "current membership state")
        s.cli.j("member", "add", "role:ops", s.alice, "--expires", "7d")
        assert s.cli("read", grandchild, ROLE_NOTE, check=True).out == ROLE_TEXT
    else:
        _denied(s.cli("--json", "read", child, PLAN), _LOST[how])
        _denied(s.cli("--json", "ls", child), _LOST[how])
        _denied(s.cli("--json", "write", child, "private/projects/x.md", stdin=b"x\n"), _LOST[how])
        # and no new child can be opened under a parent that lost its evidence
        _denied(s.cli("--json", "session", "open", "--agent", s.agent, "--child-of", s.alice_session,
                      "--cap", "private"), _LOST[how])


def test_stored_child_id_stays_denied_after_revocation(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private")
    assert s.cli("read", child, ALLERGY, check=True).out == ALICE_FACT
    s.cli.j("binding", "revoke", s.alice_binding)
    # Alice is bound again and opens a new session: the old child id does not come back to life.
    s.cli.j("bind", s.alice, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER)
    fresh = s.cli.j("session", "open", "--agent", s.agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                    "--sender", ALICE_SENDER)["session_id"]
    assert s.cli("read", fresh, ALLERGY, check=True).out == ALICE_FACT
    for argv in (["read", child, ALLERGY], ["ls", child], ["search", child, "hazelnuts"],
                 ["write", child, "private/x.md"]):
        _denied(s.cli("--json", *argv, stdin=b"x\n"), "identity-revoked")
    where = s.cli.home.parent / "m"
    where.mkdir()
    assert s.cli("mount", child, str(where)).code == 3
    assert os.listdir(where) == []
    # A child of the new session works; the old one still does not.
    assert s.cli("read", _child_id(s, fresh, "private"), ALLERGY, check=True).out == ALICE_FACT
    _denied(s.cli("--json", "read", child, ALLERGY), "identity-revoked")


def test_closing_a_child_leaves_its_parent_alone(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private")
    grandchild = _child_id(s, child, "private/projects")
    s.cli.j("session", "close", grandchild)
    _denied(s.cli("--json", "read", grandchild, PLAN), "invalid-context")
    assert s.cli("read", child, PLAN, check=True).out == PLAN_TEXT
    s.cli.j("session", "close", child)
    _denied(s.cli("--json", "read", child, PLAN), "invalid-context")
    assert s.cli("read", s.alice_session, PLAN, check=True).out == PLAN_TEXT


def test_child_of_child_is_bounded_by_both(world: Scenario) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private/projects", "agent-shared")
    wider = _child_id(s, child, "private", "roles", "agent-shared/**")  # asks for more than its parent has
    assert _ls(s.cli, wider) == ["agent-shared", "private"]
    assert _ls(s.cli, wider, "private") == ["projects"]
    assert s.cli("read", wider, PLAN, check=True).out == PLAN_TEXT
    assert s.cli("read", wider, SHARED, check=True).out == SHARED_TEXT
    for path in (ALLERGY, DIARY, ROLE_NOTE):
        _denied(s.cli("--json", "read", wider, path))
    assert sorted(_search(s.cli, wider, "canary")) == sorted([PLAN, SHARED])
    narrower = _child_id(s, child, "private/projects/none", "agent-shared")
    assert _ls(s.cli, narrower) == ["agent-shared", "private"]
    _denied(s.cli("--json", "read", narrower, PLAN))
    # The middle one closed: everything below it goes, the top stays.
    s.cli.j("session", "close", child)
    _denied(s.cli("--json", "read", wider, SHARED), "invalid-context")
    assert s.cli("read", s.alice_session, SHARED, check=True).out == SHARED_TEXT


# -- a real mount --------------------------------------------------------------------

def _grep(root: Path, word: str) -> list[str]:
    proc = subprocess.run(["grep", "-rl", word, str(root)], capture_output=True, timeout=30)
    return sorted(str(Path(p).relative_to(root)) for p in proc.stdout.decode().split())


def test_mounted_child_view(world: Scenario, mounts: Mounts) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private/projects", "agent-shared")
    view = mounts.mount(child)
    assert sorted(os.listdir(view)) == ["agent-shared", "private"]
    assert os.listdir(view / "private") == ["projects"]
    assert (view / PLAN).read_bytes() == PLAN_TEXT
    assert (view / SHARED).read_bytes() == SHARED_TEXT
    for path in (ALLERGY, DIARY, ROLE_NOTE, "private/notes", "roles", "postbox", "projections"):
        assert errno_of(functools.partial(os.stat, view / path)) == errno.ENOENT, path
    assert _grep(view, "canary") == sorted([PLAN, SHARED])
    # Writes: inside the caps they commit (the parent sees them); elsewhere they are refused.
    (view / "private/projects/idea.md").write_bytes(b"made in the child's mount\n")
    wait_until(lambda: s.cli("read", s.alice_session, "private/projects/idea.md").out
               == b"made in the child's mount\n", timeout=10.0)
    for path in ("private/elsewhere.md", "agent-shared/x.md"):
        assert errno_of(functools.partial((view / path).write_bytes, b"x")) in (errno.EROFS, errno.EACCES), path
    assert errno_of(lambda: os.mkdir(view / "private" / "other")) in (errno.EROFS, errno.EACCES)
    # A note the parent writes outside the caps never appears; one inside does.
    s.cli.j("write", s.alice_session, "private/diary/later.md", stdin=b"later canary\n")
    s.cli.j("write", s.alice_session, "private/projects/later.md", stdin=b"later canary\n")
    wait_until(lambda: (view / "private/projects/later.md").exists(), timeout=10.0)
    assert os.listdir(view / "private") == ["projects"]
    assert _grep(view, "later") == ["private/projects/later.md"]


@pytest.mark.parametrize("how", sorted(_LOST))
def test_mounted_child_loses_access_with_parent(world: Scenario, mounts: Mounts, how: str) -> None:
    s = world
    child = _child_id(s, s.alice_session, "roles/ops", "private/projects")
    view = mounts.mount(child)
    assert sorted(os.listdir(view)) == ["private", "roles"]
    assert (view / ROLE_NOTE).read_bytes() == ROLE_TEXT
    with open(view / ROLE_NOTE, "rb") as held:
        _lose(s, how)
        wait_until(lambda: errno_of(lambda: os.stat(view / ROLE_NOTE)) == errno.ENOENT, timeout=FOLLOW_S)
        assert "roles" not in os.listdir(view)
        assert errno_of(lambda: os.pread(held.fileno(), 4096, 0)) in (errno.EACCES, errno.EIO)
    if how == "membership-removed":
        assert os.listdir(view) == ["private"]
        assert (view / PLAN).read_bytes() == PLAN_TEXT
    else:
        wait_until(lambda: os.listdir(view) == [], timeout=FOLLOW_S)
        assert errno_of(lambda: (view / PLAN).read_bytes()) == errno.ENOENT


def test_child_mount_is_refused_when_the_parent_is_closed(world: Scenario, tmp_path: Path) -> None:
    s = world
    child = _child_id(s, s.alice_session, "private")
    s.cli.j("session", "close", s.alice_session)
    where = tmp_path / "m"
    where.mkdir()
    result = s.cli("--json", "mount", child, str(where))
    _denied(result, "invalid-context")
    assert os.listdir(where) == []
