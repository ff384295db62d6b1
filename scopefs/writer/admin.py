"""Notes an admin acts on from the host: found by store and path, forgotten without a view.

Some decisions belong to nobody's session: the review of the quarantine,
which no view mounts (``writer.quarantine_review``), and taking a note out
of ``agent-shared/`` or a role's store, which every view shows read-only
(``writer.unpublish``). Both name a note by its store and its path inside
it, and both may forget it: every revision, its bytes, and a hold on
whatever was derived from it, in one transaction through ``forget``'s own
commit, as the broker (``writer.broker``) and audited under the admin's
operation. No claim is rejected: the admin removes this copy, and does not
say its facts must never be written again, which is a person's ``forget``.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.lineage import descendants, resource_revisions
from scopefs.catalog.paths import Parts
from scopefs.catalog.policy import Op
from scopefs.catalog.stores import RevisionRow, StoreRow, active_at, active_revision
from scopefs.writer.broker import broker_access
from scopefs.writer.forget import Note, Plan, forget_planned


@dataclass(frozen=True)
class StoredNote:
    """One live note of a store, as the catalog has it now."""

    parts: Parts  # its path inside the store
    shown: str  # how the admin named it (for reports)
    store: StoreRow
    resource_id: str
    revision: RevisionRow  # the active one

    def still(self, catalog: apsw.Connection, agent_id: str) -> bool:
        """Whether the note is still live with the same active revision (inside a transaction)."""
        current = active_revision(catalog, agent_id, self.resource_id)
        return current is not None and current.revision_id == self.revision.revision_id


def known_agent(home: Home, agent_id: str) -> str:
    agent = validate_agent_name(agent_id)
    if not home.agent_exists(agent):
        raise BadInput(f"unknown agent: {agent}")
    return agent


def stored_note(catalog: apsw.Connection, agent_id: str, scope_kind: str, audience_id: str, parts: Parts,
                shown: str, missing: str) -> StoredNote:
    """The live note at ``parts`` of the store (``scope_kind``, ``audience_id``); BadInput(``missing``) if none."""
    found = active_at(catalog, agent_id, scope_kind, audience_id, "/".join(parts))
    if found is None:
        raise BadInput(missing)
    store, resource, revision = found
    return StoredNote(parts, shown, store, resource.resource_id, revision)


def held_by(catalog: apsw.Connection, agent_id: str, notes: list[StoredNote]) -> int:
    """How many revisions derived from ``notes`` a forget of them would hold (those held already
    included; a note derived from another of ``notes`` counted as derived, not as held)."""
    revisions = [r for note in notes for r in resource_revisions(catalog, agent_id, note.resource_id)]
    return len(descendants(catalog, agent_id, revisions)) if revisions else 0


def forget_plan(catalog: apsw.Connection, agent_id: str, notes: list[StoredNote]) -> Plan:
    """``forget``'s plan for ``notes``: each whole, with every revision it has."""
    return Plan([Note(n.shown, n.resource_id, n.store, "named",
                      tuple(resource_revisions(catalog, agent_id, n.resource_id))) for n in notes])


@dataclass(frozen=True)
class Forgotten:
    forget_id: str
    held: int | None  # ``held_by`` taken inside the forget's transaction (None: not asked for)


def forget_stored(home: Home, agent_id: str, notes: list[StoredNote], operation: str, *,
                  count_held: bool = False) -> Forgotten:
    """Forget ``notes`` as the broker, audited as ``operation``. Conflict if one changed since it was found
    (nothing is forgotten then). ``count_held``: also count what was derived from them (``held_by``) where
    the forget decides, under its lock, so that a derivation landing after the notes were found counts."""
    catalog = home.catalog(agent_id)
    plan = forget_plan(catalog, agent_id, notes)
    held: int | None = None

    def unchanged() -> bool:
        nonlocal held
        if not all(n.still(catalog, agent_id) for n in notes):
            return False
        if count_held:
            held = held_by(catalog, agent_id, notes)
        return True

    with broker_access(home, agent_id, Op.DELETE, operation) as access:
        forget_id = forget_planned(access, plan, [], unchanged, operation=operation)
    return Forgotten(forget_id, held)
