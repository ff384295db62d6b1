"""Memory views: which virtual roots a session subject sees (DESIGN.md §4).

A pure function of the subject, the subject's current role evidence and the
time. Stores are named here by (scope kind, audience), never by store id:
a view can only ever point at the stores its subject owns or shares, and
which physical store that is gets resolved later, inside the agent's cell.

    subject       roots (rw = writable)
    user          private/ rw, agent-shared/ ro, roles/<role>/ ro while the
                  membership is fresh, postbox/ owner review,
                  projections/agent-shared/ and projections/roles/<role>/
    conversation  channel/ rw, agent-shared/ ro, postbox/ deposit-only,
                  projections/channel/ and projections/agent-shared/
    service       agent/ rw, agent-shared/ ro, projections/agent-shared/
    ambiguous     agent-shared/: nothing by placement; only resources with
                  an explicit allow for anonymous use; never a write

Projections (``projections/<audience>/``) are reviewed copies addressed to
one audience each: this conversation, one of the user's roles, or every
subject of the agent. Their mounts grant nothing by placement: a copy is
readable only through its own allow entries, which expire or are revoked
with the projection, so a copy without a live projection reads as missing.

A conversation view never contains a user's private store or any role
store, whoever is speaking: other participants share the model context.

Under a pools file (``catalog.pools``) the agent's own roots are shown
only if the agent recalls ``own`` (read-only unless it also captures
there), and each shared pool it may read is added as ``pools/<name>/``
(read-only unless it is one of the pool's writers). An ambiguous view
never gains a pool: nobody verified is there to be one of its readers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from scopefs.catalog.policy import Mount, Op
from scopefs.catalog.pools import AgentMemory
from scopefs.catalog.reasons import Reason
from scopefs.catalog.subject import Subject, SubjectKind

READ_ONLY = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE})
READ_WRITE = READ_ONLY | {Op.APPEND, Op.REPLACE, Op.DELETE}
OWNER_REVIEW = frozenset({Op.RETRIEVE, Op.READ})
# What a projection's allow entries grant its audience: read it, and use it
# as a source (a copy is declassified for exactly that audience).
PROJECTED = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE})
DEPOSIT_ONLY = frozenset({Op.DEPOSIT})
ANONYMOUS_CEILING = frozenset({Op.RETRIEVE, Op.READ})
NOTHING: frozenset[Op] = frozenset()

AGENT_SHARED_AUDIENCE = ""  # the agent-shared store has no principal audience


@dataclass(frozen=True)
class RoleEvidence:
    role_id: str
    role_name: str
    expires_at: int | None

    def fresh(self, now: int) -> bool:
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True)
class View:
    subject: Subject
    mounts: tuple[Mount, ...]
    excluded: tuple[tuple[str, Reason], ...] = ()  # roots withheld, with why (for audit only)
    capture: str | None = None  # the root this session's new memories go to (a gateway's flushes); None: nowhere
    # A delegated session's capability folders (``catalog.delegation``): only what lies strictly below
    # one of them is in the view. None: no capability narrows the view.
    caps: tuple[tuple[str, ...], ...] | None = None

    def roots(self) -> tuple[str, ...]:
        """The folders the view shows even while empty: every mount's root, or the caps that narrow it."""
        if self.caps is None:
            return tuple(m.root for m in self.mounts)
        tops: list[str] = []
        for mount in self.mounts:
            root = tuple(mount.root.split("/"))
            if any(root[: len(cap)] == cap for cap in self.caps):
                tops.append(mount.root)
            else:
                tops.extend("/".join(cap) for cap in self.caps if len(cap) > len(root) and cap[: len(root)] == root)
        return tuple(tops)

    def permits(self, parts: tuple[str, ...]) -> bool:
        """Whether the view's caps let ``parts`` in: always without caps, else strictly below one of them."""
        return self.caps is None or any(len(parts) > len(cap) and parts[: len(cap)] == cap for cap in self.caps)

    def mount_for(self, parts: tuple[str, ...]) -> tuple[Mount, tuple[str, ...]] | None:
        """The mount a path falls under and the path inside it, or None (also for a path no cap lets in)."""
        found = self._mount_of(parts)
        return found if found is not None and self.permits(parts) else None

    def folder_mount(self, parts: tuple[str, ...]) -> tuple[Mount, tuple[str, ...]] | None:
        """Like ``mount_for``, for a folder to list: a cap's own folder counts (it is one of ``roots``)."""
        found = self._mount_of(parts)
        if found is None or not (self.permits(parts) or parts in (self.caps or ())):
            return None
        return found

    def _mount_of(self, parts: tuple[str, ...]) -> tuple[Mount, tuple[str, ...]] | None:
        for mount in self.mounts:
            root = tuple(mount.root.split("/"))
            if parts[: len(root)] == root:
                return mount, parts[len(root):]
        return None

    def excluded_reason(self, parts: tuple[str, ...]) -> Reason | None:
        for root, reason in self.excluded:
            root_parts = tuple(root.split("/"))
            if parts[: len(root_parts)] == root_parts:
                return reason
        return None


