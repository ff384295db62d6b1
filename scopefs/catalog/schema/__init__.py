"""Versioned schemas and the one code path that creates or upgrades them.

Each database kind has an append-only list of migration steps; step N takes
a database from version N to N+1 and is never edited once released (the
tests pin every released version's schema text). A fresh database runs all
steps, an old one runs the missing ones, each in its own transaction, so the
two always end in the same schema. A database from a newer release, or of
another kind, is refused: we never guess at a layout we do not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from scopefs.catalog.db import immediate, scalar
from scopefs.catalog.errors import StorageError


@dataclass(frozen=True)
class SchemaKind:
    name: str
    application_id: int  # PRAGMA application_id: tells our two kinds apart
    steps: Sequence[str]

    @property
    def latest(self) -> int:
        return len(self.steps)


def current_version(conn: apsw.Connection) -> int:
    return int(scalar(conn, "PRAGMA user_version"))


def ensure_schema(conn: apsw.Connection, kind: SchemaKind, *, upto: int | None = None) -> int:
    """Bring ``conn`` to ``upto`` (default: latest); returns the version.

    ``upto`` exists for the upgrade tests, which build every released version
    and then upgrade it the normal way.
    """
    target = kind.latest if upto is None else upto
    app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    version = current_version(conn)
    if version == 0 and app_id == 0:
        has_tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]
        if has_tables:
            raise StorageError(f"{kind.name} database has unknown tables and no version; refusing to use it")
    elif app_id != kind.application_id:
        raise StorageError(f"not a scopefs {kind.name} database")
    if version > kind.latest:
        raise StorageError(
            f"{kind.name} database is schema version {version},"
            f" newer than this scopefs ({kind.latest}); upgrade scopefs"
        )
    while version < target:
        with immediate(conn):
            if current_version(conn) != version:  # another process upgraded meanwhile
                version = current_version(conn)
                continue
            conn.execute(kind.steps[version])
            conn.execute(f"PRAGMA application_id={kind.application_id:d}")
            conn.execute(f"PRAGMA user_version={version + 1:d}")
        version += 1
    return version


# What SQLite makes by itself, never by a schema step: a UNIQUE/PRIMARY KEY's automatic index (it has no SQL)
# and the AUTOINCREMENT and ANALYZE tables. Matched exactly (``_`` is a wildcard to LIKE unless escaped): a
# name that merely starts with "sqlite" (a planted ``sqlitex`` trigger) is compared like any other object.
_SQLITE_OWN = (
    "(type = 'index' AND name LIKE 'sqlite\\_autoindex\\_%' ESCAPE '\\' AND sql IS NULL)"
    " OR (type = 'table' AND name IN ('sqlite_sequence', 'sqlite_stat1', 'sqlite_stat2', 'sqlite_stat3',"
    " 'sqlite_stat4'))"
)


def schema_text(conn: apsw.Connection) -> list[tuple[str, str, str]]:
    """The schema as sorted (type, name, sql) rows: every object but those SQLite makes itself.

    Restore compares a backup's schema with a fresh one by it, so nothing may
    be left out that a schema step could not have made (a trigger there runs
    on every later write).
    """
    return sorted(
        (row[0], row[1], " ".join((row[2] or "").split()))
        for row in conn.execute(f"SELECT type, name, sql FROM sqlite_schema WHERE NOT ({_SQLITE_OWN})")
    )
