"""DESIGN.md §4's table, row by row, as plain examples.

Why: the table is the contract a reviewer reads; these tests pin each cell
(which roots, which store and audience behind each, rw/ro/deposit-only/
owner review) to ``catalog.view.memory_view`` and check the decisive cells
through the evaluator too, so "ro" means no allow entry can make it
writable, not just that placement lacks a write.
"""

from __future__ import annotations

import pytest

from scopefs.catalog.policy import WRITE_OPS, AudienceKind, Decision, Effect, Entry, Mount, Op, ResourceState, evaluate
from scopefs.catalog.reasons import Reason
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind
from scopefs.catalog.view import RoleEvidence, View, memory_view

NOW = 1_000_000
LIVE = ResourceState(live=True, revision_state="active")
READ_ONLY = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE})
READ_WRITE = READ_ONLY | {Op.APPEND, Op.REPLACE, Op.DELETE}

ALICE = Subject(SubjectKind.USER, "prn_alice")
BOB = Subject(SubjectKind.USER, "prn_bob")
GROUP = Subject(SubjectKind.CONVERSATION, "prn_group")
CRON = Subject(SubjectKind.SERVICE, "prn_cron")
SHARED_MAIN = Subject(SubjectKind.AMBIGUOUS, None, AmbiguousReason.SHARED_MAIN)
UNBOUND = Subject(SubjectKind.AMBIGUOUS, None, AmbiguousReason.UNBOUND)

OPS_ROLE = RoleEvidence("prn_role_ops", "ops", NOW + 60)
HR_ROLE_STALE = RoleEvidence("prn_role_hr", "hr", NOW - 1)
FINANCE_ROLE = RoleEvidence("prn_role_finance", "finance", None)
ROLES = (OPS_ROLE, HR_ROLE_STALE, FINANCE_ROLE)


def anyone_may_do_anything() -> tuple[Entry, ...]:
    """The broadest allow rows an ACL could hold: no ceiling may be widened by them."""
    return tuple(Entry(Effect.ALLOW, op, AudienceKind.ANY) for op in Op)


def shape(view: View) -> dict[str, tuple[str, str, frozenset[Op]]]:
    return {m.root: (m.scope_kind, m.audience_id, m.placement) for m in view.mounts}


def mount(view: View, root: str) -> Mount:
    found = view.mount_for(tuple(root.split("/")) + ("note.md",))
    assert found is not None, root
    return found[0]


def writable(subject: Subject, m: Mount) -> set[Op]:
    """Write ops allowed on a live note even with every allow entry present."""
    return {op for op in WRITE_OPS if evaluate(op, subject, m, LIVE, anyone_may_do_anything(), NOW)}


def test_user_row() -> None:
    """user: private/ rw, agent-shared/ ro, roles/<role>/ ro while fresh, postbox/ owner review."""
    view = memory_view(ALICE, ROLES, NOW)
    assert shape(view) == {
        "private": ("user", "prn_alice", READ_WRITE),
        "agent-shared": ("agent-shared", "", READ_ONLY),
        "roles/finance": ("role", "prn_role_finance", READ_ONLY),
        "roles/ops": ("role", "prn_role_ops", READ_ONLY),
        "postbox": ("quarantine", "prn_alice", frozenset({Op.RETRIEVE, Op.READ})),
        "projections/agent-shared": ("projection", "", frozenset()),
        "projections/roles/finance": ("projection", "prn_role_finance", frozenset()),
        "projections/roles/ops": ("projection", "prn_role_ops", frozenset()),
    }
    assert writable(ALICE, mount(view, "private")) >= {Op.APPEND, Op.REPLACE, Op.DELETE}
    for ro in ("agent-shared", "roles/ops", "roles/finance", "postbox"):
        assert writable(ALICE, mount(view, ro)) == set(), ro
    assert evaluate(Op.READ, ALICE, mount(view, "postbox"), LIVE, (), NOW).allowed


def test_user_role_mount_follows_evidence_freshness() -> None:
    """roles/<role>/ only while membership evidence is fresh; stale evidence is withheld and audited."""
    view = memory_view(ALICE, ROLES, NOW)
    assert view.mount_for(("roles", "hr", "note.md")) is None
    assert view.excluded_reason(("roles", "hr", "note.md")) is Reason.MEMBERSHIP_STALE
    edge = RoleEvidence("prn_role_edge", "edge", NOW)
    assert "roles/edge" not in memory_view(ALICE, (edge,), NOW).roots()  # expired at the instant
    assert "roles/edge" in memory_view(ALICE, (edge,), NOW - 1).roots()


def test_two_users_see_only_their_own_private_and_postbox() -> None:
    """Alice and Bob get the same roots backed by different stores: keyed by principal id."""
    alice, bob = memory_view(ALICE, (), NOW), memory_view(BOB, (), NOW)
    assert alice.roots() == bob.roots()
    assert mount(alice, "private").audience_id == "prn_alice"
    assert mount(bob, "private").audience_id == "prn_bob"
    assert mount(bob, "postbox").audience_id == "prn_bob"


