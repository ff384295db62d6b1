"""Who a store's notes reach, as far as a derivation needs to know.

A derived revision may be read by no one its sources could not reach
(invariant 6). The rule is structural: the audience follows from the store
a note sits in (a person's private store reaches that person, a channel or
a role its members, agent-shared every subject of the agent), never from
what the note says or who is said to be in it. ``inside(t, s)`` is the one
question: does everyone ``t`` reaches also fall in ``s``? A person falls in
a group only while a live membership says so, the same evidence the views
use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scopefs.catalog.clock import now_us
from scopefs.catalog.groups import membership_expiry
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Mount

EVERYONE = "everyone"  # every subject of the agent: agent-shared, a projection to it
PRINCIPAL = "principal"  # one person or service: a private store, a service's agent store
GROUP = "group"  # a conversation's or a role's members, and projections to them
POOL = "pool"  # a shared pool: every subject of every reader agent
NOBODY = "nobody"  # a quarantine: no audience until a review decides one


@dataclass(frozen=True)
class Reach:
    kind: str
    id: str = ""


def reach_of(mount: Mount) -> Reach:
    """The audience of the store behind ``mount``."""
    return reach_of_store(mount.scope_kind, mount.audience_id, mount.cell)


def reach_of_store(kind: str, audience_id: str, cell: str = "") -> Reach:
    """The audience of a store of ``kind`` for ``audience_id`` (in a shared pool's ``cell``, if given)."""
    if cell:
        return Reach(POOL, cell)
    if kind == "agent-shared" or (kind == "projection" and not audience_id):
        return Reach(EVERYONE)
    if kind in ("user", "agent"):
        return Reach(PRINCIPAL, audience_id)
    if kind in ("channel", "role", "projection"):
        return Reach(GROUP, audience_id)
    return Reach(NOBODY)


Member = Callable[[str, str], bool]  # (principal, group) -> a live member now


def inside(t: Reach, s: Reach, member: Member) -> bool:
    """Whether every subject ``t`` reaches is also reached by ``s``."""
    if NOBODY in (t.kind, s.kind):
        return False
    if t == s:
        return True
    if s.kind == POOL:  # the deriving agent reads the pool, so all of its subjects are readers
        return t.kind in (EVERYONE, PRINCIPAL, GROUP)
    if s.kind == EVERYONE:
        return t.kind in (PRINCIPAL, GROUP)
    if s.kind == GROUP and t.kind == PRINCIPAL:
        return member(t.id, s.id)
    return False


def live_member(home: Home) -> Member:
    """Membership as the views see it now (``groups.membership_expiry``), for ``inside``."""
    state, now = home.state(), now_us()

    def member(principal_id: str, group_id: str) -> bool:
        live, expires = membership_expiry(state, group_id, principal_id)
        return live and (expires is None or now < expires)

    return member


def common(reaches: list[Reach], member: Member) -> Reach | None:
    """One of ``reaches`` inside all of them, if any: the narrowest audience the sources share."""
    for candidate in reaches:
        if all(inside(candidate, other, member) for other in reaches):
            return candidate
    return None
