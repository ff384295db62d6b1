"""Property tests for the pure policy evaluator and the memory view.

Why: ``catalog.policy.evaluate`` and ``catalog.view.memory_view`` decide
every read, listing and write (DESIGN.md §4, §5 invariants 1-3). Each test
states one rule of the specification's "Authorization model" and is built
so that a plausible mistake in the evaluator or the view makes it fail; the
docstring of each test names the mistake it catches.

The expected values come from tables written out by hand from the
specification (``SPEC_REQUIRED``, ``SPEC_WRITE_OPS``, ``spec_decision``),
never from the module under test, so a wrong table in ``catalog.policy``
cannot agree with itself.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from scopefs.catalog.policy import (
    WRITE_OPS,
    AudienceKind,
    Decision,
    Effect,
    Entry,
    Mount,
    Op,
    ResourceState,
    evaluate,
    required,
)
from scopefs.catalog.reasons import Reason
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind
from scopefs.catalog.view import RoleEvidence, View, memory_view

PROPS = settings(max_examples=300, deadline=None)
FEW = settings(max_examples=150, deadline=None)

OPS: tuple[Op, ...] = tuple(Op)
ANY_OP = st.sampled_from(OPS)
ANY_KIND = st.sampled_from(SubjectKind)
ALL_OPS = frozenset(OPS)

# ---------------------------------------------------------------------------
# The specification, written out by hand.
# ---------------------------------------------------------------------------

# "Requested operation / Required capabilities" (derive -> read -> retrieve,
# replace -> append; everything else needs only itself).
INDEPENDENT: frozenset[Op] = frozenset({Op.PROJECT, Op.DEPOSIT, Op.SYNC, Op.DELETE, Op.PUBLISH, Op.POLICY_ADMIN,
                                        Op.IMPORT, Op.EXPORT})
SPEC_REQUIRED: dict[Op, frozenset[Op]] = {
    Op.RETRIEVE: frozenset({Op.RETRIEVE}),
    Op.READ: frozenset({Op.RETRIEVE, Op.READ}),
    Op.DERIVE: frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE}),
    Op.APPEND: frozenset({Op.APPEND}),
    Op.REPLACE: frozenset({Op.APPEND, Op.REPLACE}),
    **{op: frozenset({op}) for op in INDEPENDENT},
}

# Operations that change memory: the ambiguous subject may never do any.
SPEC_WRITE_OPS: frozenset[Op] = frozenset({Op.APPEND, Op.REPLACE, Op.DELETE, Op.DEPOSIT, Op.PROJECT, Op.PUBLISH,
                                           Op.SYNC, Op.IMPORT, Op.POLICY_ADMIN})

# Operations that act on an existing revision's content (read-like, replace,
# delete, and the content-exporting project/export) need that revision to
# be active; append, deposit, sync, publish, import and policy-admin only
# need the resource to be live.
NEEDS_ACTIVE: frozenset[Op] = frozenset({Op.RETRIEVE, Op.READ, Op.DERIVE, Op.REPLACE, Op.DELETE, Op.PROJECT,
                                         Op.EXPORT})

PRECHECK_REASONS = frozenset({Reason.OUTSIDE_VIEW, Reason.REVISION_STALE})


def spec_live(entry: Entry, now: int) -> bool:
    return entry.expires_at is None or now < entry.expires_at


def spec_matches(entry: Entry, subject: Subject) -> bool:
    """Audience matching by id only: principal id, subject kind, or anyone."""
    if entry.audience_kind == AudienceKind.ANY:
        return True
    if entry.audience_kind == AudienceKind.PRINCIPAL:
        return subject.principal_id is not None and subject.principal_id == entry.audience_id
    return subject.kind.value == entry.audience_id


def spec_precheck(op: Op, mount: Mount | None, resource: ResourceState | None) -> Reason | None:
    """Steps 4-5 of the evaluation order: the view boundary, then resource state."""
    if mount is None:
        return Reason.OUTSIDE_VIEW
    if resource is None:  # only creation (append of a new path) needs no content
        return Reason.REVISION_STALE if op in NEEDS_ACTIVE else None
    if not resource.live:
        return Reason.REVISION_STALE
    if op in NEEDS_ACTIVE and resource.revision_state != "active":
        return Reason.REVISION_STALE
    return None


def spec_decision(op: Op, subject: Subject, mount: Mount | None, resource: ResourceState | None,
                  entries: tuple[Entry, ...], now: int) -> Decision:
    """An independent reading of the evaluation order, used as the oracle."""
    pre = spec_precheck(op, mount, resource)
    if pre is not None:
        return Decision(False, pre)
    assert mount is not None
    needs = SPEC_REQUIRED[op]
    applicable = [e for e in entries if spec_live(e, now) and spec_matches(e, subject)]
    if any(e.effect == Effect.DENY and e.capability in needs for e in applicable):
        return Decision(False, Reason.EXPLICIT_DENY)
    for cap in needs:
        placed = cap in mount.placement
        granted = cap in mount.ceiling and any(e.effect == Effect.ALLOW and e.capability == cap for e in applicable)
        if not (placed or granted):
            return Decision(False, Reason.DEFAULT_DENY)
    return Decision(True, Reason.ALLOWED)


# ---------------------------------------------------------------------------
# Strategies.
# ---------------------------------------------------------------------------

# A small pool of ids so that entries often name the subject; kind names and
# a display label are in the audience pool to catch id/kind/label confusion.
PRINCIPALS = ("prn_alice", "prn_bob", "prn_mike_1", "prn_mike_2", "prn_group", "prn_cron")
AUDIENCE_IDS = PRINCIPALS + tuple(k.value for k in SubjectKind) + ("", "Mike", "any")

principal_ids = st.one_of(st.sampled_from(PRINCIPALS), st.text(min_size=1, max_size=10))
times = st.integers(min_value=0, max_value=40)
expiries = st.one_of(st.none(), st.integers(min_value=0, max_value=45))
op_sets = st.frozensets(st.sampled_from(OPS))


@st.composite
def subjects(draw: st.DrawFn, kinds: st.SearchStrategy[SubjectKind] = ANY_KIND) -> Subject:
    kind = draw(kinds)
    if kind is SubjectKind.AMBIGUOUS:
        return Subject(kind, None, draw(st.sampled_from(AmbiguousReason)))
    return Subject(kind, draw(principal_ids))


def audience_ids_for(subject: Subject) -> st.SearchStrategy[str]:
    own = () if subject.principal_id is None else (subject.principal_id,)
    return st.one_of(st.sampled_from(AUDIENCE_IDS + own + (subject.kind.value,)), st.text(max_size=6))


@st.composite
def entries_for(draw: st.DrawFn, subject: Subject, caps: st.SearchStrategy[Op] = ANY_OP) -> Entry:
    return Entry(
        effect=draw(st.sampled_from(Effect)),
        capability=draw(caps),
        audience_kind=draw(st.sampled_from(AudienceKind)),
        audience_id=draw(audience_ids_for(subject)),
        expires_at=draw(expiries),
    )


@st.composite
def mounts(draw: st.DrawFn) -> Mount:
    """Any mount with placement within ceiling (Mount refuses anything else)."""
    ceiling = draw(op_sets)
    placement = draw(st.frozensets(st.sampled_from(sorted(ceiling)))) if ceiling else frozenset()
    return Mount(
        root=draw(st.sampled_from(["private", "channel", "agent", "agent-shared", "projections", "postbox",
                                   "roles/ops"])),
        scope_kind=draw(st.sampled_from(["user", "channel", "agent", "agent-shared", "projection", "postbox",
                                         "quarantine", "role"])),
        audience_id=draw(st.sampled_from(AUDIENCE_IDS)),
        placement=placement,
        ceiling=ceiling,
    )


resources = st.one_of(
    st.none(),
    st.builds(ResourceState,
              live=st.sampled_from([True, True, True, False]),
              revision_state=st.sampled_from(["active", "active", "pending", "superseded", "tombstoned", None])),
)


@dataclass(frozen=True)
class State:
    """Everything evaluate() reads besides the operation."""

    subject: Subject
    mount: Mount | None
    resource: ResourceState | None
    entries: tuple[Entry, ...]
    now: int

    def decide(self, op: Op, *, entries: tuple[Entry, ...] | None = None, now: int | None = None) -> Decision:
        return evaluate(op, self.subject, self.mount, self.resource,
                        self.entries if entries is None else entries, self.now if now is None else now)

    def oracle(self, op: Op) -> Decision:
        return spec_decision(op, self.subject, self.mount, self.resource, self.entries, self.now)


@st.composite
def states(draw: st.DrawFn, *, with_mount: bool = True, subject: st.SearchStrategy[Subject] | None = None,
           max_entries: int = 8) -> State:
    subj = draw(subject if subject is not None else subjects())
    mount = draw(mounts()) if with_mount else draw(st.one_of(st.none(), mounts()))
    return State(
        subject=subj,
        mount=mount,
        resource=draw(resources),
        entries=tuple(draw(st.lists(entries_for(subj), max_size=max_entries))),
        now=draw(times),
    )


@st.composite
def matching_entry(draw: st.DrawFn, subject: Subject, effect: Effect, cap: Op, now: int,
                   live: bool = True) -> Entry:
    """An entry that certainly matches ``subject``, live (or expired) at ``now``."""
    forms = [(AudienceKind.ANY, draw(st.text(max_size=4))), (AudienceKind.SUBJECT_KIND, subject.kind.value)]
    if subject.principal_id is not None:
        forms.append((AudienceKind.PRINCIPAL, subject.principal_id))
    kind, audience = draw(st.sampled_from(forms))
    if live:
        expires = draw(st.one_of(st.none(), st.integers(min_value=now + 1, max_value=now + 50)))
    else:
        expires = draw(st.integers(min_value=now - 50, max_value=now))
    return Entry(effect, cap, kind, audience, expires)


def allow_everything(subject: Subject) -> tuple[Entry, ...]:
    """Permanent allows of every capability in every audience form that matches."""
    out = [Entry(Effect.ALLOW, op, AudienceKind.ANY) for op in OPS]
    out += [Entry(Effect.ALLOW, op, AudienceKind.SUBJECT_KIND, subject.kind.value) for op in OPS]
    if subject.principal_id is not None:
        out += [Entry(Effect.ALLOW, op, AudienceKind.PRINCIPAL, subject.principal_id) for op in OPS]
    return tuple(out)


LIVE_ACTIVE = ResourceState(live=True, revision_state="active")
ALICE = Subject(SubjectKind.USER, "prn_alice")


# ---------------------------------------------------------------------------
# 0. The whole evaluator against the hand-written oracle.
# ---------------------------------------------------------------------------


@PROPS
@given(state=states(with_mount=False))
def test_evaluate_agrees_with_the_specification(state: State) -> None:
    """Fails on any divergence in order, reason code, lattice, expiry, matching or ceiling."""
    for op in OPS:
        assert state.decide(op) == state.oracle(op), op


# ---------------------------------------------------------------------------
# 1. Implication and independence.
# ---------------------------------------------------------------------------


def test_required_is_exactly_the_lattice_closure() -> None:
    """Fails if any op gains or loses an implied capability (e.g. delete -> replace, read without retrieve)."""
    assert set(Op) == set(SPEC_REQUIRED), "a new Op needs a row in the specification's table"
    for op in Op:
        assert required(op) == SPEC_REQUIRED[op], op
        assert op in required(op)
        for q in required(op):  # a closure is transitive
            assert required(q) <= required(op), (op, q)


def test_independent_capabilities_imply_nothing_and_are_implied_by_nothing() -> None:
    """Fails if project, deposit, sync, delete, publish, policy-admin, import or export join the lattice."""
    for x in INDEPENDENT:
        assert required(x) == {x}
        for other in Op:
            if other is not x:
                assert x not in required(other), (other, x)


@PROPS
@given(state=states())
def test_allowing_an_op_allows_everything_it_requires(state: State) -> None:
    """Fails if a deny or a missing grant is checked on the op alone (read allowed while retrieve is denied),
    or if the evaluator's lattice drops an implication (the specification's table is used here)."""
    for op in OPS:
        if state.decide(op):
            for q in SPEC_REQUIRED[op]:
                assert state.decide(q), (op, q, state.decide(q))


@PROPS
@given(state=states())
def test_an_op_is_allowed_exactly_when_each_required_capability_is(state: State) -> None:
    """Fails if the lattice is applied in the wrong direction (retrieve demanding read) or too widely."""
    for op in OPS:
        assert bool(state.decide(op)) == all(state.decide(q) for q in SPEC_REQUIRED[op]), op


def test_granting_all_but_one_capability_denies_exactly_the_ops_that_require_it() -> None:
    """Fails if any capability is derived from another one, by placement or by allow entry.

    For every capability ``b``: with everything but ``b`` granted, an op is
    allowed iff it does not require ``b``. This covers every ordered pair,
    e.g. delete allowed while project is denied, and publish while
    policy-admin is denied.
    """
    for b in Op:
        rest = ALL_OPS - {b}
        by_placement = Mount("private", "user", "prn_alice", rest, rest)
        by_allow = Mount("private", "user", "prn_alice", frozenset(), ALL_OPS)
        allows = tuple(Entry(Effect.ALLOW, cap, AudienceKind.PRINCIPAL, "prn_alice") for cap in rest)
        for mount, entries in ((by_placement, ()), (by_allow, allows)):
            for a in Op:
                decision = evaluate(a, ALICE, mount, LIVE_ACTIVE, entries, 10)
                if b in SPEC_REQUIRED[a]:
                    assert decision == Decision(False, Reason.DEFAULT_DENY), (a, b)
                else:
                    assert decision.allowed, (a, b, decision)


@PROPS
@given(state=states())
def test_an_independent_capability_needs_its_own_grant(state: State) -> None:
    """Fails if allowing any other capability (placement or allow) lets an independent one through."""
    assert state.mount is not None
    for x in INDEPENDENT:
        own_grant = x in state.mount.placement or (
            x in state.mount.ceiling and any(e.effect is Effect.ALLOW and e.capability is x
                                             and spec_live(e, state.now) and spec_matches(e, state.subject)
                                             for e in state.entries))
        if not own_grant:
            assert not state.decide(x), x


# ---------------------------------------------------------------------------
# 2. Deny precedence.
# ---------------------------------------------------------------------------


@PROPS
@given(state=states(with_mount=False), op=st.sampled_from(OPS), data=st.data())
def test_a_live_matching_deny_on_any_required_capability_wins(state: State, op: Op, data: st.DataObject) -> None:
    """Fails if a deny is checked only on the op itself, after placement, or loses to an allow."""
    cap = data.draw(st.sampled_from(sorted(SPEC_REQUIRED[op])), label="denied capability")
    deny = data.draw(matching_entry(state.subject, Effect.DENY, cap, state.now), label="deny")
    entries = data.draw(st.permutations(state.entries + allow_everything(state.subject) + (deny,)))
    decision = state.decide(op, entries=tuple(entries))
    pre = spec_precheck(op, state.mount, state.resource)
    assert decision == Decision(False, pre if pre is not None else Reason.EXPLICIT_DENY)


@PROPS
@given(state=states(), op=st.sampled_from(OPS), data=st.data())
def test_a_deny_outside_the_required_set_or_audience_changes_nothing(state: State, op: Op,
                                                                     data: st.DataObject) -> None:
    """Fails if a deny on an unrelated capability, or for someone else, blocks the op."""
    others = sorted(ALL_OPS - SPEC_REQUIRED[op])
    unrelated = Entry(Effect.DENY, data.draw(st.sampled_from(others)), AudienceKind.ANY) if others else None
    stranger = data.draw(st.sampled_from([p for p in PRINCIPALS if p != state.subject.principal_id]))
    other_kind = data.draw(st.sampled_from([k.value for k in SubjectKind if k is not state.subject.kind]))
    noise = [Entry(Effect.DENY, cap, AudienceKind.PRINCIPAL, stranger) for cap in SPEC_REQUIRED[op]]
    noise += [Entry(Effect.DENY, cap, AudienceKind.SUBJECT_KIND, other_kind) for cap in SPEC_REQUIRED[op]]
    if unrelated is not None:
        noise.append(unrelated)
    assert state.decide(op, entries=state.entries + tuple(noise)) == state.decide(op)


# ---------------------------------------------------------------------------
# 3. Expiry.
# ---------------------------------------------------------------------------


@PROPS
@given(state=states(), data=st.data())
def test_an_expired_entry_is_the_same_as_no_entry(state: State, data: st.DataObject) -> None:
    """Fails if expiry is ignored or compared with the wrong side (``now <= expires_at``)."""
    cap = data.draw(st.sampled_from(OPS))
    effect = data.draw(st.sampled_from(Effect))
    expired = data.draw(matching_entry(state.subject, effect, cap, state.now, live=False))
    at = data.draw(st.integers(min_value=0, max_value=len(state.entries)))
    with_it = state.entries[:at] + (expired,) + state.entries[at:]
    for op in OPS:
        assert state.decide(op, entries=with_it) == state.decide(op), op


@PROPS
@given(state=states(), data=st.data())
def test_an_entry_takes_effect_until_and_not_at_its_expiry(state: State, data: st.DataObject) -> None:
    """Fails on an off-by-one at the expiry instant, for allows and denies alike.

    Each entry of a generated state is compared at every instant around its
    expiry: before it, the entry acts as a permanent one; at and after it,
    as if it were absent.
    """
    if not state.entries:
        return
    i = data.draw(st.integers(min_value=0, max_value=len(state.entries) - 1))
    target = state.entries[i]
    expires = data.draw(st.integers(min_value=1, max_value=45)) if target.expires_at is None else target.expires_at
    entry = dataclasses.replace(target, expires_at=expires)
    entries = state.entries[:i] + (entry,) + state.entries[i + 1:]
    permanent = state.entries[:i] + (dataclasses.replace(target, expires_at=None),) + state.entries[i + 1:]
    absent = state.entries[:i] + state.entries[i + 1:]
    for now in (expires - 2, expires - 1, expires, expires + 1):
        expected = permanent if now < expires else absent
        for op in OPS:
            assert state.decide(op, entries=entries, now=now) == state.decide(op, entries=expected, now=now), \
                (op, now)


def test_a_deny_and_an_allow_switch_exactly_at_expires_at() -> None:
    """Fails if ``live`` uses ``<=``: the instant ``expires_at`` is already expired."""
    private = Mount("private", "user", "prn_alice", frozenset(), frozenset({Op.RETRIEVE, Op.READ}))
    placed = Mount("private", "user", "prn_alice", frozenset({Op.RETRIEVE, Op.READ}),
                   frozenset({Op.RETRIEVE, Op.READ}))
    allows = (Entry(Effect.ALLOW, Op.RETRIEVE, AudienceKind.PRINCIPAL, "prn_alice", 100),
              Entry(Effect.ALLOW, Op.READ, AudienceKind.PRINCIPAL, "prn_alice", 100))
    assert evaluate(Op.READ, ALICE, private, LIVE_ACTIVE, allows, 99).allowed
    assert evaluate(Op.READ, ALICE, private, LIVE_ACTIVE, allows, 100) == Decision(False, Reason.DEFAULT_DENY)
    deny = (Entry(Effect.DENY, Op.RETRIEVE, AudienceKind.PRINCIPAL, "prn_alice", 100),)
    assert evaluate(Op.READ, ALICE, placed, LIVE_ACTIVE, deny, 99) == Decision(False, Reason.EXPLICIT_DENY)
    assert evaluate(Op.READ, ALICE, placed, LIVE_ACTIVE, deny, 100).allowed


# ---------------------------------------------------------------------------
# 4. Ceiling and the ambiguous subject.
# ---------------------------------------------------------------------------


@PROPS
@given(state=states())
def test_an_allow_never_grants_beyond_the_ceiling(state: State) -> None:
    """Fails if allowed entries are not intersected with the mount's ceiling."""
    assert state.mount is not None
    inside = tuple(e for e in state.entries if e.effect is Effect.DENY or e.capability in state.mount.ceiling)
    broad = state.entries + allow_everything(state.subject)
    for op in OPS:
        decision = state.decide(op)
        if decision or state.decide(op, entries=broad):
            assert SPEC_REQUIRED[op] <= state.mount.ceiling, op
        assert state.decide(op, entries=inside) == decision, op