def test_conversation_row() -> None:
    """conversation: channel/ rw, agent-shared/ ro, projections/ ro, postbox/ deposit-only."""
    view = memory_view(GROUP, ROLES, NOW)  # role evidence never counts for a group
    assert shape(view) == {
        "channel": ("channel", "prn_group", READ_WRITE),
        "agent-shared": ("agent-shared", "", READ_ONLY),
        "projections/channel": ("projection", "prn_group", frozenset()),
        "projections/agent-shared": ("projection", "", frozenset()),
        "postbox": ("postbox", "", frozenset({Op.DEPOSIT})),
    }
    assert writable(GROUP, mount(view, "channel")) >= {Op.APPEND, Op.REPLACE, Op.DELETE}
    for ro in ("agent-shared", "projections/channel", "projections/agent-shared"):
        assert writable(GROUP, mount(view, ro)) == set(), ro


def test_projection_mounts_grant_only_what_a_live_projection_allows() -> None:
    """A copy in projections/ is read only through its own allows, up to read and derive; never written."""
    for subject in (ALICE, GROUP, CRON):
        shared = mount(memory_view(subject, ROLES, NOW), "projections/agent-shared")
        assert evaluate(Op.READ, subject, shared, LIVE, (), NOW) == Decision(False, Reason.DEFAULT_DENY)
        live = tuple(Entry(Effect.ALLOW, op, AudienceKind.ANY, expires_at=NOW + 1)
                     for op in (Op.RETRIEVE, Op.READ, Op.DERIVE))
        assert evaluate(Op.DERIVE, subject, shared, LIVE, live, NOW).allowed
        assert not evaluate(Op.READ, subject, shared, LIVE, live, NOW + 1)  # expired at the instant
        assert writable(subject, shared) == set()
        for op in WRITE_OPS:
            assert not evaluate(op, subject, shared, LIVE, anyone_may_do_anything(), NOW), op


def test_group_postbox_is_write_only() -> None:
    """postbox/ in a group: deposit succeeds; listing and reading back fail, even with allow rows."""
    box = mount(memory_view(GROUP, (), NOW), "postbox")
    everything = anyone_may_do_anything()
    assert writable(GROUP, box) == {Op.DEPOSIT}
    for op in (Op.RETRIEVE, Op.READ, Op.DERIVE, Op.EXPORT):
        assert evaluate(op, GROUP, box, LIVE, everything, NOW) == Decision(False, Reason.DEFAULT_DENY), op
    assert evaluate(Op.DEPOSIT, GROUP, box, None, (), NOW).allowed


def test_a_group_never_mounts_a_members_private_or_role_store() -> None:
    """Whoever sent the last message, the group's view has no user, role or quarantine store."""
    view = memory_view(GROUP, ROLES, NOW)
    assert not {m.scope_kind for m in view.mounts} & {"user", "role", "quarantine"}
    for path in (("private", "notes", "x.md"), ("roles", "ops", "x.md"), ("roles", "finance", "x.md")):
        assert view.mount_for(path) is None


def test_service_row() -> None:
    """service: agent/ rw, agent-shared/ ro, projections to the whole agent, nothing else (roles never count)."""
    view = memory_view(CRON, ROLES, NOW)
    assert shape(view) == {
        "agent": ("agent", "prn_cron", READ_WRITE),
        "agent-shared": ("agent-shared", "", READ_ONLY),
        "projections/agent-shared": ("projection", "", frozenset()),
    }
    assert writable(CRON, mount(view, "agent")) >= {Op.APPEND, Op.REPLACE, Op.DELETE}
    assert writable(CRON, mount(view, "agent-shared")) == set()


@pytest.mark.parametrize("subject", [SHARED_MAIN, UNBOUND], ids=["shared-main", "unbound"])
def test_ambiguous_row(subject: Subject) -> None:
    """ambiguous: agent-shared/ ro, only resources marked safe for anonymous use; every write fails."""
    view = memory_view(subject, ROLES, NOW)
    assert view.roots() == ("agent-shared",)
    shared = mount(view, "agent-shared")
    assert shared.placement == frozenset()
    # Nothing by placement: an unmarked shared note is not even retrievable.
    assert evaluate(Op.READ, subject, shared, LIVE, (), NOW) == Decision(False, Reason.DEFAULT_DENY)
    # A note marked safe for anonymous use can be read, not derived from or written.
    marked = tuple(Entry(Effect.ALLOW, op, AudienceKind.SUBJECT_KIND, "ambiguous") for op in Op)
    assert evaluate(Op.READ, subject, shared, LIVE, marked, NOW).allowed
    assert not evaluate(Op.DERIVE, subject, shared, LIVE, marked, NOW)
    assert writable(subject, shared) == set()
    for op in WRITE_OPS:
        assert not evaluate(op, subject, shared, None, marked + anyone_may_do_anything(), NOW), op


def test_roots_outside_the_row_are_outside_view() -> None:
    """A root from another row is simply not there: mount_for is None and the evaluator says outside-view."""
    others = {
        ALICE: ("channel", "agent"),
        GROUP: ("private", "agent", "roles"),
        CRON: ("private", "channel", "postbox", "roles"),
        SHARED_MAIN: ("private", "channel", "projections", "postbox", "agent", "roles"),
    }
    for subject, roots in others.items():
        view = memory_view(subject, ROLES, NOW)
        for root in roots:
            assert view.mount_for((root, "ops", "x.md")) is None, (subject.kind, root)
            assert evaluate(Op.READ, subject, None, LIVE, anyone_may_do_anything(), NOW) == \
                Decision(False, Reason.OUTSIDE_VIEW)
