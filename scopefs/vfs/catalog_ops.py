"""The catalog and writer calls a mount makes, each run on the catalog thread.

Thin adapters: they take the path components the mount already holds (each
name validated as it arrived, never joined and split again) and call the
same functions the command line uses, so a mount can do nothing the writer
would refuse to the command line. Where the mount acts on a note it looked
up earlier, it passes that note's resource id, and the writer checks it
inside its transaction: a rename by another session landing in between
makes the call a Conflict instead of acting on whatever note now has the
path.
"""

from __future__ import annotations

import errno
from typing import Any, BinaryIO

from scopefs.catalog.access import VACANT, authorize_session, existing_target
from scopefs.catalog.audit import AuditEvent, record_many
from scopefs.catalog.audit import drain as audit_drain
from scopefs.catalog.db import BUSY_TIMEOUT_MS, CATALOG_FAILURES, brief_wait
from scopefs.catalog.errors import Conflict
from scopefs.catalog.exposures import record_batch
from scopefs.catalog.home import Home
from scopefs.catalog.paths import Parts
from scopefs.catalog.policy import Op
from scopefs.writer import postbox, unsynced
from scopefs.writer.rename import CrossRoot, rename_parts
from scopefs.writer.tombstone import delete_parts
from scopefs.writer.transaction import WriteResult, check_write, write_parts


def check_deposit(home: Home, session_id: str, handle: str) -> None:
    """Raise the one generic refusal (audited with the true reason) unless ``handle`` may deposit now."""
    postbox.check_deposit(home, session_id, handle)


def deposit(home: Home, session_id: str, handle: str, data: bytes) -> None:
    """File a deposit's bytes into the postbox of the sender ``handle`` names (``writer.postbox.deposit``;
    writes already stopped them at ``DEPOSIT_MAX_BYTES``)."""
    postbox.deposit(home, session_id, handle, data)


class CrossDevice(OSError):
    """A rename between two roots: ``EXDEV``, so that ``mv`` copies (through the write path) instead."""


def commit(home: Home, session_id: str, parts: Parts, source: BinaryIO, expected_resource_id: str | None, *,
           durable: bool = False) -> WriteResult:
    """A draft's content (``Draft.reader``, opened by the caller on the thread that owns the draft) as
    the next revision of the note at ``parts`` (of ``expected_resource_id``, if given); synced to disk only
    if ``durable`` (an ``fsync``), as POSIX asks (``writer.transaction``); its search rows follow once the
    mount is idle, or when a search asks first (``Owed.index``)."""
    return write_parts(home, session_id, parts, source, expected_resource_id=expected_resource_id,
                       durable=durable, defer_index=True, in_memory=True)


def sync(home: Home, agent_id: str, resource_id: str | None) -> None:
    """Make the revisions a close committed without a sync durable: one note's, or (None) the cell's."""
    unsynced.sync(home, agent_id, resource_id=resource_id)


def forget_before(home: Home, agent_ids: set[str], before_us: int) -> None:
    """After ``unsynced.write_back``: the revisions activated before it started are durable."""
    for agent_id in sorted(agent_ids):
        unsynced.forget_before(home, agent_id, before_us)


def drain(home: Home, agent_ids: set[str], *, wait_ms: int = BUSY_TIMEOUT_MS) -> set[str]:
    """Deliver the audit rows saves left in these cells' outboxes (``catalog.audit``); the cells whose
    rows stay in the outbox for now (the state database or the cell's catalog stayed locked for
    ``wait_ms``, or failed), for the caller to try again. One cell's failure holds up no other's."""
    left: set[str] = set()
    for agent_id in sorted(agent_ids):
        try:
            with brief_wait(home.state(), wait_ms), brief_wait(home.catalog(agent_id), wait_ms):
                audit_drain(home.state(), home.catalog(agent_id), agent_id)
        except CATALOG_FAILURES:
            left.add(agent_id)
    return left


def record_reads(home: Home, *, wait_ms: int = BUSY_TIMEOUT_MS, **batch: Any) -> None:
    """``catalog.exposures.record_batch`` on the state database; raises ``StorageError`` if it stayed
    locked for ``wait_ms`` (nothing was written: the caller keeps the batch for the next try)."""
    with brief_wait(home.state(), wait_ms):
        record_batch(home.state(), **batch)


def record_events(home: Home, events: list[AuditEvent], *, wait_ms: int = BUSY_TIMEOUT_MS) -> None:
    """Audit rows held back (``catalog.audit.AuditBacklog``), in one commit; raises ``StorageError`` if
    the state database stayed locked for ``wait_ms`` (nothing was written: the caller keeps them)."""
    with brief_wait(home.state(), wait_ms):
        record_many(home.state(), events)


def check_save(home: Home, session_id: str, parts: Parts) -> None:
    """Raise (audited) if saving the note at ``parts`` would be refused."""
    check_write(home, session_id, parts)


def check_remove(home: Home, session_id: str, parts: Parts) -> None:
    """Raise (audited) if the note at ``parts`` may not be removed."""
    access = authorize_session(home, session_id, Op.DELETE, parts=parts)
    existing_target(access, parts, Op.DELETE)


def remove(home: Home, session_id: str, parts: Parts, resource_id: str) -> bool:
    """Tombstone the note at ``parts`` if it is still ``resource_id``; whether it was.

    A note renamed away or replaced since it was unlinked here is not ours
    to remove: the writer's own transaction finds another (or no) resource
    at the path, and nothing changes.
    """
    try:
        delete_parts(home, session_id, parts, expected_resource_id=resource_id)
    except Conflict:
        return False
    return True


def rename(home: Home, session_id: str, source: Parts, destination: Parts, resource_id: str,
           replacing: str | None) -> None:
    """Move the note ``resource_id`` from ``source`` to ``destination``, over the note ``replacing``
    (None: over nothing). Conflict if either path holds something else by then."""
    try:
        rename_parts(home, session_id, source, destination, replace=True, expected_resource_id=resource_id,
                     expected_target_id=VACANT if replacing is None else replacing)
    except CrossRoot:
        raise CrossDevice(errno.EXDEV, "cross-root rename") from None
