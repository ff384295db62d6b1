"""Deposits into a participant's quarantine, and the owner's review of them.

``deposit`` is the only path from a group into a person's memory, and it
is one way: the content becomes a pending item in the owner's quarantine
store (their DM view's ``postbox/``), a revision with trust origin
``postbox`` and an audit row, through the same staged-rename transaction
as every write. The handle is decided again inside both commits (used,
expired, the sender's membership and postbox, the rate), so two deposits
racing on one handle give one item. Every refusal, whatever its true
reason, is the same ``deposit refused`` (``catalog.postbox.refused``).

The first accepted deposit from a conversation the owner never received
from adds a notice: a row, and a new revision of ``postbox/NOTICES.md``.

The owner approves an item into ``private/`` (a copy with lineage to the
deposit and trust origin ``postbox``), rejects it, or purges every pending
item of one conversation; each removes the item from the quarantine.
Nothing here reaches the owner's search, bootstrap or private store
without that approval.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import apsw

from scopefs.catalog import ids
from scopefs.catalog.access import Access, authorize_session
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.envelope import sanitise_capture_bytes
from scopefs.catalog.errors import BadInput, Conflict, Denied
from scopefs.catalog.groups import membership_expiry
from scopefs.catalog.home import Home
from scopefs.catalog.identity import resolve_binding
from scopefs.catalog.lineage import add_lineage
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Decision, Op
from scopefs.catalog.postbox import (
    DEPOSIT_MAX_BYTES,
    ITEM_TTL_US,
    Bound,
    Item,
    check_handle,
    count_deposit,
    issue_handle,
    item,
    items,
    notices,
    refused,
    still_receiving,
)
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import active_with_store
from scopefs.catalog.subject import SubjectKind
from scopefs.writer import lock
from scopefs.writer.capture import kept_lineage, kept_still_readable, previous_bytes
from scopefs.writer.tombstone import tombstone_rows
from scopefs.writer.transaction import Provenance, WriteResult, write_copy

log = logging.getLogger("scopefs.postbox")
NOTICES = "NOTICES.md"
NOTICE_ROUNDS = 4


def _group(home: Home, session_id: str, actor_id: str | None = None) -> Access:
    access = authorize_session(home, session_id, Op.DEPOSIT, actor_id=actor_id)
    if access.session.subject.kind is not SubjectKind.CONVERSATION:
        raise BadInput("a message handle belongs to a group session")
    if access.delegated and not any(Op.DEPOSIT in m.placement for m in access.view.mounts):
        raise access.refuse(Op.DEPOSIT, Reason.OUTSIDE_VIEW, hide=True)  # a child whose caps leave out postbox/
    return access


def add_message(home: Home, session_id: str, channel: str, account: str, sender: str) -> str:
    """A handle for a message that just arrived in the group session from ``sender`` (the adapter's call)."""
    access = _group(home, session_id)
    conversation = access.session.subject.principal_id
    assert conversation is not None
    found = resolve_binding(home.state(), home.hmac_key(), channel, account, sender)
    member, expires = (False, None) if found is None else membership_expiry(home.state(), conversation, found[1])
    if found is None or not member or (expires is not None and now_us() >= expires):
        raise BadInput("the sender is not a verified member of this conversation")
    return issue_handle(home.catalog(access.agent_id), access.agent_id, session_id, conversation, found[1])


@dataclass(frozen=True)
class Deposited:
    item_id: str
    result: WriteResult


def _bound(home: Home, session_id: str, handle: str, actor_id: str | None = None) -> tuple[Access, Bound]:
    """The group session's access and what ``handle`` binds a deposit to, or ``refused()`` (audited)."""
    try:
        access = _group(home, session_id, actor_id)
    except (Denied, BadInput):
        raise refused() from None
    conversation = access.session.subject.principal_id
    assert conversation is not None
    bound, reason = check_handle(home.catalog(access.agent_id), home.state(), access.agent_id, session_id,
                                 conversation, handle, now_us())
    if bound is None:
        access.refuse(Op.DEPOSIT, reason)  # audited with the true reason
        raise refused()
    return access, bound


def check_deposit(home: Home, session_id: str, handle: str) -> None:
    """``refused()`` now if a deposit through ``handle`` would be (a mount's create asks before the bytes come)."""
    _bound(home, session_id, handle)


def deposit(home: Home, session_id: str, handle: str, data: bytes, *, actor_id: str | None = None) -> Deposited:
    """File ``data`` into the quarantine of the sender ``handle`` names; ``refused()`` for every failure.

    ``actor_id``: the group member whose message the depositing run answers (the gateway's verified
    sender), recorded as the item's actor.
    """
    access, bound = _bound(home, session_id, handle, actor_id)
    agent, conversation = access.agent_id, bound.conversation_id
    if not data or len(data) > DEPOSIT_MAX_BYTES:
        access.refuse(Op.DEPOSIT, Reason.DEFAULT_DENY)
        raise refused()
    try:
        data = sanitise_capture_bytes(data)  # a deposit is a capture: chat scaffolding never reaches the owner
    except BadInput:
        access.refuse(Op.DEPOSIT, Reason.DEFAULT_DENY)
        raise refused() from None
    item_id = ids.new_id("item")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    # Its provenance shows in the owner's listing: conversation (the folder), time, actor (a principal id), item.
    by = f"-by-{access.actor_id}" if access.actor_id else ""
    inner = (conversation, f"{stamp}{by}-{item_id}.md")
    first = [False]

    def authority(conn: apsw.Connection, activating: bool) -> Decision:
        if activating:  # this deposit's ``reserve`` used the handle: the owner must still receive
            why = still_receiving(home.state(), conversation, bound.owner_id, now_us())
            return Decision(why is Reason.ALLOWED, why)
        again, why = check_handle(conn, home.state(), agent, session_id, conversation, handle, now_us())
        return Decision(True, Reason.ALLOWED) if again == bound else Decision(False, why)

    def reserve(conn: apsw.Connection, _resource_id: str, _revision_id: str) -> None:
        count_deposit(conn, agent, bound, now_us())  # spent even if the deposit fails later: fails closed

    def record(conn: apsw.Connection, resource_id: str, revision_id: str) -> None:
        now = now_us()
        conn.execute(
            "INSERT INTO postbox_items (item_id, agent_id, owner_id, conversation_id, source_session_id, actor_id,"
            " handle_sha256, resource_id, revision_id, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (item_id, agent, bound.owner_id, conversation, session_id, access.actor_id, bound.digest, resource_id,
             revision_id, now, now + ITEM_TTL_US))
        first[0] = conn.execute(
            "INSERT OR IGNORE INTO postbox_sources (agent_id, owner_id, conversation_id, first_item_id, first_at)"
            " VALUES (?, ?, ?, ?, ?) RETURNING 1", (agent, bound.owner_id, conversation, item_id, now)).fetchall() != []

    try:
        result = write_copy(access, "quarantine", bound.owner_id, inner, data,
                            Provenance(Op.DEPOSIT, "postbox", authority, record, reserve))
    except (Denied, Conflict):
        raise refused() from None
    if first[0]:
        _write_notices(access, bound)
    return Deposited(item_id, result)


