"""Migration from the OpenClaw layout: structural classification, a reviewed plan, a verified cutover.

Real homes (the seed's scenario: Alice, Bob, two Mikes, one group), a real
legacy tree built the way OpenClaw writes it (``tests.migratekit``), the
installed ``scopefs`` command, real SQLite. The originals are compared by a
digest of every byte, mode and mtime before and after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pty
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog.home import Home
from scopefs.writer import legacy
from scopefs.writer.classify import classify, parse_session_key
from tests.conftest import (
    ACCOUNT,
    ALICE_SENDER,
    BOB_SENDER,
    CHANNEL,
    SCOPEFS,
    Scenario,
    db_copy,
    diff_snapshots,
    run_readme_example,
    snapshot,
)
from tests.crashkit import catalog_path
from tests.migratekit import (
    ALICE_TRANSCRIPT,
    CANARIES,
    CAROL_SENDER,
    DAILY,
    DEEP,
    DREAMS_KEPT,
    HANDBOOK,
    LIGHT,
    MEMORY,
    REM,
    USER,
    build_layout,
    tree_hash,
)

SHARED = "reference/handbook.md"

PRIVATE_EXPECTED = {
    "workspace/USER.md": ("private/USER.md", USER),
    "workspace/MEMORY.md": ("private/MEMORY.md", MEMORY),
    "workspace/DREAMS.md": ("private/DREAMS.md", DREAMS_KEPT),
    "workspace/memory/2026-11-30.md": ("private/memory/2026-11-30.md", DAILY),
    "state/agents/main/sessions/s-alice.jsonl": ("private/transcripts/s-alice.jsonl", ALICE_TRANSCRIPT),
}


def _args(s: Scenario, ws: Path, state: Path, *extra: str, owner: bool = True) -> list[str]:
    args = ["migrate", "--agent", s.agent, "--workspace", str(ws), "--state-dir", str(state), "--shared", SHARED]
    return args + (["--owner", s.alice] if owner else []) + list(extra)


def _by_source(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["source"] + (f"#{i['part']}" if i["part"] else ""): i for i in report["items"]}


def _rows(s: Scenario, sql: str) -> list[tuple[Any, ...]]:
    with db_copy(catalog_path(s.cli.home)) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    return build_layout(tmp_path / "legacy")


def test_session_keys_carry_a_binding_tuple_only_in_the_full_direct_shape() -> None:
    assert parse_session_key(f"agent:main:{CHANNEL}:{ACCOUNT}:direct:{ALICE_SENDER}").kind == "dm"
    assert parse_session_key(f"agent:main:{CHANNEL}:direct:{ALICE_SENDER}").kind == "dm-incomplete"
    assert parse_session_key(f"agent:main:direct:{ALICE_SENDER}").kind == "dm-incomplete"
    assert parse_session_key("agent:main:main").kind == "main"
    assert parse_session_key("agent:main:telegram:group:-100123:topic:42").kind == "group"
    assert parse_session_key("agent:main:matrix:acct:direct:@u:server").kind == "dm-incomplete"  # ':' in a peer
    assert parse_session_key("agent:main:subagent:child").kind == "other"
    assert parse_session_key("cron:nightly").kind == "other"


def test_classification_is_structural_never_by_content(tmp_path: Path) -> None:
    """The pure function, driven directly: rewriting a note to name another person changes nothing."""
    ws, state = build_layout(tmp_path / "legacy", other_sender=CAROL_SENDER)
    bindings = {(CHANNEL, ACCOUNT, ALICE_SENDER): ("binding_a", "principal_alice")}

    def plan() -> dict[str, tuple[str, str]]:
        found = legacy.scan(str(ws), str(state), "main", (SHARED,))
        items = classify(found, owner="principal_alice", resolve=lambda *t: bindings.get(t), shared=(SHARED,),
                         openclaw_agent="main")
        return {i.key: (i.action, i.reason) for i in items}

    before = plan()
    # Carol's DM resolves to nobody: she is someone other than the owner all the same (fail closed).
    assert before["workspace/MEMORY.md"] == ("quarantine", "several-people")
    assert before["state/agents/main/sessions/s-alice.jsonl"] == ("private", "bound-dm-owner")
    assert before["state/agents/main/sessions/s-other.jsonl"] == ("quarantine", "unbound")
    assert before["workspace/reference/handbook.md"] == ("agent-shared", "admin-marked")
    (ws / "MEMORY.md").write_bytes(b"Bob's secret, says the text; Carol's too. group chat. shared.\n")
    assert plan() == before
    bindings[(CHANNEL, ACCOUNT, CAROL_SENDER)] = ("binding_c", "principal_carol")
    after = plan()
    assert after["workspace/MEMORY.md"] == ("quarantine", "several-people")
    assert after["state/agents/main/sessions/s-alice.jsonl"] == ("private", "bound-dm-owner")
    assert after["state/agents/main/sessions/s-other.jsonl"] == ("quarantine", "other-person")
    # Alice alone in the DMs (the group and the shared main key are no DM partner): her memory.
    (state / "agents" / "main" / "sessions" / "sessions.json").write_text(json.dumps(
        {f"agent:main:{CHANNEL}:{ACCOUNT}:direct:{ALICE_SENDER}": {"sessionId": "s-alice"},
         "agent:main:main": {"sessionId": "s-main"}}))
    assert plan()["workspace/MEMORY.md"] == ("private", "owner-confirmed")


def test_the_dry_run_classifies_every_file_and_changes_nothing(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    home_before, tree_before = snapshot(s.cli.home), tree_hash(ws.parent)
    result = s.cli("--json", *_args(s, ws, state))
    assert result.code == 0, result.err
    report = result.json()
    assert diff_snapshots(home_before, snapshot(s.cli.home)) == []
    assert tree_hash(ws.parent) == tree_before
    assert report["applied"] is False and report["cutover"] is False and report["backup"] is None
    items = _by_source(report)
    for source, (destination, _data) in PRIVATE_EXPECTED.items():
        assert (items[source]["action"], items[source]["destination"]) == ("private", destination), source
    expected = {
        "workspace/memory.md": ("quarantine", "duplicate-root-file"),
        "workspace/DREAMS.md#light": ("quarantine", "transcript-derived"),
        "workspace/DREAMS.md#rem": ("quarantine", "transcript-derived"),
        "workspace/DREAMS.md#deep": ("quarantine", "transcript-derived"),
        "workspace/memory/.dreams/short-term-recall.json": ("quarantine", "transcript-derived"),
        "workspace/memory/.dreams/events.jsonl": ("quarantine", "transcript-derived"),
        "workspace/memory/.dreams/session-corpus/2026-12-01.txt": ("quarantine", "transcript-derived"),
        "workspace/memory/dreaming/deep/2026-12-01.md": ("quarantine", "transcript-derived"),
        "workspace/memory/latin1.md": ("quarantine", "not-utf8"),
        "workspace/memory/attachment.pdf": ("quarantine", "not-a-memory-note"),
        "workspace/memory/escape.md": ("skip", "symlink"),
        "workspace/memory/bad-\\xff-name.md": ("skip", "name-not-utf8"),
        "workspace/reference/handbook.md": ("agent-shared", "admin-marked"),
        "state/agents/main/sessions/s-group.jsonl": ("quarantine", "group-transcript"),
        "state/agents/main/sessions/s-main.jsonl": ("quarantine", "shared-main"),
        "state/agents/main/sessions/s-orphan.jsonl": ("quarantine", "transcript-unreferenced"),
        "state/agents/main/sessions/s-old.jsonl.reset.2026-11-01T00-00-00Z": ("quarantine", "transcript-unreferenced"),
        "state/agents/main/sessions/sessions.json": ("skip", "session-metadata"),
        "state/agents/main/agent/auth-profiles.json": ("skip", "not-memory"),
        "state/agents/main/agent/openclaw-agent.sqlite": ("rebuild", "derived-index"),
        "state/memory/main.sqlite": ("rebuild", "derived-index"),
    }
    for source, want in expected.items():
        assert (items[source]["action"], items[source]["reason"]) == want, source
    assert {i["destination"] for i in report["items"] if i["action"] == "quarantine"} == {"quarantine"}
    assert "AGENTS.md" not in str(items)  # not part of the memory layout
    # Nothing of the content and no raw provider id reaches the report.
    for needle in (*CANARIES, ALICE_SENDER.encode(), CAROL_SENDER.encode(), ACCOUNT.encode()):
        assert needle not in result.out, needle


def test_without_an_owner_nothing_becomes_private(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    report = s.cli.j(*_args(s, *layout, owner=False))
    actions = {i["action"] for i in report["items"]}
    assert "private" not in actions
    items = _by_source(report)
    assert items["workspace/MEMORY.md"]["reason"] == "no-owner"
    assert items["state/agents/main/sessions/s-alice.jsonl"]["reason"] == "no-owner"


def test_what_migration_quarantined_is_listed_for_review_without_content(scenario: Scenario,
                                                                          layout: tuple[Path, Path]) -> None:
    """``quarantine list`` names every note the migration sent to quarantine (under ``migration/``, with its
    class and size), exactly those, and no byte of any of them."""
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    report = s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    sent = [i for i in report["items"] if i["action"] == "quarantine"]
    assert sent, "the layout quarantines nothing: the test shows nothing"
    listed = s.cli("--json", "quarantine", "list", "--agent", s.agent)
    assert listed.code == 0, listed.err
    migrated = listed.json()["migrated"]
    assert len(migrated) == len(sent)
    assert all(m["path"].startswith("migration/") and m["class"] and m["revision_id"] for m in migrated)
    assert sorted(m["size"] for m in migrated) == sorted(i["size"] for i in sent)
    text = s.cli("quarantine", "list", "--agent", s.agent, check=True).out
    for canary in (b"canary", b"M3m0", b"L1gh", b"R3mm", b"D33p"):
        assert canary not in listed.out and canary not in text
    assert s.cli("quarantine", "list", "--agent", "nosuchagent").code == 2


def test_apply_copies_verifies_reindexes_and_cuts_over(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    tree_before = tree_hash(ws.parent)
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    result = s.cli("--json", *_args(s, ws, state, "--apply", "--confirm", digest))
    assert result.code == 0, result.err
    report = result.json()
    assert report["applied"] is True and report["cutover"] is True
    assert report["denial_matrix"]["passed"] is True and report["denial_matrix"]["subjects"] >= 6
    assert report["reindexed_revisions"] >= len(PRIVATE_EXPECTED)
    assert "migrate: 1/" in result.err  # plain progress lines when stderr is not a terminal
    assert tree_hash(ws.parent) == tree_before  # the originals, bytes and mtimes, untouched
    # The owner reads exactly the reviewed bytes; DREAMS.md without the machine blocks.
    for destination, data in PRIVATE_EXPECTED.values():
        assert s.cli("read", s.alice_session, destination, check=True).out == data
    hits = s.cli.j("search", s.alice_session, "garden plan due in May")["results"]
    assert any(h["path"] == "private/MEMORY.md" for h in hits)
    # Nobody else sees the owner's copies or the quarantine; the marked file reaches everyone read-only.
    for session in (s.bob_session, s.group_session):
        for destination, _data in PRIVATE_EXPECTED.values():
            assert s.cli("read", session, destination).code == 3
        found = s.cli("--json", "search", session, "garden plan due in May", check=True).out
        assert not any(c in found for c in CANARIES) and b"MEMORY.md" not in found
        assert s.cli("read", session, "agent-shared/reference/handbook.md", check=True).out == HANDBOOK
    for phase in (LIGHT, REM, DEEP):
        assert not any(phase in s.cli("read", s.alice_session, d).out for d, _ in PRIVATE_EXPECTED.values())
    # Lineage: every copy is a migration-origin revision with an item naming its source by digests only.
    copied = [i for i in report["items"] if i["destination"]]
    assert _rows(s, "SELECT count(*) FROM migration_items") == [(len(copied),)]
    assert _rows(s, "SELECT DISTINCT r.trust_origin FROM migration_items m JOIN revisions r USING (revision_id)") \
        == [("migration",)]
    assert _rows(s, "SELECT count(*) FROM migration_runs WHERE cutover_at IS NOT NULL") == [(1,)]
    keys = [k for (k,) in _rows(s, "SELECT source_key FROM migration_items")]
    assert not any("MEMORY" in k or "workspace" in k for k in keys)
    # The backup served the run until its cutover; after it, it is gone (forget could never reach it).
    assert report["backup"] is None and report["backup_removed"] is True
    assert not list((s.cli.home / "migrations").glob("*/backup*"))
    # The audit holds no content and no raw id.
    audit = (s.cli.home / "state.sqlite").read_bytes()
    for needle in (*CANARIES, CAROL_SENDER.encode()):
        assert needle not in audit
    assert s.cli("doctor", check=True).code == 0


def test_a_second_run_changes_nothing(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    before = snapshot(s.cli.home)
    again = s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    assert diff_snapshots(before, snapshot(s.cli.home)) == []
    assert {i["status"] for i in again["items"] if i["destination"]} == {"already-migrated"}
    preview = s.cli.j(*_args(s, ws, state))
    assert preview["plan_digest"] == digest and preview["cutover"] is True
    assert diff_snapshots(before, snapshot(s.cli.home)) == []


def test_two_verified_people_in_one_workspace(scenario: Scenario, tmp_path: Path) -> None:
    """Bob's DM is bound too: the workspace's memory has no single owner; each transcript keeps its own."""
    s = scenario
    ws, state = build_layout(tmp_path / "legacy", other_sender=BOB_SENDER)
    report = s.cli.j(*_args(s, ws, state))
    items = _by_source(report)
    for source in ("workspace/USER.md", "workspace/MEMORY.md", "workspace/DREAMS.md", "workspace/memory/2026-11-30.md"):
        assert (items[source]["action"], items[source]["reason"]) == ("quarantine", "several-people"), source
    assert items["state/agents/main/sessions/s-alice.jsonl"]["action"] == "private"
    assert (items["state/agents/main/sessions/s-other.jsonl"]["action"],
            items["state/agents/main/sessions/s-other.jsonl"]["reason"]) == ("quarantine", "other-person")
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", report["plan_digest"]))
    assert s.cli("read", s.alice_session, "private/MEMORY.md").code == 3
    assert s.cli("read", s.bob_session, "private/transcripts/s-other.jsonl").code == 3
    assert s.cli("read", s.alice_session, "private/transcripts/s-alice.jsonl", check=True).out == ALICE_TRANSCRIPT


def test_an_existing_note_is_never_overwritten(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    s.cli.j("write", s.alice_session, "private/MEMORY.md", stdin=b"written in scopefs already\n")
    report = s.cli.j(*_args(s, *layout))
    item = _by_source(report)["workspace/MEMORY.md"]
    assert (item["action"], item["reason"]) == ("quarantine", "destination-exists")
    s.cli.j(*_args(s, *layout, "--apply", "--confirm", report["plan_digest"]))
    assert s.cli("read", s.alice_session, "private/MEMORY.md", check=True).out == b"written in scopefs already\n"


def test_a_source_changed_after_review_is_not_applied(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    (ws / "memory" / "2026-11-30.md").write_bytes(b"edited after the review\n")
    before = snapshot(s.cli.home)
    result = s.cli(*_args(s, ws, state, "--apply", "--confirm", digest))
    assert result.code == 2 and "--confirm" in result.err
    assert diff_snapshots(before, snapshot(s.cli.home)) == []


def test_bad_input_exits_2_and_changes_nothing(scenario: Scenario, layout: tuple[Path, Path], tmp_path: Path) -> None:
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    lonely = s.cli.j("principal", "add", "Nobody-bound", "--kind", "human")["principal_id"]
    service = s.cli.j("principal", "add", "cron", "--kind", "service")["principal_id"]
    before = snapshot(s.cli.home)
    base = ["migrate", "--agent", s.agent, "--state-dir", str(state)]
    cases = [
        [*base, "--workspace", str(tmp_path / "missing")],
        ["migrate", "--agent", s.agent, "--workspace", str(ws), "--state-dir", str(tmp_path / "missing")],
        [*base, "--workspace", str(ws), "--owner", "principal_" + "x" * 26],
        [*base, "--workspace", str(ws), "--owner", lonely],
        [*base, "--workspace", str(ws), "--owner", service],
        ["migrate", "--agent", "nosuchagent", "--workspace", str(ws)],
        [*base, "--workspace", str(ws), "--shared", "../outside-secret.md"],
        [*base, "--workspace", str(ws), "--shared", "memory/escape.md"],
        [*base, "--workspace", str(ws), "--shared", "nothing-here.md"],
        _args(s, ws, state, "--apply"),
        _args(s, ws, state, "--apply", "--confirm", "0" * 64),
        _args(s, ws, state, "--apply", "--confirm", digest, owner=False),
    ]
    for argv in cases:
        result = s.cli(*argv)
        assert result.code == 2, (argv, result.code, result.err)
        assert len(result.err.strip().splitlines()) == 1, result.err
    assert diff_snapshots(before, snapshot(s.cli.home)) == []


def test_scan_bounds_sizes_and_never_follows_a_symlinked_folder(tmp_path: Path) -> None:
    ws, state = build_layout(tmp_path / "legacy")
    outside = tmp_path / "elsewhere"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "x.md").write_bytes(b"outside\n")
    os.symlink(outside, ws / "memory" / "linked-folder")
    big = ws / "memory" / "huge.md"
    with open(big, "wb") as fh:
        fh.truncate(legacy.MAX_FILE_BYTES + 1)
    found = {f.rel: f.kind for f in legacy.scan(str(ws), str(state), "main", ()).found}
    assert found["memory/linked-folder"] == "symlink"
    assert not any(rel.startswith("memory/linked-folder/") for rel in found)
    assert found["memory/huge.md"] == "too-large"


def test_damaged_dream_markers_keep_the_file_whole(tmp_path: Path) -> None:
    data = b"<!-- openclaw:dreaming:light:start -->\nno end\n"
    assert legacy.split_dreams(data) == [("damaged", data)]
    nested = b"<!-- openclaw:dreaming:rem:start --><!-- openclaw:dreaming:deep:start -->"
    assert legacy.split_dreams(nested)[0][0] == "damaged"
    assert legacy.split_dreams(b"plain\n") == [("", b"plain\n")]


def test_the_owner_must_still_hold_a_binding_when_the_plan_is_applied(scenario: Scenario,
                                                                       layout: tuple[Path, Path]) -> None:
    """Revoking Alice's binding between review and apply: the owner check refuses, nothing changes."""
    s = scenario
    digest = s.cli.j(*_args(s, *layout))["plan_digest"]
    s.cli.j("binding", "revoke", s.alice_binding)
    before = snapshot(s.cli.home)
    assert s.cli(*_args(s, *layout, "--apply", "--confirm", digest)).code == 2
    assert diff_snapshots(before, snapshot(s.cli.home)) == []


