"""Migration import: an OpenClaw agent's legacy memory into scoped stores, reviewed first.

The seed's migration transaction ("Migration and compatibility"): scan and
classify structurally (``writer.legacy``, ``writer.classify``), show the
plan, and only then, with the digest of exactly that plan as the owner's
confirmation, back up (``writer.backup``), copy every item through the
write transaction (trust origin ``migration``, operation ``import``, an
item row naming the source by a keyed digest of its path and the SHA-256
of its bytes, written with the activation), verify every hash, rebuild
the agent's index, run the denial matrix and commit the cutover marker in
one transaction. The backup then goes: it exists to roll back or resume a
run that has not reached cutover, and a full copy of the home would keep
every note out of ``forget``'s reach.

The plan's digest covers the agent, the owner, the admin-marked paths and
every item with its class, action, destination, reason and hashes; if any
of it differs when ``--apply`` runs (a file changed, a binding was revoked,
another person's DM appeared), the digest does not match and nothing
happens. A second run of a finished plan changes nothing; a run killed at
any point resumes from its items: each is keyed by its source and its
bytes, and committed with its revision or not at all (the write
transaction's own recovery rolls back a half-written one). The legacy
files are only ever opened read-only.

The copies are written as the broker, through a session of its own opened
for the run: a shared-main (ambiguous) session, which can read nothing but
``agent-shared/`` and is closed when the run ends. The authority for a
private copy is re-decided inside both commits of every write: the owner
is still active with a live binding, and a transcript's own binding is
still live, so a revocation landing mid-run wins; and for every copy,
the destination is still vacant or holds this source's own earlier copy,
so a note the owner saves mid-run is never superseded (the item goes to
quarantine instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw

from scopefs.catalog.access import Access
from scopefs.catalog.artifacts import open_artifact, open_store_dir
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.digests import hash_fd
from scopefs.catalog.errors import BadInput, Conflict, Denied, IntegrityError, ScopefsError, storage_error
from scopefs.catalog.fsafe import fsync_dir
from scopefs.catalog.groups import role_memberships
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.identity import binding_live, get_principal, has_live_binding, lookup_key, resolve_binding
from scopefs.catalog.index import reindex
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import ALLOW, Decision, Effect, Op
from scopefs.catalog.pools import memory_for
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import active_revision, find_resource, find_store, policy_entries
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind
from scopefs.catalog.view import AGENT_SHARED_AUDIENCE, RoleEvidence, memory_view
from scopefs.writer import legacy
from scopefs.writer.backup import backup_home
from scopefs.writer.broker import broker_access
from scopefs.writer.classify import COPIED, PRIVATE, SHARED, Item, classify, transcript_derived
from scopefs.writer.derive import QUARANTINE as AGENT_QUARANTINE
from scopefs.writer.recovery import drop_migration_backup, migration_run_dir
from scopefs.writer.steps import Step, checkpoint
from scopefs.writer.transaction import Provenance, write_copy

TRUST_ORIGIN = "migration"
Progress = Callable[[int, int, Item, str], None]  # (done, total, item, status)


@dataclass(frozen=True)
class Plan:
    agent_id: str
    openclaw_agent: str
    owner: str | None
    shared: tuple[str, ...]
    workspace: str
    state_dir: str | None
    items: list[Item]
    digest: str


@dataclass
class Report:
    plan: Plan
    applied: bool
    status: dict[str, str]  # item key -> status
    backup: str | None = None  # None once the cutover is recorded: the backup is removed then
    cutover: bool = False
    reindexed: int | None = None
    denial_matrix: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    backup_removed: bool = False

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        items = [{**i.as_dict(), "status": self.status.get(i.key, "not-copied")} for i in p.items]
        by_action: dict[str, int] = {}
        for i in p.items:
            by_action[i.action] = by_action.get(i.action, 0) + 1
        return {"agent_id": p.agent_id, "openclaw_agent": p.openclaw_agent, "owner_principal_id": p.owner,
                "plan_digest": p.digest, "applied": self.applied, "backup": self.backup,
                "backup_removed": self.backup_removed, "cutover": self.cutover,
                "reindexed_revisions": self.reindexed, "denial_matrix": self.denial_matrix,
                "summary": dict(sorted(by_action.items())), "items": items}


def _check_owner(home: Home, owner: str | None) -> None:
    """The owner's confirmation is structural: an active human principal reachable through a live binding."""
    if owner is None:
        return
    principal = get_principal(home.state(), owner)  # BadInput if unknown
    if principal.kind != "human" or principal.state != "active" or not has_live_binding(home.state(), owner):
        raise BadInput("--owner must be an active human principal with a live channel binding")