def _write_notices(access: Access, bound: Bound) -> None:
    """``postbox/NOTICES.md`` of the owner, from the notice rows (which stay the record if this fails).

    Two first deposits from two conversations can race here; each renders
    the rows it sees, so the file is written again until a write is no
    older than the rows (a few rounds at most).
    """
    catalog = access.home.catalog(access.agent_id)
    for _ in range(NOTICE_ROUNDS):
        rows = notices(catalog, access.agent_id, bound.owner_id)
        lines = ["# Postbox notices", "", "First deposits from conversations you had not received from before.", ""]
        for conversation, first_at, first_item in rows:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(first_at / 1_000_000))
            lines.append(f"- {when}: first deposit from conversation {conversation} (item {first_item})")
        try:
            write_copy(access, "quarantine", bound.owner_id, (NOTICES,), ("\n".join(lines) + "\n").encode("utf-8"),
                       Provenance(Op.DEPOSIT, "postbox-notice", lambda _c, _a: Decision(True, Reason.ALLOWED)))
        except Exception as exc:  # noqa: BLE001 - the notice row stands; `postbox list` shows it
            log.warning("postbox notice file not written (%s)", type(exc).__name__)
            return
        if notices(catalog, access.agent_id, bound.owner_id) == rows:
            return


# -- the owner's review ------------------------------------------------------------

def _owner(home: Home, session_id: str, op: Op) -> tuple[Access, str]:
    access = authorize_session(home, session_id, op)
    subject = access.session.subject
    if subject.kind is not SubjectKind.USER or subject.principal_id is None:
        raise BadInput("the postbox is reviewed from its owner's own DM session")
    if access.delegated and (op is not Op.READ or not any(m.scope_kind == "quarantine" for m in access.view.mounts)):
        raise access.refuse(op, Reason.DEFAULT_DENY)  # a delegated child reads its postbox/ cap, decides nothing
    return access, subject.principal_id


@dataclass(frozen=True)
class Review:
    pending: list[Item]
    notices: list[tuple[str, int, str]]


def review(home: Home, session_id: str) -> Review:
    access, owner = _owner(home, session_id, Op.READ)
    catalog = home.catalog(access.agent_id)
    expire(home, access, owner)
    return Review(items(catalog, access.agent_id, owner, pending_only=True), notices(catalog, access.agent_id, owner))


