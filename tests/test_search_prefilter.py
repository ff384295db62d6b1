"""Property tests: the search's SQL prefilter against the pure evaluator.

Why: a search must never show a note its session may not read, and must
never silently lose one it may read. The seed (design, "The prefilter is an
optimization with one required property") puts the two halves in different
places: ``catalog.postfilter.Postfilter`` decides every candidate with the
pure evaluator and is the security boundary; ``catalog.prefilter`` is a SQL
predicate that only narrows what the ranking SQL walks, and its one required
property is that it is a *superset* of what the evaluator allows. A false
positive there is safe (the postfilter removes it, at the cost of
over-fetch); a false negative is a correctness bug that no later stage can
repair, because a note the prefilter drops is never even looked at.

Each example builds a real agent catalog (the released schema, its
triggers, foreign keys on) from a generated world: principals; stores of
every scope kind, some retired or on a retired storage root; live and
tombstoned resources with revisions in every lifecycle state; store- and
resource-level policies (active or retired) whose entries allow or deny any
capability to any audience form, expiring before, at or after ``now``,
revoked or not; verified resource subjects; and a session subject (user
with fresh, stale or clashing role evidence, conversation, service or
ambiguous). The expected answers are computed in Python from that generated
world (``evaluate`` on ``Mount``/``Entry`` objects built from the model),
never by reading rows back through the code under test, and then compared
with what the catalog code answers over the rows:

(a) ``candidate_resources`` contains every resource ``evaluate(read)``
    allows. Catches: a deny clause that forgets expiry (a deny expired at
    ``now`` still hides), revocation or a retired policy; an allow clause
    that ignores resource-level policies or subject-kind audiences;
    requiring placement (the ambiguous session's allow-only notes vanish);
    ``>=`` where the evaluator has ``>`` on expiry.
(b) every candidate lies in one of the view's active stores and is a live
    resource with an active revision, and (the documented looseness bound)
    carries no live matching deny of read or retrieve and is either placed
    in a store that grants read by placement or has a live matching allow
    of read or retrieve. Catches a prefilter that returns everything, walks
    another user's store, a retired store, a tombstoned resource or a
    pending/superseded revision, or has lost its deny clause altogether
    (which (a) alone would never notice).
(c) ``Postfilter.allows`` equals the evaluator's decision exactly, for every
    resource and revision state, in and out of the view, with and without
    ``about``. It is the authoritative path: any drift between the rows it
    loads and the model (retired policies, revoked entries, the other
    target kind, another store's policy) is a leak or a lost note.
(d) with ``about=<principal>`` the candidates are exactly the unrestricted
    candidates that carry that verified subject, so they still contain
    every allowed resource about that principal; the postfilter refuses
    what does not carry it.

The second half of (b), the looseness bound, pins what the prefilter's
own docstring promises (it drops what a live matching deny removes and
what nothing admits where nothing is placed); relax it only together with
a deliberate loosening of the predicate.

Every generated catalog is searched by its drawn subject and by one
subject of each other kind (the rows are the expensive part), so the
ambiguous subject, which sees only what an explicit allow admits, meets
every world. Strategies weight towards what can matter (audiences that
match, read and retrieve granted together, resources in mounted stores);
400 examples run in about 15 s. Each of these mutations of the prefilter
or postfilter was checked to be found by the property on its own, in
every one of 4-8 runs: deny ignoring expiry, ``>=`` on expiry, placement
only, revocation or policy state ignored, no deny clause, tombstoned
resources or inactive revisions admitted, everything returned, store-level
policies only, subject-kind audiences ignored, every store treated as
placed, a deny of retrieve only, ``about`` ignored (prefilter or
postfilter), the postfilter loading revoked or only store-level entries.

Deterministic regression examples below pin the interesting edges one by
one (a deny expiring exactly at ``now``, an allow-only ambiguous session, a
retired policy, a revoked entry, structure outside the view).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import apsw
from hypothesis import event, given, settings
from hypothesis import strategies as st

from scopefs.catalog import ids
from scopefs.catalog.policy import AudienceKind, Effect, Entry, Mount, Op, ResourceState, evaluate
from scopefs.catalog.postfilter import Postfilter
from scopefs.catalog.prefilter import candidate_resources, scope_for
from scopefs.catalog.schema import ensure_schema
from scopefs.catalog.schema.agent import AGENT_SCHEMA
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind
from scopefs.catalog.view import AGENT_SHARED_AUDIENCE, RoleEvidence, memory_view

PROPS = settings(max_examples=400, deadline=None)

READ_NEEDS = frozenset({Op.READ, Op.RETRIEVE})  # written out by hand: read implies retrieve


def fixed_id(kind: str, label: str) -> str:
    """An id shaped exactly like ``ids.new_id(kind)`` but stable, so failures replay and shrink."""
    body = base64.b32encode(hashlib.sha256(f"{kind}:{label}".encode()).digest()[:16]).decode().rstrip("=").lower()
    out = f"{ids.PREFIXES[kind]}_{body}"
    assert ids.looks_like(kind, out)
    return out


AGENT = "agent-main"
NOW = 1_700_000_000_000_000  # microseconds, like catalog.clock.now_us

USERS = tuple(fixed_id("principal", f"user{i}") for i in range(3))
CONVERSATIONS = tuple(fixed_id("principal", f"conversation{i}") for i in range(2))
SERVICES = tuple(fixed_id("principal", f"service{i}") for i in range(2))
ROLES = tuple(fixed_id("principal", f"role{i}") for i in range(2))
PRINCIPALS = USERS + CONVERSATIONS + SERVICES + ROLES
ROLE_NAMES = ("ops", "eng")

# Every store a world may hold, named as memory_view names them: (scope kind, audience id).
STORE_KEYS: tuple[tuple[str, str], ...] = (
    *(("user", u) for u in USERS[:2]),
    *(("channel", c) for c in CONVERSATIONS),
    *(("agent", s) for s in SERVICES[:1]),
    ("agent-shared", AGENT_SHARED_AUDIENCE),
    *(("role", r) for r in ROLES),
    ("projection", CONVERSATIONS[0]),
    ("quarantine", USERS[0]),
)

REVISION_STATES = ("active", "active", "superseded", "tombstoned", "pending", "rolled-back", "corrupt")
# How each final revision state is reached from 'pending' (the triggers only let a state move forward).
TRANSITIONS = {
    "pending": (),
    "active": ("active",),
    "rolled-back": ("rolled-back",),
    "superseded": ("active", "superseded"),
    "tombstoned": ("active", "tombstoned"),
    "corrupt": ("active", "superseded", "corrupt"),
}


# ---------------------------------------------------------------------------
# The generated world (the model) and its expected answers.
# ---------------------------------------------------------------------------


def _name(value: str) -> str:
    """A principal id as the constant that holds it, for readable counterexamples."""
    for name, pool in (("USERS", USERS), ("CONVERSATIONS", CONVERSATIONS), ("SERVICES", SERVICES),
                       ("ROLES", ROLES)):
        if value in pool:
            return f"{name}[{pool.index(value)}]"
    return repr(value)


@dataclass(frozen=True)
class EntrySpec:
    effect: Effect
    capability: Op
    audience_kind: AudienceKind
    audience_id: str
    expires_at: int | None
    revoked: bool = False

    def __repr__(self) -> str:
        """As the ``allow``/``deny`` call that makes it (a shrunk counterexample reads as test code)."""
        args = [f"Op.{self.capability.name}"]
        if self.expires_at is not None:
            near = abs(self.expires_at - NOW) < 10**6
            args.append(f"NOW{self.expires_at - NOW:+d}" if near else str(self.expires_at))
        if self.revoked:
            args.append("revoked=True")
        if self.audience_kind is not AudienceKind.ANY or self.audience_id:
            args.append(f"kind=AudienceKind.{self.audience_kind.name}, audience={_name(self.audience_id)}")
        return f"{self.effect.value}({', '.join(args)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # what hypothesis prints a counterexample with
        p.text(repr(self))


@dataclass(frozen=True)
class PolicySpec:
    active: bool
    entries: tuple[EntrySpec, ...]


@dataclass(frozen=True)
class StoreSpec:
    scope_kind: str
    audience_id: str
    state: str = "active"  # stores.state
    root_state: str = "active"  # storage_roots.state
    policy: PolicySpec | None = None


@dataclass(frozen=True)
class ResourceSpec:
    store: int  # index into World.stores
    live: bool = True
    revisions: tuple[str, ...] = ("active",)  # final states, at most one 'active'
    subjects: frozenset[str] = frozenset()
    policy: PolicySpec | None = None

    @property
    def revision_state(self) -> str | None:
        """The state of the revision a read resolves: the active one, else the newest."""
        if "active" in self.revisions:
            return "active"
        return self.revisions[-1] if self.revisions else None


@dataclass(frozen=True)
class World:
    stores: tuple[StoreSpec, ...]
    resources: tuple[ResourceSpec, ...]
    subject: Subject
    roles: tuple[RoleEvidence, ...]
    now: int
    about: str


@dataclass
class Built:
    """The catalog built from a world, plus what the triggers let in."""

    conn: apsw.Connection
    store_ids: list[str]
    resource_ids: list[str]
    # Entries that were inserted (a few are refused by policy_entries_never_hide_from_writer).
    store_entries: list[tuple[EntrySpec, ...]] = field(default_factory=list)
    resource_entries: list[tuple[EntrySpec, ...]] = field(default_factory=list)
    refused: int = 0


def spec_live(e: EntrySpec, now: int) -> bool:
    return e.expires_at is None or now < e.expires_at


def spec_matches(e: EntrySpec, subject: Subject) -> bool:
    if e.audience_kind is AudienceKind.ANY:
        return True
    if e.audience_kind is AudienceKind.PRINCIPAL:
        return subject.principal_id is not None and e.audience_id == subject.principal_id
    return e.audience_id == subject.kind.value


class Expected:
    """Everything the test expects, from the world model and the inserted entries only."""

    def __init__(self, world: World, built: Built) -> None:
        self.world = world
        self.built = built
        self.mounts = memory_view(world.subject, world.roles, world.now).mounts

    def mount(self, store: int) -> Mount | None:
        """The view's mount that resolves to this store (only active stores on active roots resolve)."""
        spec = self.world.stores[store]
        if spec.state != "active" or spec.root_state != "active":
            return None
        return next((m for m in self.mounts if (m.scope_kind, m.audience_id) == (spec.scope_kind, spec.audience_id)),
                    None)

    def entries(self, i: int) -> list[EntrySpec]:
        """Entries that count for resource ``i``: unrevoked, on an active policy of its store or itself."""
        res = self.world.resources[i]
        out: list[EntrySpec] = []
        for policy, inserted in ((self.world.stores[res.store].policy, self.built.store_entries[res.store]),
                                 (res.policy, self.built.resource_entries[i])):
            if policy is not None and policy.active:
                out += [e for e in inserted if not e.revoked]
        return out

    def decide(self, i: int, revision_state: str | None = None, *, about: str | None = None) -> bool:
        res = self.world.resources[i]
        if about is not None and about not in res.subjects:
            return False
        state = res.revision_state if revision_state is None else revision_state
        entries = [Entry(e.effect, e.capability, e.audience_kind, e.audience_id, e.expires_at) for e in self.entries(i)]
        return evaluate(Op.READ, self.world.subject, self.mount(res.store), ResourceState(res.live, state),
                        entries, self.world.now).allowed

    def structural(self, i: int) -> bool:
        res = self.world.resources[i]
        return self.mount(res.store) is not None and res.live and "active" in res.revisions

    def loose(self, i: int) -> bool:
        """The prefilter's documented bound: structural, no live matching read deny, placed or allowed."""
        if not self.structural(i):
            return False
        mount = self.mount(self.world.resources[i].store)
        assert mount is not None
        applicable = [e for e in self.entries(i)
                      if spec_live(e, self.world.now) and spec_matches(e, self.world.subject)]
        if any(e.effect is Effect.DENY and e.capability in READ_NEEDS for e in applicable):
            return False
        return READ_NEEDS <= mount.placement or any(
            e.effect is Effect.ALLOW and e.capability in READ_NEEDS for e in applicable)

    def ids_where(self, pred: Callable[[int], bool]) -> set[str]:
        return {rid for i, rid in enumerate(self.built.resource_ids) if pred(i)}