def _check_shared(shared: tuple[str, ...]) -> tuple[str, ...]:
    """Clean paths, none of them transcript-derived: what the dreaming sweep wrote from transcripts is
    quarantined whatever the operator marks (the seed's rule 2 before rule 3)."""
    for rel in shared:
        try:
            split_virtual_path(rel)
        except BadInput:
            raise BadInput(f"--shared takes a clean path relative to the workspace: {rel!r}") from None
        if transcript_derived(rel):
            raise BadInput(f"--shared cannot mark {rel}: it holds what the dreaming sweep derived from transcripts,"
                           " which always goes to quarantine")
    return tuple(sorted(set(shared)))


def _resolver(home: Home) -> Callable[[str, str, str], tuple[str, str] | None]:
    def resolve(channel: str, account: str, sender: str) -> tuple[str, str] | None:
        try:
            return resolve_binding(home.state(), home.hmac_key(), channel, account, sender)
        except BadInput:  # a key part no binding could ever hold
            return None
    return resolve


def source_key(home: Home, agent_id: str, owner: str | None, item: Item) -> str:
    """The item's source and destination, keyed with the home's secret: its path never reaches the catalog.

    The destination (store and path) is part of the key: the same bytes
    from the same path are "already migrated" only where this run would
    put them, never because they sit in another person's store (another
    ``--owner``, or a second workspace with identical files).
    """
    scope_kind, audience = _destination_store(owner, item.action)
    return lookup_key(home.hmac_key(), "migration-source", agent_id, item.key, scope_kind, audience,
                      "/".join(item.inner)).hex()


def _destination_store(owner: str | None, action: str) -> tuple[str, str]:
    if action == PRIVATE:
        assert owner is not None
        return "user", owner
    if action == SHARED:
        return "agent-shared", AGENT_SHARED_AUDIENCE
    return AGENT_QUARANTINE


def _store_of(plan: Plan, action: str) -> tuple[str, str]:
    return _destination_store(plan.owner, action)


def _taken(home: Home, agent_id: str, owner: str | None, item: Item) -> bool:
    """Whether the destination holds a note this source did not put there as it is now (never overwritten).

    An item already copied (same source, same bytes) is never taken: it is
    done. A source copied before with other bytes replaces its earlier copy
    only while that copy is still the note's active revision; once anyone
    wrote the note since, the new bytes wait in quarantine.
    """
    if item.action not in (PRIVATE, SHARED):
        return False
    catalog = home.catalog(agent_id)
    key = source_key(home, agent_id, owner, item)
    if one(catalog, "SELECT 1 FROM migration_items WHERE agent_id = ? AND source_key = ? AND sha256 = ?",
           (agent_id, key, item.sha256)) is not None:
        return False
    store = find_store(catalog, agent_id, *_destination_store(owner, item.action))
    if store is None:
        return False
    resource = find_resource(catalog, agent_id, store.store_id, "/".join(item.inner))
    current = active_revision(catalog, agent_id, resource.resource_id) if resource is not None else None
    if current is None:
        return False  # nothing there, or only a write a crash left pending (recovery rolls it back)
    ours = one(catalog, "SELECT 1 FROM migration_items WHERE agent_id = ? AND source_key = ? AND revision_id = ?",
               (agent_id, key, current.revision_id))
    return ours is None