@PROPS
@given(state=states(subject=subjects(st.just(SubjectKind.AMBIGUOUS))), op=st.sampled_from(sorted(SPEC_WRITE_OPS)))
def test_the_ambiguous_subject_never_writes_whatever_entries_exist(state: State, op: Op) -> None:
    """Fails if the anonymous ceiling admits a write, or placement grants one."""
    entries = state.entries + allow_everything(state.subject)
    for mount in memory_view(state.subject, (), state.now).mounts:
        assert not evaluate(op, state.subject, mount, state.resource, entries, state.now), (mount.root, op)


def test_write_ops_are_the_specified_writes() -> None:
    """Fails if a write op is missing from WRITE_OPS (callers use it to refuse writes)."""
    assert WRITE_OPS == SPEC_WRITE_OPS


# ---------------------------------------------------------------------------
# 6. Audience matching.
# ---------------------------------------------------------------------------


@PROPS
@given(data=st.data(), subject=subjects(), op=st.sampled_from(sorted(INDEPENDENT)))
def test_an_entry_matches_by_principal_id_subject_kind_or_anyone(data: st.DataObject, subject: Subject,
                                                                  op: Op) -> None:
    """Fails if matching confuses a principal id with a kind name, or lets ANY/kind entries miss."""
    entry = data.draw(entries_for(subject, st.just(op)))
    assert entry.matches(subject) == spec_matches(entry, subject)
    allow = dataclasses.replace(entry, effect=Effect.ALLOW, expires_at=None)
    mount = Mount("x", "user", "", frozenset(), ALL_OPS)
    assert evaluate(op, subject, mount, LIVE_ACTIVE, (allow,), 0).allowed == spec_matches(entry, subject)


