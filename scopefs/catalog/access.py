"""From a session id to an authorized view, and from a path to a decision.

Every operation, read or write, starts here: the session's write-once
subject is loaded, its current evidence rechecked (a revoked binding, a
disabled principal, a stale actor membership deny everything), the view is
computed, and a virtual path is resolved inside that view only. Refusals are
audited with the true internal reason and raised with the public one, so a
hidden note and a missing note look the same to the caller.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scopefs.catalog import pools
from scopefs.catalog.audit import AuditEvent, record_quietly
from scopefs.catalog.clock import now_us
from scopefs.catalog.delegation import MAX_DEPTH, delegation_of, restrict
from scopefs.catalog.errors import BadInput, Conflict, Denied, ScopefsError
from scopefs.catalog.groups import membership_expiry, role_memberships
from scopefs.catalog.home import Home
from scopefs.catalog.identity import binding_live, get_principal
from scopefs.catalog.policy import Decision, Entry, Mount, Op, ResourceState, evaluate
from scopefs.catalog.reasons import Reason, public_reason
from scopefs.catalog.sessions import SessionRecord, load_session, rebound
from scopefs.catalog.stores import (
    ResourceRow,
    RevisionRow,
    StoreRow,
    active_revision,
    find_resource,
    find_store,
    policy_entries,
)
from scopefs.catalog.subject import SubjectKind
from scopefs.catalog.view import RoleEvidence, View, memory_view

READ_LIKE = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE, Op.EXPORT})


@dataclass(frozen=True)
class Access:
    """An authorized session for one operation: subject, actor, view, time.

    ``cell`` is the catalog the operation works in: the session's own agent
    cell (""), or a shared pool's once ``narrowed`` to a path under it.
    Everything that reads or writes a store takes ``agent_id``, which names
    that cell, so one code path serves agents and pools alike.
    """

    home: Home
    session: SessionRecord
    actor_id: str | None
    view: View
    now: int
    cell: str = ""
    pools_revision: int = 0  # of the pools file the view was computed under (0: none applied)
    evidence_until: int | None = None  # when the next time-bound evidence (a role membership) runs out
    delegated: bool = False  # a child session (``catalog.delegation``): its parents' evidence counts too

    @property
    def agent_id(self) -> str:
        return self.cell or self.session.agent_id

    def cells(self) -> tuple[str, ...]:
        """The cells this view reaches, the session's own first."""
        found = dict.fromkeys(m.cell for m in self.view.mounts)
        return tuple(sorted(found, key=lambda c: (c != "", c)))

    def in_cell(self, cell: str) -> Access:
        """This access confined to one cell: only that cell's mounts, queries in that cell's catalog."""
        mounts = tuple(m for m in self.view.mounts if m.cell == cell)
        excluded = self.view.excluded if cell == "" else ()
        return dataclasses.replace(self, cell=cell, view=dataclasses.replace(self.view, mounts=mounts,
                                                                             excluded=excluded))

    def narrowed(self, parts: tuple[str, ...]) -> Access:
        """Confined to the cell that holds ``parts`` (the own cell for a path under no mount)."""
        found = self.view.mount_for(parts)
        return self.in_cell(found[0].cell if found is not None else "")

    def event(self, operation: Op | str, decision: str, reason: Reason | str, *, store_id: str | None = None,
              revision_id: str | None = None) -> AuditEvent:
        return AuditEvent(
            operation=str(operation), decision=decision, reason=str(reason), agent_id=self.agent_id,
            session_id=self.session.session_id, subject_kind=self.session.subject.kind.value,
            actor_id=self.actor_id, store_id=store_id, revision_id=revision_id,
        )

    def refuse(self, operation: Op, reason: Reason, *, store_id: str | None = None,
               revision_id: str | None = None, hide: bool = False) -> Denied:
        """Audit a refusal with its true reason; return the public error.

        ``hide`` is for paths outside the view: whatever the internal reason
        (a stale role, say), the caller learns only ``outside-view``, so it
        cannot tell which roots exist for others or once existed for it.
        """
        record_quietly(self.home.state(), self.event(operation, "deny", reason, store_id=store_id,
                                                     revision_id=revision_id))
        return self.denied(operation, reason, hide=hide)

    def denied(self, operation: Op, reason: Reason, *, hide: bool = False) -> Denied:
        """The public error for a refusal whose audit is recorded elsewhere."""
        shown = Reason.OUTSIDE_VIEW if hide else public_reason(reason, read_like=operation in READ_LIKE)
        if shown is Reason.OUTSIDE_VIEW:
            return Denied(shown, "not available in this view (no such note, or not permitted)")
        return Denied(shown, f"denied: {shown}")

    def refuse_outside(self, operation: Op, parts: tuple[str, ...]) -> Denied:
        """Refuse a path under no mount of the view (audited with why)."""
        return self.refuse(operation, self.view.excluded_reason(parts) or Reason.OUTSIDE_VIEW, hide=True)