# ---------------------------------------------------------------------------
# Building the catalog: plain INSERTs and lifecycle UPDATEs, as the writer would leave them.
# ---------------------------------------------------------------------------


def _policy(conn: apsw.Connection, target_kind: str, target_id: str, spec: PolicySpec | None, now: int,
            built: Built) -> tuple[EntrySpec, ...]:
    if spec is None:
        return ()
    policy_id = fixed_id("policy", f"{target_kind}:{target_id}")
    conn.execute("INSERT INTO policies (policy_id, agent_id, target_kind, target_id, state, created_by, created_at)"
                 " VALUES (?, ?, ?, ?, ?, 'operator', ?)",
                 (policy_id, AGENT, target_kind, target_id, "active" if spec.active else "retired", now - 100))
    inserted = []
    for n, e in enumerate(spec.entries):
        entry_id = fixed_id("entry", f"{policy_id}:{n}")
        try:
            conn.execute(
                "INSERT INTO policy_entries (entry_id, agent_id, policy_id, policy_revision, effect, capability,"
                " audience_kind, audience_id, grantor, created_at, expires_at, revoked_at)"
                " VALUES (?, ?, ?, 1, ?, ?, ?, ?, 'operator', ?, ?, ?)",
                (entry_id, AGENT, policy_id, e.effect.value, e.capability.value, e.audience_kind.value, e.audience_id,
                 now - 50, e.expires_at, now - 10 if e.revoked else None))
        except apsw.ConstraintError as exc:
            # Only the never-hide-from-writer trigger may refuse an entry here.
            assert "cannot hide notes from the subject that writes their store" in str(exc)
            built.refused += 1
            continue
        inserted.append(e)
    return tuple(inserted)