def test_principals_sharing_a_label_are_different_audiences() -> None:
    """Fails if an entry is ever matched by display name rather than principal id."""
    labels = {"prn_mike_1": "Mike", "prn_mike_2": "Mike"}  # two principals, one label
    mike1, mike2 = (Subject(SubjectKind.USER, pid) for pid in labels)
    mount = Mount("private", "user", "", frozenset(), ALL_OPS)
    allow = (Entry(Effect.ALLOW, Op.RETRIEVE, AudienceKind.PRINCIPAL, "prn_mike_1"),)
    assert evaluate(Op.RETRIEVE, mike1, mount, LIVE_ACTIVE, allow, 0).allowed
    assert evaluate(Op.RETRIEVE, mike2, mount, LIVE_ACTIVE, allow, 0) == Decision(False, Reason.DEFAULT_DENY)
    by_label = (Entry(Effect.ALLOW, Op.RETRIEVE, AudienceKind.PRINCIPAL, "Mike"),)
    for who in (mike1, mike2):
        assert not evaluate(Op.RETRIEVE, who, mount, LIVE_ACTIVE, by_label, 0)
    deny = (Entry(Effect.DENY, Op.RETRIEVE, AudienceKind.PRINCIPAL, "prn_mike_2"),)
    placed = Mount("private", "user", "", frozenset({Op.RETRIEVE}), frozenset({Op.RETRIEVE}))
    assert evaluate(Op.RETRIEVE, mike1, placed, LIVE_ACTIVE, deny, 0).allowed
    assert evaluate(Op.RETRIEVE, mike2, placed, LIVE_ACTIVE, deny, 0) == Decision(False, Reason.EXPLICIT_DENY)
    # No input of the evaluator can carry a label.
    for cls in (Subject, Entry, Mount, ResourceState):
        assert not any("label" in f.name or "name" in f.name for f in dataclasses.fields(cls)), cls


