"""Adding and revoking policy entries (deny rows, exceptional allows).

Entries are immutable once written; a change is a revocation plus a new
entry, and each bumps the policy's revision so a cached decision can tell it
is stale. A deny that would hide a note from the subject that writes its
store is refused: that subject's writes would collide with, and so reveal,
the hidden name.
"""

from __future__ import annotations

import apsw

from catalog import ids
from catalog.clock import now_us
from catalog.db import immediate, one
from catalog.errors import BadInput
from catalog.policy import AudienceKind, Effect, Entry, Op
from catalog.subject import Subject, SubjectKind

# Who writes a store by placement: that subject must always see every name
# in it, or its own writes would reveal (and collide with) hidden notes.
_WRITER_OF_SCOPE = {"user": SubjectKind.USER, "channel": SubjectKind.CONVERSATION, "agent": SubjectKind.SERVICE}


def _hides_from_writer(entry: Entry, scope_kind: str, audience_id: str) -> bool:
    writer = _WRITER_OF_SCOPE.get(scope_kind)
    return (writer is not None and entry.effect is Effect.DENY and entry.capability in (Op.RETRIEVE, Op.READ)
            and entry.matches(Subject(writer, audience_id)))


def add_entry(conn: apsw.Connection, agent_id: str, *, target_kind: str, target_id: str, effect: Effect,
              capability: Op, audience_kind: AudienceKind, audience_id: str = "", grantor: str = "operator",
              expires_at: int | None = None) -> str:
    if target_kind not in ("store", "resource"):
        raise BadInput("policy target must be a store or a resource")
    table, column = ("stores", "store_id") if target_kind == "store" else ("resources", "resource_id")
    entry_id = ids.new_id("entry")
    now = now_us()
    entry = Entry(effect, capability, audience_kind, audience_id, expires_at)  # validates the values
    with immediate(conn):
        if target_kind == "store":
            owner = one(conn, "SELECT scope_kind, audience_id FROM stores WHERE agent_id = ? AND store_id = ?",
                        (agent_id, target_id))
        else:
            owner = one(conn, "SELECT s.scope_kind, s.audience_id FROM resources r JOIN stores s USING (store_id)"
                              " WHERE r.agent_id = ? AND s.agent_id = ? AND r.resource_id = ?",
                        (agent_id, agent_id, target_id))
        if owner is None:
            raise BadInput(f"unknown {target_kind}")
        if _hides_from_writer(entry, owner[0], owner[1]):
            raise BadInput("a deny cannot hide notes from the subject that writes their store: its writes would"
                           " collide with names it cannot see; move the note to quarantine instead")
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
            " audience_kind, audience_id, grantor, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry_id, agent_id, policy_id, revision, effect.value, capability.value, audience_kind.value,
             audience_id, grantor, now, expires_at),
        )
    return entry_id


def revoke_entry(conn: apsw.Connection, agent_id: str, entry_id: str) -> bool:
    with immediate(conn):
        row = one(conn, "SELECT policy_id, revoked_at FROM policy_entries WHERE agent_id = ? AND entry_id = ?",
                  (agent_id, entry_id))
        if row is None:
            raise BadInput("unknown policy entry")
        if row[1] is not None:
            return False
        conn.execute("UPDATE policy_entries SET revoked_at = ? WHERE entry_id = ?", (now_us(), entry_id))
        conn.execute("UPDATE policies SET revision = revision + 1 WHERE policy_id = ?", (row[0],))
    return True