def _check_actor(home: Home, session: SessionRecord, actor_id: str, now: int) -> Reason | None:
    actor = get_principal(home.state(), actor_id)  # BadInput if unknown
    if actor.state != "active":
        return Reason.IDENTITY_REVOKED
    subject = session.subject
    if subject.kind is SubjectKind.AMBIGUOUS:
        return Reason.INVALID_CONTEXT  # nobody is verified here; a claimed actor proves nothing
    if subject.kind in (SubjectKind.USER, SubjectKind.SERVICE):
        return None if actor_id == subject.principal_id else Reason.INVALID_CONTEXT
    if subject.kind is SubjectKind.CONVERSATION:
        assert subject.principal_id is not None
        member, expires = membership_expiry(home.state(), subject.principal_id, actor_id)
        if not member or (expires is not None and now >= expires):
            return Reason.MEMBERSHIP_STALE
    return None


def _evidence_problem(home: Home, session: SessionRecord) -> Reason | None:
    """Recheck the evidence behind the subject; it may have been revoked."""
    if session.closed_at is not None:
        return Reason.INVALID_CONTEXT
    if rebound(home, session):
        return Reason.SESSION_REBOUND  # its gateway key now names another session: never followed
    subject = session.subject
    if subject.kind is SubjectKind.AMBIGUOUS:
        return None
    assert subject.principal_id is not None
    if subject.kind is SubjectKind.USER and session.human:
        # Opened at the console (``catalog.human``): the evidence is the principal itself, an active human.
        principal = get_principal(home.state(), subject.principal_id)
        return None if principal.kind == "human" and principal.state == "active" else Reason.IDENTITY_REVOKED
    if subject.kind is SubjectKind.USER:
        assert session.binding_id is not None
        return None if binding_live(home.state(), session.binding_id, subject.principal_id) else Reason.IDENTITY_REVOKED
    principal = get_principal(home.state(), subject.principal_id)
    return None if principal.state == "active" else Reason.IDENTITY_REVOKED


@dataclass(frozen=True)
class _Standing:
    """A session's view as of one moment, and what, if anything, is wrong with its evidence."""

    view: View
    pools_revision: int
    evidence_until: int | None
    problem: Reason | None
    delegated: bool = False


def _standing(home: Home, session: SessionRecord, now: int, depth: int = 0) -> _Standing:
    """The session's view and evidence now; for a delegated session, its parent's narrowed by its caps.

    A child's standing is its parent's, computed the same way every time
    (``catalog.delegation``): whatever the parent loses, the child loses
    with it. A chain deeper than ``MAX_DEPTH``, a parent that cannot be
    loaded, or rows that disagree fail closed (``invalid-context``).
    """
    delegation = delegation_of(home.catalog(session.agent_id), session.agent_id, session.session_id)
    if delegation is None:
        pools_revision, memory = pools.memory_for(home, session.agent_id)
        roles = _roles(home, session)
        view = memory_view(session.subject, roles, now, memory)
        # The only evidence that changes with time alone: a mounted view must look again then (``vfs.follow``).
        evidence_until = min((r.expires_at for r in roles if r.expires_at is not None and r.expires_at > now),
                             default=None)
        return _Standing(view, pools_revision, evidence_until, _evidence_problem(home, session))
    nothing = _Standing(View(session.subject, (), caps=()), 0, None, Reason.INVALID_CONTEXT, True)
    if depth >= MAX_DEPTH:
        return nothing
    try:
        parent = load_session(home, delegation.parent_session_id)
    except BadInput:
        return nothing
    if (parent.agent_id, parent.subject, parent.binding_id) != (session.agent_id, session.subject, session.binding_id):
        return nothing
    above = _standing(home, parent, now, depth + 1)
    problem = _evidence_problem(home, session) or above.problem
    return _Standing(restrict(above.view, delegation.cap_parts), above.pools_revision, above.evidence_until, problem,
                     True)