def test_a_principal_entry_never_matches_the_ambiguous_subject() -> None:
    """Fails if a principal entry with an empty or kind-like id matches a subject without a principal."""
    anon = Subject(SubjectKind.AMBIGUOUS, None, AmbiguousReason.UNBOUND)
    for audience in ("", "ambiguous", "None"):
        assert not Entry(Effect.ALLOW, Op.READ, AudienceKind.PRINCIPAL, audience).matches(anon)
    assert Entry(Effect.ALLOW, Op.READ, AudienceKind.SUBJECT_KIND, "ambiguous").matches(anon)
    assert Entry(Effect.ALLOW, Op.READ, AudienceKind.ANY, "prn_alice").matches(anon)


# ---------------------------------------------------------------------------
# Reason codes.
# ---------------------------------------------------------------------------


@FEW
@given(state=states())
def test_no_mount_is_outside_view_whatever_else_holds(state: State) -> None:
    """Fails if anything (an ANY allow, a dead resource) is considered before the view boundary."""
    entries = state.entries + allow_everything(state.subject)
    for op in OPS:
        decision = evaluate(op, state.subject, None, state.resource, entries, state.now)
        assert decision == Decision(False, Reason.OUTSIDE_VIEW), op


@PROPS
@given(state=states(), data=st.data())
def test_a_dead_resource_or_inactive_revision_is_revision_stale(state: State, data: st.DataObject) -> None:
    """Fails if a tombstoned resource is writable, or a pending/superseded revision readable, or
    if the check runs after the deny/allow steps (it precedes them in the evaluation order)."""
    live = data.draw(st.booleans())
    revision = data.draw(st.sampled_from(["active", "pending", "superseded", "tombstoned", None]))
    resource = ResourceState(live, revision)
    for op in OPS:
        entries = state.entries + allow_everything(state.subject) + (Entry(Effect.DENY, op, AudienceKind.ANY),)
        decision = evaluate(op, state.subject, state.mount, resource, entries, state.now)
        if not live or (op in NEEDS_ACTIVE and revision != "active"):
            assert decision == Decision(False, Reason.REVISION_STALE), op
        else:
            assert decision == Decision(False, Reason.EXPLICIT_DENY), op