def _shared(placement: frozenset[Op] = READ_ONLY, ceiling: frozenset[Op] = READ_ONLY) -> Mount:
    return Mount("agent-shared", "agent-shared", AGENT_SHARED_AUDIENCE, placement, ceiling)


def memory_view(subject: Subject, roles: Iterable[RoleEvidence], now: int,
                memory: AgentMemory | None = None) -> View:
    """The view for ``subject``; ``roles`` only counts for user subjects.

    ``memory``: the agent's pools (None: no pools file, the agent's own cell only).
    """
    own = _own_view(subject, roles, now)
    own_capture = next((m.root for m in own.mounts if Op.APPEND in m.placement), None)
    if memory is None:
        return dataclasses.replace(own, capture=own_capture)
    mounts = list(own.mounts) if memory.own else []
    if not memory.own_writable:
        mounts = [_read_only(m) for m in mounts]
    # A view that also holds a person's or a conversation's own roots never writes a pool: a copy
    # (``cp private/x pools/team/``) would hand one audience's content to every reader of the pool
    # with no publish step. Such a session reads the pool; writers write it from service sessions,
    # or as agents that recall no store of their own (agent-privacy-pools' social agent).
    narrower = memory.own and subject.kind in (SubjectKind.USER, SubjectKind.CONVERSATION)
    if subject.kind is not SubjectKind.AMBIGUOUS:
        for pool in memory.pools:
            access = READ_WRITE if pool.writable and not narrower else READ_ONLY
            mounts.append(Mount(pool.root, "agent-shared", AGENT_SHARED_AUDIENCE, access, access, cell=pool.cell))
    capture = own_capture if memory.own_writable else next(
        (m.root for m in mounts if m.root == f"pools/{memory.capture_pool}" and Op.APPEND in m.placement), None)
    return View(subject, tuple(mounts), own.excluded if memory.own else (), capture)


def projection_mount(root: str, audience_id: str) -> Mount:
    """Copies projected to one audience: nothing by placement, what their allows grant up to ``PROJECTED``."""
    return Mount(root, "projection", audience_id, NOTHING, PROJECTED)


PROJECTIONS_SHARED = "projections/agent-shared"


def _read_only(mount: Mount) -> Mount:
    return Mount(mount.root, mount.scope_kind, mount.audience_id, mount.placement & READ_ONLY,
                 mount.ceiling & READ_ONLY, mount.cell)


def _own_view(subject: Subject, roles: Iterable[RoleEvidence], now: int) -> View:
    pid = subject.principal_id
    if subject.kind is SubjectKind.USER:
        assert pid is not None
        mounts = [
            Mount("private", "user", pid, READ_WRITE, READ_WRITE),
            _shared(),
        ]
        excluded: list[tuple[str, Reason]] = []
        roles = tuple(roles)
        names = [r.role_name for r in roles]
        projected = [projection_mount(PROJECTIONS_SHARED, AGENT_SHARED_AUDIENCE)]
        for role in sorted(roles, key=lambda r: r.role_name):
            roots = (f"roles/{role.role_name}", f"projections/roles/{role.role_name}")
            if names.count(role.role_name) > 1:  # ambiguous folder: mount neither (fail closed)
                excluded.extend((root, Reason.OUTSIDE_VIEW) for root in roots)
            elif role.fresh(now):
                mounts.append(Mount(roots[0], "role", role.role_id, READ_ONLY, READ_ONLY))
                projected.append(projection_mount(roots[1], role.role_id))
            else:
                excluded.extend((root, Reason.MEMBERSHIP_STALE) for root in roots)
        mounts.append(Mount("postbox", "quarantine", pid, OWNER_REVIEW, OWNER_REVIEW))
        return View(subject, (*mounts, *projected), tuple(excluded))
    if subject.kind is SubjectKind.CONVERSATION:
        assert pid is not None
        return View(subject, (
            Mount("channel", "channel", pid, READ_WRITE, READ_WRITE),
            _shared(),
            # Deposits are routed per message to a participant's quarantine;
            # the mount itself has no store, so it lists and reads nothing.
            Mount("postbox", "postbox", "", DEPOSIT_ONLY, DEPOSIT_ONLY),
            projection_mount("projections/channel", pid),
            projection_mount(PROJECTIONS_SHARED, AGENT_SHARED_AUDIENCE),
        ))
    if subject.kind is SubjectKind.SERVICE:
        assert pid is not None
        return View(subject, (
            Mount("agent", "agent", pid, READ_WRITE, READ_WRITE),
            _shared(),
            projection_mount(PROJECTIONS_SHARED, AGENT_SHARED_AUDIENCE),
        ))
    return View(subject, (_shared(NOTHING, ANONYMOUS_CEILING),))
