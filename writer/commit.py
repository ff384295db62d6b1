"""The two short catalog transactions that settle a pending revision.

Shared by the live write path and by recovery, so an interrupted write is
completed or rolled back by exactly the code that would have done it. Both
run without any file I/O inside the transaction: the final hash is computed
before ``activate`` is called.
"""

from __future__ import annotations

import apsw

from catalog.audit import settle
from catalog.clock import now_us
from catalog.db import immediate, one
from catalog.errors import Conflict, IntegrityError
from catalog.reasons import Reason
from catalog.stores import active_revision


def activate(catalog: apsw.Connection, agent_id: str, *, resource_id: str, revision_id: str, base_revision_id: str | None,
             intent_id: str, event_id: str | None, expected_sha256: str, final_sha256: str) -> None:
    """Step 4: activate a pending revision whose final hash is already known.

    Shared with recovery, which completes an interrupted intent the same
    way. Raises Conflict if the base revision is no longer the active one,
    IntegrityError if the final file does not hash to the pending row; the
    transaction then changes nothing.
    """
    now = now_us()
    with immediate(catalog):
        state = one(catalog, "SELECT state FROM revisions WHERE agent_id = ? AND revision_id = ?",
                    (agent_id, revision_id))
        if state is None or state[0] != "pending":
            raise Conflict("the pending revision was already settled by recovery")
        current = active_revision(catalog, agent_id, resource_id)
        if (current.revision_id if current else None) != base_revision_id:
            raise Conflict("the note changed while it was being written; nothing was written, try again")
        if final_sha256 != expected_sha256:
            raise IntegrityError("the final file does not match what was staged; nothing was activated")
        if base_revision_id is not None:
            catalog.execute("UPDATE revisions SET state = 'superseded' WHERE revision_id = ?", (base_revision_id,))
        catalog.execute("UPDATE revisions SET state = 'active', activated_at = ? WHERE revision_id = ?",
                        (now, revision_id))
        catalog.execute("UPDATE write_intents SET state = 'done', finished_at = ? WHERE intent_id = ?",
                        (now, intent_id))
        if event_id is not None:
            settle(catalog, event_id, decision="allow", reason=Reason.ALLOWED)


def roll_back(catalog: apsw.Connection, agent_id: str, *, revision_id: str, intent_id: str, event_id: str | None,
              reason: Reason) -> None:
    """Mark a pending revision and its intent rolled back (files already gone)."""
    now = now_us()
    with immediate(catalog):
        catalog.execute("UPDATE revisions SET state = 'rolled-back' WHERE agent_id = ? AND revision_id = ?"
                        " AND state = 'pending'", (agent_id, revision_id))
        catalog.execute("UPDATE write_intents SET state = 'rolled-back', finished_at = ? WHERE intent_id = ?"
                        " AND state = 'pending'", (now, intent_id))
        if event_id is not None:
            settle(catalog, event_id, decision="error", reason=reason)
