"""Principals and verified identity bindings.

A binding maps the provider tuple (channel, account, sender) to one
principal. The tuple is stored only as a keyed HMAC: the raw sender id never
reaches disk, a log line or an audit row, yet the same tuple always finds
the same binding. Display names are labels: nothing here ever looks a
principal up by its label.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput

MAX_PROVIDER_FIELD_BYTES = 256
MAX_LABEL_CHARS = 128
PRINCIPAL_KINDS = ("human", "service")


def _clean_text(value: str, what: str, max_bytes: int) -> str:
    if not isinstance(value, str) or not value:
        raise BadInput(f"{what} must not be empty")
    try:
        encoded = value.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise BadInput(f"{what} is not valid UTF-8") from None
    if len(encoded) > max_bytes:
        raise BadInput(f"{what} is longer than {max_bytes} bytes")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in value):
        raise BadInput(f"{what} contains control characters")
    return value


def provider_field(value: str, what: str) -> str:
    """A provider identifier (channel, account, sender, conversation), exactly.

    Never normalized: two ids the provider treats as different (say the NFC
    and NFD spellings of one handle) must never share a binding, so the HMAC
    is taken over the exact UTF-8 bytes. Only empty, non-UTF-8, over-long or
    control-character values are refused.
    """
    return _clean_text(value, what, MAX_PROVIDER_FIELD_BYTES)


def lookup_key(key: bytes, purpose: str, *fields: str) -> bytes:
    """HMAC-SHA256 over length-prefixed fields, domain-separated by purpose.

    Length prefixes make the encoding injective: ("a:b", "c") and
    ("a", "b:c") never collide.
    """
    # Imported on first use: only binding and session opening compute a lookup key, and a
    # mount server, which never does, should not carry the library (7 MiB of each mount's RSS).
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import hmac as crypto_hmac

    mac = crypto_hmac.HMAC(key, hashes.SHA256())
    for part in (f"scopefs/{purpose}/v1", *fields):
        data = part.encode("utf-8")
        mac.update(len(data).to_bytes(4, "big"))
        mac.update(data)
    return mac.finalize()


def binding_lookup_key(key: bytes, channel: str, account: str, sender: str) -> bytes:
    return lookup_key(
        key,
        "binding",
        provider_field(channel, "channel"),
        provider_field(account, "account"),
        provider_field(sender, "sender"),
    )


@dataclass(frozen=True)
class Principal:
    principal_id: str
    kind: str
    label: str | None
    state: str


def get_principal(state: apsw.Connection, principal_id: str) -> Principal:
    """The principal, or BadInput naming it unknown (the id is ours, not raw)."""
    row = None
    if ids.looks_like("principal", principal_id):
        row = one(state, "SELECT principal_id, kind, label, state FROM principals WHERE principal_id = ?",
                  (principal_id,))
    if row is None:
        shown = principal_id if ids.looks_like("principal", principal_id) else "(malformed id)"
        raise BadInput(f"unknown principal: {shown}")
    return Principal(*row)


def add_principal(state: apsw.Connection, label: str, kind: str) -> str:
    if kind not in PRINCIPAL_KINDS:
        raise BadInput("principal kind must be human or service")
    label = _clean_text(label, "name", MAX_LABEL_CHARS * 4)
    if len(label) > MAX_LABEL_CHARS:
        raise BadInput(f"name is longer than {MAX_LABEL_CHARS} characters")
    principal_id = ids.new_id("principal")
    with immediate(state):
        state.execute(
            "INSERT INTO principals (principal_id, kind, label, created_at) VALUES (?, ?, ?, ?)",
            (principal_id, kind, label, now_us()),
        )
    return principal_id


def bind(state: apsw.Connection, key: bytes, principal_id: str, channel: str, account: str, sender: str,
         *, created_by: str = "operator") -> tuple[str, bool]:
    """Bind the tuple to a human principal; returns (binding_id, created).

    Binding the same live tuple to the same principal again is a no-op.
    Rebinding a live tuple to another principal is refused: the operator
    must revoke the old binding, which also ends every session opened
    through it.
    """
    principal = get_principal(state, principal_id)
    if principal.kind != "human":
        raise BadInput("only human principals can be bound to a channel sender")
    if principal.state != "active":
        raise BadInput("principal is disabled")
    lkey = binding_lookup_key(key, channel, account, sender)
    with immediate(state):
        live = one(state, "SELECT binding_id, principal_id FROM identity_bindings"
                          " WHERE lookup_key = ? AND revoked_at IS NULL", (lkey,))
        if live is not None:
            if live[1] == principal_id:
                return live[0], False
            raise BadInput("this sender is already bound to another principal; revoke that binding first")
        binding_id = ids.new_id("binding")
        state.execute(
            "INSERT INTO identity_bindings (binding_id, lookup_key, principal_id, adapter, assurance, verification,"
            " created_by, created_at) VALUES (?, ?, ?, 'operator-cli', 'operator-attested', 'operator', ?, ?)",
            (binding_id, lkey, principal_id, created_by, now_us()),
        )
    return binding_id, True


def revoke_binding(state: apsw.Connection, binding_id: str) -> bool:
    """Revoke a binding; returns False if it was already revoked."""
    if not ids.looks_like("binding", binding_id):
        raise BadInput("unknown binding: (malformed id)")
    with immediate(state):
        row = one(state, "SELECT revoked_at FROM identity_bindings WHERE binding_id = ?", (binding_id,))
        if row is None:
            raise BadInput(f"unknown binding: {binding_id}")
        if row[0] is not None:
            return False
        state.execute("UPDATE identity_bindings SET revoked_at = ? WHERE binding_id = ?", (now_us(), binding_id))
    return True


def resolve_binding(state: apsw.Connection, key: bytes, channel: str, account: str,
                    sender: str) -> tuple[str, str] | None:
    """(binding_id, principal_id) of the live binding for the tuple, if any."""
    row = one(
        state,
        "SELECT b.binding_id, b.principal_id FROM identity_bindings b JOIN principals p USING (principal_id)"
        " WHERE b.lookup_key = ? AND b.revoked_at IS NULL AND p.state = 'active'",
        (binding_lookup_key(key, channel, account, sender),),
    )
    return None if row is None else (row[0], row[1])


def binding_live(state: apsw.Connection, binding_id: str, principal_id: str) -> bool:
    """Whether the binding a session was opened through still stands."""
    row = one(
        state,
        "SELECT 1 FROM identity_bindings b JOIN principals p USING (principal_id)"
        " WHERE b.binding_id = ? AND b.principal_id = ? AND b.revoked_at IS NULL AND p.state = 'active'",
        (binding_id, principal_id),
    )
    return row is not None


def has_live_binding(state: apsw.Connection, principal_id: str) -> bool:
    """Whether an active principal can be reached through at least one live channel binding."""
    row = one(
        state,
        "SELECT 1 FROM identity_bindings b JOIN principals p USING (principal_id)"
        " WHERE b.principal_id = ? AND b.revoked_at IS NULL AND p.state = 'active'",
        (principal_id,),
    )
    return row is not None
