"""Projections: a reviewed, immutable copy of one private note for one audience.

The spec's explicit declassification. The owner of a note (a verified user,
projecting from its own ``private/``) names exactly one audience it is in
today (a conversation, one of its roles, or the whole agent), a purpose,
and an expiry or the recorded choice of none. Without ``--yes`` that is a
preview. With it, the copy is written into the audience's projection store
(``projections/<audience>/`` in their views) with lineage to the source
revision, and its own allow entries (retrieve, read, derive; expiring with
the projection) are born in the transaction that records it: the copy's
mount grants nothing by placement, so those entries are the only way to it,
and when they expire or are revoked the copy is gone from every read,
listing and search, and from live mounts through the change log.

Editing the source changes nothing here: the copy stays at its revision
until the owner projects again, which replaces it (one live projection per
copy). Revoking revokes the entries, tombstones the copy, and answers with
the sessions that had been shown it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.access import Access
from scopefs.catalog.audit import AuditEvent, drain_quietly, enqueue, settle
from scopefs.catalog.auditlog import pruned_before
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import BadInput, Conflict
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import add_lineage, hold, inherited_validity
from scopefs.catalog.policies import insert_entry, revoke_entry_in
from scopefs.catalog.policy import AudienceKind, Decision, Effect, Op
from scopefs.catalog.projections import PURPOSE_MAX, Projection, get_projection, projection_at, sessions_exposed
from scopefs.catalog.readjournal import replay
from scopefs.catalog.reasons import Reason
from scopefs.catalog.sharing import Audience, audience_today, in_audience, parse_audience
from scopefs.catalog.stores import find_resource, find_store
from scopefs.catalog.subject import SubjectKind
from scopefs.catalog.view import PROJECTED
from scopefs.writer import lock
from scopefs.writer.copies import (
    Source,
    lineage_allows,
    read_source,
    source_still_active,
)
from scopefs.writer.tombstone import tombstone_rows
from scopefs.writer.transaction import Provenance, WriteResult, write_copy

_PURPOSE_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))


@dataclass(frozen=True)
class Expiry:
    """When a projection ends: at ``at`` (absolute, microseconds), or never (``at`` None), chosen on purpose."""

    at: int | None

    @classmethod
    def choose(cls, expires_after_us: int | None, no_expiry: bool) -> Expiry:
        if (expires_after_us is None) == (not no_expiry):
            raise BadInput("a projection needs exactly one of --expires DURATION and --no-expiry")
        if expires_after_us is not None and expires_after_us <= 0:
            raise BadInput("the expiry must lie in the future")
        return cls(None if no_expiry else now_us() + (expires_after_us or 0))


def check_purpose(purpose: str) -> str:
    """A purpose is a line a person reads in a review: 1-500 characters, no control characters."""
    if not isinstance(purpose, str) or not purpose.strip():
        raise BadInput("a projection needs a purpose (--purpose TEXT)")
    if len(purpose) > PURPOSE_MAX:
        raise BadInput(f"the purpose is longer than {PURPOSE_MAX} characters")
    if any(ch in _PURPOSE_CONTROL for ch in purpose):
        raise BadInput("the purpose holds control characters")
    try:
        purpose.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput("the purpose is not valid text") from None
    return purpose


@dataclass(frozen=True)
class Projected:
    preview: dict[str, Any]
    result: WriteResult | None  # None: only previewed
    projection_id: str | None
    replaced: str | None  # the projection this one replaced (same copy), if any


def project(home: Home, session_id: str, path: str, to: str, *, purpose: str, expiry: Expiry,
            name: str | None = None, yes: bool = False) -> Projected:
    """Preview, or with ``yes`` make, a projection of the note at ``path`` for the audience ``to``."""
    check_purpose(purpose)
    source = read_source(home, session_id, path)
    access = source.access
    audience = parse_audience(home.state(), access.agent_id, to)
    inner = source.copy_name(name)
    catalog = home.catalog(access.agent_id)
    decision = _owner_decision(access, source, audience)
    if decision:
        decision = lineage_allows(catalog, source, "projection", audience.principal_id)
    if not decision:
        raise access.refuse(Op.PROJECT, decision.reason)
    now = now_us()
    replaced = _replaced(catalog, access, audience, inner, source, now)
    members = audience_today(home.state(), audience, now)
    preview = source.preview(
        target=audience.spelled, target_path=f"{audience.projection_root()}/{'/'.join(inner)}", purpose=purpose,
        expires_at_us=expiry.at, no_expiry=expiry.at is None,
        audience="every session of this agent" if audience.kind == "agent-shared"
        else [{"principal_id": pid, "label": label} for pid, label in members],
        replaces=replaced.projection_id if replaced else None)
    if not yes:
        return Projected(preview, None, None, replaced.projection_id if replaced else None)
    projection_id = ids.new_id("projection")

    def authority(conn: apsw.Connection, _activating: bool) -> Decision:
        decided = _owner_decision(access, source, audience)
        if decided:
            decided = lineage_allows(conn, source, "projection", audience.principal_id)
        return source_still_active(conn, source.revision_id) if decided else decided

    def record(conn: apsw.Connection, resource_id: str, revision_id: str) -> None:
        """With the copy's activation: its allows, its row, its lineage; the projection it replaces revoked."""
        agent, at = access.agent_id, now_us()
        holder = projection_at(conn, agent, resource_id)
        if holder is not None:
            if not holder.expired(at) and holder.projection_id != (replaced.projection_id if replaced else None):
                raise Conflict("another projection took that name meanwhile; nothing was written, try again")
            revoke_rows(conn, agent, holder)
        add_lineage(conn, agent, revision_id, source.revision_id, "project")
        for capability in sorted(PROJECTED):
            insert_entry(conn, agent, target_kind="resource", target_id=resource_id, effect=Effect.ALLOW,
                         capability=capability, audience_kind=AudienceKind.ANY,
                         grantor=access.actor_id or "owner", expires_at=expiry.at)
        conn.execute(
            "INSERT INTO projections (projection_id, agent_id, source_revision_id, source_session_id, publisher_id,"
            " target_kind, target_id, purpose, expires_at, no_expiry, copy_resource_id, copy_revision_id,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (projection_id, agent, source.revision_id, access.session.session_id, access.actor_id,
             audience.kind, audience.principal_id, purpose, expiry.at, int(expiry.at is None), resource_id,
             revision_id, at))

    provenance = Provenance(Op.PROJECT, "projection", authority, record,
                            valid_until=lambda conn: inherited_validity(conn, [source.revision_id]))
    result = write_copy(access, "projection", audience.principal_id, inner, source.data, provenance)
    return Projected(preview, result, projection_id, replaced.projection_id if replaced else None)