def current_access(home: Home, session_id: str, *, actor_id: str | None = None) -> tuple[Access, Reason | None]:
    """The session's access as of now and what, if anything, is wrong with it.

    Nothing is audited: a mounted view asks this on every catalog change and
    must not write an audit row each time; callers that refuse audit.
    """
    session = load_session(home, session_id)
    now = now_us()
    standing = _standing(home, session, now)
    problem = standing.problem
    if problem is None and actor_id is not None:
        problem = _check_actor(home, session, actor_id, now)
    if actor_id is None and session.subject.kind in (SubjectKind.USER, SubjectKind.SERVICE):
        actor_id = session.subject.principal_id  # a private or service session acts as its subject
    return Access(home, session, actor_id, standing.view, now, pools_revision=standing.pools_revision,
                  evidence_until=standing.evidence_until, delegated=standing.delegated), problem


def authorize_session(home: Home, session_id: str, operation: Op, *, actor_id: str | None = None,
                      parts: tuple[str, ...] | None = None) -> Access:
    """Load the session and recheck its evidence, or raise Denied (audited).

    ``parts``: the path the operation acts on; the access is then confined
    to the cell that holds it (``Access.narrowed``).
    """
    access, problem = current_access(home, session_id, actor_id=actor_id)
    if problem is not None:
        raise access.refuse(operation, problem)
    return access if parts is None else access.narrowed(parts)


def revalidate(access: Access, operation: Op) -> None:
    """Recheck the session's evidence again (before each commit of a write).

    Identity and catalog live in two databases, so a revocation can land
    between authorization and commit; rechecking right before each commit
    narrows that window to the commit itself.
    """
    if not access.delegated:
        problem = _evidence_problem(access.home, access.session)
    else:  # a delegated session: its parents' evidence too, up the whole chain
        problem = _standing(access.home, access.session, now_us()).problem
    if problem is None and access.actor_id is not None:
        problem = _check_actor(access.home, access.session, access.actor_id, now_us())
    if problem is None and _writable_moved(access):
        problem = Reason.PLAN_EXPIRED  # a pools file applied meanwhile took (or changed) this write's root
    if problem is not None:
        raise access.refuse(operation, problem)


_WRITES = frozenset({Op.APPEND, Op.REPLACE, Op.DELETE})


def _writable_moved(access: Access) -> bool:
    """Whether the writable roots of the access's cell differ now from when it was authorized.

    A subject's own placement never changes, but a pools file can take
    a pool (or the agent's own store) away from a writer in the middle of
    a write that has been staging for a while. One query when no file was
    applied since (the usual case).
    """
    revision, _memory = pools.memory_for(access.home, access.session.agent_id)
    if revision == access.pools_revision:
        return False
    fresh = _standing(access.home, access.session, now_us()).view

    def writable(mounts: tuple[Mount, ...]) -> set[tuple[str, frozenset[Op], frozenset[Op]]]:
        return {(m.root, m.placement, m.ceiling) for m in mounts
                if m.cell == access.cell and (m.placement | m.ceiling) & _WRITES}

    return writable(fresh.mounts) != writable(access.view.mounts)


def _roles(home: Home, session: SessionRecord) -> tuple[RoleEvidence, ...]:
    subject = session.subject
    if subject.kind is not SubjectKind.USER or subject.principal_id is None:
        return ()
    return tuple(RoleEvidence(m.role_id, m.role_name, m.expires_at)
                 for m in role_memberships(home.state(), subject.principal_id))


@dataclass(frozen=True)
class Target:
    """What a virtual path names inside one view (any part may be absent)."""

    mount: Mount | None
    inner: tuple[str, ...]
    store: StoreRow | None
    resource: ResourceRow | None
    revision: RevisionRow | None
    entries: tuple[Entry, ...]

    @property
    def inner_path(self) -> str:
        return "/".join(self.inner)


