"""Forgetting: the explicit, stronger act than ``rm``.

``rm`` in a mount tombstones a note (its revisions stay, for audit and
repair). ``forget`` removes the note with every revision of it, and every
note derived from it that the caller may delete, and rejects the claims it
held (``catalog.claims``) so the same fact cannot be written again through
any session, derivation, deposit or import of the cell.

One report shape serves the preview (``dry_run``) and the act, as in
OpenClaw's ``forgetMemoryEntries``: what will be (was) forgotten, and
``refusals`` for what it will not touch instead of a partial delete: a
path the caller may not delete, a descendant outside the caller's writable
roots, a descendant that also derives from notes not being forgotten
(mixed lineage). Those are still held by their lineage (denied to every
reader) once their source is gone; forgetting them is their owner's act.

Everything is decided and applied in one transaction under the writer
lock, after the contents were read (no file I/O inside a transaction); if
anything moved in between, nothing changes and the caller is asked to try
again. The artifacts are unlinked after the commit; a crash before that
leaves files no revision serves, which ``doctor`` reports and
``doctor --fix`` removes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import apsw

from scopefs.catalog import claims, ids
from scopefs.catalog.access import Access, Target, authorize_session, decide, resolve
from scopefs.catalog.artifacts import open_store_dir, read_verified
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import BadInput, Conflict, IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import descendants, parents, resource_revisions
from scopefs.catalog.paths import Parts, check_parts, split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.projections import projection_at
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import RevisionRow, StoreRow, revision_by_id
from scopefs.writer import lock
from scopefs.writer.projections import revoke_rows
from scopefs.writer.quarantine import remove_tampered
from scopefs.writer.scrub import scrub, secure_delete
from scopefs.writer.steps import Step, checkpoint
from scopefs.writer.tombstone import tombstone_rows

MAX_PATHS = 256
log = logging.getLogger("scopefs.forget")


@dataclass(frozen=True)
class Note:
    """One resource to forget, as the caller's view names it."""

    path: str
    resource_id: str
    store: StoreRow
    relation: str  # named, removed (rm'd, by its old path), descendant, removed-descendant or copy
    revisions: tuple[str, ...]  # the revisions forgotten: all of a named note; a descendant's derived ones
    whole: bool = True  # the note itself goes (its current revision is among them)


@dataclass
class Plan:
    notes: list[Note] = field(default_factory=list)
    refusals: list[dict[str, str]] = field(default_factory=list)

    def key(self) -> tuple[Any, ...]:
        return (tuple((n.resource_id, n.revisions) for n in self.notes),
                tuple(sorted(tuple(sorted(r.items())) for r in self.refusals)))


@dataclass(frozen=True)
class Report:
    dry_run: bool
    forget_id: str | None
    plan: Plan
    claims: int
    unreadable: int  # revisions whose artifact did not verify: forgotten, their claims not keyed

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "forget_id": self.forget_id,
                "forgotten": [{"path": n.path, "resource_id": n.resource_id, "relation": n.relation,
                               "revisions": len(n.revisions)} for n in self.plan.notes],
                "refusals": self.plan.refusals, "claims": self.claims, "unreadable_revisions": self.unreadable}


def forget(home: Home, session_id: str, paths: list[str], *, dry_run: bool = False,
           actor_id: str | None = None) -> Report:
    """Preview (``dry_run``) or forget the notes at ``paths`` and what was derived from them."""
    check_count(paths, "notes to forget")
    named = [check_parts(split_virtual_path(p)) for p in paths]
    access = authorize_session(home, session_id, Op.DELETE, actor_id=actor_id)
    catalog = home.catalog(access.agent_id)
    plan = _plan(access, catalog, named)
    keys, unreadable = _claim_keys(home, access, catalog, plan)
    if dry_run or not plan.notes:
        return Report(dry_run, None, plan, len(keys), unreadable)
    forget_id = forget_planned(access, plan, keys, lambda: _plan(access, catalog, named).key() == plan.key())
    return Report(False, forget_id, plan, len(keys), unreadable)


def check_count(named: list[str], what: str) -> None:
    """BadInput unless 1 to ``MAX_PATHS`` were named: one bound for every command that names notes to remove."""
    if not named or len(named) > MAX_PATHS:
        raise BadInput(f"name 1 to {MAX_PATHS} {what}")