def make_plan(home: Home, agent_id: str, workspace: str, *, state_dir: str | None = None, owner: str | None = None,
              shared: tuple[str, ...] = (), openclaw_agent: str | None = None) -> Plan:
    """Scan and classify; raises BadInput before anything is read if an argument is wrong."""
    agent_id = validate_agent_name(agent_id)
    if not home.agent_exists(agent_id):
        raise BadInput("unknown agent")
    oc_agent = validate_agent_name(openclaw_agent or agent_id)
    if not os.path.isdir(workspace):
        raise BadInput(f"no workspace folder at {workspace}")
    if state_dir is not None and not os.path.isdir(state_dir):
        raise BadInput(f"no OpenClaw state folder at {state_dir}")
    _check_owner(home, owner)
    shared = _check_shared(shared)
    layout = legacy.scan(workspace, state_dir, oc_agent, shared)
    files = {f.rel for f in layout.found if f.area == "workspace" and f.kind == "file"}
    missing = [rel for rel in shared if rel not in files]
    if missing:
        raise BadInput(f"--shared names no regular file of the workspace: {missing[0]}")
    items = classify(layout, owner=owner, resolve=_resolver(home), shared=shared, openclaw_agent=oc_agent)
    items = [i.quarantined("destination-exists") if _taken(home, agent_id, owner, i) else i for i in items]
    canonical = json.dumps({"agent": agent_id, "openclaw_agent": oc_agent, "owner": owner, "shared": shared,
                            "items": [{**i.as_dict(), "source_sha256": i.source_sha256} for i in items]},
                           sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return Plan(agent_id, oc_agent, owner, shared, workspace, state_dir, items, digest)


def _migrated_to(home: Home, plan: Plan, item: Item) -> bool:
    """Whether the item's bytes already sit where it goes (the key names the destination; the join checks it)."""
    scope_kind, audience = _store_of(plan, item.action)
    return one(home.catalog(plan.agent_id),
               "SELECT 1 FROM migration_items m JOIN revisions r USING (revision_id) JOIN resources res"
               " ON res.resource_id = r.resource_id JOIN stores s ON s.store_id = res.store_id"
               " WHERE m.agent_id = ? AND m.source_key = ? AND m.sha256 = ? AND s.scope_kind = ?"
               " AND s.audience_id = ? AND res.path = ?",
               (plan.agent_id, source_key(home, plan.agent_id, plan.owner, item), item.sha256, scope_kind, audience,
                "/".join(item.inner))) is not None


def _migrated(home: Home, plan: Plan) -> dict[str, str]:
    return {i.key: "already-migrated" for i in plan.items if i.action in COPIED and _migrated_to(home, plan, i)}


def preview(home: Home, plan: Plan) -> Report:
    status = {i.key: "to-copy" for i in plan.items if i.action in COPIED}
    status.update(_migrated(home, plan))
    catalog = home.catalog(plan.agent_id)
    run = one(catalog, "SELECT cutover_at FROM migration_runs WHERE agent_id = ? AND plan_digest = ?",
              (plan.agent_id, plan.digest))
    return Report(plan, False, status, cutover=bool(run and run[0] is not None))


def _read_item(plan: Plan, item: Item) -> bytes:
    """The item's bytes, read again without following anything; they must be the ones reviewed."""
    area, _, rel = item.source.partition("/")
    root = plan.workspace if area == "workspace" else plan.state_dir
    assert root is not None
    fd = legacy.open_root(root)
    try:
        data = legacy.read_file_at(fd, tuple(rel.split("/")))
    except OSError as exc:
        raise Conflict(f"{item.source} changed or vanished after the dry run; run it again and review") from exc
    finally:
        os.close(fd)
    if hashlib.sha256(data).hexdigest() != item.source_sha256:
        raise Conflict(f"{item.source} changed after the dry run; run it again and review")
    data = dict(legacy.parts_of(area, rel, data)).get(item.part, b"")
    if hashlib.sha256(data).hexdigest() != item.sha256:
        raise Conflict(f"{item.source} changed after the dry run; run it again and review")
    return data


def _occupied(catalog: apsw.Connection, plan: Plan, item: Item, key: str) -> bool:
    """Whether the destination holds an active note this source did not put there (read inside the commit).

    The plan's ``_taken`` saw the destination when it was made; the owner
    may have saved a note there since (between the rescan of ``--apply``
    and this item's copy). Vacant, or holding this source's own earlier
    copy (a changed source, a resumed run), is the only state a copy may
    replace.
    """
    store = find_store(catalog, plan.agent_id, *_store_of(plan, item.action))
    resource = find_resource(catalog, plan.agent_id, store.store_id, "/".join(item.inner)) if store else None
    current = active_revision(catalog, plan.agent_id, resource.resource_id) if resource is not None else None
    if current is None:
        return False
    return one(catalog, "SELECT 1 FROM migration_items WHERE agent_id = ? AND source_key = ? AND revision_id = ?",
               (plan.agent_id, key, current.revision_id)) is None


def _provenance(home: Home, plan: Plan, item: Item, key: str, occupied: list[bool]) -> Provenance:
    """The copy's authority, re-made in both commits: the destination still vacant, the owner's evidence live.

    ``occupied`` is set when the destination was found written by someone
    else: the caller then sends the item to quarantine instead.
    """
    def authority(catalog: apsw.Connection, _activating: bool) -> Decision:
        if _occupied(catalog, plan, item, key):
            occupied.append(True)
            return Decision(False, Reason.REVISION_STALE)
        if item.action != PRIVATE:
            return ALLOW  # agent-shared by the operator's mark, quarantine by nobody's: no person's evidence
        assert plan.owner is not None
        state = home.state()
        if not has_live_binding(state, plan.owner):
            return Decision(False, Reason.IDENTITY_REVOKED)
        if item.binding_id is not None and not binding_live(state, item.binding_id, plan.owner):
            return Decision(False, Reason.IDENTITY_REVOKED)
        return ALLOW

    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        conn.execute("INSERT INTO migration_items (agent_id, source_key, sha256, source_sha256, plan_digest, class,"
                     " revision_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (plan.agent_id, key, item.sha256, item.source_sha256, plan.digest, item.klass, revision_id,
                      now_us()))

    return Provenance(Op.IMPORT, TRUST_ORIGIN, authority, record)


