"""Versioned schemas: fresh and upgraded databases end in the same place.

``tests/fixtures/released_schemas.json`` pins the schema text of every
released version. A migration step is never edited after release (the pin
fails), and every released version upgrades to the latest through the same
code path a user's old home takes (the upgrade test). When a version is
added, append its step, extend the pin with the new version, and these
tests cover the new upgrade path automatically.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import apsw
import pytest

from scopefs.catalog.errors import StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.schema import SchemaKind, ensure_schema, schema_text
from scopefs.catalog.schema.agent import AGENT_SCHEMA
from scopefs.catalog.schema.state import STATE_SCHEMA
from tests.conftest import ALICE_FACT, Scenario, snapshot

PINNED = json.loads((Path(__file__).parent / "fixtures" / "released_schemas.json").read_text())
KINDS = [STATE_SCHEMA, AGENT_SCHEMA]


def _built(kind: SchemaKind, version: int) -> apsw.Connection:
    conn = apsw.Connection(":memory:")
    ensure_schema(conn, kind, upto=version)
    return conn


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_released_version_is_pinned_and_unchanged(kind: SchemaKind) -> None:
    released = sorted(int(key.split("@")[1]) for key in PINNED if key.split("@")[0] == kind.name)
    assert released == list(range(1, kind.latest + 1)), "pin every released version in the fixture"
    for version in released:
        assert [list(r) for r in schema_text(_built(kind, version))] == PINNED[f"{kind.name}@{version}"]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_upgrade_from_each_version_matches_fresh(kind: SchemaKind) -> None:
    fresh = schema_text(_built(kind, kind.latest))
    for version in range(kind.latest + 1):
        conn = _built(kind, version)
        assert ensure_schema(conn, kind) == kind.latest
        assert schema_text(conn) == fresh
        assert conn.execute("PRAGMA user_version").fetchall()[0][0] == kind.latest


def test_existing_home_opens_unchanged(scenario: Scenario) -> None:
    """Opening a current home changes no row and still reads its notes."""
    home = scenario.cli.home
    before = snapshot(home, skip_tables=("audit",))
    result = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md")
    assert result.code == 0 and result.out == ALICE_FACT
    assert snapshot(home, skip_tables=("audit",)) == before


def _set_version(db: Path, version: int, app_id: int | None = None) -> None:
    conn = apsw.Connection(str(db))
    conn.execute(f"PRAGMA user_version={version}")
    if app_id is not None:
        conn.execute(f"PRAGMA application_id={app_id}")
    conn.close()


def test_newer_schema_is_refused(scenario: Scenario) -> None:
    home = scenario.cli.home
    _set_version(home / "state.sqlite", STATE_SCHEMA.latest + 1)
    result = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md")
    assert result.code == 1 and "newer" in result.err and result.out == b""


def test_newer_agent_catalog_is_refused(scenario: Scenario) -> None:
    home = scenario.cli.home
    _set_version(home / "agents" / "main" / "catalog.sqlite", AGENT_SCHEMA.latest + 1)
    result = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md")
    assert result.code == 1 and "newer" in result.err and result.out == b""


def test_wrong_kind_of_database_is_refused(scenario: Scenario) -> None:
    home = scenario.cli.home
    shutil.copyfile(home / "agents" / "main" / "catalog.sqlite", home / "state.sqlite")
    result = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md")
    assert result.code == 1 and "not a scopefs state database" in result.err


def test_catalog_of_another_agent_is_refused(scenario: Scenario) -> None:
    """A catalog copied into another agent's cell cannot be used there."""
    cli = scenario.cli
    cli.j("agent", "add", "other")
    home = cli.home
    shutil.copyfile(home / "agents" / "main" / "catalog.sqlite", home / "agents" / "other" / "catalog.sqlite")
    result = cli("session", "open", "--agent", "other", "--shared-main")
    assert result.code == 1 and "another agent cell" in result.err


def test_unversioned_database_with_tables_is_refused(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "x.sqlite"))
    conn.execute("CREATE TABLE stranger (x)")
    with pytest.raises(StorageError):
        ensure_schema(conn, STATE_SCHEMA)


def test_fresh_home_is_latest(tmp_path: Path) -> None:
    home, created = Home.init(tmp_path / "h")
    assert created
    state = home.state()
    assert state.execute("PRAGMA user_version").fetchall()[0][0] == STATE_SCHEMA.latest
    assert state.execute("PRAGMA application_id").fetchall()[0][0] == STATE_SCHEMA.application_id
    assert state.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    assert state.execute("PRAGMA foreign_keys").fetchall()[0][0] == 1
    assert state.execute("PRAGMA synchronous").fetchall()[0][0] == 2  # FULL
