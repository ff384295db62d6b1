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
import threading
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


class AuditBacklog:
    """What a process's audit writes could not deliver yet, for it to deliver later.

    Active (``active``) around a call, it makes that call's refusal, error
    and search audit rows, and its outbox drains, wait at most ``wait_ms``
    for another process's lock on ``state.sqlite`` (or on the cell's
    catalog). Rows that could not be written because the lock stayed taken
    are held here, up to ``limit``; outboxes that could not be drained are
    named here (their rows stay in the outbox). The owner delivers both at
    its next ticks (``vfs.follow``), each try as brief, the last one (when
    it goes) as patient as any write. Without a backlog these writes wait
    the full busy timeout, as every command's do.

    Bounded, because code in a sandbox can make refusals at will: past
    ``limit`` a row is not held but counted (``dropped``), as a row that
    stayed locked out for the busy timeout was dropped before backlogs
    existed; a search, whose rows are the audit of what it exposes, then
    fails instead (``hold``). A failure other than the lock (a full disk)
    is not held either: waiting does not cure it.

    Thread-safe: the calls that hold rows run on one thread (a mount's
    catalog thread), the owner takes them on another.
    """

    def __init__(self, wait_ms: int, limit: int = 10_000) -> None:
        self.wait_ms = wait_ms
        self.limit = limit
        self.dropped = 0  # rows not held since the owner last took: the backlog was full
        self._events: list[AuditEvent] = []
        self._cells: set[str] = set()  # agent ids whose outbox still holds rows to drain
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def active(self) -> Iterator[AuditBacklog]:
        token = _BACKLOG.set(self)
        try:
            yield self
        finally:
            _BACKLOG.reset(token)

    def hold(self, events: list[AuditEvent]) -> bool:
        """Keep ``events`` for the owner, all or none; False (counted in ``dropped``) if they would
        take the backlog past ``limit``."""
        with self._lock:
            if len(self._events) + len(events) > self.limit:
                self.dropped += len(events)
                return False
            self._events += events
            return True

    def hold_drain(self, agent_id: str) -> None:
        with self._lock:
            self._cells.add(agent_id)

    def take(self) -> tuple[list[AuditEvent], int]:
        """The rows held so far and how many were dropped since the last take, for the owner to
        deliver (and to ``keep`` what it still cannot)."""
        with self._lock:
            taken = self._events, self.dropped
            self._events, self.dropped = [], 0
            return taken

    def take_drains(self) -> set[str]:
        """The cells whose outbox a drain could not empty, for the owner to drain."""
        with self._lock:
            cells, self._cells = self._cells, set()
            return cells

    def keep(self, events: list[AuditEvent]) -> None:
        """Put back rows ``take`` gave that could not be written yet, ahead of those held since; the
        newest past ``limit`` are dropped and counted."""
        with self._lock:
            merged = events + self._events
            self.dropped += max(0, len(merged) - self.limit)
            self._events = merged[:self.limit]


_BACKLOG: contextvars.ContextVar[AuditBacklog | None] = contextvars.ContextVar("audit_backlog", default=None)


def contended(exc: BaseException) -> bool:
    """Whether a failed write failed because another connection held the lock past the wait (and so
    may succeed later), not because the storage failed."""
    return isinstance(exc, apsw.BusyError) or isinstance(exc.__cause__, apsw.BusyError)


@contextlib.contextmanager
def patience(*conns: apsw.Connection) -> Iterator[AuditBacklog | None]:
    """Wait as the current backlog says (briefly) on ``conns`` inside the block, or the full busy timeout
    if there is none; yields the backlog, for the caller to hold what the block could not write."""
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
    Under a backlog, a row locked out now is held for later (``True``).
    """
    try:
        with patience(state) as backlog:
            try:
                record(state, event)
            except CATALOG_FAILURES as exc:
                if backlog is None or not contended(exc) or not backlog.hold([event]):
                    raise
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
                backlog.hold_drain(agent_id)
            raise
