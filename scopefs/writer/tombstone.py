"""Removing a note: one short transaction that tombstones it.

No file is touched: revisions are immutable and stay on disk for audit and
repair; a tombstoned resource simply has no active revision, so every
reader (the command line, every mounted view through the change log)
stops serving it at once. Physical cleanup is a later, separate step.
"""

from __future__ import annotations

import apsw

from scopefs.catalog.access import Expected, authorize_session, existing_target
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.db import immediate, scalar
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import hold_descendants
from scopefs.catalog.paths import Parts, check_parts, split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason
from scopefs.writer import lock


def tombstone_rows(catalog: apsw.Connection, resource_id: str, revision_id: str, *, cause: str = "tombstone") -> None:
    """Inside the caller's transaction: the resource, its active revision, and every revision derived from it.

    Deletion is symmetric (the specification's "Deletion is symmetric"):
    whatever was made from any revision of the note (a summary, a published
    or projected copy, and what was made from those) is held in the same
    transaction (``catalog.lineage``), so no reader ever sees a descendant
    outlive its source.
    """
    catalog.execute("UPDATE revisions SET state = 'tombstoned' WHERE revision_id = ? AND state = 'active'",
                    (revision_id,))
    catalog.execute("UPDATE resources SET state = 'tombstoned' WHERE resource_id = ? AND state = 'live'",
                    (resource_id,))
    agent_id = scalar(catalog, "SELECT agent_id FROM resources WHERE resource_id = ?", (resource_id,))
    if agent_id is not None:
        hold_descendants(catalog, str(agent_id), resource_id, cause)


def delete_note(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> str:
    """Tombstone the note at virtual ``path`` (a string, as the command line has it)."""
    return delete_parts(home, session_id, split_virtual_path(path), actor_id=actor_id)


def delete_parts(home: Home, session_id: str, parts: Parts, *, actor_id: str | None = None,
                 expected_resource_id: Expected = None) -> str:
    """Tombstone the note at ``parts``; returns its resource id.

    ``expected_resource_id``: the note the caller means; if the path holds
    another one (or none) by the time the transaction runs, Conflict and
    nothing changes (``catalog.access.expect_resource``).
    """
    check_parts(parts)
    access = authorize_session(home, session_id, Op.DELETE, actor_id=actor_id, parts=parts)
    catalog = home.catalog(access.agent_id)
    with lock.shared(home.lock_path(access.agent_id)):
        with immediate(catalog):  # decided and applied in one transaction: nothing can change in between
            target = existing_target(access, parts, Op.DELETE, expected_resource_id=expected_resource_id)
            assert target.resource is not None and target.revision is not None and target.store is not None
            event_id = enqueue(catalog, access.agent_id, access.event(
                Op.DELETE, "allow", Reason.ALLOWED, store_id=target.store.store_id,
                revision_id=target.revision.revision_id))
            tombstone_rows(catalog, target.resource.resource_id, target.revision.revision_id)
            settle(catalog, event_id, decision="allow", reason=Reason.ALLOWED)
    drain_quietly(home.state(), catalog, access.agent_id)
    return target.resource.resource_id