def build(world: World) -> Built:
    conn = apsw.Connection(":memory:")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA recursive_triggers=ON")
    ensure_schema(conn, AGENT_SCHEMA)
    now = world.now
    conn.execute("INSERT INTO agent_cell (agent_id, created_at) VALUES (?, ?)", (AGENT, now - 1000))
    built = Built(conn, [], [])
    for n, s in enumerate(world.stores):
        root_id, store_id = fixed_id("storage_root", str(n)), fixed_id("store", str(n))
        conn.execute("INSERT INTO storage_roots (storage_root_id, agent_id, backend_kind, path_key, authority_kind,"
                     " state, created_at) VALUES (?, ?, 'fs', ?, 'agent', ?, ?)",
                     (root_id, AGENT, f"k{n}", s.root_state, now - 900))
        conn.execute("INSERT INTO stores (store_id, agent_id, storage_root_id, scope_kind, audience_id, state,"
                     " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (store_id, AGENT, root_id, s.scope_kind, s.audience_id, s.state, now - 900))
        built.store_ids.append(store_id)
    for n, r in enumerate(world.resources):
        resource_id = fixed_id("resource", str(n))
        conn.execute("INSERT INTO resources (resource_id, agent_id, store_id, path, state, created_at)"
                     " VALUES (?, ?, ?, ?, ?, ?)",
                     (resource_id, AGENT, built.store_ids[r.store], f"notes/{n}.md",
                      "live" if r.live else "tombstoned", now - 800))
        built.resource_ids.append(resource_id)
        # The one that stays active goes last: two active revisions can never coexist.
        order = sorted(range(len(r.revisions)), key=lambda k: r.revisions[k] == "active")
        for no in order:
            revision_id = fixed_id("revision", f"{n}:{no}")
            conn.execute(
                "INSERT INTO revisions (revision_id, agent_id, resource_id, revision_no, content_sha256, size, locator,"
                " state, trust_origin, created_at) VALUES (?, ?, ?, ?, ?, 0, ?, 'pending', 'user', ?)",
                (revision_id, AGENT, resource_id, no + 1, "0" * 64, f"{revision_id}.blob", now - 700))
            for state in TRANSITIONS[r.revisions[no]]:
                conn.execute("UPDATE revisions SET state = ? WHERE revision_id = ?", (state, revision_id))
        for principal in sorted(r.subjects):
            conn.execute("INSERT INTO resource_subjects (resource_id, principal_id, agent_id, session_id, created_at)"
                         " VALUES (?, ?, ?, 'session-x', ?)", (resource_id, principal, AGENT, now - 600))
    for n, s in enumerate(world.stores):
        built.store_entries.append(_policy(conn, "store", built.store_ids[n], s.policy, now, built))
    for n, r in enumerate(world.resources):
        built.resource_entries.append(_policy(conn, "resource", built.resource_ids[n], r.policy, now, built))
    return built


# ---------------------------------------------------------------------------
# Strategies.
# ---------------------------------------------------------------------------


def expiries(now: int) -> st.SearchStrategy[int | None]:
    # Before, exactly at, just after and well after now; None never expires.
    return st.sampled_from([None, None, None, now - 1, now, now, now + 1, now + 10_000, 0])


# What one grant names: both halves of read (what a read needs), one half only, read with
# derive, or capabilities a read never needs (which must neither admit nor hide it).
GRANT_CAPS: tuple[tuple[Op, ...], ...] = (
    (Op.READ, Op.RETRIEVE), (Op.READ, Op.RETRIEVE), (Op.RETRIEVE, Op.READ), (Op.RETRIEVE, Op.READ),
    (Op.READ,), (Op.READ,), (Op.RETRIEVE,),
    (Op.DERIVE, Op.READ, Op.RETRIEVE), (Op.DERIVE,), (Op.APPEND,), (Op.REPLACE, Op.APPEND), (Op.DELETE,),
    (Op.EXPORT,),
)


def audiences(subject: Subject) -> st.SearchStrategy[tuple[AudienceKind, str]]:
    """An audience that matches the subject or the ambiguous one (two times in three), or a near miss."""
    own = [(AudienceKind.ANY, ""), (AudienceKind.ANY, "any"), (AudienceKind.SUBJECT_KIND, subject.kind.value),
           (AudienceKind.SUBJECT_KIND, SubjectKind.AMBIGUOUS.value)]
    if subject.principal_id is not None:
        own.append((AudienceKind.PRINCIPAL, subject.principal_id))
    other = [(AudienceKind.PRINCIPAL, p) for p in PRINCIPALS if p != subject.principal_id]
    other += [(AudienceKind.SUBJECT_KIND, k.value) for k in SubjectKind if k is not subject.kind]
    # A kind name as a principal id, a principal id as a kind, a capitalised kind, the empty id.
    other += [(AudienceKind.PRINCIPAL, subject.kind.value), (AudienceKind.PRINCIPAL, ""),
              (AudienceKind.SUBJECT_KIND, subject.principal_id or USERS[0]),
              (AudienceKind.SUBJECT_KIND, subject.kind.value.capitalize()), (AudienceKind.SUBJECT_KIND, "")]
    return st.one_of(st.sampled_from(own), st.sampled_from(own), st.sampled_from(other))


@st.composite
def grants(draw: st.DrawFn, subject: Subject, now: int) -> tuple[EntrySpec, ...]:
    """One allow or deny of a capability group for one audience: one entry per capability.

    The entries of a grant usually share expiry and revocation; sometimes the
    last one differs (read allowed for longer than retrieve, one half revoked).
    """
    effect = draw(st.sampled_from(Effect))
    kind, audience = draw(audiences(subject))
    expires, revoked = draw(expiries(now)), draw(st.sampled_from([False, False, False, True]))
    caps = draw(st.sampled_from(GRANT_CAPS))
    out = [EntrySpec(effect, cap, kind, audience, expires, revoked) for cap in caps]
    if draw(st.sampled_from([False, False, False, True])):
        out[-1] = EntrySpec(effect, caps[-1], kind, audience, draw(expiries(now)), draw(st.booleans()))
    return tuple(out)


@st.composite
def policy_specs(draw: st.DrawFn, subject: Subject, now: int) -> PolicySpec | None:
    if not draw(st.sampled_from([False, True, True])):
        return None
    entries = draw(st.lists(grants(subject, now), min_size=1, max_size=3))
    return PolicySpec(draw(st.sampled_from([True, True, True, True, False])), tuple(e for g in entries for e in g))


@st.composite
def subjects(draw: st.DrawFn) -> Subject:
    # The ambiguous subject is the only one with nothing by placement: weight it up.
    kind = draw(st.sampled_from([SubjectKind.AMBIGUOUS, *SubjectKind]))
    if kind is SubjectKind.AMBIGUOUS:
        return Subject(kind, None, draw(st.sampled_from(AmbiguousReason)))
    pool = {SubjectKind.USER: USERS, SubjectKind.CONVERSATION: CONVERSATIONS, SubjectKind.SERVICE: SERVICES}[kind]
    return Subject(kind, draw(st.sampled_from(pool)))


def view_keys(subject: Subject, roles: tuple[RoleEvidence, ...], now: int) -> set[tuple[str, str]]:
    return {(m.scope_kind, m.audience_id) for m in memory_view(subject, roles, now).mounts}


@st.composite
def worlds(draw: st.DrawFn) -> World:
    now = draw(st.sampled_from([NOW, NOW + 1]))
    subject = draw(subjects())
    # Role evidence (fresh, stale, two roles under one name); only a user subject's view uses it.
    roles = tuple(draw(st.lists(st.builds(RoleEvidence, st.sampled_from(ROLES), st.sampled_from(ROLE_NAMES),
                                           expiries(now)), max_size=3)))
    # The subject's own stores are usually there, other audiences' stores often: both sides get exercised.
    own = view_keys(subject, roles, now)
    # (Choices list the simpler one first: that is where a counterexample shrinks to.)
    keys = [key for key in STORE_KEYS if draw(st.sampled_from([False] + [True] * 4 if key in own
                                                               else [False, False, True]))]
    keys = keys or [("agent-shared", AGENT_SHARED_AUDIENCE)]
    stores: list[StoreSpec] = []
    for kind, audience in keys:
        status = draw(st.sampled_from(["active"] * 6 + ["store-retired", "root-retired", "twin"]))
        policy = draw(policy_specs(subject, now))
        if status == "twin":  # a retired predecessor next to the active store: same scope, other id
            stores.append(StoreSpec(kind, audience, "retired", "active", draw(policy_specs(subject, now))))
        stores.append(StoreSpec(kind, audience, "retired" if status == "store-retired" else "active",
                                "retired" if status == "root-retired" else "active", policy))
    # Most resources sit in a store the view mounts (or a retired twin of one), the rest anywhere.
    mine = [n for n, spec in enumerate(stores) if (spec.scope_kind, spec.audience_id) in own]
    anywhere = st.integers(min_value=0, max_value=len(stores) - 1)
    shared = [n for n, spec in enumerate(stores) if spec.scope_kind == "agent-shared"]  # every view mounts it
    placed = st.one_of(*[st.sampled_from(near) for near in (mine, mine, shared) if near], anywhere)
    resources = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        revisions = draw(st.lists(st.sampled_from(REVISION_STATES), min_size=1, max_size=3))
        if draw(st.sampled_from([True, True, False])):
            revisions.append("active")
        first_active = revisions.index("active") if "active" in revisions else -1
        revisions = [s if s != "active" or k == first_active else "superseded" for k, s in enumerate(revisions)]
        resources.append(ResourceSpec(
            store=draw(placed),
            live=draw(st.sampled_from([True, True, True, True, False])),
            revisions=tuple(revisions),
            subjects=draw(st.frozensets(st.sampled_from(PRINCIPALS), max_size=2)),
            policy=draw(policy_specs(subject, now)),
        ))
    # Ask about a principal some resource carries more often than about one none does.
    carried = sorted(set().union(*(r.subjects for r in resources)))
    asked = st.one_of(st.sampled_from(carried), st.sampled_from(carried), st.sampled_from(PRINCIPALS)) if carried \
        else st.sampled_from(PRINCIPALS)
    return World(tuple(stores), tuple(resources), subject, roles, now, draw(asked))


# ---------------------------------------------------------------------------
# The checks, shared by the property and the regression examples.
# ---------------------------------------------------------------------------


def check(world: World, built: Built | None = None) -> tuple[Expected, set[str]]:
    """Run (a)-(d) on one world (built now, or already); returns the expectations and the candidates."""
    built = build(world) if built is None else built
    conn, exp = built.conn, Expected(world, built)
    n = range(len(world.resources))
    scope = scope_for(conn, AGENT, world.subject, exp.mounts, world.now)
    candidates = candidate_resources(conn, scope)
    allowed = exp.ids_where(exp.decide)
    structural = exp.ids_where(exp.structural)
    loose = exp.ids_where(exp.loose)

    def at(found: set[str]) -> list[int]:  # resource ids as indices into world.resources
        return sorted(built.resource_ids.index(rid) for rid in found)

    # (a) the one required property: nothing the evaluator allows is dropped.
    assert allowed <= candidates, f"prefilter dropped allowed resources {at(allowed - candidates)}"
    # (b) the structural part is exact and the looseness bounded.
    assert candidates <= structural, f"candidates outside the view or not readable: {at(candidates - structural)}"
    assert candidates <= loose, f"candidates a live matching deny removes or nothing admits: {at(candidates - loose)}"

    # (c) the authoritative decision equals the evaluator's, for every resource and revision state.
    post = Postfilter(conn, scope)
    about_scope = scope_for(conn, AGENT, world.subject, exp.mounts, world.now, world.about)
    post_about = Postfilter(conn, about_scope)
    for i in n:
        res, rid = world.resources[i], built.resource_ids[i]
        for state in sorted(set(res.revisions) | {"active"}):
            assert post.allows(rid, built.store_ids[res.store], res.live, state, "") == exp.decide(i, state), (i, state)
            assert post_about.allows(rid, built.store_ids[res.store], res.live, state, "") == \
                exp.decide(i, state, about=world.about), (i, state, "about")

    # (d) about= restricts to the resources carrying that verified subject, and nothing else.
    carrying = exp.ids_where(lambda i: world.about in world.resources[i].subjects)
    about_candidates = candidate_resources(conn, about_scope)
    assert about_candidates == candidates & carrying, \
        f"about: got {at(about_candidates)}, expected {at(candidates & carrying)}"
    assert exp.ids_where(lambda i: exp.decide(i, about=world.about)) <= about_candidates

    return exp, candidates


# Besides the drawn subject, every world is also searched by one subject of each kind: the
# catalog is the expensive part, and the ambiguous subject (nothing by placement) and the
# others see the same rows very differently.
OTHER_SUBJECTS = (Subject(SubjectKind.AMBIGUOUS, None, AmbiguousReason.UNBOUND), Subject(SubjectKind.USER, USERS[0]),
                  Subject(SubjectKind.CONVERSATION, CONVERSATIONS[0]), Subject(SubjectKind.SERVICE, SERVICES[0]))


def searched_by(world: World) -> list[World]:
    return [world] + [dataclasses.replace(world, subject=s) for s in OTHER_SUBJECTS if s != world.subject]


@PROPS
@given(world=worlds())
def test_prefilter_is_a_superset_of_the_evaluator_and_the_postfilter_equals_it(world: World) -> None:
    """(a)-(d) above on generated worlds; see the module docstring for what each catches."""
    built = build(world)
    seen: dict[str, bool] = {"allowed": False, "false positive": False, "allowed about the asked principal": False,
                             "allowed without placement": False}
    for variant in reversed(searched_by(world)):  # the same rows: only the subject differs
        exp, candidates = check(variant, built)
        allowed = exp.ids_where(exp.decide)
        seen["allowed"] |= bool(allowed)
        seen["false positive"] |= bool(candidates - allowed)
        about_asked = exp.ids_where(functools.partial(exp.decide, about=world.about))
        seen["allowed about the asked principal"] |= bool(about_asked)
        seen["allowed without placement"] |= variant.subject.kind is SubjectKind.AMBIGUOUS and bool(allowed)
    for what, happened in seen.items():
        event(f"{what}: {'some' if happened else 'none'} (any subject)")
    event(f"entries refused by the writer trigger: {'some' if exp.built.refused else 'none'}")
    event(f"subject: {world.subject.kind.value}")


# ---------------------------------------------------------------------------
# Deterministic regression examples.
# ---------------------------------------------------------------------------

USER = Subject(SubjectKind.USER, USERS[0])
AMBIGUOUS = Subject(SubjectKind.AMBIGUOUS, None, AmbiguousReason.SHARED_MAIN)
SHARED = StoreSpec("agent-shared", AGENT_SHARED_AUDIENCE)


def _world(subject: Subject, resources: Iterable[ResourceSpec], stores: tuple[StoreSpec, ...] = (SHARED,)) -> World:
    return World(stores, tuple(resources), subject, (), NOW, USERS[0])


def _verdicts(world: World) -> list[tuple[bool, bool]]:
    """(candidate, allowed) per resource, after all of (a)-(d) passed."""
    exp, candidates = check(world)
    return [(rid in candidates, exp.decide(i)) for i, rid in enumerate(exp.built.resource_ids)]


def deny(cap: Op, expires: int | None = None, *, revoked: bool = False, kind: AudienceKind = AudienceKind.ANY,
         audience: str = "") -> EntrySpec:
    return EntrySpec(Effect.DENY, cap, kind, audience, expires, revoked)


def allow(cap: Op, expires: int | None = None, *, revoked: bool = False, kind: AudienceKind = AudienceKind.ANY,
          audience: str = "") -> EntrySpec:
    return EntrySpec(Effect.ALLOW, cap, kind, audience, expires, revoked)


def test_a_deny_expiring_exactly_now_no_longer_hides() -> None:
    """Expiry is exclusive (live while now < expires_at). A prefilter using ``>=`` would drop the first note."""
    world = _world(USER, [
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.READ, NOW),))),  # expired at now: readable
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.RETRIEVE, NOW + 1),))),  # live for one more tick
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.READ, NOW - 1),))),
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.READ, NOW + 1),))),  # either half of read hides it
    ])
    assert _verdicts(world) == [(True, True), (False, False), (True, True), (False, False)]


