"""Stable reason codes from the specification's authorization model.

Audit rows, refusals and tests use these strings; they are part of the
public contract and never change meaning.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    ALLOWED = "allowed"
    INVALID_CONTEXT = "invalid-context"
    SESSION_REBOUND = "session-rebound"
    DELIVERY_REBOUND = "delivery-rebound"
    PLAN_EXPIRED = "plan-expired"
    IDENTITY_REVOKED = "identity-revoked"
    MEMBERSHIP_STALE = "membership-stale"
    OUTSIDE_VIEW = "outside-view"
    REVISION_STALE = "revision-stale"
    EXPLICIT_DENY = "explicit-deny"
    DEFAULT_DENY = "default-deny"
    LINEAGE_DENY = "lineage-deny"
    BACKEND_NONCONFORMING = "backend-nonconforming"
    # A revision committed without a disk sync whose artifact did not survive
    # a power loss: recovery rolled its note back to the revision before it.
    REVISION_LOST = "revision-lost"
    # A committed revision whose artifact was changed outside scopefs:
    # ``doctor --fix`` quarantined the file and rolled its note back the same way.
    REVISION_TAMPERED = "revision-tampered"
    # Publishing into agent-shared/ or a role store needs a live publisher
    # grant for the session's verified subject; reading never implies it.
    NOT_PUBLISHER = "not-publisher"
    # A projection is made by the note's verified owner, into an audience
    # the owner belongs to (catalog.sharing).
    NOT_OWNER = "not-owner"
    NOT_IN_AUDIENCE = "not-in-audience"
    # A publish at a name that holds another publisher's live copy (``writer.publish``).
    NAME_TAKEN = "name-taken"
    # Deposits (audit only: a depositor is told one generic refusal).
    HANDLE_INVALID = "handle-invalid"
    POSTBOX_OFF = "postbox-off"
    RATE_LIMITED = "rate-limited"
    # The lifecycle of derived memory (issue 16).
    EXPIRED = "expired"  # past its valid-until, or superseded
    MIXED_AUDIENCE = "mixed-audience"  # a derivation whose sources have no common audience with its target
    FORGOTTEN = "forgotten"  # the content holds a claim an owner forgot


# Reasons that describe the caller's own session rather than a resource.
# These may be shown as they are; every resource-level reason is reported to
# the caller as OUTSIDE_VIEW so that "hidden" and "missing" look the same.
SESSION_REASONS = frozenset(
    {
        Reason.INVALID_CONTEXT,
        Reason.SESSION_REBOUND,
        Reason.DELIVERY_REBOUND,
        Reason.PLAN_EXPIRED,
        Reason.IDENTITY_REVOKED,
        Reason.MEMBERSHIP_STALE,
    }
)


# Reasons about the caller's own authority to share: they name nothing of
# another scope, so the caller sees them as they are.
SHARING_REASONS = frozenset({Reason.NOT_PUBLISHER, Reason.NOT_OWNER, Reason.NOT_IN_AUDIENCE, Reason.MIXED_AUDIENCE,
                             Reason.FORGOTTEN, Reason.NAME_TAKEN})


def public_reason(reason: Reason, *, read_like: bool) -> Reason:
    """The reason a caller may see for an internal decision.

    For reads and lookups every resource-level refusal collapses to
    ``outside-view``: the caller cannot tell a hidden note from a missing
    one. Write refusals against a root the caller can already see keep
    ``default-deny`` (the root is visibly read-only, nothing is revealed).
    """
    if reason in SESSION_REASONS or reason in SHARING_REASONS:
        return reason
    if read_like:
        return Reason.OUTSIDE_VIEW
    if reason in (Reason.DEFAULT_DENY, Reason.OUTSIDE_VIEW):
        return reason
    return Reason.OUTSIDE_VIEW