def forget_planned(access: Access, plan: Plan, keys: list[str], unchanged: Callable[[], bool], *,
                   operation: str = "forget") -> str:
    """Apply ``plan`` (rejecting the claims ``keys``) in one transaction; then the bytes leave. Its forget id.

    ``unchanged`` re-reads, inside the transaction and under the writer lock,
    whether the plan still holds; if not, nothing changes (Conflict). Shared
    by ``forget`` and the quarantine's purge (``writer.quarantine_review``),
    which plans from the catalog rather than from a view and rejects no claim.
    """
    home, agent = access.home, access.agent_id
    catalog = home.catalog(agent)
    forget_id = ids.random_token()
    with lock.shared(home.lock_path(agent)), secure_delete(catalog):
        with immediate(catalog):
            if not unchanged():
                raise Conflict("the notes changed while the forget was prepared; nothing was forgotten, try again")
            forget_rows(access, catalog, forget_id, plan, keys, operation)
            checkpoint(Step.FORGETTING)
    checkpoint(Step.FORGOTTEN)
    drain_quietly(home.state(), catalog, agent)
    forget_files(home, agent, catalog, plan)
    return forget_id


def forget_files(home: Home, agent_id: str, catalog: apsw.Connection, plan: Plan) -> None:
    """After the commit of ``forget_rows``: the bytes leave the disk and the catalog's files."""
    _unlink_artifacts(home, agent_id, catalog, plan)
    scrub(catalog, agent_id)


def _deletable(access: Access, target: Target) -> bool:
    return target.resource is not None and target.revision is not None and bool(decide(access, target, Op.DELETE))


def _removed_at(access: Access, catalog: apsw.Connection, store_id: str, path: str) -> list[str]:
    """Resources once at ``path`` of a store the caller deletes in, tombstoned and not yet forgotten."""
    return [str(r[0]) for r in catalog.execute(
        "SELECT r.resource_id FROM resources r WHERE r.agent_id = ? AND r.store_id = ? AND r.path = ?"
        " AND r.state = 'tombstoned' AND EXISTS (SELECT 1 FROM revisions v WHERE v.resource_id = r.resource_id"
        " AND v.state != 'rolled-back' AND v.revision_id NOT IN (SELECT revision_id FROM forgotten_revisions))"
        " ORDER BY r.created_at", (access.agent_id, store_id, path))]


def _plan(access: Access, catalog: apsw.Connection, named: list[Parts]) -> Plan:
    plan = Plan()
    chosen: dict[str, Note] = {}
    for parts in named:
        target = resolve(access, parts)
        path = "/".join(parts)
        if target.mount is not None and not target.mount.cell and target.resource is None and target.store is not None \
                and Op.DELETE in target.mount.placement:
            removed = _removed_at(access, catalog, target.store.store_id, target.inner_path)
            for rid in removed:  # notes removed from here before (rm): forgetting them is still the owner's act
                chosen.setdefault(rid, Note(path, rid, target.store, "removed",
                                             tuple(resource_revisions(catalog, access.agent_id, rid))))
            if removed:
                continue
        # A held or expired note is still its owner's to forget: DELETE needs no readable content.
        if target.mount is None or target.mount.cell or not _deletable(access, target):
            plan.refusals.append({"path": path, "reason": Reason.OUTSIDE_VIEW.value})  # as for a missing note
            continue
        assert target.resource is not None and target.store is not None
        rid = target.resource.resource_id
        chosen.setdefault(rid, Note(path, rid, target.store, "named",
                                     tuple(resource_revisions(catalog, access.agent_id, rid))))
    roots = [rev for note in chosen.values() for rev in note.revisions]
    below = descendants(catalog, access.agent_id, roots)
    family = set(roots) | set(below)  # a parent in here is itself being forgotten (or refused, and held)
    own_roots = _in_own_store(access, catalog, family)  # what the caller may have published or projected
    for child in below:
        _plan_descendant(access, catalog, child, chosen, family, plan, own_roots)
    plan.notes = list(chosen.values())
    return plan


# Which of the given revisions (a JSON list) are notes of the subject's own store. ``+v.agent_id``: looked
# up by id, never a walk of every revision (``catalog.stores.ACTIVE_WITH_STORE``).
OWN_STORE_REVISIONS = (
    "SELECT v.revision_id FROM revisions v JOIN resources r ON r.resource_id = v.resource_id"
    " JOIN stores s ON s.store_id = r.store_id WHERE +v.agent_id = ? AND s.scope_kind IN ('user', 'agent')"
    " AND s.audience_id = ? AND v.revision_id IN (SELECT value FROM json_each(?))"
)