@PROPS
@given(state=states())
def test_a_required_capability_without_placement_or_allow_is_default_deny(state: State) -> None:
    """Fails if a missing grant is allowed, or reported under another reason."""
    assert state.mount is not None
    applicable = [e for e in state.entries if spec_live(e, state.now) and spec_matches(e, state.subject)]
    granted = state.mount.placement | (state.mount.ceiling & {e.capability for e in applicable
                                                              if e.effect is Effect.ALLOW})
    for op in OPS:
        if spec_precheck(op, state.mount, state.resource) is not None:
            continue
        if any(e.effect is Effect.DENY and e.capability in SPEC_REQUIRED[op] for e in applicable):
            continue
        expected = Decision(True, Reason.ALLOWED) if SPEC_REQUIRED[op] <= granted else \
            Decision(False, Reason.DEFAULT_DENY)
        assert state.decide(op) == expected, op


def test_a_new_resource_skips_the_revision_check_for_creation() -> None:
    """Fails if creating a note (append, resource None) is refused as revision-stale."""
    private = memory_view(ALICE, (), 0).mount_for(("private", "n.md"))
    assert private is not None
    assert evaluate(Op.APPEND, ALICE, private[0], None, (), 0).allowed
    assert evaluate(Op.APPEND, ALICE, private[0], ResourceState(True, None), (), 0).allowed
    assert evaluate(Op.REPLACE, ALICE, private[0], ResourceState(True, None), (), 0) == \
        Decision(False, Reason.REVISION_STALE)