def test_an_ambiguous_session_sees_only_what_an_allow_admits() -> None:
    """Nothing is placed for the ambiguous subject; a prefilter requiring placement would drop every note.

    An allow of read alone does not admit a read (retrieve is missing): the
    prefilter keeps it (it is loose by design) and the postfilter refuses it.
    """
    kind: dict[str, Any] = {"kind": AudienceKind.SUBJECT_KIND, "audience": "ambiguous"}
    world = _world(AMBIGUOUS, [
        ResourceSpec(0, policy=PolicySpec(True, (allow(Op.READ, **kind), allow(Op.RETRIEVE, **kind)))),
        ResourceSpec(0, policy=PolicySpec(True, (allow(Op.READ, **kind),))),
        ResourceSpec(0),  # no allow: not even a candidate
        ResourceSpec(0, policy=PolicySpec(True, (allow(Op.READ, **kind), allow(Op.RETRIEVE, NOW, **kind)))),
    ])
    assert _verdicts(world) == [(True, True), (True, False), (False, False), (True, False)]
    # The same allows on the store admit every note in it.
    store_wide = StoreSpec("agent-shared", AGENT_SHARED_AUDIENCE,
                           policy=PolicySpec(True, (allow(Op.READ), allow(Op.RETRIEVE))))
    assert _verdicts(_world(AMBIGUOUS, [ResourceSpec(0)], (store_wide,))) == [(True, True)]


