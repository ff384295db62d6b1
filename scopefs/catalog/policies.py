"""Adding and revoking policy entries (deny rows, exceptional allows).

Entries are immutable once written; a change is a revocation plus a new
entry, and each bumps the policy's revision so a cached decision can tell it
is stale. A deny that would hide a note from the subject that writes its
store is refused by the schema itself: that subject's writes would collide
with, and so reveal, the hidden name.
"""

from __future__ import annotations

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.policy import AudienceKind, Effect, Entry, Op


def add_entry(conn: apsw.Connection, agent_id: str, *, target_kind: str, target_id: str, effect: Effect,
              capability: Op, audience_kind: AudienceKind, audience_id: str = "", grantor: str = "operator",
              expires_at: int | None = None) -> str:
    try:
        with immediate(conn):
            return insert_entry(conn, agent_id, target_kind=target_kind, target_id=target_id, effect=effect,
                                capability=capability, audience_kind=audience_kind, audience_id=audience_id,
                                grantor=grantor, expires_at=expires_at)
    except apsw.ConstraintError as exc:
        if "hide notes" not in str(exc):  # the schema's rule (catalog.schema.agent)
            raise
        raise BadInput("a deny cannot hide notes from the subject that writes their store: its writes would"
                       " collide with names it cannot see; move the note to quarantine instead") from None


def insert_entry(conn: apsw.Connection, agent_id: str, *, target_kind: str, target_id: str, effect: Effect,
                 capability: Op, audience_kind: AudienceKind, audience_id: str = "", grantor: str = "operator",
                 expires_at: int | None = None) -> str:
    """``add_entry`` inside the caller's transaction (a copy's allows are born with its revision)."""
    if target_kind not in ("store", "resource"):
        raise BadInput("policy target must be a store or a resource")
    entry = Entry(effect, capability, audience_kind, audience_id, expires_at)  # coerces and validates
    table, column = ("stores", "store_id") if target_kind == "store" else ("resources", "resource_id")
    entry_id = ids.new_id("entry")
    now = now_us()
    if one(conn, f"SELECT 1 FROM {table} WHERE agent_id = ? AND {column} = ?", (agent_id, target_id)) is None:
        raise BadInput(f"unknown {target_kind}")
    row = one(conn, "SELECT policy_id, revision FROM policies WHERE agent_id = ? AND target_kind = ? AND target_id = ?",
              (agent_id, target_kind, target_id))
    if row is None:
        policy_id, revision = ids.new_id("policy"), 1
        conn.execute(
            "INSERT INTO policies (policy_id, agent_id, target_kind, target_id, created_by, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (policy_id, agent_id, target_kind, target_id, grantor, now),
        )
    else:
        policy_id, revision = row[0], row[1] + 1
        conn.execute("UPDATE policies SET revision = ? WHERE policy_id = ?", (revision, policy_id))
    conn.execute(
        "INSERT INTO policy_entries (entry_id, agent_id, policy_id, policy_revision, effect, capability,"
        " audience_kind, audience_id, grantor, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (entry_id, agent_id, policy_id, revision, entry.effect.value, entry.capability.value,
         entry.audience_kind.value, audience_id, grantor, now, expires_at),
    )
    return entry_id


def revoke_entry(conn: apsw.Connection, agent_id: str, entry_id: str) -> bool:
    with immediate(conn):
        return revoke_entry_in(conn, agent_id, entry_id)


def revoke_entry_in(conn: apsw.Connection, agent_id: str, entry_id: str) -> bool:
    """``revoke_entry`` inside the caller's transaction; False if it was revoked already."""
    row = one(conn, "SELECT policy_id, revoked_at FROM policy_entries WHERE agent_id = ? AND entry_id = ?",
              (agent_id, entry_id))
    if row is None:
        raise BadInput("unknown policy entry")
    if row[1] is not None:
        return False
    conn.execute("UPDATE policy_entries SET revoked_at = ? WHERE entry_id = ?", (now_us(), entry_id))
    conn.execute("UPDATE policies SET revision = revision + 1 WHERE policy_id = ?", (row[0],))
    return True
