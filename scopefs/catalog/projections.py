"""Reading the projection records: what was projected where, and who saw a copy.

A projection's state is derived, never stored twice: revoked once its
``revoked_at`` is set (by a revocation, or by a later projection that
replaced its copy), expired once its time has passed, unavailable if its
copy no longer verifies, live otherwise. A projection row exists only
for a copy that was activated: it is written in that transaction.
Who saw a copy comes from exposure records (the API's receipts) and the
audit's allowed reads (the command line's and the mounts'): ids only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog.home import Home

PURPOSE_MAX = 500
_COLUMNS = ("projection_id, source_revision_id, source_session_id, publisher_id, target_kind, target_id, purpose,"
            " expires_at, no_expiry, copy_resource_id, copy_revision_id, created_at, revoked_at")


@dataclass(frozen=True)
class Projection:
    projection_id: str
    source_revision_id: str
    source_session_id: str
    publisher_id: str
    target_kind: str
    target_id: str
    purpose: str
    expires_at: int | None
    no_expiry: bool
    copy_resource_id: str
    copy_revision_id: str
    created_at: int
    revoked_at: int | None

    def expired(self, now: int) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def state(self, now: int, copy_state: str | None) -> str:
        """revoked (or replaced); unavailable (its copy failed verification); expired; live."""
        if self.revoked_at is not None:
            return "revoked"
        if copy_state != "active":
            return "unavailable"
        return "expired" if self.expired(now) else "live"

    @property
    def target(self) -> str:
        return "agent-shared" if self.target_kind == "agent-shared" else f"{self.target_kind}:{self.target_id}"

    def as_dict(self, now: int, copy_state: str | None) -> dict[str, Any]:
        return {"projection_id": self.projection_id, "source_revision_id": self.source_revision_id,
                "source_session_id": self.source_session_id, "publisher_id": self.publisher_id,
                "target": self.target,
                "purpose": self.purpose, "expires_at_us": self.expires_at, "no_expiry": self.no_expiry,
                "copy_revision_id": self.copy_revision_id, "created_at_us": self.created_at,
                "revoked_at_us": self.revoked_at, "state": self.state(now, copy_state)}


def _row(row: tuple[Any, ...]) -> Projection:
    values = list(row)
    values[8] = bool(values[8])
    return Projection(*values)


def get_projection(catalog: apsw.Connection, agent_id: str, projection_id: str) -> Projection | None:
    rows = catalog.execute(f"SELECT {_COLUMNS} FROM projections WHERE agent_id = ? AND projection_id = ?",
                           (agent_id, projection_id)).fetchall()
    return _row(rows[0]) if rows else None


def list_projections(catalog: apsw.Connection, agent_id: str,
                     source_session_id: str | None = None) -> list[tuple[Projection, str | None]]:
    """Every projection of the agent (of one source session), oldest first, with its copy revision's state."""
    sql = (f"SELECT {', '.join('p.' + c.strip() for c in _COLUMNS.split(','))}, v.state FROM projections p"
           " LEFT JOIN revisions v ON v.revision_id = p.copy_revision_id WHERE p.agent_id = ?")
    args: tuple[Any, ...] = (agent_id,)
    if source_session_id is not None:
        sql += " AND p.source_session_id = ?"
        args += (source_session_id,)
    return [(_row(row[:-1]), row[-1]) for row in catalog.execute(sql + " ORDER BY p.created_at, p.projection_id", args)]


def projection_at(catalog: apsw.Connection, agent_id: str, copy_resource_id: str) -> Projection | None:
    """The unrevoked projection whose copy a resource holds, if any (expired or not)."""
    rows = catalog.execute(
        f"SELECT {_COLUMNS} FROM projections WHERE agent_id = ? AND copy_resource_id = ? AND revoked_at IS NULL"
        " ORDER BY created_at DESC LIMIT 1", (agent_id, copy_resource_id)).fetchall()
    return _row(rows[0]) if rows else None


def sessions_exposed(home: Home, revision_id: str) -> list[str]:
    """Every session that was shown ``revision_id``: exposure receipts, allowed reads and search hits, ids only."""
    rows = home.state().execute(
        "SELECT session_id FROM exposures WHERE revision_id = ?1"
        " UNION SELECT session_id FROM audit WHERE revision_id = ?1 AND decision = 'allow'"
        " AND operation IN ('read', 'search') AND session_id IS NOT NULL ORDER BY 1", (revision_id,))
    return [row[0] for row in rows]