def test_a_retired_policy_neither_hides_nor_admits() -> None:
    """A retired policy's entries are history: its deny must not drop a note, its allow must not add one."""
    retired_deny = PolicySpec(False, (deny(Op.READ), deny(Op.RETRIEVE)))
    retired_allow = PolicySpec(False, (allow(Op.READ), allow(Op.RETRIEVE)))
    assert _verdicts(_world(USER, [ResourceSpec(0, policy=retired_deny)])) == [(True, True)]
    assert _verdicts(_world(AMBIGUOUS, [ResourceSpec(0, policy=retired_allow)])) == [(False, False)]
    store_retired_deny = StoreSpec("agent-shared", AGENT_SHARED_AUDIENCE, policy=retired_deny)
    assert _verdicts(_world(USER, [ResourceSpec(0)], (store_retired_deny,))) == [(True, True)]


def test_a_revoked_entry_neither_hides_nor_admits() -> None:
    """Revocation ends an entry at once; a prefilter ignoring ``revoked_at`` would drop or admit by it."""
    world = _world(USER, [
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.READ, revoked=True),))),
        ResourceSpec(0, policy=PolicySpec(True, (deny(Op.READ, revoked=True), deny(Op.RETRIEVE)))),
    ])
    assert _verdicts(world) == [(True, True), (False, False)]
    revoked_allow = PolicySpec(True, (allow(Op.READ), allow(Op.RETRIEVE, revoked=True)))
    assert _verdicts(_world(AMBIGUOUS, [ResourceSpec(0, policy=revoked_allow)])) == [(True, False)]