def _owner_decision(access: Access, source: Source, audience: Audience) -> Decision:
    """Only a verified user projects, only from its own private store, only into an audience it is in."""
    subject = access.session.subject
    if subject.kind is not SubjectKind.USER or not source.own():
        return Decision(False, Reason.NOT_OWNER)
    assert subject.principal_id is not None
    if not in_audience(access.home.state(), subject.principal_id, audience, now_us()):
        return Decision(False, Reason.NOT_IN_AUDIENCE)
    return Decision(True, Reason.ALLOWED)


def _replaced(catalog: apsw.Connection, access: Access, audience: Audience, inner: tuple[str, ...],
              source: Source, now: int) -> Projection | None:
    """The owner's live projection of the same note that this one replaces; None if the name is free
    (nothing there, or a projection that expired); BadInput if another live projection holds it.

    The owner is in the audience, so a live projection's name is one it
    can see: refusing a taken name tells it nothing new.
    """
    store = find_store(catalog, access.agent_id, "projection", audience.principal_id)
    resource = None if store is None else find_resource(catalog, access.agent_id, store.store_id, "/".join(inner))
    holder = None if resource is None else projection_at(catalog, access.agent_id, resource.resource_id)
    if holder is None or holder.expired(now):
        return None
    if holder.publisher_id == access.actor_id and catalog.execute(
            "SELECT 1 FROM revisions a JOIN revisions b ON a.resource_id = b.resource_id"
            " WHERE a.revision_id = ? AND b.revision_id = ?", (holder.source_revision_id, source.revision_id)
    ).fetchall():
        return holder
    raise BadInput("the audience already has a projection by that name; choose another with --as")


def revoke_rows(conn: apsw.Connection, agent_id: str, projection: Projection) -> None:
    """Inside the caller's transaction: the projection revoked, its copy's allows with it, and whatever
    was derived from its copy held (a replaced projection's copy stays as an older revision: its
    descendants must not outlive the decision that let them be made)."""
    conn.execute("UPDATE projections SET revoked_at = ? WHERE projection_id = ? AND revoked_at IS NULL",
                 (now_us(), projection.projection_id))
    hold(conn, agent_id, [projection.copy_revision_id], "revoke")
    for (entry_id,) in conn.execute(
            "SELECT e.entry_id FROM policy_entries e JOIN policies p USING (policy_id) WHERE p.agent_id = ?"
            " AND p.target_kind = 'resource' AND p.target_id = ? AND e.revoked_at IS NULL",
            (agent_id, projection.copy_resource_id)).fetchall():
        revoke_entry_in(conn, agent_id, str(entry_id))


@dataclass(frozen=True)
class Revoked:
    projection_id: str
    revoked: bool  # False: it was revoked already
    exposed_sessions: list[str]
    pruned_before_us: int | None  # the exposures are complete from then on only (``catalog.auditlog``)


def revoke_projection(home: Home, projection_id: str) -> Revoked:
    """Revoke a projection: its copy is gone from every new read at once; returns who had been shown it."""
    if not ids.looks_like("projection", projection_id):
        raise BadInput("unknown projection")
    for agent_id in home.agents():
        catalog = home.catalog(agent_id)
        if get_projection(catalog, agent_id, projection_id) is None:
            continue
        replay(home)  # reads of the copy a killed mount served count too (``catalog.readjournal``)
        with lock.shared(home.lock_path(agent_id)), immediate(catalog):
            projection = get_projection(catalog, agent_id, projection_id)
            assert projection is not None
            revoked = projection.revoked_at is None
            if revoked:
                revoke_rows(catalog, agent_id, projection)
                tombstone_rows(catalog, projection.copy_resource_id, projection.copy_revision_id)
                event = AuditEvent(operation="projection-revoke", decision="allow", reason=Reason.ALLOWED,
                                   agent_id=agent_id, revision_id=projection.copy_revision_id)
                settle(catalog, enqueue(catalog, agent_id, event), decision="allow", reason=Reason.ALLOWED)
        drain_quietly(home.state(), catalog, agent_id)
        return Revoked(projection_id, revoked, sessions_exposed(home, projection.copy_revision_id),
                       pruned_before(home.state()))
    raise BadInput("unknown projection")


__all__ = ["Expiry", "Projected", "Revoked", "check_purpose", "project", "revoke_projection"]
