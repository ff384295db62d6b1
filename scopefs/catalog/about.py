"""Verified subjects of a note: who a note is about, attested by a trusted caller.

The seed's "Subject lookup": person references are canonical principal ids
in policy metadata, never names recovered by similarity. Only the operator
(the command line, or a gateway speaking for verified identity resolution)
can attach one, and only by principal id; text inside a note, a sandboxed
process or a search query can never create or change one. So two people
named Mike stay two ids, and ``search --about`` narrows to one of them
inside the view before anything is ranked.

Attaching needs the same right as changing the note (``replace``), and the
note must be visible to the session, so a subject can neither be planted on
nor reveal a note outside the view.
"""

from __future__ import annotations

from scopefs.catalog.access import authorize_session, existing_target
from scopefs.catalog.audit import record
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.home import Home
from scopefs.catalog.identity import get_principal
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason


def attach(home: Home, session_id: str, path: str, principal_id: str, *, remove: bool = False) -> bool:
    """Attach (or with ``remove``, detach) a verified subject; True if anything changed."""
    get_principal(home.state(), principal_id)  # BadInput for an unknown or malformed id
    parts = split_virtual_path(path)
    access = authorize_session(home, session_id, Op.REPLACE, parts=parts)
    target = existing_target(access, parts, Op.REPLACE)
    assert target.resource is not None and target.store is not None
    catalog = home.catalog(access.agent_id)
    with immediate(catalog):
        if remove:
            catalog.execute("DELETE FROM resource_subjects WHERE agent_id = ? AND resource_id = ? AND principal_id = ?",
                            (access.agent_id, target.resource.resource_id, principal_id))
        else:
            catalog.execute("INSERT OR IGNORE INTO resource_subjects (resource_id, principal_id, agent_id, session_id,"
                            " created_at) VALUES (?, ?, ?, ?, ?)",
                            (target.resource.resource_id, principal_id, access.agent_id, session_id, now_us()))
        changed = catalog.changes() > 0
    record(home.state(), access.event("subject-remove" if remove else "subject-add", "allow", Reason.ALLOWED,
                                      store_id=target.store.store_id,
                                      revision_id=target.revision.revision_id if target.revision else None))
    return changed


def subjects_of(home: Home, session_id: str, path: str) -> list[str]:
    """The verified subject principals of a note the session can read."""
    parts = split_virtual_path(path)
    access = authorize_session(home, session_id, Op.READ, parts=parts)
    target = existing_target(access, parts, Op.READ)
    assert target.resource is not None
    return [row[0] for row in home.catalog(access.agent_id).execute(
        "SELECT principal_id FROM resource_subjects WHERE agent_id = ? AND resource_id = ? ORDER BY principal_id",
        (access.agent_id, target.resource.resource_id))]
