"""The write path: revisions, lazy opaque stores, folders, concurrency."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog import ids
from scopefs.catalog.errors import BadInput, Conflict
from scopefs.catalog.home import Home
from scopefs.catalog.reader import read_note
from scopefs.writer import steps
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario, table_dump

OPAQUE = re.compile(r"[a-z2-7]{26}")


def _catalog(scenario: Scenario) -> dict[str, Any]:
    return table_dump(scenario.cli.home / "agents" / "main" / "catalog.sqlite")


def test_each_write_is_one_new_revision(scenario: Scenario) -> None:
    cli = scenario.cli
    for n in (2, 3, 4):
        out = cli.j("write", scenario.alice_session, "private/notes/allergy.md", stdin=f"v{n}\n".encode())
        assert out["revision"] == n and not out["created"]
    assert cli("read", scenario.alice_session, "private/notes/allergy.md").out == b"v4\n"
    revisions = [r for r in _catalog(scenario)["revisions"] if r[2] == out["resource_id"]]
    states = sorted((r[3], r[8]) for r in revisions)  # (revision_no, state)
    assert states == [(1, "superseded"), (2, "superseded"), (3, "superseded"), (4, "active")]
    for row in revisions:
        assert row[10] == scenario.alice and row[11] == "verified-user"  # actor, trust origin
        assert row[9] == scenario.alice_session


def test_stores_are_created_lazily_under_opaque_names(scenario: Scenario) -> None:
    cli = scenario.cli
    v1 = cli.home / "agents" / "main" / "memory-scopes" / "v1"
    before = {p.name for p in v1.iterdir()}
    assert len(before) == 3  # Alice's, Bob's and the channel's: nothing else exists yet
    carol = cli.j("principal", "add", "Carol", "--kind", "human")["principal_id"]
    cli.j("bind", carol, "--channel", "telegram", "--account", "acct", "--sender", "carol-1")
    session = cli.j("session", "open", "--agent", "main", "--dm", "--channel", "telegram", "--account", "acct",
                    "--sender", "carol-1")["session_id"]
    assert cli.j("ls", session, "private")["entries"] == []
    assert {p.name for p in v1.iterdir()} == before  # listing and reading create nothing
    cli.j("write", session, "private/a.md", stdin=b"a")
    created = {p.name for p in v1.iterdir()} - before
    assert len(created) == 1 and OPAQUE.fullmatch(created.pop())
    stores = _catalog(scenario)["stores"]
    assert len({row[0] for row in stores}) == len(stores) == 4


def test_store_directory_collision_retries_with_a_new_key(scenario: Scenario,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Exclusive mkdir: an existing directory name is never reused."""
    home = Home.open(scenario.cli.home)
    v1 = scenario.cli.home / "agents" / "main" / "memory-scopes" / "v1"
    taken = next(p.name for p in v1.iterdir())
    tokens = iter([taken, taken, "a" * 26])
    real = ids.random_token

    def colliding(nbytes: int = 16) -> str:
        return next(tokens, None) or real(nbytes)

    monkeypatch.setattr("scopefs.writer.stores.ids.random_token", colliding)
    service = scenario.cli.j("principal", "add", "cron", "--kind", "service")["principal_id"]
    session = scenario.cli.j("session", "open", "--agent", "main", "--service", service)["session_id"]
    write_note(home, session, "agent/state.md", b"ok")
    assert (v1 / ("a" * 26)).is_dir()
    assert read_note(home, session, "agent/state.md") == b"ok"
    # The colliding directory still belongs to its own store.
    assert read_note(home, scenario.alice_session, "private/notes/allergy.md") == ALICE_FACT


def test_folders_and_notes_do_not_overlap(scenario: Scenario) -> None:
    cli = scenario.cli
    for path in ("private/notes", "private/notes/allergy.md/deeper.md"):
        result = cli("write", scenario.alice_session, path, stdin=b"x")
        assert result.code == 2, path
    listing = cli.j("ls", scenario.alice_session, "private")["entries"]
    assert listing == [{"name": "notes", "type": "folder", "size": 0}]


def _race_at(step: steps.Step, home: Home, scenario: Scenario, data: bytes) -> None:
    """Have another writer commit ``data`` when our write reaches ``step``."""
    interloper = Home.open(scenario.cli.home)

    def race(reached: steps.Step) -> None:
        if reached is step:
            steps.set_hook(None)
            write_note(interloper, scenario.alice_session, "private/notes/allergy.md", data)

    steps.set_hook(race)


def test_a_base_that_moves_after_the_pending_commit_is_a_conflict(scenario: Scenario) -> None:
    """Another writer activating between our two commits wins; ours changes nothing."""
    home = Home.open(scenario.cli.home)
    _race_at(steps.Step.PENDING, home, scenario, b"interloper\n")
    try:
        with pytest.raises(Conflict):
            write_note(home, scenario.alice_session, "private/notes/allergy.md", b"mine\n")
    finally:
        steps.set_hook(None)
    assert read_note(home, scenario.alice_session, "private/notes/allergy.md") == b"interloper\n"
    staging = scenario.cli.home / "agents" / "main" / "staging"
    assert list(staging.iterdir()) == []
    catalog = _catalog(scenario)
    assert all(r[8] != "pending" for r in catalog["revisions"])
    v1 = scenario.cli.home / "agents" / "main" / "memory-scopes" / "v1"
    locators = {r[7] for r in catalog["revisions"] if r[8] != "rolled-back"}
    assert {p.name for d in v1.iterdir() for p in d.iterdir()} == locators  # our file is gone


def test_a_write_staged_while_another_commits_is_planned_again(scenario: Scenario) -> None:
    """Staging happens before the lock; the plan is made again after it."""
    home = Home.open(scenario.cli.home)
    _race_at(steps.Step.STAGED, home, scenario, b"interloper\n")
    try:
        result = write_note(home, scenario.alice_session, "private/notes/allergy.md", b"mine\n")
    finally:
        steps.set_hook(None)
    assert result.revision_no == 3
    assert read_note(home, scenario.alice_session, "private/notes/allergy.md") == b"mine\n"


def test_large_notes_stream_through(scenario: Scenario) -> None:
    data = bytes(range(256)) * 40_000  # 10 MB, not valid UTF-8
    cli = scenario.cli
    out = cli.j("write", scenario.alice_session, "private/blob.bin", stdin=data)
    assert out["size"] == len(data)
    assert cli("read", scenario.alice_session, "private/blob.bin").out == data
    result = cli("--json", "read", scenario.alice_session, "private/blob.bin")
    assert result.code == 1 and "UTF-8" in result.json()["error"]


def test_nothing_in_staging_after_writes(scenario: Scenario) -> None:
    staging: Path = scenario.cli.home / "agents" / "main" / "staging"
    assert list(staging.iterdir()) == []


def test_write_refuses_bad_input_before_staging(scenario: Scenario) -> None:
    home = Home.open(scenario.cli.home)
    with pytest.raises(BadInput):
        write_note(home, scenario.alice_session, "private/../x.md", b"x")