def _in_own_store(access: Access, catalog: apsw.Connection, revisions: set[str]) -> set[str]:
    """Those of ``revisions`` that are notes of the caller's own store (a user's private, a service's agent)."""
    subject = access.session.subject.principal_id
    if subject is None:
        return set()
    return {str(r[0]) for r in catalog.execute(
        OWN_STORE_REVISIONS, (access.agent_id, subject, json.dumps(sorted(revisions))))}


def _own_copy(access: Access, catalog: apsw.Connection, child: str, own_roots: set[str]) -> str | None:
    """How the report names ``child`` if it is a published or projected copy of one of the caller's own
    notes being forgotten (only a note's owner publishes or projects it), else None."""
    made = [(parent, relation) for parent, relation in parents(catalog, access.agent_id, child)
            if relation in ("publish", "project") and parent in own_roots]
    if not made:
        return None
    projection = catalog.execute("SELECT projection_id FROM projections WHERE copy_revision_id = ?",
                                 (child,)).fetchall()
    return f"projection:{projection[0][0]}" if projection else f"published copy of revision {made[0][0]}"


def _deletes_in(access: Access, scope_kind: str, audience_id: str) -> bool:
    """Whether the caller's view deletes in the store (scope, audience) of its own cell."""
    return any(not m.cell and m.scope_kind == scope_kind and m.audience_id == audience_id
               and Op.DELETE in m.placement for m in access.view.mounts)


def _root_of(access: Access, scope_kind: str, audience_id: str) -> str:
    return next(m.root for m in access.view.mounts if not m.cell and m.scope_kind == scope_kind
                and m.audience_id == audience_id)


def _plan_descendant(access: Access, catalog: apsw.Connection, child: str, chosen: dict[str, Note],
                     family: set[str], plan: Plan, own_roots: set[str]) -> None:
    row = catalog.execute("SELECT r.resource_id, r.path, r.store_id, s.scope_kind, s.audience_id, r.state"
                          " FROM revisions v"
                          " JOIN resources r ON r.resource_id = v.resource_id JOIN stores s ON s.store_id = r.store_id"
                          " WHERE v.revision_id = ? AND v.agent_id = ?", (child, access.agent_id)).fetchall()
    if not row:
        return
    resource_id, inner, scope_kind, audience_id = (str(v) for v in (row[0][0], row[0][1], row[0][3], row[0][4]))
    if resource_id in chosen:
        return
    copy = _own_copy(access, catalog, child, own_roots)
    if copy is not None or row[0][5] == "tombstoned":
        # A copy the caller published or projected of its own note, or a descendant already removed from
        # a store the caller deletes in: the caller's to forget. Only the revisions made from what is
        # forgotten go (another person's revision of a shared copy name is theirs).
        if copy is None and not _deletes_in(access, scope_kind, audience_id):
            return
        store = catalog.execute("SELECT s.store_id, sr.path_key FROM stores s JOIN storage_roots sr"
                                " ON sr.storage_root_id = s.storage_root_id WHERE s.store_id = ?",
                                (str(row[0][2]),)).fetchall()[0]
        derived = tuple(r for r in resource_revisions(catalog, access.agent_id, resource_id) if r in family)
        current = catalog.execute("SELECT revision_id FROM revisions WHERE resource_id = ? AND state = 'active'",
                                  (resource_id,)).fetchall()
        chosen[resource_id] = Note(copy or f"{_root_of(access, scope_kind, audience_id)}/{inner}", resource_id,
                                    StoreRow(str(store[0]), scope_kind, audience_id, str(store[1])),
                                    "copy" if copy else "removed-descendant", derived,
                                    whole=not current or str(current[0][0]) in family)
        return
    mount = next((m for m in access.view.mounts if not m.cell and m.scope_kind == scope_kind
                  and m.audience_id == audience_id), None)
    target = resolve(access, (*mount.root.split("/"), *inner.split("/"))) if mount is not None else None
    if mount is None or target is None or target.resource is None or target.resource.resource_id != resource_id:
        return  # outside the caller's view: held by its lineage, and never named to this caller
    seen = decide(access, target, Op.READ)
    if not seen and seen.reason not in (Reason.LINEAGE_DENY, Reason.EXPIRED):
        return  # in a root of the view but not the caller's to see: the same
    path = f"{mount.root}/{inner}"
    if not _deletable(access, target):
        plan.refusals.append({"path": path, "reason": "outside-writable-roots"})
        return
    if not {parent for parent, _relation in parents(catalog, access.agent_id, child)} <= family:
        plan.refusals.append({"path": path, "reason": "mixed-lineage"})
        return
    assert target.store is not None and target.revision is not None
    derived = tuple(r for r in resource_revisions(catalog, access.agent_id, resource_id) if r in family)
    chosen[resource_id] = Note(path, resource_id, target.store, "descendant", derived,
                                whole=target.revision.revision_id in family)


