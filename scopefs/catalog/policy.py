"""The pure policy evaluator: permissions, denies, expiry, reason codes.

No I/O and no clock: every input, including ``now``, is an argument, so the
same function serves the broker, the SQL prefilter's property tests, the
search's postfilter and the audit explanation. The order follows the specification's evaluation
order, restricted to what a local broker decides:

1. the resource must be inside a mount of the session's view;
2. its revision must be active and its resource live;
3. the requested permission is expanded through the lattice
   (derive -> read -> retrieve, replace -> append; the rest independent);
4. any live deny matching the subject on any required permission denies;
5. every required permission needs placement authority, or a live matching
   allow that the mount's ceiling admits (an ACL narrows a mount, it can
   never widen it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from scopefs.catalog.reasons import Reason
from scopefs.catalog.subject import Subject


class Op(StrEnum):
    RETRIEVE = "retrieve"
    READ = "read"
    DERIVE = "derive"
    APPEND = "append"
    REPLACE = "replace"
    PROJECT = "project"
    DEPOSIT = "deposit"
    SYNC = "sync"
    DELETE = "delete"
    PUBLISH = "publish"
    POLICY_ADMIN = "policy-admin"
    IMPORT = "import"
    EXPORT = "export"


# Direct implications; required() takes the closure. Everything not listed is
# independent: it neither implies nor is implied by any other permission.
_IMPLIES: dict[Op, frozenset[Op]] = {
    Op.DERIVE: frozenset({Op.READ}),
    Op.READ: frozenset({Op.RETRIEVE}),
    Op.REPLACE: frozenset({Op.APPEND}),
}

WRITE_OPS = frozenset({Op.APPEND, Op.REPLACE, Op.DELETE, Op.DEPOSIT, Op.PROJECT, Op.PUBLISH, Op.IMPORT, Op.SYNC,
                       Op.POLICY_ADMIN})


# Operations on existing content: they need an active revision to act on.
NEEDS_ACTIVE = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE, Op.REPLACE, Op.DELETE, Op.PROJECT, Op.EXPORT})


# Operations that use a revision's content: a revision held by its lineage,
# or past its validity, is denied for these and only these (it may still be
# replaced by a fresh revision, or deleted, by whoever may write its store).
CONTENT_OPS = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE, Op.PROJECT, Op.EXPORT})


def required(op: Op) -> frozenset[Op]:
    """Every permission an operation needs: the op and all it implies."""
    out = {op}
    frontier = [op]
    while frontier:
        for implied in _IMPLIES.get(frontier.pop(), ()):
            if implied not in out:
                out.add(implied)
                frontier.append(implied)
    return frozenset(out)


class Effect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class AudienceKind(StrEnum):
    ANY = "any"  # every subject
    PRINCIPAL = "principal"  # the subject's principal (user, conversation or service)
    SUBJECT_KIND = "subject-kind"  # every subject of one kind, e.g. 'ambiguous'


@dataclass(frozen=True)
class Entry:
    """One policy row: an allow or deny of one capability for an audience."""

    effect: Effect
    capability: Op
    audience_kind: AudienceKind
    audience_id: str = ""
    expires_at: int | None = None

    def __post_init__(self) -> None:
        # Coerce plain strings: the checks below compare enum members, and a
        # deny that silently failed to match would fail open.
        object.__setattr__(self, "effect", Effect(self.effect))
        object.__setattr__(self, "capability", Op(self.capability))
        object.__setattr__(self, "audience_kind", AudienceKind(self.audience_kind))

    def live(self, now: int) -> bool:
        return self.expires_at is None or now < self.expires_at

    def matches(self, subject: Subject) -> bool:
        if self.audience_kind is AudienceKind.ANY:
            return True
        if self.audience_kind is AudienceKind.PRINCIPAL:
            return subject.principal_id is not None and subject.principal_id == self.audience_id
        return subject.kind.value == self.audience_id


@dataclass(frozen=True)
class Mount:
    """One virtual root of a view and what placement in it grants.

    ``placement`` is granted by being mounted; ``ceiling`` bounds what an
    explicit allow may add. ``placement`` is always within ``ceiling``.
    ``cell`` names the catalog that holds the store: "" for the session's
    own agent cell, ``pool:<name>`` for a shared pool, which is a cell of
    its own so that no agent's database ever holds another agent's notes.
    """

    root: str
    scope_kind: str
    audience_id: str
    placement: frozenset[Op]
    ceiling: frozenset[Op]
    cell: str = ""

    def __post_init__(self) -> None:
        if not self.placement <= self.ceiling:
            raise ValueError("placement must lie within the ceiling")


@dataclass(frozen=True)
class ResourceState:
    """What the catalog says about the target; None in evaluate() = new resource."""

    live: bool
    revision_state: str | None  # state of the revision being read; None if it has none
    held: bool = False  # an ancestor it was derived from was retired (``catalog.lineage``)
    valid_until: int | None = None  # its ``valid-until`` (or supersession) time, if it has one

    @property
    def readable(self) -> bool:
        return self.live and self.revision_state == "active"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: Reason

    def __bool__(self) -> bool:
        return self.allowed


ALLOW = Decision(True, Reason.ALLOWED)


def evaluate(op: Op, subject: Subject, mount: Mount | None, resource: ResourceState | None,
             entries: Iterable[Entry], now: int) -> Decision:
    """Decide one operation; see the module docstring for the order.

    ``resource`` is None when the operation creates a new resource (append
    of a path that does not exist). An operation on existing content
    (``NEEDS_ACTIVE``) without a live resource and an active revision is
    ``revision-stale``.
    """
    if mount is None:
        return Decision(False, Reason.OUTSIDE_VIEW)
    needs = required(op)
    has_content = resource is not None and resource.live and resource.revision_state == "active"
    if (resource is not None and not resource.live) or (needs & NEEDS_ACTIVE and not has_content):
        return Decision(False, Reason.REVISION_STALE)  # gone, or nothing to read, replace or delete
    if resource is not None and needs & CONTENT_OPS:  # what the revision's content may no longer be used for
        if resource.held:
            return Decision(False, Reason.LINEAGE_DENY)
        if resource.valid_until is not None and now >= resource.valid_until:
            return Decision(False, Reason.EXPIRED)
    applicable = [e for e in entries if e.live(now) and e.matches(subject)]
    if any(e.effect is Effect.DENY and e.capability in needs for e in applicable):
        return Decision(False, Reason.EXPLICIT_DENY)
    allowed_extra = {e.capability for e in applicable if e.effect is Effect.ALLOW} & mount.ceiling
    for cap in needs:
        if cap not in mount.placement and cap not in allowed_extra:
            return Decision(False, Reason.DEFAULT_DENY)
    return ALLOW
