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

A process whose thread has more urgent work queued behind its audit
writes (a mount: its view's refreshes run on the same catalog thread)
makes them under an ``AuditBacklog``: they wait briefly for another
process's lock on ``state.sqlite``, and what could not be written yet is
kept for that process to write later, instead of the thread waiting up to
the busy timeout.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import CATALOG_FAILURES, brief_wait, immediate, relaxed, scalar


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


@dataclass
class AuditBacklog:
    """What a process's audit writes could not deliver yet, for it to deliver later.

    Active (``active``) around a call, it makes that call's refusal, error
    and search audit rows, and its outbox drains, wait at most ``wait_ms``
    for another process's lock on ``state.sqlite`` (or on the cell's
    catalog). Rows that could not be written are kept here; outboxes that
    could not be drained are named here (their rows stay in the outbox).
    The owner delivers both at its next tick (``vfs.follow``) and, when it
    goes, waits as long as any write would. Without a backlog these writes
    wait the full busy timeout, as every command's do.
    """

    wait_ms: int
    events: list[AuditEvent] = field(default_factory=list)
    cells: set[str] = field(default_factory=set)  # agent ids whose outbox still holds rows to drain

    @contextlib.contextmanager
    def active(self) -> Iterator[AuditBacklog]:
        token = _BACKLOG.set(self)
        try:
            yield self
        finally:
            _BACKLOG.reset(token)

    def take(self) -> tuple[list[AuditEvent], set[str]]:
        """Everything kept so far, for the owner to deliver (``keep`` what it still cannot)."""
        events, cells, self.events, self.cells = self.events, self.cells, [], set()
        return events, cells

    def keep(self, events: list[AuditEvent]) -> None:
        """Put back rows ``take`` gave that could not be written yet, ahead of those kept since."""
        self.events[:0] = events


_BACKLOG: contextvars.ContextVar[AuditBacklog | None] = contextvars.ContextVar("audit_backlog", default=None)


def current_backlog() -> AuditBacklog | None:
    """The backlog of the call running now, if its caller made one active."""
    return _BACKLOG.get()


@contextlib.contextmanager
def patience(*conns: apsw.Connection) -> Iterator[AuditBacklog | None]:
    """Wait as the current backlog says (briefly) on ``conns`` inside the block, or the full busy timeout
    if there is none; yields the backlog, for the caller to keep what the block could not write."""
    backlog = _BACKLOG.get()
    if backlog is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        for conn in conns:
            stack.enter_context(brief_wait(conn, backlog.wait_ms))
        yield backlog


def record_quietly(state: apsw.Connection, event: AuditEvent) -> bool:
    """Record, but let a failing audit store not mask the caller's own error.

    Used on paths that are already failing (integrity errors, refusals):
    the refusal stands either way; audit delivery never decides access.
    Under a backlog, a row that cannot be written now is kept for later.
    """
    try:
        with patience(state) as backlog:
            try:
                record(state, event)
            except CATALOG_FAILURES:
                if backlog is None:
                    raise
                backlog.events.append(event)
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
    """Copy ready outbox rows to the shared audit, then remove them from the outbox; returns how many.

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
        # Delivered rows leave the outbox (older versions kept them, marked 'drained': those go too,
        # a batch at a time, so that an outbox holds what is undelivered, not every write ever made).
        # The delete needs no fsync of its own: if power loss takes it, the rows are delivered again
        # and INSERT OR IGNORE drops them. The next FULL commit on this database makes it durable.
        with relaxed(catalog), immediate(catalog):
            for event_id, _ in rows:
                catalog.execute("DELETE FROM audit_outbox WHERE event_id = ?", (event_id,))
            catalog.execute("DELETE FROM audit_outbox WHERE rowid IN (SELECT rowid FROM audit_outbox"
                            " WHERE agent_id = ? AND state = 'drained' LIMIT ?)", (agent_id, batch))
        total += len(rows)


def drain_quietly(state: apsw.Connection, catalog: apsw.Connection, agent_id: str) -> None:
    """Drain after a successful write; a failure leaves the rows in the outbox, for the backlog's owner
    (if any) to drain at its next tick, or for the next drain of any process, or doctor."""
    with contextlib.suppress(*CATALOG_FAILURES), patience(state, catalog) as backlog:
        try:
            drain(state, catalog, agent_id)
        except CATALOG_FAILURES:
            if backlog is not None:
                backlog.cells.add(agent_id)
            raise
