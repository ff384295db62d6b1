"""Publishing: a publisher's reviewed copy into ``agent-shared/`` or a role store.

Those stores are read-only in every view, for every subject: reading them
never implies writing them. The only way in is ``publish``, by a session
whose verified subject holds a live publisher grant for that store
(``catalog.sharing.may_publish``), taking one revision of a note of that
subject's own store (``Source.own``): never a note it only reads (another
person's projection, a role note, a postbox deposit, agent-shared itself),
which would republish someone else's content past its audience, expiry or
review. Without ``--yes`` it only previews. With it, the copy
is an immutable revision of the target note, with lineage to its source,
trust origin ``publish`` and an audit row, committed by the same write
transaction as every note; the grant and the source are decided again
inside both of its commits, so a revocation landing meanwhile wins.

A name that holds another publisher's live copy is refused (``name-taken``,
audited): holding a grant for the same store does not make two publishers
one, and without this either could silently replace what the other
reviewed and published. A copy stops holding its name once it expired, or
once a note of its own publisher's store that it comes from was retired
(it is held for good, and only that publisher retires notes there). A note
no publish made (an operator's migrated one) holds no name. The name is
part of the decision, so the first commit decides it again with the note
it replaces: a copy that lands before that commit is refused the same way;
one that lands after it fails the activation's check that the note is
unchanged (``Conflict``, nothing written), and a retry is refused. A
preview does not look at the name: it writes nothing, and a publisher who
is no member of a role learns what the role's store holds only by
publishing, which is audited.

An administrator grants and revokes publisher authority; granting it
exercises nothing (the grant names a principal, whose own session must
publish).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog.clock import now_us
from scopefs.catalog.db import one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.identity import get_principal
from scopefs.catalog.lineage import add_lineage, held_from, inherited_validity
from scopefs.catalog.paths import Parts
from scopefs.catalog.policies import add_entry, revoke_entry
from scopefs.catalog.policy import AudienceKind, Decision, Effect, Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.sharing import Audience, check_grant_id, may_publish, parse_audience
from scopefs.catalog.stores import active_revision, find_resource, find_store
from scopefs.writer.copies import (
    Source,
    lineage_allows,
    read_source,
    source_still_active,
)
from scopefs.writer.stores import ensure_store_for
from scopefs.writer.transaction import Provenance, WriteResult, write_copy


@dataclass(frozen=True)
class Grant:
    grant_id: str
    agent_id: str
    created: bool


def grant_publisher(home: Home, agent_id: str, principal_id: str, scope: str) -> Grant:
    """Let ``principal_id``'s own sessions publish into ``scope`` (agent-shared or role:R); idempotent."""
    if not home.agent_exists(validate_agent_name(agent_id)):
        raise BadInput("unknown agent")
    principal = get_principal(home.state(), principal_id)
    if principal.kind not in ("human", "service") or principal.state != "active":
        raise BadInput("a publisher is an active human or service principal")
    audience = parse_audience(home.state(), agent_id, scope)
    scope_kind, audience_id = audience.published_store()
    store = ensure_store_for(home, agent_id, scope_kind, audience_id)
    catalog = home.catalog(agent_id)
    live = one(catalog, "SELECT e.entry_id FROM policy_entries e JOIN policies p USING (policy_id)"
                        " WHERE p.agent_id = ? AND p.target_kind = 'store' AND p.target_id = ? AND e.effect = 'allow'"
                        " AND e.capability = 'publish' AND e.audience_kind = 'principal' AND e.audience_id = ?"
                        " AND e.revoked_at IS NULL AND e.expires_at IS NULL", (agent_id, store.store_id, principal_id))
    if live is not None:
        return Grant(live[0], agent_id, False)
    entry_id = add_entry(catalog, agent_id, target_kind="store", target_id=store.store_id, effect=Effect.ALLOW,
                         capability=Op.PUBLISH, audience_kind=AudienceKind.PRINCIPAL, audience_id=principal_id)
    return Grant(entry_id, agent_id, True)