def _backup(home: Home, plan: Plan) -> Path:
    """The home as it was before this plan's first copy: made once, reused by a resumed run."""
    run_dir = migration_run_dir(home, plan.digest)
    runs = run_dir.parent
    final, partial = run_dir / "backup", run_dir / "backup.partial"
    if final.is_dir():
        return final
    try:
        for folder in (runs, run_dir):
            folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)
        if partial.exists():
            shutil.rmtree(partial)  # a run killed while backing up: start the backup again
        backup_home(home, partial)
        os.rename(partial, final)
        fsync_dir(run_dir)
        fsync_dir(runs)
    except OSError as exc:
        raise storage_error("cannot write the migration backup", exc) from exc
    return final


def _drop_backup(home: Home, plan: Plan) -> str | None:
    """After the cutover: the backup (a full copy of the home, out of ``forget``'s reach) goes; its path if it stays.

    It exists to roll back or resume a run that has not reached its
    cutover; past that, keeping every note's old bytes in a second place
    would undo every later ``forget``. A removal that fails leaves it for
    ``doctor`` to report (``migration-backup``) and ``doctor --fix`` to retry.
    """
    try:
        drop_migration_backup(home, plan.digest)
    except OSError:
        return str(migration_run_dir(home, plan.digest) / "backup")
    return None


