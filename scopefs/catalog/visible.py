"""Everything a session's view may read, as one immutable picture.

A mounted view answers ``lookup``, ``readdir`` and ``getattr`` from memory:
asking the catalog per request would cost a query per file of ``grep -r``.
This module builds that picture with the same evaluator a single read
uses (``read`` on each live resource with an active revision), and keeps
it current by following the change log: a changed resource is decided
again alone, a store-wide policy change re-decides its store, and any
change of evidence (a revoked binding, a role that went stale, a closed
session) rebuilds the whole picture. A picture whose evidence is gone
holds no notes at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog.access import Access, current_access
from scopefs.catalog.changes import changes_since, latest_seq
from scopefs.catalog.db import scalar
from scopefs.catalog.home import Home
from scopefs.catalog.layered import LayeredMap, editing
from scopefs.catalog.policy import Effect, Entry, Mount, Op, ResourceState, evaluate
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import MountedStore, find_store, mounted_stores, policy_entries

_NOTE_COLS = ("r.resource_id, r.path, v.revision_id, v.content_sha256, v.size, v.locator,"
              " coalesce(v.activated_at, v.created_at),"
              " EXISTS (SELECT 1 FROM lineage_holds h WHERE h.revision_id = v.revision_id),"
              " (SELECT x.valid_until FROM revision_validity x WHERE x.revision_id = v.revision_id)")
_NOTES = (f"SELECT {_NOTE_COLS} FROM resources r"
          " JOIN revisions v ON v.resource_id = r.resource_id AND v.state = 'active' AND v.agent_id = r.agent_id"
          " WHERE r.agent_id = ? AND r.store_id = ? AND r.state = 'live'")
_ENTRIES = ("SELECT p.target_kind, p.target_id, e.effect, e.capability, e.audience_kind, e.audience_id, e.expires_at"
            " FROM policy_entries e JOIN policies p USING (policy_id)"
            " WHERE e.agent_id = ? AND p.agent_id = ? AND p.state = 'active' AND e.revoked_at IS NULL"
            " AND ((p.target_kind = 'store' AND p.target_id = ?) OR (p.target_kind = 'resource' AND p.target_id IN"
            "      (SELECT resource_id FROM resources WHERE agent_id = ? AND store_id = ? AND state = 'live')))")


@dataclass(frozen=True)
class VisibleNote:
    """One readable note: where it shows, and the revision it shows."""

    parts: tuple[str, ...]  # full virtual path, root included
    mount_root: str
    resource_id: str
    store_id: str
    path_key: str
    revision_id: str
    sha256: str
    size: int
    locator: str
    mtime_us: int
    cell: str  # the catalog and artifact area that hold it: the agent's, or a shared pool's


@dataclass(frozen=True)
class VisibleView:
    access: Access
    problem: Reason | None  # set when the session's evidence is gone: nothing is visible
    stores: tuple[MountedStore, ...]
    notes: Mapping[tuple[str, ...], VisibleNote]  # a LayeredMap: the next picture shares its bulk
    by_resource: Mapping[str, tuple[str, ...]]
    seq: int  # the change-log position this picture reflects
    valid_until: int | None  # earliest policy expiry that can change a decision
    base_seq: int | None = None  # set by refresh(): the picture this one was derived from...
    delta: frozenset[tuple[str, ...]] = frozenset()  # ...and every path whose entry may differ from it
    pool_seqs: tuple[tuple[str, int], ...] = ()  # (cell, change-log position) of each shared pool shown

    @property
    def usable(self) -> bool:
        return self.problem is None

    def emptied(self, problem: Reason, access: Access | None = None) -> VisibleView:
        """This view with nothing in it, for ``problem``: evidence gone, or a catalog that cannot be read."""
        return VisibleView(access or self.access, problem, (), LayeredMap(), LayeredMap(), self.seq, None)

    def store(self, store_id: str) -> MountedStore | None:
        return next((s for s in self.stores if s.store_id == store_id), None)


def _decide(access: Access, mount: Mount, entries: tuple[Entry, ...], row: tuple[Any, ...]) -> bool:
    """The read decision on one note row (``_NOTES``): its policy, its lineage hold, its validity.

    A delegated session's caps come first: a note no cap lets in is not in the picture at all.
    """
    if not access.view.permits(_root_parts(mount) + tuple(row[1].split("/"))):
        return False
    state = ResourceState(True, "active", bool(row[7]), row[8])
    return bool(evaluate(Op.READ, access.session.subject, mount, state, entries, access.now))


def _validity_expiry(row: tuple[Any, ...], now: int) -> list[int]:
    """When a note row's validity runs out, if that is still to come: the view must wake then."""
    return [row[8]] if row[8] is not None and row[8] > now else []