# ---------------------------------------------------------------------------
# 5. Memory views.
# ---------------------------------------------------------------------------

ROLE_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")  # catalog.groups accepts exactly these role names
role_names = st.one_of(st.sampled_from(["ops", "finance", "hr", "on-call", "x"]), st.from_regex(ROLE_NAME,
                                                                                                  fullmatch=True))
view_times = st.integers(min_value=0, max_value=10**6)


@st.composite
def role_evidence(draw: st.DrawFn, now: int) -> tuple[RoleEvidence, ...]:
    """Live role memberships; role names are unique labels in the catalog."""
    names = draw(st.lists(role_names, max_size=6, unique=True))
    out = []
    for name in names:
        expires = draw(st.one_of(st.none(), st.integers(min_value=max(0, now - 5), max_value=now + 5),
                                 view_times))
        out.append(RoleEvidence(draw(st.text(min_size=1, max_size=12)), name, expires))
    return tuple(draw(st.permutations(out)))


@st.composite
def view_inputs(draw: st.DrawFn) -> tuple[Subject, tuple[RoleEvidence, ...], int, View]:
    subject = draw(subjects())
    now = draw(view_times)
    roles = draw(role_evidence(now))
    return subject, roles, now, memory_view(subject, roles, now)


def _parts(root: str) -> tuple[str, ...]:
    return tuple(root.split("/"))


