"""Opaque, expiring session capabilities: what a gateway holds instead of ids.

A capability seals (AES-256-GCM under the home's own ``api.key``, made
on first use, 0600) the session it acts for, the verified actor and the
binding that verified it, the agent, the policy revision it was issued
under and the server process that issued it. The client learns none of
them and can change none: a forged, altered or truncated token fails to
open, and one issued by another home (another key) too. Nothing is
stored, so issuing costs no write; a capability ends when it expires,
when its server stops (its nonces died with it, ``replay``), when the
session's or the actor's evidence goes, or when the policy revision it
names is no longer current (``revision``). ``api.key`` is its own file so
that capabilities can be revoked all at once (delete it) without
touching the bindings' keys.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import asdict, dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from scopefs.catalog import ids
from scopefs.catalog.errors import Denied
from scopefs.catalog.home import Home
from scopefs.catalog.reasons import Reason

PREFIX = "scap1_"
MAX_TOKEN_CHARS = 1024  # bounded before anything is decoded
NONCE_BYTES = 12


@dataclass(frozen=True)
class Grant:
    """What a capability lets its holder do: act in one session, as one actor, until a time."""

    grant_id: str  # names this capability in replay checks and audits (never the token itself)
    server_id: str  # the server process that issued it: only that one holds its nonces
    session_id: str
    agent_id: str
    actor_id: str | None
    actor_binding_id: str | None  # the binding the actor was verified through: it must stay live
    policy_revision: str
    expires_us: int


def _key(home: Home) -> bytes:
    return home.api_key()


def new_grant_id() -> str:
    return ids.random_token()


def issue(home: Home, grant: Grant) -> str:
    """The opaque token for ``grant``."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(_key(home)).encrypt(nonce, json.dumps(asdict(grant), sort_keys=True).encode(), PREFIX.encode())
    return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")


def invalid() -> Denied:
    return Denied(Reason.INVALID_CONTEXT, "denied: the capability is not valid here (open the session again)")


def open_grant(home: Home, token: object, now_us: int) -> Grant:
    """The grant sealed in ``token``; Denied (invalid-context, plan-expired) otherwise."""
    if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > MAX_TOKEN_CHARS:
        raise invalid()
    body = token[len(PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        plain = AESGCM(_key(home)).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], PREFIX.encode())
        grant = Grant(**json.loads(plain))
    except (binascii.Error, ValueError, InvalidTag, TypeError):
        raise invalid() from None
    if grant.expires_us <= now_us:
        raise Denied(Reason.PLAN_EXPIRED, "denied: the capability has expired (open the session again)")
    return grant