def _revision_rows(catalog: apsw.Connection, revision_ids: tuple[str, ...]) -> list[RevisionRow]:
    return [row for row in (revision_by_id(catalog, r) for r in revision_ids) if row is not None]


def _claim_keys(home: Home, access: Access, catalog: apsw.Connection, plan: Plan) -> tuple[list[str], int]:
    """The claims of every revision to forget, read and verified before the transaction."""
    keys: dict[str, None] = {}
    unreadable = 0
    secret = home.hmac_key()
    for note in plan.notes:
        for revision in _revision_rows(catalog, note.revisions):
            try:
                data = read_verified(home, access.agent_id, note.store, revision, keep=claims.MAX_SCAN_BYTES)
            except IntegrityError:
                unreadable += 1
                continue
            keys.update(dict.fromkeys(claims.keys(secret, data)))
    return list(keys), unreadable


def forget_rows(access: Access, catalog: apsw.Connection, forget_id: str, plan: Plan, keys: list[str],
                operation: str, *, revision_id: str | None = None) -> None:
    """Inside the caller's transaction (under the writer lock): ``plan`` forgotten in the catalog, its
    claims ``keys`` rejected, audited as ``operation`` (naming ``revision_id``, if given). Then, after the
    commit, ``forget_files``; a crash between leaves files no revision serves (``doctor --fix``)."""
    now = now_us()
    agent = access.agent_id
    event_id = enqueue(catalog, agent, access.event(operation, "allow", Reason.ALLOWED, revision_id=revision_id))
    catalog.execute("INSERT INTO forgets (forget_id, agent_id, session_id, actor_id, notes, claims, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)", (forget_id, agent, access.session.session_id, access.actor_id,
                                                      len(plan.notes), len(keys), now))
    for note in plan.notes:
        if note.whole:
            active = catalog.execute("SELECT revision_id FROM revisions WHERE resource_id = ? AND state = 'active'",
                                     (note.resource_id,)).fetchall()
            tombstone_rows(catalog, note.resource_id, str(active[0][0]) if active else "", cause="forget")
        if note.relation == "copy":  # the owner's own projection of it ends with it (never another's)
            projection = projection_at(catalog, agent, note.resource_id)
            if projection is not None and projection.copy_revision_id in note.revisions:
                revoke_rows(catalog, agent, projection)
        catalog.executemany("UPDATE revisions SET state = 'tombstoned' WHERE revision_id = ? AND state = 'superseded'",
                            [(r,) for r in note.revisions])
        catalog.executemany("INSERT OR IGNORE INTO forgotten_revisions (revision_id, agent_id, forget_id, forgotten_at)"
                            " VALUES (?, ?, ?, ?)", [(r, agent, forget_id, now) for r in note.revisions])
    catalog.executemany("INSERT OR IGNORE INTO rejected_claims (agent_id, claim_key, forget_id, created_at)"
                        " VALUES (?, ?, ?, ?)", [(agent, key, forget_id, now) for key in keys])
    settle(catalog, event_id, decision="allow", reason=Reason.ALLOWED)


def _unlink_artifacts(home: Home, agent_id: str, catalog: apsw.Connection, plan: Plan) -> None:
    """The forgotten bytes leave the disk, quarantined tampered copies too (after the commit: a crash before
    leaves unserved orphans)."""
    for note in plan.notes:
        try:
            store_fd = open_store_dir(home, agent_id, note.store.path_key)
        except IntegrityError:
            continue
        try:
            for revision in _revision_rows(catalog, note.revisions):
                with contextlib.suppress(OSError):
                    os.unlink(revision.locator, dir_fd=store_fd)
            with contextlib.suppress(OSError):
                os.fsync(store_fd)
        finally:
            os.close(store_fd)
    with contextlib.suppress(OSError):  # a tampered copy doctor moved aside is the note's text too
        remove_tampered(home, agent_id, [r for note in plan.notes for r in note.revisions])