def _root_parts(mount: Mount) -> tuple[str, ...]:
    return tuple(mount.root.split("/"))


def _note(access: Access, store: MountedStore, row: tuple[Any, ...]) -> VisibleNote:
    resource_id, path, revision_id, sha, size, locator, mtime = row[:7]
    return VisibleNote(_root_parts(store.mount) + tuple(path.split("/")), store.mount.root, resource_id,
                       store.store_id, store.path_key, revision_id, sha, size, locator, mtime, access.agent_id)


def _expiries(entries: list[Entry], now: int) -> list[int]:
    return [e.expires_at for e in entries if e.expires_at is not None and e.expires_at > now]


def _store_notes(conn: apsw.Connection, access: Access, store: MountedStore) -> tuple[list[VisibleNote], list[int]]:
    """Every readable note of one store: two queries, then the evaluator."""
    agent = access.agent_id
    store_level: list[Entry] = []
    per_resource: dict[str, list[Entry]] = {}
    for kind, target, *entry in conn.execute(_ENTRIES, (agent, agent, store.store_id, agent, store.store_id)):
        item = Entry(Effect(entry[0]), Op(entry[1]), *entry[2:])
        (store_level if kind == "store" else per_resource.setdefault(target, [])).append(item)
    notes = []
    expiries = _expiries(store_level, access.now)
    for row in conn.execute(_NOTES, (agent, store.store_id)):
        own = per_resource.get(row[0], [])
        expiries += _expiries(own, access.now) + _validity_expiry(row, access.now)
        if _decide(access, store.mount, (*store_level, *own), row):
            notes.append(_note(access, store, row))
    return notes, expiries


def _one_note(conn: apsw.Connection, access: Access, store: MountedStore,
              resource_id: str) -> tuple[VisibleNote | None, list[int]]:
    """One note decided again, and the times its decision can change by itself."""
    row = conn.execute(_NOTES + " AND r.resource_id = ?", (access.agent_id, store.store_id, resource_id)).fetchall()
    if not row:
        return None, []
    entries = policy_entries(conn, access.agent_id, store.store_id, resource_id)
    when = _expiries(list(entries), access.now) + _validity_expiry(row[0], access.now)
    return (_note(access, store, row[0]) if _decide(access, store.mount, entries, row[0]) else None), when


def build(home: Home, session_id: str) -> VisibleView:
    """The whole picture, from scratch: the agent's own cell, then each shared pool of the view."""
    access, problem = current_access(home, session_id)
    seq = latest_seq(home.catalog(access.agent_id))  # before the notes: a change landing meanwhile is applied again
    stores: list[MountedStore] = []
    notes: dict[tuple[str, ...], VisibleNote] = {}
    expiries: list[int] = []
    pool_seqs: list[tuple[str, int]] = []
    for cell in access.cells() if problem is None else ():
        inside = access.in_cell(cell)
        conn = home.catalog(inside.agent_id)
        if cell:
            pool_seqs.append((cell, latest_seq(conn)))
        for store in mounted_stores(conn, inside.agent_id, inside.view.mounts):
            stores.append(store)
            found, when = _store_notes(conn, inside, store)
            expiries += when
            notes.update((n.parts, n) for n in found)
    return VisibleView(access, problem, tuple(stores), LayeredMap(notes),
                       LayeredMap({n.resource_id: p for p, n in notes.items()}), seq, min(expiries, default=None),
                       pool_seqs=tuple(pool_seqs))


