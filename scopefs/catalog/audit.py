"""The redacted audit: decisions and ids, never content.

An audit row holds the operation, the subject kind, the session, the actor
principal, the store and revision ids, the decision, the reason code and the
time. It never holds note content, a path a user chose, a query, a snippet
or a raw provider id; the types here have no field that could carry one.

Reads and refusals are recorded straight into ``state.sqlite``. Writes
enqueue their row in the agent's outbox inside the same transaction that
creates the pending revision, so the audit can never miss a committed
change; the outbox then drains idempotently (by event id) to the shared
table.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import CATALOG_FAILURES, immediate, relaxed, scalar


@dataclass(frozen=True)
class AuditEvent:
    operation: str
    decision: str  # allow | deny | error
    reason: str
    agent_id: str | None = None
    session_id: str | None = None
    subject_kind: str | None = None
    actor_id: str | None = None
    store_id: str | None = None
    revision_id: str | None = None
    at: int = field(default_factory=now_us)


_COLUMNS = ("at", "agent_id", "session_id", "operation", "subject_kind", "actor_id", "store_id", "revision_id",
            "decision", "reason")
_INSERT = (f"INSERT OR IGNORE INTO audit (event_id, {', '.join(_COLUMNS)})"
           f" VALUES (?, {', '.join('?' for _ in _COLUMNS)})")


def record(state: apsw.Connection, event: AuditEvent) -> None:
    """Write one audit row now (reads, refusals, identity changes)."""
    values = asdict(event)
    with immediate(state):
        state.execute(_INSERT, (None, *(values[c] for c in _COLUMNS)))


def record_many(state: apsw.Connection, events: list[AuditEvent]) -> None:
    """Write several rows in one transaction (a mount's batched read exposures)."""
    with immediate(state):
        insert_many(state, events)


def insert_many(state: apsw.Connection, events: list[AuditEvent]) -> None:
    """Insert rows inside the caller's open transaction (a search adds its timing to the same one)."""
    state.executemany(_INSERT, [(None, *(getattr(e, c) for c in _COLUMNS)) for e in events])


def record_quietly(state: apsw.Connection, event: AuditEvent) -> bool:
    """Record, but let a failing audit store not mask the caller's own error.

    Used on paths that are already failing (integrity errors, refusals):
    the refusal stands either way; audit delivery never decides access.
    """
    try:
        record(state, event)
    except CATALOG_FAILURES:
        return False
    return True


def enqueue(catalog: apsw.Connection, agent_id: str, event: AuditEvent) -> str:
    """Add an outbox row inside the caller's open transaction."""
    event_id = ids.new_id("event")
    catalog.execute(
        "INSERT INTO audit_outbox (event_id, agent_id, payload, state, created_at) VALUES (?, ?, ?, 'pending', ?)",
        (event_id, agent_id, json.dumps(asdict(event), sort_keys=True), event.at),
    )
    return event_id


def settle(catalog: apsw.Connection, event_id: str, *, decision: str, reason: str,
           revision_id: str | None = None) -> None:
    """Finalize an outbox row inside the caller's transaction; ready to drain."""
    stored = scalar(catalog, "SELECT payload FROM audit_outbox WHERE event_id = ?", (event_id,))
    if stored is None:
        return
    payload = json.loads(stored)
    payload.update(decision=decision, reason=reason)
    if revision_id is not None:
        payload["revision_id"] = revision_id
    catalog.execute("UPDATE audit_outbox SET payload = ?, state = 'ready' WHERE event_id = ?",
                    (json.dumps(payload, sort_keys=True), event_id))


def drain(state: apsw.Connection, catalog: apsw.Connection, agent_id: str, *, batch: int = 1000) -> int:
    """Copy ready outbox rows to the shared audit; returns how many.

    Idempotent: the shared table is keyed by event id, so a crash between
    the two commits re-delivers nothing twice.
    """
    total = 0
    while True:
        rows = catalog.execute(
            "SELECT event_id, payload FROM audit_outbox WHERE agent_id = ? AND state = 'ready'"
            " ORDER BY created_at LIMIT ?",
            (agent_id, batch),
        ).fetchall()
        if not rows:
            return total
        with immediate(state):
            for event_id, payload in rows:
                values = json.loads(str(payload))
                state.execute(_INSERT, (event_id, *(values.get(c) for c in _COLUMNS)))
        # The "drained" mark needs no fsync of its own: if power loss takes
        # it, the rows are delivered again and INSERT OR IGNORE drops them.
        # The next FULL commit on this database makes the mark durable.
        with relaxed(catalog), immediate(catalog):
            for event_id, _ in rows:
                catalog.execute("UPDATE audit_outbox SET state = 'drained' WHERE event_id = ?", (event_id,))
        total += len(rows)


def drain_quietly(state: apsw.Connection, catalog: apsw.Connection, agent_id: str) -> None:
    """Drain after a successful write; a failure leaves rows for doctor."""
    with contextlib.suppress(*CATALOG_FAILURES):
        drain(state, catalog, agent_id)
