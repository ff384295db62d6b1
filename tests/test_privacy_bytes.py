"""No raw identifier on disk (DESIGN.md §3).

After the whole end-to-end scenario (DMs, colliding names, a group, writes,
reads, a member leaving, a revoked binding, doctor), every byte of the home,
WAL files included, is searched: raw sender ids, the account and the
conversation id appear nowhere, and display names appear only as principal
labels in state.sqlite.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from tests.conftest import ACCOUNT, ALICE_SENDER, BOB_SENDER, GROUP_CONVERSATION, MIKE1_SENDER, MIKE2_SENDER, Scenario

RAW_IDS = [ALICE_SENDER, BOB_SENDER, MIKE1_SENDER, MIKE2_SENDER, ACCOUNT, GROUP_CONVERSATION]
NAMES = ["Alice", "Bob", "Mike"]


def _finish_scenario(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/allergy.md", stdin=b"v2\n")
    cli("read", scenario.group_session, "private/notes/allergy.md")
    cli.j("member", "remove", scenario.conversation, scenario.bob)
    cli("write", scenario.group_session, "channel/x.md", "--actor", scenario.bob, stdin=b"x")
    cli.j("binding", "revoke", scenario.bob_binding)
    cli("read", scenario.bob_session, "private/notes/allergy.md")
    cli.j("doctor", "--fix")


def _text_cells(db: Path) -> list[tuple[str, str, object]]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    cells: list[tuple[str, str, object]] = []
    for (table,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"):
        # From the schema: a cursor over an empty table has no row to describe.
        columns = [info[1] for info in conn.execute(f'PRAGMA table_info("{table}")')]
        for row in conn.execute(f'SELECT * FROM "{table}"'):
            cells.extend((table, col, value) for col, value in zip(columns, row, strict=True))
    conn.close()
    return cells


def test_raw_ids_nowhere_and_names_only_as_labels(scenario: Scenario) -> None:
    _finish_scenario(scenario)
    home = scenario.cli.home
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name == "state.sqlite" for p in files)
    for path in files:
        data = path.read_bytes()
        rel = str(path.relative_to(home))
        for raw in RAW_IDS:
            assert raw.encode() not in data, (raw, rel)
        if not path.name.startswith("state.sqlite"):
            for name in NAMES:
                assert name.encode() not in data, (name, rel)
    # Inside state.sqlite, the names are principal labels and nothing else.
    for table, column, value in _text_cells(home / "state.sqlite"):
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        for name in NAMES:
            if name in text:
                assert (table, column) == ("principals", "label"), (table, column)
    # No path component anywhere in the home is derived from an identifier.
    for path in home.rglob("*"):
        for raw in RAW_IDS + NAMES:
            assert raw not in path.name
