"""Who content may be shared with on purpose, and who may share it.

Sharing never opens one person's store to another. It makes a reviewed
copy in a store of its own audience: a publisher's copy in ``agent-shared``
or a role store, a projection's copy in the projection store of one
conversation, one role or the whole agent. This module names those
audiences (an operator's ``agent-shared``, ``role:NAME`` or
``conversation:ID``; never a person or a private store: the spec defers
direct user-to-user access, so no spelling of one parses) and decides the
two authorities sharing needs, each independent of reading:

* publishing: a live ``publish`` allow for the session's verified subject
  on the target store (``scopefs grant publisher``), decided by the same
  evaluator as every other capability, with a mount that grants nothing by
  placement, so an administrator's own views gain nothing from it;
* projecting: the note's owner (a verified user projecting from its own
  private store) into an audience the owner is in today.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from scopefs.catalog import ids
from scopefs.catalog.db import one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.groups import conversation_agent, membership_expiry
from scopefs.catalog.policy import Decision, Mount, Op, evaluate
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import policy_entries
from scopefs.catalog.subject import Subject, SubjectKind
from scopefs.catalog.view import AGENT_SHARED_AUDIENCE, PROJECTIONS_SHARED

AGENT_SHARED = "agent-shared"
_SPELLING = "agent-shared, role:ROLE or conversation:CONVERSATION"
MAX_TARGET = 200  # bytes of a target argument looked at


@dataclass(frozen=True)
class Audience:
    """One audience content can be shared with; ``principal_id`` is '' for agent-shared."""

    kind: str  # 'agent-shared' | 'role' | 'conversation'
    principal_id: str
    name: str  # how the operator spells it (a role's name, a conversation's id)

    @property
    def spelled(self) -> str:
        return AGENT_SHARED if self.kind == AGENT_SHARED else f"{self.kind}:{self.name}"

    def published_store(self) -> tuple[str, str]:
        """(scope kind, audience) of the store a publisher writes for this audience."""
        if self.kind == "conversation":
            raise BadInput("publish targets agent-shared or role:ROLE; a conversation gets a projection")
        return (AGENT_SHARED, AGENT_SHARED_AUDIENCE) if self.kind == AGENT_SHARED else ("role", self.principal_id)

    def projection_root(self) -> str:
        """Where members of the audience see projections to it."""
        if self.kind == AGENT_SHARED:
            return PROJECTIONS_SHARED
        return f"projections/roles/{self.name}" if self.kind == "role" else "projections/channel"

    def published_root(self) -> str:
        return AGENT_SHARED if self.kind == AGENT_SHARED else f"roles/{self.name}"


def parse_audience(state: apsw.Connection, agent_id: str, text: str) -> Audience:
    """``agent-shared``, ``role:NAME`` or ``conversation:ID`` (registered for ``agent_id``), else BadInput."""
    try:
        too_long = not isinstance(text, str) or len(text.encode("utf-8")) > MAX_TARGET
    except UnicodeEncodeError:  # a lone surrogate (an argv byte that is not UTF-8): never reaches a query
        too_long = True
    if too_long:
        raise BadInput(f"a target is {_SPELLING}")
    if text == AGENT_SHARED:
        return Audience(AGENT_SHARED, AGENT_SHARED_AUDIENCE, AGENT_SHARED)
    kind, sep, name = text.partition(":")
    if sep and kind == "role":
        row = one(state, "SELECT principal_id FROM principals WHERE kind = 'role' AND state = 'active'"
                         " AND (label = ? OR principal_id = ?)", (name, name))
        if row is None:
            raise BadInput("unknown role")
        label = one(state, "SELECT label FROM principals WHERE principal_id = ?", (row[0],))
        return Audience("role", row[0], label[0] if label else name)
    if sep and kind == "conversation":
        if conversation_agent(state, name) != agent_id:
            raise BadInput("unknown conversation")
        return Audience("conversation", name, name)
    raise BadInput(f"a target is {_SPELLING}; nothing is shared with a person or a private store")


def audience_today(state: apsw.Connection, audience: Audience, now: int) -> list[tuple[str, str]]:
    """(principal id, display label) of who is in ``audience`` now: for a preview, never for a decision."""
    if audience.kind == AGENT_SHARED:
        return []  # everyone the agent serves; the preview says so
    rows = state.execute(
        "SELECT p.principal_id, coalesce(p.label, '') FROM memberships m JOIN principals p"
        " ON p.principal_id = m.principal_id WHERE m.group_id = ? AND m.removed_at IS NULL"
        " AND (m.expires_at IS NULL OR m.expires_at > ?) AND p.state = 'active' ORDER BY p.label, p.principal_id",
        (audience.principal_id, now))
    return [(row[0], row[1]) for row in rows]


def in_audience(state: apsw.Connection, principal_id: str, audience: Audience, now: int) -> bool:
    """Whether ``principal_id`` is in ``audience`` today (agent-shared: everyone)."""
    if audience.kind == AGENT_SHARED:
        return True
    member, expires = membership_expiry(state, audience.principal_id, principal_id)
    return member and (expires is None or now < expires)


def publisher_mount(scope_kind: str, audience_id: str) -> Mount:
    """The target store as the publish decision sees it: nothing by placement, ``publish`` by an allow."""
    return Mount("publish", scope_kind, audience_id, frozenset(), frozenset({Op.PUBLISH}))


def may_publish(catalog: apsw.Connection, agent_id: str, subject: Subject, store_id: str | None,
                scope_kind: str, audience_id: str, now: int) -> Decision:
    """A live publisher grant for ``subject`` on the store, or ``not-publisher``."""
    if subject.kind not in (SubjectKind.USER, SubjectKind.SERVICE) or store_id is None:
        return Decision(False, Reason.NOT_PUBLISHER)  # only a verified person or service publishes
    entries = policy_entries(catalog, agent_id, store_id, None)
    decision = evaluate(Op.PUBLISH, subject, publisher_mount(scope_kind, audience_id), None, entries, now)
    return decision if decision else Decision(False, Reason.NOT_PUBLISHER)


def check_grant_id(grant_id: str) -> str:
    if not ids.looks_like("entry", grant_id):
        raise BadInput("unknown grant")
    return grant_id
