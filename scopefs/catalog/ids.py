"""Opaque identifiers from a CSPRNG.

Every id we mint is random, so ids reveal neither provider identifiers nor
creation order or row counts. A short prefix says what kind of thing an id
names, which keeps operator output and test failures readable.
"""

from __future__ import annotations

import base64
import re
import secrets

_ID_BYTES = 16  # 128 bits: collisions are not a practical concern
_ID_BODY = re.compile(r"[a-z2-7]{26}")

PREFIXES = {
    "principal": "p",
    "binding": "b",
    "session": "s",
    "store": "st",
    "storage_root": "sr",
    "resource": "r",
    "revision": "v",
    "intent": "wi",
    "event": "ev",
    "policy": "pol",
    "entry": "pe",
    "membership": "m",
    "projection": "pj",
    "item": "pb",
    "human_evidence": "hv",
}


def random_token(nbytes: int = _ID_BYTES) -> str:
    """Lower-case base32 without padding: safe in paths and shell words."""
    return base64.b32encode(secrets.token_bytes(nbytes)).decode("ascii").rstrip("=").lower()


def new_id(kind: str) -> str:
    return f"{PREFIXES[kind]}_{random_token()}"


def looks_like(kind: str, value: str) -> bool:
    """Cheap shape check before a lookup, bounded by construction."""
    prefix = PREFIXES[kind] + "_"
    return (
        isinstance(value, str)
        and len(value) == len(prefix) + 26
        and value.startswith(prefix)
        and _ID_BODY.fullmatch(value[len(prefix):]) is not None
    )
