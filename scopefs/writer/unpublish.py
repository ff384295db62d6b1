"""An admin takes notes out of ``agent-shared/`` or a role's store.

Those stores are read-only in every view, the publisher's included
(``writer.publish``), so no session can remove what reached them: a copy
published by mistake, a file an operator marked for everyone at migration,
a note the quarantine review released there. A publisher can only retire
the source note of its own copy. ``unpublish`` is the admin's way out:
each named note is forgotten (``writer.admin``: every revision, its bytes,
a hold on what was derived from it), audited as ``unpublish``. Sources in
their owners' private stores are untouched: the owner published a copy,
and only the copy goes. Every view drops the note within its next refresh.

Paths are spelled as views show them: ``agent-shared/...`` or
``roles/<role>/...``. A preview (without ``yes``) lists what would go and
how many derived revisions would be held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.sharing import AGENT_SHARED, parse_audience
from scopefs.catalog.view import AGENT_SHARED_AUDIENCE
from scopefs.writer.admin import StoredNote, forget_stored, held_by, known_agent, stored_note
from scopefs.writer.forget import check_count

OPERATION = "unpublish"
ROLES = "roles"
_NOT_THERE = "no such note in agent-shared/ or roles/<role>/ (unpublish takes paths as a view shows them)"


@dataclass(frozen=True)
class Unpublished:
    notes: list[StoredNote]
    held: int  # derived revisions held with them, counted in the forget's transaction (a preview: would be)
    forget_id: str | None  # None: only previewed

    def as_dict(self, agent_id: str) -> dict[str, Any]:
        return {"agent_id": agent_id, "applied": self.forget_id is not None, "forget_id": self.forget_id,
                "notes": [{"path": n.shown, "resource_id": n.resource_id, "revision_id": n.revision.revision_id}
                          for n in self.notes], "derived_revisions_held": self.held}


def _published_note(home: Home, agent_id: str, path: str) -> StoredNote:
    parts = split_virtual_path(path)
    if parts[0] == AGENT_SHARED and len(parts) > 1:
        scope_kind, audience_id, inner = AGENT_SHARED, AGENT_SHARED_AUDIENCE, parts[1:]
    elif parts[0] == ROLES and len(parts) > 2:
        scope_kind, audience_id = parse_audience(home.state(), agent_id, f"role:{parts[1]}").published_store()
        inner = parts[2:]
    else:
        raise BadInput(_NOT_THERE)
    return stored_note(home.catalog(agent_id), agent_id, scope_kind, audience_id, inner, "/".join(parts), _NOT_THERE)


def unpublish(home: Home, agent_id: str, paths: list[str], *, yes: bool = False) -> Unpublished:
    """Preview, or (``yes``) forget, the notes at ``paths`` of agent-shared and role stores."""
    check_count(paths, "notes to unpublish")
    agent = known_agent(home, agent_id)
    found: dict[str, StoredNote] = {}
    for path in paths:
        note = _published_note(home, agent, path)
        found.setdefault(note.resource_id, note)
    notes = list(found.values())
    if not yes:
        return Unpublished(notes, held_by(home.catalog(agent), agent, notes), None)
    forgotten = forget_stored(home, agent, notes, OPERATION, count_held=True)
    assert forgotten.held is not None
    return Unpublished(notes, forgotten.held, forgotten.forget_id)