def approve(home: Home, session_id: str, item_id: str, to: str | None = None) -> tuple[Item, WriteResult]:
    """Copy a pending item into the owner's private store; it leaves the postbox in the same transaction."""
    access, owner = _owner(home, session_id, Op.APPEND)
    catalog = home.catalog(access.agent_id)
    expire(home, access, owner)
    found = item(catalog, access.agent_id, owner, item_id)
    if found.state != "pending":
        raise BadInput(f"the item is {found.state} already")
    parts = split_virtual_path(to) if to else ("private", "postbox", f"{found.item_id}.md")
    if len(parts) < 2 or parts[0] != "private":
        raise BadInput("approve --to names a note under private/, e.g. private/notes/x.md")
    found_mount = access.view.mount_for(parts)
    if found_mount is None or Op.APPEND not in found_mount[0].placement:  # e.g. a pools file made it read-only
        raise access.refuse(Op.APPEND, Reason.DEFAULT_DENY)
    held = active_with_store(catalog, access.agent_id, found.revision_id)
    if held is None:
        raise BadInput("unknown postbox item")
    data, kept_from = previous_bytes(home, session_id, "/".join(parts)).keep_block(
        read_verified(home, access.agent_id, held[1], held[0]))
    kept_rows, kept_until = kept_lineage(kept_from)

    def authority(conn: apsw.Connection, _activating: bool) -> Decision:
        row = conn.execute("SELECT state FROM postbox_items WHERE item_id = ?", (item_id,)).fetchall()
        pending = bool(row) and row[0][0] == "pending"
        if not pending:
            return Decision(False, Reason.REVISION_STALE)
        return kept_still_readable(conn, kept_from)

    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        if not _decide(conn, access, [found], "approved", approved=revision_id):
            raise Conflict("the item was decided meanwhile; nothing was written")
        add_lineage(conn, access.agent_id, revision_id, found.revision_id, "postbox")
        kept_rows(conn, _resource_id, revision_id)

    result = write_copy(access, "user", owner, parts[1:], data,
                        Provenance(Op.APPEND, "postbox", authority, record, valid_until=kept_until))
    drain_quietly(home.state(), catalog, access.agent_id)
    return found, result


def reject(home: Home, session_id: str, item_id: str) -> Item:
    access, owner = _owner(home, session_id, Op.DELETE)
    expire(home, access, owner)
    found = item(home.catalog(access.agent_id), access.agent_id, owner, item_id)
    if found.state != "pending":
        raise BadInput(f"the item is {found.state} already")
    _settle(home, access, [found], "rejected")
    return found


def purge(home: Home, session_id: str, conversation_id: str) -> list[Item]:
    """Every pending item from one conversation, removed from the postbox."""
    access, owner = _owner(home, session_id, Op.DELETE)
    if not isinstance(conversation_id, str) or not ids.looks_like("principal", conversation_id):
        raise BadInput("unknown conversation")
    expire(home, access, owner)
    found = items(home.catalog(access.agent_id), access.agent_id, owner, pending_only=True,
                  conversation_id=conversation_id)
    return _settle(home, access, found, "purged")


def expire(home: Home, access: Access, owner: str) -> None:
    """Pending items past their expiry leave the quarantine (each review, and each deposit, looks)."""
    now = now_us()
    due = [i for i in items(home.catalog(access.agent_id), access.agent_id, owner, pending_only=True)
           if now >= i.expires_at]
    _settle(home, access, due, "expired")


def _settle(home: Home, access: Access, found: list[Item], state: str) -> list[Item]:
    """The items decided, and their deposits out of the quarantine, in one transaction; those it decided."""
    if not found:
        return []
    catalog = home.catalog(access.agent_id)
    with lock.shared(home.lock_path(access.agent_id)), immediate(catalog):
        decided = _decide(catalog, access, found, state)
    drain_quietly(home.state(), catalog, access.agent_id)
    return decided


def _decide(catalog: apsw.Connection, access: Access, found: list[Item], state: str, *,
            approved: str | None = None) -> list[Item]:
    """Inside the caller's transaction: each still pending item decided, its deposit tombstoned, audited."""
    now = now_us()
    decided = []
    for one_item in found:
        changed = catalog.execute(
            "UPDATE postbox_items SET state = ?, decided_at = ?, approved_revision_id = ?"
            " WHERE item_id = ? AND state = 'pending' RETURNING 1",
            (state, now, approved, one_item.item_id)).fetchall()
        if not changed:
            continue
        tombstone_rows(catalog, one_item.resource_id, one_item.revision_id)
        event = access.event(f"postbox-{state}", "allow", Reason.ALLOWED, revision_id=one_item.revision_id)
        settle(catalog, enqueue(catalog, access.agent_id, event), decision="allow", reason=Reason.ALLOWED)
        decided.append(one_item)
    return decided