def _verify(home: Home, plan: Plan, diverted: dict[str, Item]) -> int:
    """Every copied item's active revision holds the reviewed bytes, on disk and in the catalog."""
    catalog = home.catalog(plan.agent_id)
    bad = checked = 0
    for planned in plan.items:
        if planned.action not in COPIED:
            continue
        item = diverted.get(planned.key, planned)
        if item.action not in COPIED:
            continue  # sent to quarantine, but its path did not fit there: skipped, nothing to check
        row = one(catalog, "SELECT r.content_sha256, r.locator, r.state, sr.path_key FROM migration_items m"
                           " JOIN revisions r USING (revision_id) JOIN resources res ON res.resource_id = r.resource_id"
                           " JOIN stores s ON s.store_id = res.store_id JOIN storage_roots sr USING (storage_root_id)"
                           " WHERE m.agent_id = ? AND m.source_key = ? AND m.sha256 = ?",
                  (plan.agent_id, source_key(home, plan.agent_id, plan.owner, item), item.sha256))
        if row is None:
            bad += 1
            continue
        if row[2] != "active":
            continue  # edited or forgotten since by its owner: that revision is no longer this run's to check
        checked += 1
        try:
            store_fd = open_store_dir(home, plan.agent_id, row[3])
            try:
                fd = open_artifact(store_fd, row[1])
                try:
                    sha, _size = hash_fd(fd)
                finally:
                    os.close(fd)
            finally:
                os.close(store_fd)
        except (OSError, ScopefsError):
            sha = ""
        if not (sha == row[0] == item.sha256):
            bad += 1
    if bad:
        raise IntegrityError(f"migration verification failed: {bad} item(s) do not match their source; no cutover")
    return checked


def _copy(home: Home, plan: Plan, access: Access, item: Item, diverted: dict[str, Item]) -> str:
    """One item through the write transaction; its status. A destination written since goes to quarantine."""
    occupied: list[bool] = []
    data = _read_item(plan, item)
    key = source_key(home, plan.agent_id, plan.owner, item)
    try:
        write_copy(access, *_store_of(plan, item.action), item.inner, data,
                   _provenance(home, plan, item, key, occupied))
        return "copied"
    except Denied:
        if not occupied:
            raise
    except Conflict:  # saved between this copy's two commits: the activation saw its base move
        if not _occupied(home.catalog(plan.agent_id), plan, item, key):
            raise
    moved = item.quarantined("destination-exists")
    diverted[item.key] = moved
    if moved.action in COPIED and not _migrated_to(home, plan, moved):
        write_copy(access, *_store_of(plan, moved.action), moved.inner, data,
                   _provenance(home, plan, moved, source_key(home, plan.agent_id, plan.owner, moved), []))
    return "quarantined-destination-exists"