def test_a_failing_denial_matrix_refuses_the_cutover(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    """An allow reaching Bob on Alice's store (no command can make one; planted here): exit 4, no cutover."""
    from scopefs.catalog.policies import add_entry
    from scopefs.catalog.policy import AudienceKind, Effect, Op
    from scopefs.catalog.stores import find_store

    s = scenario
    digest = s.cli.j(*_args(s, *layout))["plan_digest"]
    home = Home.open(s.cli.home)
    try:
        catalog = home.catalog(s.agent)
        store = find_store(catalog, s.agent, "user", s.alice)
        assert store is not None
        add_entry(catalog, s.agent, target_kind="store", target_id=store.store_id, effect=Effect.ALLOW,
                  capability=Op.READ, audience_kind=AudienceKind.PRINCIPAL, audience_id=s.bob)
    finally:
        home.close()
    result = s.cli(*_args(s, *layout, "--apply", "--confirm", digest))
    assert result.code == 4 and "denial matrix" in result.err
    assert _rows(s, "SELECT count(*) FROM migration_runs WHERE cutover_at IS NOT NULL") == [(0,)]


def test_a_note_no_write_would_take_is_skipped_not_half_applied(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    (ws / "memory" / "2026-11-29.md").write_bytes(b"---\nvalid-until: someday\n---\nbody\n")
    report = s.cli.j(*_args(s, ws, state))
    item = _by_source(report)["workspace/memory/2026-11-29.md"]
    assert (item["action"], item["reason"]) == ("skip", "front-matter-invalid")
    assert s.cli.j(*_args(s, ws, state, "--apply", "--confirm", report["plan_digest"]))["cutover"] is True


def test_a_changed_source_replaces_its_own_copy_but_never_the_owners_edit(scenario: Scenario,
                                                                          layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    (ws / "USER.md").write_bytes(b"# User\n- revised in OpenClaw\n")
    (ws / "MEMORY.md").write_bytes(b"# Memory\n- revised in OpenClaw\n")
    s.cli.j("write", s.alice_session, "private/MEMORY.md", stdin=b"Alice's own edit in scopefs\n")
    report = s.cli.j(*_args(s, ws, state))
    items = _by_source(report)
    assert (items["workspace/USER.md"]["action"], items["workspace/USER.md"]["status"]) == ("private", "to-copy")
    assert items["workspace/MEMORY.md"]["reason"] == "destination-exists"
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", report["plan_digest"]))
    assert s.cli("read", s.alice_session, "private/USER.md", check=True).out == b"# User\n- revised in OpenClaw\n"
    assert s.cli("read", s.alice_session, "private/MEMORY.md", check=True).out == b"Alice's own edit in scopefs\n"


def test_the_state_dir_defaults_to_openclaws_own(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    fake_home = tmp_path / "user"
    ws, _state = build_layout(fake_home, agent="main")
    (fake_home / "openclaw").rename(fake_home / ".openclaw")
    runner = dataclasses.replace(s.cli, env={"HOME": str(fake_home)})
    report = runner.j("migrate", "--agent", s.agent, "--workspace", str(ws), "--owner", s.alice)
    assert _by_source(report)["state/agents/main/sessions/s-alice.jsonl"]["action"] == "private"


def test_a_terminal_gets_a_progress_bar(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    """stderr on a pseudo-terminal: rich draws the bar there; stdout keeps exactly one JSON object."""
    s = scenario
    digest = s.cli.j(*_args(s, *layout))["plan_digest"]
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run([SCOPEFS, "--json", *_args(s, *layout, "--apply", "--confirm", digest)],
                              stdout=subprocess.PIPE, stderr=follower, timeout=120,
                              env={**os.environ, "SCOPEFS_HOME": str(s.cli.home), "COLUMNS": "100"})
        os.close(follower)
        follower = -1
        drawn = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(leader, 65536):
                drawn += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert proc.returncode == 0, drawn[-2000:]
    assert json.loads(proc.stdout)["cutover"] is True
    assert b"100%" in drawn and b"migrate: 1/" not in drawn


_MEMORY_SOURCES = ("workspace/USER.md", "workspace/MEMORY.md", "workspace/DREAMS.md", "workspace/memory/2026-11-30.md")


def _pure_plan(ws: Path, state: Path | None, bindings: dict[tuple[str, ...], tuple[str, str]] | None = None
               ) -> dict[str, tuple[str, str]]:
    known = bindings if bindings is not None else {(CHANNEL, ACCOUNT, ALICE_SENDER): ("binding_a", "principal_alice")}
    found = legacy.scan(str(ws), str(state) if state is not None else None, "main", ())
    items = classify(found, owner="principal_alice", resolve=lambda *t: known.get(t), shared=(),
                     openclaw_agent="main")
    return {i.key: (i.action, i.reason) for i in items}


def _memory_reasons(plan: dict[str, tuple[str, str]]) -> set[tuple[str, str]]:
    return {plan[source] for source in _MEMORY_SOURCES}


def test_an_unreadable_session_index_never_confirms_the_owner(tmp_path: Path) -> None:
    """Who talked to the agent cannot be said: the memory waits in quarantine, whatever made the index unreadable."""
    def sessions_of(state: Path) -> Path:
        return state / "agents" / "main" / "sessions"

    # A key over the bound.
    ws, state = build_layout(tmp_path / "hostile")
    index = sessions_of(state) / "sessions.json"
    doc = json.loads(index.read_text())
    doc["agent:main:" + "x" * (legacy.MAX_KEY_BYTES + 1)] = {"sessionId": "s-main"}
    index.write_text(json.dumps(doc))
    assert _memory_reasons(_pure_plan(ws, state)) == {("quarantine", "session-index-unreadable")}
    # A FIFO where sessions.json belongs: listed and skipped, never opened for a blocking read.
    ws, state = build_layout(tmp_path / "fifo")
    index = sessions_of(state) / "sessions.json"
    index.unlink()
    os.mkfifo(index)
    plan = _pure_plan(ws, state)
    assert _memory_reasons(plan) == {("quarantine", "session-index-unreadable")}
    assert plan["state/agents/main/sessions/sessions.json"] == ("skip", "not-regular")
    # A symlinked sessions folder: listed as what it is, nothing behind it read, no transcript decided.
    ws, state = build_layout(tmp_path / "linked")
    sessions_of(state).rename(tmp_path / "linked" / "elsewhere")
    os.symlink(tmp_path / "linked" / "elsewhere", sessions_of(state))
    plan = _pure_plan(ws, state)
    assert _memory_reasons(plan) == {("quarantine", "session-index-unreadable")}
    assert plan["state/agents/main/sessions"] == ("skip", "symlink")
    assert not any(k.startswith("state/agents/main/sessions/") for k in plan)
    # A symlinked agents folder: listed once, both fixed paths behind it unread.
    ws, state = build_layout(tmp_path / "agents-linked")
    (state / "agents").rename(tmp_path / "agents-linked" / "agents-elsewhere")
    os.symlink(tmp_path / "agents-linked" / "agents-elsewhere", state / "agents")
    plan = _pure_plan(ws, state)
    assert _memory_reasons(plan) == {("quarantine", "session-index-unreadable")}
    assert [k for k in plan if k.startswith("state/agents")] == ["state/agents"]


def test_no_session_index_never_confirms_the_owner(scenario: Scenario, tmp_path: Path) -> None:
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    assert _memory_reasons(_pure_plan(ws, None)) == {("quarantine", "no-session-index")}
    (state / "agents" / "main" / "sessions" / "sessions.json").unlink()
    assert _memory_reasons(_pure_plan(ws, state)) == {("quarantine", "no-session-index")}
    # The command without --state-dir and without ~/.openclaw: the same.
    runner = dataclasses.replace(s.cli, env={"HOME": str(tmp_path / "nobody")})
    items = _by_source(runner.j("migrate", "--agent", s.agent, "--workspace", str(ws), "--owner", s.alice))
    assert {(items[k]["action"], items[k]["reason"]) for k in _MEMORY_SOURCES} == {("quarantine", "no-session-index")}


def test_a_dm_with_anyone_but_the_owner_keeps_the_memory_from_the_owner(scenario: Scenario, tmp_path: Path) -> None:
    """Unbound, revoked or account-less: a DM partner not proven to be the owner is someone else."""
    s = scenario
    ws, state = build_layout(tmp_path / "unbound", other_sender=CAROL_SENDER)
    items = _by_source(s.cli.j(*_args(s, ws, state)))
    assert {(items[k]["action"], items[k]["reason"]) for k in _MEMORY_SOURCES} == {("quarantine", "several-people")}
    assert (items["state/agents/main/sessions/s-other.jsonl"]["action"],
            items["state/agents/main/sessions/s-other.jsonl"]["reason"]) == ("quarantine", "unbound")
    assert items["state/agents/main/sessions/s-alice.jsonl"]["action"] == "private"
    ws, state = build_layout(tmp_path / "noaccount", no_account_dm=True)
    items = _by_source(s.cli.j(*_args(s, ws, state)))
    assert {(items[k]["action"], items[k]["reason"]) for k in _MEMORY_SOURCES} == {("quarantine", "several-people")}
    assert items["state/agents/main/sessions/s-noaccount.jsonl"]["reason"] == "dm-key-lacks-account"
    # Bob's DM while his binding was live; then revoked: he is still someone other than Alice.
    ws, state = build_layout(tmp_path / "revoked", other_sender=BOB_SENDER)
    s.cli.j("binding", "revoke", s.bob_binding)
    items = _by_source(s.cli.j(*_args(s, ws, state)))
    assert {(items[k]["action"], items[k]["reason"]) for k in _MEMORY_SOURCES} == {("quarantine", "several-people")}


def test_a_hard_link_out_of_the_workspace_is_skipped_not_copied(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    os.link(ws.parent / "outside-secret.md", ws / "memory" / "2026-11-28.md")  # a daily note's name, outside bytes
    report = s.cli.j(*_args(s, ws, state))
    item = _by_source(report)["workspace/memory/2026-11-28.md"]
    assert (item["action"], item["reason"], item["destination"]) == ("skip", "hard-link", None)
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", report["plan_digest"]))
    assert s.cli("read", s.alice_session, "private/memory/2026-11-28.md").code != 0
    assert b"0ut5" not in s.cli("--json", "search", s.alice_session, "outside the workspace").out


def test_the_dry_run_leaves_the_originals_access_times_alone(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    old = 1_577_836_800 * 10**9  # 2020-01-01: older than the mtime, so relatime would update it on a read
    originals = [ws / "MEMORY.md", ws / "DREAMS.md", state / "agents" / "main" / "sessions" / "s-alice.jsonl",
                 state / "agents" / "main" / "sessions" / "sessions.json", ws, ws / "memory",
                 state / "agents" / "main" / "sessions"]  # folders too: a listing is an access
    for path in originals:
        os.utime(path, ns=(old, os.stat(path).st_mtime_ns))
    assert s.cli("--json", *_args(s, ws, state)).code == 0
    assert [os.stat(p).st_atime_ns for p in originals] == [old] * len(originals)


def test_no_mark_publishes_what_dreaming_took_from_transcripts(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    """--shared on DREAMS.md or the dreaming folders: refused, exit 2, nothing changed; the pure rule agrees."""
    s = scenario
    ws, state = layout
    before = snapshot(s.cli.home)
    for rel in ("DREAMS.md", "dreams.md", "memory/.dreams/events.jsonl", "memory/dreaming/deep/2026-12-01.md"):
        result = s.cli(*_args(s, ws, state, "--shared", rel))
        assert result.code == 2 and "transcripts" in result.err, (rel, result.code, result.err)
        assert len(result.err.strip().splitlines()) == 1
    assert diff_snapshots(before, snapshot(s.cli.home)) == []
    marked = ("memory/.dreams/events.jsonl", "memory/dreaming/deep/2026-12-01.md")
    items = {i.key: i for i in classify(legacy.scan(str(ws), str(state), "main", marked), owner=None,
                                        resolve=lambda *t: None, shared=marked, openclaw_agent="main")}
    for rel in marked:
        item = items[f"workspace/{rel}"]
        assert (item.klass, item.action, item.reason) != ("reference", "agent-shared", "admin-marked"), rel
        assert (item.action, item.reason) == ("quarantine", "transcript-derived"), rel


def test_already_migrated_means_in_this_destination(scenario: Scenario, tmp_path: Path) -> None:
    """The same bytes applied for Alice are not 'already migrated' for Bob: his run copies them into his store."""
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    for_bob = ["migrate", "--agent", s.agent, "--workspace", str(ws), "--owner", s.bob]
    sessions = state / "agents" / "main" / "sessions"
    (sessions / "sessions.json").write_text(json.dumps(  # the same workspace, now Bob's DM only
        {f"agent:main:{CHANNEL}:{ACCOUNT}:direct:{BOB_SENDER}": {"sessionId": "s-bob"}}))
    report = s.cli.j(*for_bob, "--state-dir", str(state))
    items = _by_source(report)
    assert (items["workspace/MEMORY.md"]["destination"], items["workspace/MEMORY.md"]["status"]) \
        == ("private/MEMORY.md", "to-copy")
    s.cli.j(*for_bob, "--state-dir", str(state), "--apply", "--confirm", report["plan_digest"])
    assert s.cli("read", s.bob_session, "private/MEMORY.md", check=True).out == MEMORY
    assert s.cli("read", s.alice_session, "private/MEMORY.md", check=True).out == MEMORY


def test_after_cutover_no_backup_keeps_what_forget_removes(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    # A second migration after USER.md changed: its backup would hold the first run's copy of MEMORY.md.
    (ws / "USER.md").write_bytes(b"# User\n- revised in OpenClaw\n")
    second = s.cli.j(*_args(s, ws, state))["plan_digest"]
    result = s.cli(*_args(s, ws, state, "--apply", "--confirm", second))
    assert result.code == 0, result.err
    s.cli.j("forget", s.alice_session, "private/MEMORY.md")
    for path in s.cli.home.rglob("*"):
        if path.is_file():
            assert b"M3m0" not in path.read_bytes(), path
    assert b"pre-migration backup was removed" in result.out
    assert not list((s.cli.home / "migrations").iterdir())


def test_doctor_reports_a_migration_backup_left_behind(scenario: Scenario, layout: tuple[Path, Path]) -> None:
    """A crash between the cutover and the backup's removal: a notice; --fix (or the same apply) removes it."""
    s = scenario
    ws, state = layout
    digest = s.cli.j(*_args(s, ws, state))["plan_digest"]
    s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))
    leftover = s.cli.home / "migrations" / digest[:32] / "backup"

    def left_behind() -> dict[str, Any]:
        leftover.mkdir(parents=True, mode=0o700)
        (leftover / "state.sqlite").write_bytes(b"an old copy")
        result = s.cli("--json", "doctor")
        assert result.code == 0, result.err  # a notice fails nothing
        found: list[dict[str, Any]] = [f for f in result.json()["findings"] if f["kind"] == "migration-backup"]
        assert len(found) == 1 and found[0]["notice"] is True and "forget" in found[0]["hint"]
        return found[0]

    left_behind()
    fixed = [f for f in s.cli.j("doctor", "--fix")["findings"] if f["kind"] == "migration-backup"]
    assert fixed[0]["action"] == "removed" and not leftover.exists()
    left_behind()
    assert s.cli.j(*_args(s, ws, state, "--apply", "--confirm", digest))["backup"] is None  # the same apply
    assert not leftover.exists()
    assert s.cli.j("doctor")["findings"] == []


def test_the_readme_example_works(tmp_path: Path) -> None:
    """The copy-paste example of the README's "Moving an OpenClaw agent to scopefs", run as it is printed."""
    proc = run_readme_example("## Moving an OpenClaw agent to scopefs", tmp_path)
    assert proc.stdout.decode().endswith("# Memory\n- Alice prefers tea\n" '{"type":"session","id":"s1"}\n'
                                         "# Handbook\n- lunch at noon\n")
