"""Revisions committed without a disk sync: made durable on demand, settled after a power loss.

A close through a mount commits its revision without syncing anything
(``writer.transaction``, DESIGN.md §6): the kernel's page cache holds the
artifact, so the death of any process loses nothing, and the revision is
listed in ``unsynced_revisions`` with that page cache (``catalog.boot``).

* ``write_back`` and ``forget_before``: what the kernel's own writeback
  did anyway, made official every half minute, so the list stays short.
* ``sync``: what ``fsync`` of a note (or of a folder) through a mount asks.
  The artifacts are fsynced with their directories, then one
  ``synchronous=FULL`` commit, which syncs the whole write-ahead log and so
  every commit before it, removes their rows: from then on they survive
  power loss like any durable write.
* ``settle_restarted``: after the page cache that held such revisions is
  gone (a power loss, a reboot, the home's filesystem mounted again), each
  artifact is verified. One that verifies reached the disk: it is synced
  and its row removed. One that does not (missing, short, zero-filled) is
  a revision the power loss took, never more than that: it is marked
  ``corrupt`` and its note returns to the newest revision before it that
  is intact (a note that had none is tombstoned), audited as
  ``revision-lost``, and the restored revision is indexed again. A
  broken revision is never served meanwhile either: readers verify every
  artifact before any byte leaves.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import apsw

from scopefs.catalog.artifacts import check_locator, open_artifact, open_store_dir, verify
from scopefs.catalog.audit import AuditEvent, drain_quietly, enqueue, settle
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import IntegrityError, StorageError
from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home
from scopefs.catalog.index import index_again
from scopefs.catalog.reasons import Reason

_libc = ctypes.CDLL(None, use_errno=True)

_SELECT = (
    "SELECT u.revision_id, u.resource_id, v.state, v.locator, v.size, v.content_sha256, r.path_key, s.store_id"
    " FROM unsynced_revisions u JOIN revisions v ON v.revision_id = u.revision_id"
    " JOIN resources res ON res.resource_id = u.resource_id JOIN stores s ON s.store_id = res.store_id"
    " JOIN storage_roots r ON r.storage_root_id = s.storage_root_id WHERE u.agent_id = ?"
)


@dataclass(frozen=True)
class _Unsynced:
    revision_id: str
    resource_id: str
    state: str
    locator: str
    size: int
    sha256: str
    path_key: str
    store_id: str


def _rows(home: Home, agent_id: str, where: str, params: tuple[str, ...]) -> list[_Unsynced]:
    rows = home.catalog(agent_id).execute(_SELECT + where + " ORDER BY u.created_at", (agent_id, *params))
    return [_Unsynced(*row) for row in rows]


def _fsync_artifacts(home: Home, agent_id: str, rows: list[_Unsynced]) -> None:
    """fsync each artifact, then each of their store directories (a rename is durable with its directory)."""
    by_dir: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        by_dir[row.path_key].append(check_locator(row.locator))
    for path_key, locators in by_dir.items():
        store_fd = open_store_dir(home, agent_id, path_key)
        try:
            for locator in locators:
                fd = open_artifact(store_fd, locator)
                try:
                    os.fsync(fd)  # an error here is final: the caller's fsync fails, the row stays
                finally:
                    os.close(fd)
            os.fsync(store_fd)
        finally:
            os.close(store_fd)


def _forget(home: Home, agent_id: str, revision_ids: list[str]) -> None:
    """Drop the rows of revisions now durable, in a commit that syncs the catalog."""
    catalog = home.catalog(agent_id)
    with immediate(catalog):
        catalog.executemany("DELETE FROM unsynced_revisions WHERE revision_id = ?", [(r,) for r in revision_ids])


def sync(home: Home, agent_id: str, *, resource_id: str | None = None) -> int:
    """Make the unsynced revisions of one note (or, with None, all of ``agent_id``'s) durable; how many.

    Raises StorageError if an artifact cannot be synced: the ``fsync`` that
    asked must fail, as it would on any filesystem that lost a write.
    """
    # Only this page cache's: one that is gone may have lost bytes that an fsync now would
    # bless; those are recovery's to verify (``settle_restarted``).
    now = home.page_cache()
    rows = _rows(home, agent_id, " AND u.page_cache = ?" + ("" if resource_id is None else " AND u.resource_id = ?"),
                 (now,) if resource_id is None else (now, resource_id))
    if not rows:
        return 0
    try:
        _fsync_artifacts(home, agent_id, rows)
    except (OSError, IntegrityError) as exc:
        raise StorageError(f"cannot sync the note: {exc.__class__.__name__}") from exc
    _forget(home, agent_id, [row.revision_id for row in rows])
    return len(rows)


def write_back(home: Home) -> int:
    """``syncfs`` of the home's filesystem: every byte written before the call is on disk after it.

    The kernel writes dirty pages back within about 30 s anyway; a mount
    calls this every ``vfs.follow.WRITEBACK_S`` and at unmount, and then
    ``forget_before`` the time it started, so the unsynced list holds only
    the last half minute of saves, not every save since the last fsync.
    Returns the time (``now_us``) before the call.
    """
    started = now_us()
    fd = open_dir(home.root)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise StorageError(f"cannot sync the home: {os.strerror(err)}")
    finally:
        os.close(fd)
    return started


def forget_before(home: Home, agent_id: str, before_us: int) -> int:
    """Drop the rows of this page cache's revisions activated before ``before_us`` (``write_back`` made
    them durable). Rows of a page cache that is gone stay for recovery to verify."""
    catalog = home.catalog(agent_id)
    with immediate(catalog):  # synchronous=FULL: the activations themselves are durable from here on
        catalog.execute("DELETE FROM unsynced_revisions WHERE agent_id = ? AND page_cache = ? AND created_at < ?",
                        (agent_id, home.page_cache(), before_us))
        return catalog.changes()


def restarted(home: Home, agent_id: str) -> bool:
    """Whether unsynced revisions of a page cache that is gone are waiting.

    Runs before every write, so two index probes (below and above the
    current page cache), never a scan of the unsynced rows.
    """
    now, catalog = home.page_cache(), home.catalog(agent_id)
    return any(one(catalog, f"SELECT 1 FROM unsynced_revisions WHERE agent_id = ? AND page_cache {op} ? LIMIT 1",
                   (agent_id, now)) is not None for op in ("<", ">"))


@dataclass(frozen=True)
class Settled:
    revision_id: str
    lost: bool  # rolled back: its artifact did not survive


def _intact(home: Home, agent_id: str, row: _Unsynced) -> bool:
    try:
        store_fd = open_store_dir(home, agent_id, row.path_key)
    except IntegrityError:
        return False
    try:
        fd = open_artifact(store_fd, check_locator(row.locator))
    except IntegrityError:
        return False
    finally:
        os.close(store_fd)
    try:
        verify(fd, row.size, row.sha256)
        return True
    except IntegrityError:
        return False
    finally:
        os.close(fd)


def _gone(home: Home, agent_id: str) -> list[_Unsynced]:
    now = home.page_cache()
    return _rows(home, agent_id, " AND (u.page_cache < ? OR u.page_cache > ?)", (now, now))


def inspect_restarted(home: Home, agent_id: str) -> list[Settled]:
    """What ``settle_restarted`` would do, changing nothing (``scopefs doctor`` without ``--fix``)."""
    return [Settled(row.revision_id, not _intact(home, agent_id, row)) for row in _gone(home, agent_id)]


def settle_restarted(home: Home, agent_id: str) -> list[Settled]:
    """Settle every unsynced revision whose page cache is gone (module docstring).

    The caller holds the writer lock exclusively, so no write of this cell
    is between its plan and its activation meanwhile.
    """
    rows = _gone(home, agent_id)
    if not rows:
        return []
    intact = [row for row in rows if _intact(home, agent_id, row)]
    lost = [row for row in rows if row not in intact]
    if intact:
        _fsync_artifacts(home, agent_id, intact)
    restored = _roll_back(home, agent_id, lost) if lost else []
    _forget(home, agent_id, [row.revision_id for row in intact])
    if restored:
        with contextlib.suppress(IntegrityError, StorageError):  # doctor reports what stays unindexed
            index_again(home, agent_id, restored)
    drain_quietly(home.state(), home.catalog(agent_id), agent_id)
    return [Settled(row.revision_id, row in lost) for row in rows]


# ``+v.agent_id``: looked up by id, never a walk of every revision (``catalog.stores.ACTIVE_WITH_STORE``).
SELECT_REVISIONS = (
    "SELECT v.revision_id, v.resource_id, v.state, v.locator, v.size, v.content_sha256, r.path_key, s.store_id"
    " FROM revisions v JOIN resources res ON res.resource_id = v.resource_id JOIN stores s ON s.store_id = res.store_id"
    " JOIN storage_roots r ON r.storage_root_id = s.storage_root_id"
    " WHERE +v.agent_id = ? AND v.revision_id IN (SELECT value FROM json_each(?)) ORDER BY v.created_at, v.revision_no"
)


def roll_back_broken(home: Home, agent_id: str, revision_ids: list[str], reason: Reason) -> list[str]:
    """Retire committed revisions whose artifact is gone for good, as a lost one is; the revisions restored.

    ``doctor --fix`` moves a tampered artifact to quarantine: its revision
    can never be served again, so it is marked ``corrupt`` exactly like a
    revision a power loss took (an active one's note returns to its newest
    intact predecessor, or is tombstoned; a superseded one just stops being
    required), audited with ``reason``. The caller holds the writer lock
    exclusively.
    """
    rows = [_Unsynced(*row) for row in home.catalog(agent_id).execute(
        SELECT_REVISIONS, (agent_id, json.dumps(sorted(revision_ids))))]
    restored = _roll_back(home, agent_id, rows, reason) if rows else []
    if restored:
        with contextlib.suppress(IntegrityError, StorageError):  # doctor reports what stays unindexed
            index_again(home, agent_id, restored)
    drain_quietly(home.state(), home.catalog(agent_id), agent_id)
    return restored


def _roll_back(home: Home, agent_id: str, lost: list[_Unsynced], reason: Reason = Reason.REVISION_LOST) -> list[str]:
    """Mark ``lost`` corrupt and give each note its newest intact revision back; the revisions restored.

    One transaction, oldest first, so a chain of lost revisions of one note
    walks back past all of them. A predecessor is verified before it is
    served again: one whose artifact is missing, unsafe or does not hash is
    passed over and retired on the way (audited ``revision-lost``), so a
    note is never left at a revision nobody can read.
    """
    catalog = home.catalog(agent_id)
    lost_ids = {row.revision_id for row in lost}
    restored: list[str] = []
    with immediate(catalog):
        for row in lost:
            catalog.execute("DELETE FROM unsynced_revisions WHERE revision_id = ?", (row.revision_id,))
            if row.state not in ("active", "superseded"):
                continue  # tombstoned since: nothing is served from it, nothing to restore
            _retire(catalog, agent_id, row.store_id, row.revision_id, reason)
            if row.state != "active":
                continue
            previous, passed_over = _newest_intact_before(
                catalog, row.revision_id, lost_ids, lambda candidate: _revision_intact(home, agent_id, candidate))
            if previous is None:
                catalog.execute("UPDATE resources SET state = 'tombstoned' WHERE resource_id = ? AND state = 'live'",
                                (row.resource_id,))
            else:
                for broken in passed_over:  # the schema reactivates only a revision whose successor is corrupt
                    _retire(catalog, agent_id, row.store_id, broken, Reason.REVISION_LOST)
                catalog.execute("UPDATE revisions SET state = 'active' WHERE revision_id = ?", (previous,))
                restored.append(previous)
    return restored


def _retire(catalog: apsw.Connection, agent_id: str, store_id: str, revision_id: str, reason: Reason) -> None:
    """A revision that can never be served again: marked ``corrupt``, audited with ``reason``."""
    catalog.execute("UPDATE revisions SET state = 'corrupt' WHERE revision_id = ?", (revision_id,))
    event_id = enqueue(catalog, agent_id, AuditEvent(
        operation="recover", decision="error", reason=reason, agent_id=agent_id,
        store_id=store_id, revision_id=revision_id))
    settle(catalog, event_id, decision="error", reason=reason)


def _revision_intact(home: Home, agent_id: str, revision_id: str) -> bool:
    """Whether a revision's artifact is there, safe, and hashes to the catalog: before it is served again."""
    found = [_Unsynced(*row) for row in home.catalog(agent_id).execute(
        SELECT_REVISIONS, (agent_id, json.dumps([revision_id])))]
    return len(found) == 1 and _intact(home, agent_id, found[0])


def _newest_intact_before(catalog: apsw.Connection, revision_id: str, lost_ids: set[str],
                          intact: Callable[[str], bool]) -> tuple[str | None, list[str]]:
    """The nearest superseded ancestor of ``revision_id`` that was not lost too and whose artifact is ``intact``,
    and the superseded ones passed over on the way because theirs is not.

    Checking the state alone once activated a predecessor whose artifact had
    gone missing (or was changed): a note nobody could read.
    """
    current = revision_id
    passed_over: list[str] = []
    for _ in range(100_000):  # a chain is finite; bound the walk anyway
        found = one(catalog, "SELECT base_revision_id FROM revisions WHERE revision_id = ?", (current,))
        base = found[0] if found is not None else None
        if base is None:
            return None, passed_over
        state = one(catalog, "SELECT state FROM revisions WHERE revision_id = ?", (base,))
        if state is None or state[0] not in ("corrupt", "superseded"):
            return None, passed_over
        if state[0] == "superseded" and base not in lost_ids:
            if intact(str(base)):
                return str(base), passed_over
            passed_over.append(str(base))
        current = base
    return None, passed_over