@PROPS
@given(inputs=view_inputs())
def test_a_view_only_names_stores_its_subject_owns_or_shares(
        inputs: tuple[Subject, tuple[RoleEvidence, ...], int, View]) -> None:
    """Fails if a view mounts another principal's user store or any audience not justified by evidence."""
    subject, roles, now, view = inputs
    fresh_roles = {r.role_id for r in roles if r.expires_at is None or now < r.expires_at}
    for mount in view.mounts:
        if mount.scope_kind == "user":
            assert subject.kind is SubjectKind.USER and mount.audience_id == subject.principal_id
        if mount.scope_kind == "role" or mount.root.startswith("projections/roles/"):
            assert subject.kind is SubjectKind.USER and mount.audience_id in fresh_roles
        elif mount.audience_id != "":
            assert mount.audience_id == subject.principal_id, mount


@PROPS
@given(inputs=view_inputs())
def test_a_conversation_view_never_mounts_user_role_or_quarantine_stores(
        inputs: tuple[Subject, tuple[RoleEvidence, ...], int, View]) -> None:
    """Fails if a group view picks up a member's private, role or quarantine store (whoever is speaking)."""
    subject, _roles, _now, view = inputs
    if subject.kind is SubjectKind.CONVERSATION:
        assert not {m.scope_kind for m in view.mounts} & {"user", "role", "quarantine"}
        assert not any(root == "private" or root.startswith("roles/") for root in view.roots())
    if subject.kind is not SubjectKind.USER:
        assert not any(m.scope_kind == "role" for m in view.mounts)