def resolve(access: Access, parts: tuple[str, ...]) -> Target:
    """Resolve validated path components; never leaves the view's stores."""
    found = access.view.mount_for(parts)
    if found is None:
        return Target(None, (), None, None, None, ())
    mount, inner = found
    catalog = access.home.catalog(access.agent_id)
    store = find_store(catalog, access.agent_id, mount.scope_kind, mount.audience_id)
    if store is None or not inner:
        return Target(mount, inner, store, None, None, ())
    resource = find_resource(catalog, access.agent_id, store.store_id, "/".join(inner))
    revision = None if resource is None else active_revision(catalog, access.agent_id, resource.resource_id)
    entries = policy_entries(catalog, access.agent_id, store.store_id, resource.resource_id if resource else None)
    return Target(mount, inner, store, resource, revision, entries)


def decide(access: Access, target: Target, op: Op) -> Decision:
    """The evaluator's decision for ``op`` on ``target``.

    A path outside every mount, a root itself, or a name with no resource
    is ``outside-view`` for reads; for a write it means "create new".
    """
    if target.mount is None:
        return Decision(False, Reason.OUTSIDE_VIEW)
    if op in READ_LIKE and (target.resource is None or target.revision is None):
        return Decision(False, Reason.OUTSIDE_VIEW)
    state = None
    if target.resource is not None:
        revision = target.revision
        state = ResourceState(target.resource.state == "live", revision.state if revision else None,
                              revision.held if revision else False, revision.valid_until if revision else None)
    return evaluate(op, access.session.subject, target.mount, state, target.entries, access.now)


class _Vacant:
    """The expectation that a path holds no note at all (``VACANT``)."""

    def __repr__(self) -> str:
        return "VACANT"


VACANT = _Vacant()
Expected = str | _Vacant | None  # the resource a path should hold, no note at all, or anything (None)


def expect_resource(found: ResourceRow | None, expected: Expected) -> None:
    """Conflict unless ``found`` (what a path holds now) is what the caller means.

    A caller that acts on a note it looked up earlier (a mount removing the
    note it unlinked, say) passes that note's id, or ``VACANT`` for a name
    it saw empty (a rename's destination), and the check runs inside the
    writer's transaction: a rename landing in between makes the call fail
    instead of acting on whatever note now has the path. A path that is
    empty now and one that holds another note, visible or not, give the
    same Conflict, so it tells nothing about other scopes.
    """
    if expected is None:
        return
    if isinstance(expected, _Vacant):
        if found is not None:
            raise Conflict("a note appeared at the destination meanwhile; nothing was changed")
        return
    if found is None or found.resource_id != expected:
        raise Conflict("the note moved or was replaced meanwhile; nothing was changed")


def refuse_unseen(access: Access, op: Op, reason: Reason, *, store_id: str | None, revision_id: str | None,
                  expected: Expected, hide: bool = False) -> ScopefsError:
    """The refusal of a note this subject may not read (audited with the true reason).

    A caller that named the note it meant gets the same Conflict it would
    get had the note moved: otherwise the two answers would tell it, for a
    note it just lost, whether it was revoked or moved.
    """
    denied = access.refuse(op, reason, store_id=store_id, revision_id=revision_id, hide=hide)
    if expected is not None:
        return Conflict("the note moved or was replaced meanwhile; nothing was changed")
    return denied


def existing_target(access: Access, parts: tuple[str, ...], op: Op, *,
                    expected_resource_id: Expected = None) -> Target:
    """Resolve a note that must exist and be visible, and decide ``op`` on it.

    A note this subject may not read is refused exactly like a missing one:
    removing, renaming or annotating it would otherwise confirm that it
    exists. Shared by the writer (delete, rename) and verified subjects.
    ``expected_resource_id``: see ``expect_resource`` (checked first) and
    ``refuse_unseen``.
    """
    target = resolve(access, parts)
    expect_resource(target.resource, expected_resource_id)
    if target.mount is None:
        raise access.refuse_outside(op, parts)
    store_id = target.store.store_id if target.store else None
    revision_id = target.revision.revision_id if target.revision else None
    visible = decide(access, target, Op.READ)
    if not visible:
        raise refuse_unseen(access, op, visible.reason, store_id=store_id, revision_id=revision_id,
                            expected=expected_resource_id, hide=True)
    decision = decide(access, target, op)
    if not decision:
        raise access.refuse(op, decision.reason, store_id=store_id, revision_id=revision_id)
    return target
