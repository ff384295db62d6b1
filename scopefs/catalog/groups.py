"""Conversations, roles and memberships: the groups a principal belongs to.

Conversations and roles are principals too, so memberships, audiences and
policy entries can name them uniformly. A conversation is found by a keyed
HMAC of its provider tuple; the raw conversation id is never stored.
Membership evidence expires: a stale membership counts as no membership.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.identity import get_principal, lookup_key, provider_field

_ROLE_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


def conversation_lookup_key(key: bytes, agent_id: str, channel: str, account: str, conversation: str) -> bytes:
    return lookup_key(
        key,
        "conversation",
        agent_id,
        provider_field(channel, "channel"),
        provider_field(account, "account"),
        provider_field(conversation, "conversation"),
    )


def add_conversation(state: apsw.Connection, key: bytes, agent_id: str, channel: str, account: str,
                     conversation: str) -> tuple[str, bool]:
    """Register a group conversation for an agent; idempotent per tuple."""
    lkey = conversation_lookup_key(key, agent_id, channel, account, conversation)
    with immediate(state):
        if one(state, "SELECT 1 FROM agents WHERE agent_id = ?", (agent_id,)) is None:
            raise BadInput(f"unknown agent: {agent_id}")
        row = one(state, "SELECT conversation_id FROM conversations WHERE agent_id = ? AND lookup_key = ?",
                  (agent_id, lkey))
        if row is not None:
            return row[0], False
        conversation_id = ids.new_id("principal")
        now = now_us()
        state.execute(
            "INSERT INTO principals (principal_id, kind, label, created_at) VALUES (?, 'conversation', NULL, ?)",
            (conversation_id, now),
        )
        state.execute(
            "INSERT INTO conversations (conversation_id, agent_id, lookup_key, created_at) VALUES (?, ?, ?, ?)",
            (conversation_id, agent_id, lkey, now),
        )
    return conversation_id, True


def find_conversation(state: apsw.Connection, key: bytes, agent_id: str, channel: str, account: str,
                      conversation: str) -> str | None:
    """The conversation registered for these provider facts, or None (a gateway knows only the facts)."""
    row = one(state, "SELECT conversation_id FROM conversations WHERE agent_id = ? AND lookup_key = ?",
              (agent_id, conversation_lookup_key(key, agent_id, channel, account, conversation)))
    return None if row is None else row[0]


def conversation_agent(state: apsw.Connection, conversation_id: str) -> str | None:
    """The agent a conversation is registered for, or None if unknown."""
    if not ids.looks_like("principal", conversation_id):
        return None
    row = one(state, "SELECT agent_id FROM conversations WHERE conversation_id = ?", (conversation_id,))
    return None if row is None else row[0]


def add_role(state: apsw.Connection, name: str) -> tuple[str, bool]:
    """A role principal; its name is also its folder under ``roles/``."""
    if not isinstance(name, str) or _ROLE_NAME.fullmatch(name) is None:
        raise BadInput("invalid role name: use 1-32 characters a-z, 0-9 and '-', starting with a letter")
    with immediate(state):
        row = one(state, "SELECT principal_id FROM principals WHERE kind = 'role' AND label = ?", (name,))
        if row is not None:
            return row[0], False
        role_id = ids.new_id("principal")
        state.execute(
            "INSERT INTO principals (principal_id, kind, label, created_at) VALUES (?, 'role', ?, ?)",
            (role_id, name, now_us()),
        )
    return role_id, True


def group_id_of(state: apsw.Connection, group: str) -> str:
    """A group as the operator names it: a conversation or role id, or ``role:NAME``."""
    if isinstance(group, str) and group.startswith("role:"):
        name = group[len("role:"):]
        row = None
        if _ROLE_NAME.fullmatch(name) is not None:
            row = one(state, "SELECT principal_id FROM principals WHERE kind = 'role' AND label = ?", (name,))
        if row is None:
            raise BadInput("unknown role")
        return str(row[0])
    return group


def add_member(state: apsw.Connection, group_id: str, principal_id: str, expires_after_us: int | None) -> str:
    """Record (or refresh) membership evidence; returns the membership id.

    Refreshing replaces the live row with a new one and a higher evidence
    revision, so history is kept and expiry is always the latest evidence.
    """
    group_id = group_id_of(state, group_id)
    group = get_principal(state, group_id)
    if group.kind not in ("conversation", "role"):
        raise BadInput("the group must be a conversation or a role")
    member = get_principal(state, principal_id)
    if member.kind not in ("human", "service"):
        raise BadInput("only human or service principals can be members")
    now = now_us()
    expires = None if expires_after_us is None else now + expires_after_us
    with immediate(state):
        prev = one(state, "SELECT membership_id, evidence_revision FROM memberships"
                   " WHERE group_id = ? AND principal_id = ? AND removed_at IS NULL", (group_id, principal_id))
        revision = 1
        if prev is not None:
            state.execute("UPDATE memberships SET removed_at = ? WHERE membership_id = ?", (now, prev[0]))
            revision = prev[1] + 1
        membership_id = ids.new_id("membership")
        state.execute(
            "INSERT INTO memberships (membership_id, group_id, principal_id, evidence_revision, added_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (membership_id, group_id, principal_id, revision, now, expires),
        )
    return membership_id


def remove_member(state: apsw.Connection, group_id: str, principal_id: str) -> bool:
    group_id = group_id_of(state, group_id)
    get_principal(state, group_id)
    get_principal(state, principal_id)
    with immediate(state):
        row = one(state, "SELECT membership_id FROM memberships"
                         " WHERE group_id = ? AND principal_id = ? AND removed_at IS NULL",
                  (group_id, principal_id))
        if row is None:
            return False
        state.execute("UPDATE memberships SET removed_at = ? WHERE membership_id = ?", (now_us(), row[0]))
    return True


@dataclass(frozen=True)
class RoleMembership:
    role_id: str
    role_name: str
    expires_at: int | None


def role_memberships(state: apsw.Connection, principal_id: str) -> tuple[RoleMembership, ...]:
    """Live role memberships with their expiry; freshness is the view's call."""
    rows = state.execute(
        "SELECT m.group_id, p.label, m.expires_at FROM memberships m JOIN principals p ON p.principal_id = m.group_id"
        " WHERE m.principal_id = ? AND m.removed_at IS NULL AND p.kind = 'role' AND p.state = 'active'"
        " ORDER BY p.label",
        (principal_id,),
    )
    return tuple(RoleMembership(*row) for row in rows)


def membership_expiry(state: apsw.Connection, group_id: str, principal_id: str) -> tuple[bool, int | None]:
    """(is a live member, expiry) for one group."""
    row = one(state, "SELECT expires_at FROM memberships"
                     " WHERE group_id = ? AND principal_id = ? AND removed_at IS NULL",
              (group_id, principal_id))
    return (False, None) if row is None else (True, row[0])