def _same_evidence(old: VisibleView, access: Access, problem: Reason | None) -> bool:
    return problem == old.problem and access.view.mounts == old.access.view.mounts


def refresh(home: Home, old: VisibleView) -> VisibleView:
    """``old`` brought up to date; ``old`` itself if nothing changed.

    Cheap when nothing changed (one evidence check and one change-log
    query), proportional to the changed notes otherwise.
    """
    session_id = old.access.session.session_id
    access, problem = current_access(home, session_id)
    if problem is not None:  # evidence gone: empty at once, before anything else can fail
        if old.problem == problem:
            return old
        return old.emptied(problem, access)
    conn = home.catalog(access.agent_id)
    changes = changes_since(conn, old.seq)
    expired = old.valid_until is not None and access.now >= old.valid_until
    if not _same_evidence(old, access, problem) or changes.overflow or expired or _pools_moved(home, old):
        return build(home, session_id)
    known = {s.store_id for s in old.stores}
    if any(s not in known for s in changes.store_ids) or _new_store(conn, access, old):
        return build(home, session_id)
    if not changes:
        if access.evidence_until == old.access.evidence_until:
            return old
        # The same view, with evidence that runs out at another time (a membership renewed or
        # shortened): the mount must wake then (``vfs.follow``), so it gets the new access.
        return dataclasses.replace(old, access=access, base_seq=old.seq, delta=frozenset())
    notes = editing(old.notes)  # copies what changed since the last flattening, not the whole view
    by_resource = editing(old.by_resource)
    delta: set[tuple[str, ...]] = set()
    expiries = [old.valid_until] if old.valid_until is not None else []

    def put(note: VisibleNote) -> None:
        notes[note.parts] = note
        by_resource[note.resource_id] = note.parts
        delta.add(note.parts)

    def drop(parts: tuple[str, ...]) -> None:
        gone = notes.pop(parts, None)
        if gone is not None:
            by_resource.pop(gone.resource_id, None)
            delta.add(parts)

    for store in old.stores:
        if store.store_id in changes.store_ids:
            for parts in [p for p, n in notes.items() if n.store_id == store.store_id]:
                drop(parts)
            found, when = _store_notes(conn, access, store)
            for note in found:
                put(note)
            expiries += when
    for resource_id in changes.resource_ids:
        shown_at = by_resource.get(resource_id)
        if shown_at is not None and notes[shown_at].resource_id == resource_id:
            drop(shown_at)
        store_id = _store_of(conn, access.agent_id, resource_id)
        home_store = old.store(store_id) if store_id else None
        if home_store is None:
            continue
        changed, when = _one_note(conn, access, home_store, resource_id)
        expiries += when
        if changed is not None:
            if changed.parts in notes:  # another resource moved away from this path in the same batch
                drop(changed.parts)
            put(changed)
    return dataclasses.replace(old, access=access, notes=notes.done(), by_resource=by_resource.done(),
                               seq=changes.last_seq,
                               valid_until=min(expiries, default=None), base_seq=old.seq,
                               delta=frozenset(delta))


def _store_of(conn: apsw.Connection, agent_id: str, resource_id: str) -> str | None:
    store_id = scalar(conn, "SELECT store_id FROM resources WHERE agent_id = ? AND resource_id = ?",
                      (agent_id, resource_id))
    return None if store_id is None else str(store_id)


def _new_store(conn: apsw.Connection, access: Access, old: VisibleView) -> bool:
    """A mount of the agent's own cell without a store may have gained one (the first write to it).

    Shared pools are followed whole by ``_pools_moved``.
    """
    have = {s.mount.root for s in old.stores}
    return any(find_store(conn, access.agent_id, m.scope_kind, m.audience_id) is not None
               for m in access.view.mounts if m.root not in have and not m.cell)


def _pools_moved(home: Home, old: VisibleView) -> bool:
    """Whether any shared pool of the view changed since ``old``: then the picture is built again.

    One change-log query per pool. A pool's changes are not followed note
    by note: pools are shared reference material, written far less often
    than a person's own store.
    """
    return any(latest_seq(home.catalog(cell)) != seq for cell, seq in old.pool_seqs)
