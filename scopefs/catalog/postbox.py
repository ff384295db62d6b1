"""The postbox: a one-way valve from a group into one participant's quarantine.

A group session never names a person. When a message arrives, the channel
adapter (trusted) asks for a message handle (``issue_handle``): a random,
single-use token bound to that group session, its conversation and the
verified sender behind the message, which it hands to the group's agent.
Filing ``postbox/<handle>.md`` (or ``scopefs deposit``) then puts the
content into that sender's quarantine (``writer.postbox``), never into
their private store, and the group learns only "accepted" or one generic
refusal, whatever went wrong: a forged, reused, expired, other-session or
other-conversation handle, a sender whose postbox is off or who left, a
deposit over the rate. The true reason goes to the audit only.

The owner reviews in its own DM view (``postbox/``, read-only, never in
search) and approves into ``private/``, rejects, or purges by conversation.

Only the handle's SHA-256 is stored: the catalog never holds a token that
would let its reader deposit.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput, Denied
from scopefs.catalog.groups import membership_expiry
from scopefs.catalog.identity import get_principal
from scopefs.catalog.reasons import Reason

HANDLE_PREFIX = "mh_"
HANDLE_BYTES = 20  # 160 bits, 32 base32 characters
_HANDLE = re.compile(r"mh_[a-z2-7]{32}")
HANDLE_TTL_US = 24 * 3600 * 1_000_000  # a message's handle is good for a day
ITEM_TTL_US = 30 * 24 * 3600 * 1_000_000  # a pending deposit waits this long for its owner
RATE_WINDOW_US = 3600 * 1_000_000
RATE_CAP = 20  # accepted deposits per (source conversation, owner) per window
MODES = ("review",)
DEPOSIT_MAX_BYTES = 1 << 20  # a deposit is an observation, not a file drop
DEPOSIT_REFUSED = "deposit refused"


def refused() -> Denied:
    """The one answer a depositor gets for every refusal."""
    return Denied(Reason.DEFAULT_DENY, DEPOSIT_REFUSED)


def new_handle() -> str:
    return HANDLE_PREFIX + ids.random_token(HANDLE_BYTES)


def handle_digest(handle: str) -> str | None:
    """The stored form of a well-formed handle; None for anything else (bounded before the regex)."""
    if not isinstance(handle, str) or len(handle) != len(HANDLE_PREFIX) + 32 or _HANDLE.fullmatch(handle) is None:
        return None
    return hashlib.sha256(handle.encode("ascii")).hexdigest()


def handle_of_name(name: str) -> str | None:
    """The handle a deposit's file name (``<handle>.md``) carries, or None."""
    if not name.endswith(".md"):
        return None
    handle = name[:-3]
    return handle if handle_digest(handle) is not None else None


# -- the owner's switch (state.sqlite) --------------------------------------------

def set_mode(state: apsw.Connection, principal_id: str, mode: str | None) -> bool:
    """Turn a person's postbox on (``mode``) or off (None); False if it already was so."""
    principal = get_principal(state, principal_id)
    if principal.kind != "human":
        raise BadInput("only a person has a postbox")
    if mode is not None and mode not in MODES:
        raise BadInput("the postbox mode is review (reviewed by its owner before anything is kept)")
    now = now_us()
    with immediate(state):
        live = one(state, "SELECT setting_id, mode FROM postbox_settings WHERE principal_id = ?"
                          " AND disabled_at IS NULL", (principal_id,))
        if live is not None and live[1] == mode:
            return False
        if live is None and mode is None:
            return False
        if live is not None:
            state.execute("UPDATE postbox_settings SET disabled_at = ? WHERE setting_id = ?", (now, live[0]))
        if mode is not None:
            state.execute("INSERT INTO postbox_settings (setting_id, principal_id, mode, enabled_at)"
                          " VALUES (?, ?, ?, ?)", (ids.random_token(), principal_id, mode, now))
    return True


def mode_of(state: apsw.Connection, principal_id: str) -> str | None:
    row = one(state, "SELECT mode FROM postbox_settings WHERE principal_id = ? AND disabled_at IS NULL",
              (principal_id,))
    return None if row is None else str(row[0])


# -- handles (the agent's catalog) ----------------------------------------------------

@dataclass(frozen=True)
class Bound:
    """What a valid handle binds a deposit to."""

    digest: str
    conversation_id: str
    owner_id: str  # the message's verified sender: whose quarantine receives it