def test_structure_outside_the_view_or_without_an_active_revision_is_never_a_candidate() -> None:
    """Allow-everything entries cannot pull in another user's note, a retired store or a dead revision."""
    everyone = PolicySpec(True, (allow(Op.READ), allow(Op.RETRIEVE)))
    stores = (StoreSpec("user", USERS[0]), StoreSpec("user", USERS[1], policy=everyone),
              StoreSpec("agent-shared", AGENT_SHARED_AUDIENCE, state="retired", policy=everyone),
              StoreSpec("role", ROLES[0], root_state="retired", policy=everyone))
    world = World(stores, (
        ResourceSpec(0),  # own private note
        ResourceSpec(1),  # another user's private note
        ResourceSpec(2),  # a retired store
        ResourceSpec(3),  # a store on a retired storage root
        ResourceSpec(0, live=False),  # tombstoned resource with an active revision
        ResourceSpec(0, revisions=("superseded", "pending")),
        ResourceSpec(0, revisions=()),
    ), USER, (RoleEvidence(ROLES[0], "ops", None),), NOW, USERS[0])
    assert _verdicts(world) == [(True, True)] + [(False, False)] * 6


def test_the_writer_deny_trigger_is_what_refuses_entries() -> None:
    """Guard on the harness: the only refusal it tolerates is the never-hide-from-writer trigger."""
    store = StoreSpec("user", USERS[0], policy=PolicySpec(True, (deny(Op.READ),
                                                                 deny(Op.READ, kind=AudienceKind.PRINCIPAL,
                                                                      audience=USERS[1]))))
    world = _world(USER, [ResourceSpec(0)], (store,))
    built = build(world)
    assert built.refused == 1 and built.store_entries[0] == (store.policy.entries[1],)  # type: ignore[union-attr]
