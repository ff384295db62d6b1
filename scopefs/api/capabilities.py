"""Opaque, expiring session capabilities: what a gateway holds instead of ids.

A capability seals (AES-256-GCM, a key derived from the home's
``hmac.key``) the session it acts for, the verified actor, the agent and
the policy revision it was issued under. The client learns none of them
and can change none: a forged, altered or truncated token fails to open,
and one issued by another home (another key) too. Nothing is stored, so
issuing costs no write; a capability ends when it expires, when the
session's evidence goes (checked on every request by the catalog), or
when the policy revision it names is no longer current (``policy``).
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
from scopefs.catalog.identity import lookup_key
from scopefs.catalog.reasons import Reason

PREFIX = "scap1_"
MAX_TOKEN_CHARS = 1024  # bounded before anything is decoded
NONCE_BYTES = 12


@dataclass(frozen=True)
class Grant:
    """What a capability lets its holder do: act in one session, as one actor, until a time."""

    grant_id: str  # names this capability in replay checks and audits (never the token itself)
    session_id: str
    agent_id: str
    actor_id: str | None
    policy_revision: str
    expires_us: int


def _key(home: Home) -> bytes:
    return lookup_key(home.hmac_key(), "api-capability-key")


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
