"""Session subjects: whose audience a session serves, fixed at creation.

The subject is not the actor. In a group the subject is the conversation,
whoever sent the last message; an unverified or shared DM is ambiguous and
can never become a user subject later.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SubjectKind(StrEnum):
    USER = "user"
    CONVERSATION = "conversation"
    SERVICE = "service"
    AMBIGUOUS = "ambiguous"


class AmbiguousReason(StrEnum):
    SHARED_MAIN = "shared-main"
    UNBOUND = "unbound"


@dataclass(frozen=True)
class Subject:
    kind: SubjectKind
    principal_id: str | None = None  # None exactly when ambiguous
    reason: AmbiguousReason | None = None  # set exactly when ambiguous

    def __post_init__(self) -> None:
        ambiguous = self.kind is SubjectKind.AMBIGUOUS
        if ambiguous != (self.principal_id is None) or ambiguous != (self.reason is not None):
            raise ValueError("an ambiguous subject has a reason and no principal; others the reverse")
