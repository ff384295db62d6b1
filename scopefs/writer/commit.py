"""The catalog transactions that settle a pending revision: its activation (or its rollback).

A durable write activates in a transaction of its own (``activate``); a
close through a mount writes the same rows (``settle_active``) in the one
transaction that also records the revision
(``writer.transaction._commit_once``). None does file I/O inside the
transaction: the final hash is computed before, and the files of a
rolled-back revision are handled by the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import apsw

from scopefs.catalog.audit import settle
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one, relaxed
from scopefs.catalog.errors import Conflict, IntegrityError
from scopefs.catalog.index import PreparedIndex, insert, retire_rows
from scopefs.catalog.policy import Decision
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import active_revision


class PolicyChanged(Exception):
    """The policy no longer allows the write at commit time (nothing changed)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(str(decision.reason))


def activate(catalog: apsw.Connection, agent_id: str, *, resource_id: str, store_id: str, revision_id: str,
             base_revision_id: str | None, intent_id: str, event_id: str | None, expected_sha256: str,
             final_sha256: str, recheck: Callable[[], Decision], index: PreparedIndex | None,
             unsynced: str | None = None, record: Callable[[], None] | None = None) -> None:
    """Step 4: activate a pending revision whose final hash is already known.

    ``index`` (prepared from the final file before this transaction) is
    written in the same transaction, so a revision is searchable exactly
    when it is active; superseding the base retires the base's rows by
    trigger. None (a close through a mount) queues the revision in
    ``index_backlog`` instead: cutting and embedding its text is a third of
    a save, and the index catches up when the mount is idle or before any
    search reads it (``catalog.index.catch_up``).

    ``recheck`` re-evaluates the policy inside the transaction (catalog reads
    only), so a deny added while the content was being written wins.
    Raises Conflict if the base revision is no longer the active one,
    IntegrityError if the final file does not hash to the pending row, and
    PolicyChanged if the write is no longer allowed; each changes nothing.

    ``unsynced``: the page cache (``catalog.boot``) of an artifact that was
    not synced; the commit then syncs nothing either, and the revision is
    listed as unsynced until ``writer.sync`` or recovery settles it.

    ``record``: rows that must exist exactly when the revision is active (a
    copy's lineage, a projection, a postbox item), written once it is, in
    this transaction; whatever it raises undoes the activation.
    """
    now = now_us()
    with contextlib.ExitStack() as stack:
        if unsynced is not None:
            stack.enter_context(relaxed(catalog))
        stack.enter_context(immediate(catalog))
        state = one(catalog, "SELECT state FROM revisions WHERE agent_id = ? AND revision_id = ?",
                    (agent_id, revision_id))
        if state is None or state[0] != "pending":
            raise Conflict("the pending revision was already settled by recovery")
        current = active_revision(catalog, agent_id, resource_id)
        if (current.revision_id if current else None) != base_revision_id:
            raise Conflict("the note changed while it was being written; nothing was written, try again")
        if final_sha256 != expected_sha256:
            raise IntegrityError("the final file does not match what was staged; nothing was activated")
        decision = recheck()
        if not decision:
            raise PolicyChanged(decision)
        settle_active(catalog, agent_id, resource_id=resource_id, store_id=store_id, revision_id=revision_id,
                      base_revision_id=base_revision_id, intent_id=intent_id, event_id=event_id, index=index,
                      unsynced=unsynced, record=record, now=now)


def settle_active(catalog: apsw.Connection, agent_id: str, *, resource_id: str, store_id: str, revision_id: str,
                  base_revision_id: str | None, intent_id: str | None, event_id: str | None,
                  index: PreparedIndex | None, unsynced: str | None, record: Callable[[], None] | None,
                  now: int) -> None:
    """The rows that make a checked pending revision the active one, inside the caller's transaction.

    ``activate`` calls it once its checks passed; a close through a mount
    (``writer.transaction._commit_once``) calls it in the one transaction that also records the
    revision, after the same checks.
    """
    if base_revision_id is not None:
        catalog.execute("UPDATE revisions SET state = 'superseded' WHERE revision_id = ?", (base_revision_id,))
    catalog.execute("UPDATE revisions SET state = 'active', activated_at = ? WHERE revision_id = ?",
                    (now, revision_id))
    if index is None:
        catalog.execute("INSERT INTO index_backlog (revision_id, agent_id, store_id, queued_at)"
                        " VALUES (?, ?, ?, ?)", (revision_id, agent_id, store_id, now))
    else:
        if base_revision_id is not None:  # what superseding queued (trigger), done now
            retire_rows(catalog, base_revision_id)
        insert(catalog, agent_id, revision_id=revision_id, resource_id=resource_id, store_id=store_id,
               prepared=index)
    if record is not None:
        record()
    if intent_id is not None:
        # Done, the intent says nothing the active revision does not: it goes, so that the table holds
        # the writes in flight, not every write ever made (rolled-back ones stay, as a record of failure).
        catalog.execute("DELETE FROM write_intents WHERE intent_id = ?", (intent_id,))
    if unsynced is not None:
        catalog.execute("INSERT INTO unsynced_revisions (revision_id, agent_id, resource_id, page_cache,"
                        " created_at) VALUES (?, ?, ?, ?, ?)", (revision_id, agent_id, resource_id, unsynced, now))
    if event_id is not None:
        settle(catalog, event_id, decision="allow", reason=Reason.ALLOWED)


def roll_back(catalog: apsw.Connection, agent_id: str, *, revision_id: str, intent_id: str, event_id: str | None,
              reason: Reason, decision: str = "error") -> bool:
    """Mark a pending revision and its intent rolled back; True if it was pending.

    Returns False, changing nothing, when the revision is no longer pending:
    an activation that committed just before an exception (a signal
    arriving as COMMIT returns, say) must keep its rows and its file. Only
    a real rollback tombstones a resource the failed write had created and
    that has no other revision, so a write that never happened leaves no
    name behind to collide with later writes.
    """
    now = now_us()
    with immediate(catalog):
        catalog.execute("UPDATE revisions SET state = 'rolled-back' WHERE agent_id = ? AND revision_id = ?"
                        " AND state = 'pending'", (agent_id, revision_id))
        if catalog.changes() == 0:
            return False
        catalog.execute("UPDATE write_intents SET state = 'rolled-back', finished_at = ? WHERE intent_id = ?"
                        " AND state = 'pending'", (now, intent_id))
        catalog.execute(
            "UPDATE resources SET state = 'tombstoned' WHERE agent_id = ? AND state = 'live'"
            " AND resource_id = (SELECT resource_id FROM revisions WHERE revision_id = ?)"
            " AND NOT EXISTS (SELECT 1 FROM revisions v WHERE v.resource_id = resources.resource_id"
            "                 AND v.state != 'rolled-back')",
            (agent_id, revision_id),
        )
        if event_id is not None:
            settle(catalog, event_id, decision=decision, reason=reason)
    return True