def issue_handle(catalog: apsw.Connection, agent_id: str, session_id: str, conversation_id: str,
                 sender_id: str) -> str:
    handle = new_handle()
    digest = handle_digest(handle)
    now = now_us()
    with immediate(catalog):
        catalog.execute("INSERT INTO message_handles (handle_sha256, agent_id, session_id, conversation_id, sender_id,"
                        " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (digest, agent_id, session_id, conversation_id, sender_id, now, now + HANDLE_TTL_US))
    return handle


def check_handle(catalog: apsw.Connection, state: apsw.Connection, agent_id: str, session_id: str,
                 conversation_id: str, handle: str, now: int) -> tuple[Bound | None, Reason]:
    """The deposit a handle allows now, or None and the true reason (for the audit only)."""
    digest = handle_digest(handle)
    if digest is None:
        return None, Reason.HANDLE_INVALID
    row = one(catalog, "SELECT session_id, conversation_id, sender_id, expires_at, used_at FROM message_handles"
                       " WHERE agent_id = ? AND handle_sha256 = ?", (agent_id, digest))
    if row is None or row[0] != session_id or row[1] != conversation_id or row[4] is not None or now >= row[3]:
        return None, Reason.HANDLE_INVALID
    sender = str(row[2])
    receiving = still_receiving(state, conversation_id, sender, now)
    if receiving is not Reason.ALLOWED:
        return None, receiving
    window = one(catalog, "SELECT window_start, accepted FROM postbox_rates WHERE agent_id = ? AND conversation_id = ?"
                          " AND owner_id = ?", (agent_id, conversation_id, sender))
    if window is not None and now < window[0] + RATE_WINDOW_US and window[1] >= RATE_CAP:
        return None, Reason.RATE_LIMITED
    return Bound(digest, conversation_id, sender), Reason.ALLOWED


def still_receiving(state: apsw.Connection, conversation_id: str, owner_id: str, now: int) -> Reason:
    """Whether a deposit from ``conversation_id`` may reach ``owner_id`` now: an active person, a fresh
    member, postbox on."""
    if get_principal(state, owner_id).state != "active":
        return Reason.IDENTITY_REVOKED
    member, expires = membership_expiry(state, conversation_id, owner_id)
    if not member or (expires is not None and now >= expires):
        return Reason.MEMBERSHIP_STALE
    return Reason.ALLOWED if mode_of(state, owner_id) is not None else Reason.POSTBOX_OFF


def count_deposit(catalog: apsw.Connection, agent_id: str, bound: Bound, now: int) -> None:
    """Inside the deposit's transaction: the handle used, the rate window counted."""
    catalog.execute("UPDATE message_handles SET used_at = ? WHERE handle_sha256 = ?", (now, bound.digest))
    window = one(catalog, "SELECT window_start FROM postbox_rates WHERE agent_id = ? AND conversation_id = ?"
                          " AND owner_id = ?", (agent_id, bound.conversation_id, bound.owner_id))
    if window is None:
        catalog.execute("INSERT INTO postbox_rates (agent_id, conversation_id, owner_id, window_start, accepted)"
                        " VALUES (?, ?, ?, ?, 1)", (agent_id, bound.conversation_id, bound.owner_id, now))
    elif now >= window[0] + RATE_WINDOW_US:
        catalog.execute("UPDATE postbox_rates SET window_start = ?, accepted = 1 WHERE agent_id = ?"
                        " AND conversation_id = ? AND owner_id = ?",
                        (now, agent_id, bound.conversation_id, bound.owner_id))
    else:
        catalog.execute("UPDATE postbox_rates SET accepted = accepted + 1 WHERE agent_id = ? AND conversation_id = ?"
                        " AND owner_id = ?", (agent_id, bound.conversation_id, bound.owner_id))


# -- items -------------------------------------------------------------------------

_ITEM_COLUMNS = ("item_id, owner_id, conversation_id, source_session_id, actor_id, resource_id, revision_id,"
                 " created_at, expires_at, state, decided_at, approved_revision_id")


@dataclass(frozen=True)
class Item:
    item_id: str
    owner_id: str
    conversation_id: str
    source_session_id: str
    actor_id: str | None
    resource_id: str
    revision_id: str
    created_at: int
    expires_at: int
    state: str
    decided_at: int | None
    approved_revision_id: str | None

    def as_dict(self, now: int) -> dict[str, Any]:
        return {"item_id": self.item_id, "conversation_id": self.conversation_id,
                "source_session_id": self.source_session_id, "actor_id": self.actor_id,
                "revision_id": self.revision_id, "created_at_us": self.created_at, "expires_at_us": self.expires_at,
                "state": self.state if self.state != "pending" or now < self.expires_at else "expired",
                "approved_revision_id": self.approved_revision_id}


def items(catalog: apsw.Connection, agent_id: str, owner_id: str, *, pending_only: bool = False,
          conversation_id: str | None = None) -> list[Item]:
    sql = f"SELECT {_ITEM_COLUMNS} FROM postbox_items WHERE agent_id = ? AND owner_id = ?"
    args: tuple[Any, ...] = (agent_id, owner_id)
    if pending_only:
        sql += " AND state = 'pending'"
    if conversation_id is not None:
        sql += " AND conversation_id = ?"
        args += (conversation_id,)
    return [_item(row) for row in catalog.execute(sql + " ORDER BY created_at, item_id", args)]


def item(catalog: apsw.Connection, agent_id: str, owner_id: str, item_id: str) -> Item:
    """The owner's item ``item_id``; BadInput for anything else (an id of another owner is unknown too)."""
    if not isinstance(item_id, str) or not ids.looks_like("item", item_id):
        raise BadInput("unknown postbox item")
    rows = catalog.execute(f"SELECT {_ITEM_COLUMNS} FROM postbox_items WHERE agent_id = ? AND owner_id = ?"
                           " AND item_id = ?", (agent_id, owner_id, item_id)).fetchall()
    if not rows:
        raise BadInput("unknown postbox item")
    return _item(rows[0])


def _item(row: tuple[Any, ...]) -> Item:
    return Item(*row)


def notices(catalog: apsw.Connection, agent_id: str, owner_id: str) -> list[tuple[str, int, str]]:
    """(conversation, first time, first item) of each conversation the owner first received from."""
    return [(row[0], int(row[1]), row[2]) for row in catalog.execute(
        "SELECT conversation_id, first_at, first_item_id FROM postbox_sources WHERE agent_id = ? AND owner_id = ?"
        " ORDER BY first_at, conversation_id", (agent_id, owner_id))]