def denial_matrix(home: Home, plan: Plan) -> dict[str, Any]:
    """No subject but the owner reaches the owner's store, and none reaches the migration quarantine.

    Every principal and session kind this agent can have (each other
    human, each service, each of its conversations, shared-main and
    unbound DMs) gets its view from ``catalog.view`` as a session would,
    and every copied private or quarantined note's live policy entries are
    read from the catalog and matched against that subject, as the
    evaluator does. The owner's own view must hold the private store.
    """
    state, catalog, agent = home.state(), home.catalog(plan.agent_id), plan.agent_id
    now = now_us()
    subjects = [Subject(SubjectKind.AMBIGUOUS, reason=r) for r in AmbiguousReason]
    for pid, kind in state.execute("SELECT principal_id, kind FROM principals WHERE kind IN ('human', 'service')"
                                   " AND state = 'active' ORDER BY principal_id"):
        if pid != plan.owner:
            subjects.append(Subject(SubjectKind.USER if kind == "human" else SubjectKind.SERVICE, pid))
    for (cid,) in state.execute("SELECT conversation_id FROM conversations WHERE agent_id = ? ORDER BY 1", (agent,)):
        subjects.append(Subject(SubjectKind.CONVERSATION, cid))
    _revision, memory = memory_for(home, agent)
    closed = {AGENT_QUARANTINE}
    if plan.owner is not None:
        closed.add(("user", plan.owner))
    resources = [(r, st) for (r, st) in catalog.execute(
        "SELECT DISTINCT r.resource_id, s.store_id FROM migration_items m JOIN revisions r USING (revision_id)"
        " JOIN resources res ON res.resource_id = r.resource_id JOIN stores s ON s.store_id = res.store_id"
        " WHERE m.agent_id = ? AND (s.scope_kind, s.audience_id) IN (VALUES ('quarantine', ''), ('user', ?))",
        (agent, plan.owner or ""))]
    leaks = checks = 0
    for subject in subjects:
        roles: tuple[RoleEvidence, ...] = ()
        if subject.kind is SubjectKind.USER and subject.principal_id is not None:
            roles = tuple(RoleEvidence(m.role_id, m.role_name, m.expires_at)
                          for m in role_memberships(state, subject.principal_id))
        view = memory_view(subject, roles, now, memory)
        for mount in view.mounts:
            checks += 1
            if mount.cell == "" and (mount.scope_kind, mount.audience_id) in closed:
                leaks += 1
        for resource_id, store_id in resources:
            for entry in policy_entries(catalog, agent, store_id, resource_id):
                checks += 1
                if entry.effect is Effect.ALLOW and entry.live(now) and entry.matches(subject):
                    leaks += 1
    if plan.owner is not None:
        own = memory_view(Subject(SubjectKind.USER, plan.owner), (), now, memory)
        mounted = {(m.scope_kind, m.audience_id) for m in own.mounts if m.cell == ""}
        if AGENT_QUARANTINE in mounted or (("user", plan.owner) not in mounted and any(
                i.action == PRIVATE for i in plan.items)):
            leaks += 1
    if leaks:
        raise IntegrityError(f"denial matrix failed: {leaks} check(s) reach migrated private or quarantined notes;"
                             " no cutover")
    return {"subjects": len(subjects), "checks": checks, "passed": True}


def apply(home: Home, plan: Plan, confirm: str | None, progress: Progress | None = None) -> Report:
    """Carry out ``plan`` (module docstring); ``confirm`` must be its digest."""
    if confirm != plan.digest:
        raise BadInput("--confirm must be the plan_digest of the dry run of exactly this plan (the plan differs,"
                       " or none was given); run the dry run again and review it")
    catalog, agent = home.catalog(plan.agent_id), plan.agent_id
    run = one(catalog, "SELECT cutover_at FROM migration_runs WHERE agent_id = ? AND plan_digest = ?",
              (agent, plan.digest))
    status = _migrated(home, plan)
    if run is not None and run[0] is not None:  # done; a backup a crash left behind after the cutover goes now
        return Report(plan, True, status, _drop_backup(home, plan), cutover=True)
    _backup(home, plan)  # before the first copy; removed again once the cutover is recorded
    with immediate(catalog):
        catalog.execute("INSERT OR IGNORE INTO migration_runs (plan_digest, agent_id, owner_principal_id, started_at)"
                        " VALUES (?, ?, ?, ?)", (plan.digest, agent, plan.owner, now_us()))
    checkpoint(Step.MIGRATION_BACKED_UP)
    todo = [i for i in plan.items if i.action in COPIED]
    diverted: dict[str, Item] = {}  # item key -> the item sent to quarantine instead (its destination was taken)
    with broker_access(home, agent, Op.IMPORT, "migrate") as access:
        for n, item in enumerate(todo, 1):
            if item.key not in status:
                status[item.key] = _copy(home, plan, access, item, diverted)
            if progress is not None:
                progress(n, len(todo), item, status[item.key])
    checkpoint(Step.MIGRATION_COPIED)
    _verify(home, plan, diverted)
    reindexed = reindex(home, agent)
    matrix = denial_matrix(home, plan)
    checkpoint(Step.MIGRATION_VERIFIED)
    with immediate(catalog):  # the cutover marker: one row, one transaction
        catalog.execute("UPDATE migration_runs SET cutover_at = ? WHERE agent_id = ? AND plan_digest = ?"
                        " AND cutover_at IS NULL", (now_us(), agent, plan.digest))
    kept = _drop_backup(home, plan)
    return Report(plan, True, status, kept, True, reindexed.revisions, matrix, backup_removed=kept is None)