def revoke_grant(home: Home, grant_id: str) -> bool:
    """Revoke a publisher grant (in whichever agent holds it); False if it was revoked already."""
    check_grant_id(grant_id)
    for agent_id in home.agents():
        catalog = home.catalog(agent_id)
        if one(catalog, "SELECT 1 FROM policy_entries WHERE agent_id = ? AND entry_id = ? AND effect = 'allow'"
                        " AND capability = 'publish'", (agent_id, grant_id)) is not None:
            return revoke_entry(catalog, agent_id, grant_id)
    raise BadInput("unknown grant")


@dataclass(frozen=True)
class Published:
    preview: dict[str, Any]
    result: WriteResult | None  # None: only previewed


def publish(home: Home, session_id: str, path: str, to: str, *, name: str | None = None,
            yes: bool = False) -> Published:
    """Preview, or with ``yes`` publish, the note at ``path`` of the session's view into ``to``."""
    source = read_source(home, session_id, path)
    access = source.access
    audience = parse_audience(home.state(), access.agent_id, to)
    scope_kind, audience_id = audience.published_store()
    inner = source.copy_name(name)
    catalog = home.catalog(access.agent_id)
    decision = _decide(catalog, source, scope_kind, audience_id, inner if yes else None)
    if not decision:
        raise access.refuse(Op.PUBLISH, decision.reason)
    preview = source.preview(target=audience.spelled, target_path=f"{audience.published_root()}/{'/'.join(inner)}",
                             audience=_audience_line(audience))
    if not yes:
        return Published(preview, None)

    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        add_lineage(conn, access.agent_id, revision_id, source.revision_id, "publish")

    # Inside each commit the note at the name is the one the commit replaces: both check it unchanged first.
    provenance = Provenance(Op.PUBLISH, "publish",
                            lambda conn, _: _decide(conn, source, scope_kind, audience_id, inner), record,
                            valid_until=lambda conn: inherited_validity(conn, [source.revision_id]))
    return Published(preview, write_copy(access, scope_kind, audience_id, inner, source.data, provenance))


def _decide(catalog: apsw.Connection, source: Source, scope_kind: str, audience_id: str,
            inner: Parts | None) -> Decision:
    """A live grant for the subject (else ``not-publisher``), a note of its own (else ``not-owner``), still
    active, and (given the name ``inner``) no other publisher's live copy there (else ``name-taken``)."""
    access = source.access
    store = find_store(catalog, access.agent_id, scope_kind, audience_id)
    decision = may_publish(catalog, access.agent_id, access.session.subject, store.store_id if store else None,
                           scope_kind, audience_id, now_us())
    if decision and not source.own():
        decision = Decision(False, Reason.NOT_OWNER)
    if decision:
        decision = lineage_allows(catalog, source, scope_kind, audience_id)
    if decision:
        decision = source_still_active(catalog, source.revision_id)
    if decision and store is not None and inner is not None and _taken(catalog, source, store.store_id, inner):
        decision = Decision(False, Reason.NAME_TAKEN)
    return decision


def _taken(catalog: apsw.Connection, source: Source, store_id: str, inner: Parts) -> bool:
    """Whether the note at ``inner`` in the target store is another publisher's copy that still counts.

    It counts while it was published from a store other than the source's, has not expired, and is not
    held by a retired note of its publisher's store. Held only by someone else's retired note, it keeps
    its name: nobody but its publisher may free it.
    """
    agent_id = source.access.agent_id
    resource = find_resource(catalog, agent_id, store_id, "/".join(inner))
    current = None if resource is None else active_revision(catalog, agent_id, resource.resource_id)
    if current is None:
        return False
    row = one(catalog, "SELECT r.store_id FROM lineage_edges e JOIN revisions p ON p.revision_id = e.parent_revision_id"
                       " JOIN resources r ON r.resource_id = p.resource_id"
                       " WHERE e.agent_id = ? AND e.child_revision_id = ? AND e.relation = 'publish'",
              (agent_id, current.revision_id))
    assert source.target.store is not None  # Source.own: a note of the subject's own store
    if row is None or row[0] == source.target.store.store_id:
        return False
    if held_from(catalog, current.revision_id, str(row[0])):
        return False
    until = inherited_validity(catalog, [current.revision_id])
    return until is None or until > now_us()


def _audience_line(audience: Audience) -> str:
    if audience.kind == "agent-shared":
        return "every session of this agent (agent-shared/, read-only)"
    return f"members of role {audience.name} while their membership is current (roles/{audience.name}/, read-only)"