@PROPS
@given(inputs=view_inputs())
def test_a_user_view_has_a_role_mount_exactly_for_fresh_evidence(
        inputs: tuple[Subject, tuple[RoleEvidence, ...], int, View]) -> None:
    """Fails on an off-by-one at the evidence expiry, or if stale evidence still mounts (or isn't audited)."""
    subject, roles, now, view = inputs
    if subject.kind is not SubjectKind.USER:
        return
    fresh = {(f"roles/{r.role_name}", r.role_id) for r in roles if r.expires_at is None or now < r.expires_at}
    stale = {f"roles/{r.role_name}" for r in roles if r.expires_at is not None and now >= r.expires_at}
    assert {(m.root, m.audience_id) for m in view.mounts if m.scope_kind == "role"} == fresh
    # Projections to a role show exactly while its store does: same evidence, same instant.
    assert {(m.root, m.audience_id) for m in view.mounts if m.root.startswith("projections/roles/")} == \
        {(f"projections/{root}", role_id) for root, role_id in fresh}
    stale |= {f"projections/{root}" for root in stale}
    assert all(m.placement == m.ceiling == {Op.RETRIEVE, Op.READ, Op.DERIVE}
               for m in view.mounts if m.scope_kind == "role")
    assert {root for root, reason in view.excluded if reason is Reason.MEMBERSHIP_STALE} == stale
    for root in stale:
        assert view.mount_for(_parts(root) + ("n.md",)) is None
        assert view.excluded_reason(_parts(root) + ("n.md",)) is Reason.MEMBERSHIP_STALE


@PROPS
@given(inputs=view_inputs())
def test_mounts_are_well_formed_and_the_ambiguous_view_is_anonymous(
        inputs: tuple[Subject, tuple[RoleEvidence, ...], int, View]) -> None:
    """Fails if placement exceeds ceiling, a root repeats or nests, or the ambiguous view gains anything."""
    subject, _roles, _now, view = inputs
    assert view.subject == subject
    roots = view.roots()
    assert len(set(roots)) == len(roots)
    for a in roots:  # no root is a path prefix of another, so mount_for is unambiguous
        for b in roots:
            if a != b:
                assert _parts(b)[: len(_parts(a))] != _parts(a), (a, b)
    for mount in view.mounts:
        assert mount.placement <= mount.ceiling
    if subject.kind is SubjectKind.AMBIGUOUS:
        assert roots == ("agent-shared",)
        (shared,) = view.mounts
        assert shared.placement == frozenset()
        assert not shared.ceiling & SPEC_WRITE_OPS


@PROPS
@given(inputs=view_inputs(), suffix=st.lists(st.text(min_size=1, max_size=6), max_size=3),
       stray=st.lists(st.sampled_from(["private", "channel", "roles", "agent", "agent-shared", "projections",
                                       "postbox", "ops", "x", ""]), max_size=3))
def test_mount_for_returns_the_mount_whose_root_prefixes_the_path(
        inputs: tuple[Subject, tuple[RoleEvidence, ...], int, View], suffix: list[str], stray: list[str]) -> None:
    """Fails if mount_for matches by string prefix ("private2"), returns the wrong mount, or mangles the rest."""
    _subject, _roles, _now, view = inputs
    for mount in view.mounts:
        assert view.mount_for(_parts(mount.root) + tuple(suffix)) == (mount, tuple(suffix))
        lookalike = _parts(mount.root)[:-1] + (_parts(mount.root)[-1] + "2",) + tuple(suffix)
        near = view.mount_for(lookalike)
        assert near is None or near[0] is not mount
    parts = tuple(stray) + tuple(suffix)
    found = view.mount_for(parts)
    owners = [m for m in view.mounts if parts[: len(_parts(m.root))] == _parts(m.root)]
    if found is None:
        assert owners == []
    else:
        mount, rest = found
        assert owners == [mount]
        assert _parts(mount.root) + rest == parts
