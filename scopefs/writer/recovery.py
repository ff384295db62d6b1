"""Recovery and inspection: make the artifact area agree with the catalog.

``recover_pending_if_idle`` runs before writes: if no writer holds the lock,
every pending intent was abandoned by a crash and is settled now, and so
are the revisions committed without a disk sync whose page cache is gone
(``writer.unsynced``); ``recover_home`` settles only the latter, when a
mount, the API or a read starts. ``inspect`` is ``scopefs doctor``: it reports, and
with ``fix`` repairs, everything that does not match the catalog:

* pending intents of writers that died: rolled back, their files removed.
  A pending write was never acknowledged, and once its writer is gone
  nothing can prove its file's fsync succeeded (Linux reports a writeback
  error once, to the descriptors open at the time; a fresh fsync may return
  success over lost data). Completing it would retry and trust an fsync;
  rolling it back loses nothing anyone was promised;
* closes through a mount that died between placing their file and their
  one commit (``writer.placing``): the file removed, never acknowledged;
* staging leftovers (never committed content) of writers that died:
  removed. A staging file whose writer is alive holds an flock and is left
  alone, so doctor never disturbs a write that is still reading its input;
* files and directories in the artifact area that no revision or store
  names, and entries that are not plain single-link files: moved to the
  agent's quarantine, never into a readable place;
* revisions committed without a disk sync before a power loss or reboot:
  synced if their artifact verifies, rolled back to the revision before
  them if it does not (``writer.unsynced``);
* undrained audit outbox rows: drained;
* active revisions the search index does not cover (written before it
  existed, or embedded by a model that is no longer current): reindexed;
* committed revisions whose artifact is missing, unsafe or does not hash to
  the catalog: reported as integrity failures. They cannot be repaired from
  here and stay unreadable. A tampered artifact (changed behind the
  broker's back, say by hand in the artifact area) is moved by ``fix`` to
  the agent's quarantine as ``tampered-<revision_id>`` (a forget of the
  note removes it there too, ``writer.quarantine``, and so does ``fix``
  when that forget was killed after its commit); its catalog hash is
  never rewritten to match. The revision is retired as a lost one is
  (``writer.unsynced.roll_back_broken``, audited ``revision-tampered``):
  an active one's note returns to its newest intact revision (or is
  removed, with none), a superseded one stops being required, so doctor
  and ``scopefs backup`` are clean again.

Without ``fix`` nothing is changed. Findings carry our own ids only, never
content or user-chosen paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import apsw

from scopefs.catalog import broker_sessions, ids
from scopefs.catalog.artifacts import (
    check_locator,
    open_artifact,
    open_scopes_dir,
    open_store_dir,
    verify,
)
from scopefs.catalog.audit import drain, drain_quietly
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one, scalar
from scopefs.catalog.errors import IntegrityError, StorageError
from scopefs.catalog.fsafe import lock_held, open_dir, renameat2_noreplace
from scopefs.catalog.home import Home
from scopefs.catalog.index import catch_up, reindex, stale_count
from scopefs.catalog.reasons import Reason
from scopefs.writer import lock, placing, unsynced
from scopefs.writer.commit import roll_back
from scopefs.writer.quarantine import remove_tampered, tampered_copies, tampered_name
from scopefs.writer.scrub import scrub, unscrubbed

INTEGRITY_KINDS = frozenset({"missing-artifact", "tampered-artifact", "unsafe-artifact", "missing-store-dir"})
# What a finding left unfixed means for people, and what brings it back (doctor prints it).
HINTS = {
    "unscrubbed-forget": "a forget was interrupted before the catalog's index and log were rewritten without "
                         "the forgotten text; 'scopefs doctor --fix' (or the next forget) finishes it",
    "migration-backup": "a pre-migration backup (a full copy of the home as it was before 'scopefs migrate "
                        "--apply') is still present: 'forget' never reaches it. Its run has reached its cutover "
                        "(or a later run has, so no rollback needs it): 'scopefs doctor --fix' removes it",
    "migration-backup-pending": "a pre-migration backup of a run that has not reached its cutover (ref_id: its "
                                "plan digest) is still present: it holds a full copy of the home as it was before "
                                "'scopefs migrate --apply', which 'forget' never reaches. To end it, run the same "
                                "'scopefs migrate ... --apply --confirm DIGEST' again to finish the run (its cutover "
                                "removes the backup), or, once you decide not to roll back, remove "
                                "<home>/migrations/<first 32 characters of the digest>/; a later run's cutover also "
                                "lets 'scopefs doctor --fix' remove it",
    "expired-note": "a note past its valid-until (or superseded): denied to every reader; write it again to "
                    "renew it, or forget or remove it",
    "unindexed-revisions": "search cannot find some notes (never indexed, or a search found their artifact "
                           "tampered and retired their rows); 'scopefs doctor --fix', or a read that verifies "
                           "each one, indexes them again",
    "unsynced-revision": "a note saved without a sync before the last restart reached the disk intact; "
                         "'scopefs doctor --fix' (or the next write, mount or read) syncs it",
    "tampered-artifact": "an artifact was changed outside scopefs: it is never served or trusted; "
                         "'scopefs doctor --fix' moves it to the agent's quarantine and returns the note to its "
                         "newest intact revision (removes it, with none); restore a backup to get the lost "
                         "revision back",
    "missing-artifact": "the note's revision stays unavailable (EIO, exit 4): restore its artifact from a backup, "
                        "or write the note again",
    "lost-revision": "a note saved without a sync before a power loss did not reach the disk; "
                     "'scopefs doctor --fix' (or the next write, mount or read) returns it to the revision "
                     "before it",
    "broker-session": "an operator's command (migrate, quarantine release or purge, unpublish) was stopped before "
                      "it closed its own session (ref_id): nothing can use that session, and 'scopefs doctor "
                      "--fix' closes it",
    "unfinished-close": "a save through a mount stopped between placing its file and committing it (its mount "
                        "died): it was never acknowledged and no one can read the file; 'scopefs doctor --fix' "
                        "(or the next write) removes it",
    "close-marker": "a save through a mount committed, but its mount died before removing the marker it "
                    "left while saving; the save is there. 'scopefs doctor --fix' (or the next write) removes "
                    "the marker",
    "finished-intents": "write intents that finished, which scopefs versions before 2026-12-03 kept: they hold "
                        "nothing the revisions do not, and cost the catalog space and every save index work; "
                        "'scopefs doctor --fix' removes them",
}

# Finished intents removed per transaction: a batch holds the catalog's write lock for a fraction of a
# second (a deletion overwrites what it removes, ``secure_delete``), not for the whole sweep.
SWEEP_BATCH = 10_000


@dataclass(frozen=True)
class Finding:
    kind: str
    agent_id: str
    ref: str | None  # one of our ids (revision, store) or None
    action: str | None = None  # what --fix did; None when nothing was done
    notice: bool = False  # a fact to know, not a fault: it needs no fix and fails nothing
    hint_kind: str | None = None  # the HINTS entry, when one kind has states that are cleared differently

    @property
    def integrity(self) -> bool:
        return self.kind in INTEGRITY_KINDS

    @property
    def hint(self) -> str | None:
        """What the finding means and how to clear it, while nothing was done about it."""
        return HINTS.get(self.hint_kind or self.kind) if self.action is None else None


@dataclass(frozen=True)
class _Intent:
    intent_id: str
    revision_id: str
    resource_id: str
    base_revision_id: str | None
    staged_name: str
    final_locator: str
    expected_sha256: str
    event_id: str | None
    path_key: str


def _pending_intents(home: Home, agent_id: str) -> list[_Intent]:
    rows = home.catalog(agent_id).execute(
        "SELECT i.intent_id, i.revision_id, v.resource_id, v.base_revision_id, i.staged_name, i.final_locator,"
        " i.expected_sha256, i.event_id, r.path_key"
        " FROM write_intents i JOIN revisions v ON v.revision_id = i.revision_id"
        " JOIN stores s ON s.store_id = i.store_id JOIN storage_roots r ON r.storage_root_id = s.storage_root_id"
        " WHERE i.agent_id = ? AND v.agent_id = ? AND s.agent_id = ? AND i.state = 'pending' ORDER BY i.created_at",
        (agent_id, agent_id, agent_id),
    )
    return [_Intent(*row) for row in rows]


def _to_quarantine(home: Home, agent_id: str, dirfd: int, name: str, as_name: str | None = None) -> None:
    """Move ``name`` into the agent's quarantine, as ``as_name`` (a random name when None or taken)."""
    qfd = open_dir(home.quarantine_dir(agent_id))
    try:
        if as_name is None:
            renameat2_noreplace(dirfd, name, qfd, ids.random_token())
        else:
            try:
                renameat2_noreplace(dirfd, name, qfd, as_name)
            except FileExistsError:
                renameat2_noreplace(dirfd, name, qfd, f"{as_name}-{ids.random_token()}")
        os.fsync(qfd)
        os.fsync(dirfd)
    finally:
        os.close(qfd)


def _settle(home: Home, agent_id: str, intent: _Intent) -> str:
    """Roll back one abandoned intent and remove its files; returns what was done.

    Rows first, then files: if we die in between, the files are orphans that
    the next doctor removes, never a revision without its artifact.
    """
    check_locator(intent.staged_name)
    check_locator(intent.final_locator)
    if not roll_back(home.catalog(agent_id), agent_id, revision_id=intent.revision_id, intent_id=intent.intent_id,
                     event_id=intent.event_id, reason=Reason.REVISION_STALE):
        return "already settled"  # its revision left pending meanwhile: keep its file
    _remove_durably(open_dir(home.staging_dir(agent_id)), intent.staged_name)
    with contextlib.suppress(IntegrityError):  # no store directory: no final file either
        _remove_durably(open_store_dir(home, agent_id, intent.path_key), intent.final_locator)
    return "rolled back"


def _remove_durably(dirfd: int, name: str) -> None:
    """Unlink ``name`` if present and sync its directory; closes ``dirfd``."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dirfd)
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def _in_flight(dirfd: int, name: str) -> bool:
    """Whether a live writer holds this staging file (its flock)."""
    return lock_held(name, dir_fd=dirfd)


def _intent_in_flight(home: Home, agent_id: str, staging_fd: int, intent: _Intent) -> bool:
    """A live writer keeps its staged file flocked, before and after the rename."""
    if _in_flight(staging_fd, intent.staged_name):
        return True
    try:
        store_fd = open_store_dir(home, agent_id, intent.path_key)
    except IntegrityError:
        return False
    try:
        return _in_flight(store_fd, intent.final_locator)
    finally:
        os.close(store_fd)


def recover_pending_if_idle(home: Home, agent_id: str) -> int:
    """Settle abandoned intents and closes' markers, and unsynced revisions of a page cache that is gone,
    when no writer is active; returns how many intents (markers are not counted)."""
    catalog = home.catalog(agent_id)
    pending = one(catalog, "SELECT 1 FROM write_intents WHERE agent_id = ? AND state = 'pending' LIMIT 1", (agent_id,))
    restarted = unsynced.restarted(home, agent_id)
    if pending is None and not restarted and not placing.any_left(home, agent_id):
        return 0
    staging_fd = open_dir(home.staging_dir(agent_id))
    try:
        with lock.exclusive(home.lock_path(agent_id), wait=False) as held:
            if not held:
                return 0
            for marker in placing.markers(staging_fd):  # listed again under the lock: none has a live writer
                placing.settle(home, agent_id, staging_fd, marker)
            intents = _pending_intents(home, agent_id)
            for intent in intents:
                _settle(home, agent_id, intent)
            if restarted:
                unsynced.settle_restarted(home, agent_id)
            return len(intents)
    finally:
        os.close(staging_fd)


def recover_home(home: Home) -> int:
    """Settle the unsynced revisions of a page cache that is gone, in every cell, when no writer is active.

    What a mount, the API server and a read do first, so that a save a
    power loss took is rolled back rather than refused as tampered. Pending
    intents are left to the next write and to doctor. Returns how many
    revisions were settled.
    """
    settled = 0
    for cell in home.cells():
        if unsynced.restarted(home, cell):
            with lock.exclusive(home.lock_path(cell), wait=False) as held:
                if held:
                    settled += len(unsynced.settle_restarted(home, cell))
    return settled


def drain_home(home: Home) -> None:
    """Deliver the audit rows saves left in every cell's outbox (a mount that died before its batch)."""
    for cell in home.cells():
        drain_quietly(home.state(), home.catalog(cell), cell)


def _names(dirfd: int) -> Iterator[os.DirEntry[str]]:
    with os.scandir(dirfd) as entries:
        yield from sorted(entries, key=lambda e: e.name)


def _inspect_store(home: Home, agent_id: str, store_id: str, path_key: str, fix: bool,
                   lost: frozenset[str], placed: set[str]) -> list[Finding]:
    catalog = home.catalog(agent_id)
    findings: list[Finding] = []
    tampered: list[str] = []
    revisions = {
        row[0]: (row[1], row[2], row[3], row[4])
        for row in catalog.execute(
            "SELECT v.locator, v.revision_id, v.state, v.content_sha256, v.size FROM revisions v"
            " JOIN resources r ON r.resource_id = v.resource_id"
            " WHERE v.agent_id = ? AND r.agent_id = ? AND r.store_id = ? AND v.state != 'rolled-back'",
            (agent_id, agent_id, store_id),
        )
    }
    try:
        store_fd = open_store_dir(home, agent_id, path_key)
    except IntegrityError:
        committed = any(state in ("active", "superseded") for _, state, _, _ in revisions.values())
        if committed:
            return [Finding("missing-store-dir", agent_id, store_id)]
        action = None
        if fix:  # nothing was ever committed there: an empty directory is the whole repair
            scopes_fd = open_scopes_dir(home, agent_id)
            try:
                os.mkdir(path_key, 0o700, dir_fd=scopes_fd)
                os.fsync(scopes_fd)
            finally:
                os.close(scopes_fd)
            action = "recreated"
        return [Finding("empty-store-dir-missing", agent_id, store_id, action)]
    forgotten = {str(r[0]) for r in catalog.execute(
        "SELECT f.revision_id FROM forgotten_revisions f JOIN revisions v USING (revision_id)"
        " JOIN resources r ON r.resource_id = v.resource_id WHERE f.agent_id = ? AND r.store_id = ?",
        (agent_id, store_id))}
    try:
        for entry in _names(store_fd):
            known = revisions.get(entry.name)
            if known is not None and known[0] in forgotten:  # a forget died before its files went
                removed = None
                if fix:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=store_fd)
                    os.fsync(store_fd)
                    removed = "removed"
                findings.append(Finding("forgotten-artifact", agent_id, known[0], removed))
                continue
            if known is None:
                if entry.name in placed or (not fix and lock_held(entry.name, dir_fd=store_fd)):
                    continue  # a close's file: reported with its marker, or still in flight
                moved = None
                if fix:
                    _to_quarantine(home, agent_id, store_fd, entry.name)
                    moved = "quarantined"
                kind = "orphan-file" if entry.is_file(follow_symlinks=False) else "unexpected-entry"
                findings.append(Finding(kind, agent_id, store_id, moved))
        for locator, (revision_id, state, sha256, size) in revisions.items():
            if state not in ("active", "superseded") or revision_id in lost:
                continue
            check_locator(locator)
            try:
                fd = open_artifact(store_fd, locator)
            except IntegrityError as exc:
                missing = isinstance(exc.__cause__, FileNotFoundError)
                if missing and fix and _quarantined_as_tampered(home, agent_id, revision_id):
                    tampered.append(revision_id)  # a fix that died between the move and the roll-back
                    findings.append(Finding("tampered-artifact", agent_id, revision_id, "rolled back"))
                    continue
                findings.append(Finding("missing-artifact" if missing else "unsafe-artifact", agent_id, revision_id))
                continue
            try:
                verify(fd, size, sha256)
            except IntegrityError:
                moved = None
                if fix:  # moved aside, never re-hashed: the revision is retired below, as a lost one is
                    _to_quarantine(home, agent_id, store_fd, locator, tampered_name(revision_id))
                    tampered.append(revision_id)
                    moved = "quarantined, rolled back"
                findings.append(Finding("tampered-artifact", agent_id, revision_id, moved))
            finally:
                os.close(fd)
    finally:
        os.close(store_fd)
    if tampered:
        unsynced.roll_back_broken(home, agent_id, tampered, Reason.REVISION_TAMPERED)
    return findings


def _forgotten_copies(home: Home, agent_id: str, fix: bool) -> list[Finding]:
    """Quarantined tampered copies of forgotten revisions: a forget killed after its commit left them.

    They are (a changed version of) the forgotten text, so they go as the
    forgotten artifacts in the store directories do.
    """
    copies = tampered_copies(home, agent_id)
    if not copies:
        return []
    forgotten = sorted(str(r[0]) for r in home.catalog(agent_id).execute(
        "SELECT revision_id FROM forgotten_revisions WHERE agent_id = ?"
        " AND revision_id IN (SELECT value FROM json_each(?))", (agent_id, json.dumps(sorted(copies)))))
    action = None
    if fix and forgotten:
        remove_tampered(home, agent_id, forgotten)
        action = "removed"
    return [Finding("forgotten-artifact", agent_id, revision_id, action) for revision_id in forgotten]


def _quarantined_as_tampered(home: Home, agent_id: str, revision_id: str) -> bool:
    """Whether a fix moved this revision's artifact aside (under either name ``_to_quarantine`` gives)."""
    return bool(tampered_copies(home, agent_id, [revision_id]))


def inspect(home: Home, agent_id: str, *, fix: bool) -> list[Finding]:
    """Doctor for one agent. With ``fix`` it holds the writer lock throughout."""
    if fix:
        with lock.exclusive(home.lock_path(agent_id), wait=True):
            return _inspect(home, agent_id, fix=True)
    return _inspect(home, agent_id, fix=False)


def _inspect(home: Home, agent_id: str, *, fix: bool) -> list[Finding]:
    catalog = home.catalog(agent_id)
    findings: list[Finding] = []
    pending = _pending_intents(home, agent_id)
    staging_fd = open_dir(home.staging_dir(agent_id))
    try:
        for intent in pending:
            if not fix and _intent_in_flight(home, agent_id, staging_fd, intent):
                continue  # a live writer is between its two commits
            findings.append(Finding("pending-intent", agent_id, intent.revision_id,
                                    _settle(home, agent_id, intent) if fix else None))
        settled = unsynced.settle_restarted(home, agent_id) if fix else unsynced.inspect_restarted(home, agent_id)
        for one_settled in settled:
            action = ("rolled back to the revision before it" if one_settled.lost else "synced") if fix else None
            findings.append(Finding("lost-revision" if one_settled.lost else "unsynced-revision", agent_id,
                                    one_settled.revision_id, action))
        placed, marked = set(), set()
        for marker in placing.markers(staging_fd):
            if not fix and placing.in_flight(home, agent_id, staging_fd, marker):
                continue  # a live close between its marker and its commit
            placed.add(marker.locator)  # reported here, not again as an orphan file of its store,
            marked.add(marker.staged_name)  # nor as a staging leftover
            kind = "close-marker" if placing.committed(home, agent_id, marker) else "unfinished-close"
            findings.append(Finding(kind, agent_id, None,
                                    placing.settle(home, agent_id, staging_fd, marker) if fix else None))
        part_of_intents = {i.staged_name for i in pending}
        for entry in _names(staging_fd):
            if placing.is_marker(entry.name) or entry.name in marked:
                continue  # a close's marker and its staged file, handled above
            if entry.name in part_of_intents and not fix:
                continue  # reported with its intent
            if entry.is_file(follow_symlinks=False) and _in_flight(staging_fd, entry.name):
                continue  # a live writer is still staging it
            action = None
            if fix:
                if entry.is_dir(follow_symlinks=False):
                    _to_quarantine(home, agent_id, staging_fd, entry.name)
                    action = "quarantined"
                else:
                    try:
                        os.unlink(entry.name, dir_fd=staging_fd)
                    except FileNotFoundError:
                        continue  # its writer removed it meanwhile: nothing left to report
                    action = "removed"
            findings.append(Finding("staging-leftover", agent_id, None, action))
    finally:
        os.close(staging_fd)
    stores = {
        row[0]: row[1]
        for row in catalog.execute(
            "SELECT r.path_key, s.store_id FROM stores s JOIN storage_roots r ON r.storage_root_id = s.storage_root_id"
            " WHERE s.agent_id = ? AND r.agent_id = ?",
            (agent_id, agent_id),
        )
    }
    scopes_fd = open_scopes_dir(home, agent_id)
    try:
        present = set()
        for entry in _names(scopes_fd):
            if entry.name in stores and entry.is_dir(follow_symlinks=False):
                present.add(entry.name)
                continue
            action = None
            if fix:
                if entry.is_dir(follow_symlinks=False) and not any(True for _ in _names_of(scopes_fd, entry.name)):
                    os.rmdir(entry.name, dir_fd=scopes_fd)
                    action = "removed"
                else:
                    _to_quarantine(home, agent_id, scopes_fd, entry.name)
                    action = "quarantined"
            findings.append(Finding("orphan-store-dir" if entry.is_dir(follow_symlinks=False) else "unexpected-entry",
                                    agent_id, None, action))
    finally:
        os.close(scopes_fd)
    lost = frozenset(s.revision_id for s in settled if s.lost)  # reported above, not as tampering
    for path_key, store_id in stores.items():
        findings.extend(_inspect_store(home, agent_id, store_id, path_key, fix, lost, placed))
    findings += _forgotten_copies(home, agent_id, fix)
    if fix:
        catch_up(home, agent_id)  # what a killed mount left queued; a search would do it too
    if stale_count(catalog, agent_id):  # e.g. notes written before the index existed (schema V2)
        action = None
        if fix:
            failed = reindex(home, agent_id, only_stale=True).failed
            action = "reindexed" + (f" ({len(failed)} failed verification and stay unsearchable)" if failed else "")
        findings.append(Finding("unindexed-revisions", agent_id, None, action))
    findings += _migration_backups(home, agent_id, fix)
    findings += [Finding("expired-note", agent_id, revision_id, notice=True)
                 for revision_id in expired_revisions(catalog, agent_id, now_us())]
    if unscrubbed(catalog, agent_id):  # a forget died before its text left the catalog's files
        findings.append(Finding("unscrubbed-forget", agent_id, None,
                                ("scrubbed" if scrub(catalog, agent_id) else None) if fix else None))
    ready = scalar(catalog, "SELECT count(*) FROM audit_outbox WHERE agent_id = ? AND state = 'ready'", (agent_id,))
    if ready:
        action = None
        if fix:
            drain(home.state(), catalog, agent_id)
            action = "drained"
        findings.append(Finding("undrained-audit", agent_id, None, action))
    if one(catalog, "SELECT 1 FROM write_intents WHERE agent_id = ? AND state = 'done' LIMIT 1", (agent_id,)):
        findings.append(Finding("finished-intents", agent_id, None,
                                _sweep_finished_intents(catalog, agent_id) if fix else None, notice=True))
    findings += [Finding("broker-session", agent_id, session_id,
                         _close_broker_session(home, agent_id, session_id) if fix else None, notice=True)
                 for session_id in broker_sessions.stale(home, agent_id)]
    return findings


def _close_broker_session(home: Home, agent_id: str, session_id: str) -> str:
    """Close a broker session whose run was killed before it could (``catalog.broker_sessions``)."""
    return "closed" if broker_sessions.close_stale(home, agent_id, session_id) else "closed already"


def _sweep_finished_intents(catalog: apsw.Connection, agent_id: str) -> str:
    """Remove the 'done' intents older versions kept (a finished write now deletes its own), a batch per
    transaction; what was done, for the finding."""
    removed = 0
    while True:
        with immediate(catalog):
            catalog.execute("DELETE FROM write_intents WHERE rowid IN (SELECT rowid FROM write_intents"
                            " WHERE agent_id = ? AND state = 'done' LIMIT ?)", (agent_id, SWEEP_BATCH))
            batch = catalog.changes()
        removed += batch
        if batch < SWEEP_BATCH:
            return f"removed {removed}"


def migration_run_dir(home: Home, plan_digest: str) -> Path:
    """Where a migration run keeps its backup of the home (``writer.migrate``)."""
    return home.root / "migrations" / plan_digest[:32]


def drop_migration_backup(home: Home, plan_digest: str) -> None:
    """Remove a run's backup (and a half-made one): only once no rollback needs it (its own cutover, or a later
    run's, is recorded). OSError if it stays."""
    run_dir = migration_run_dir(home, plan_digest)
    for name in ("backup", "backup.partial"):
        if (run_dir / name).exists():
            shutil.rmtree(run_dir / name)
    with contextlib.suppress(FileNotFoundError):
        run_dir.rmdir()
        fd = open_dir(str(run_dir.parent))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _migration_backups(home: Home, agent_id: str, fix: bool) -> list[Finding]:
    """A notice per migration run of this agent whose backup is still on disk; ``fix`` drops it once no
    rollback needs it: after its own cutover, or after the cutover of a run started later.

    A run that never reached its cutover keeps its backup for a resume or a
    rollback, but a rollback is only offered before cutover: once a later
    run of the same agent has cut over, going back to the older copy is
    moot, and the copy would only keep every since-forgotten note's bytes.
    """
    findings = []
    runs = [(str(row[0]), row[1], cast(int, row[2])) for row in home.catalog(agent_id).execute(
        "SELECT plan_digest, cutover_at, started_at FROM migration_runs WHERE agent_id = ? ORDER BY started_at",
        (agent_id,))]
    last_cutover_start = max((started_at for _, cutover_at, started_at in runs if cutover_at is not None),
                             default=None)
    for digest, cutover_at, started_at in runs:
        run_dir = migration_run_dir(home, digest)
        if not ((run_dir / "backup").exists() or (run_dir / "backup.partial").exists()):
            continue
        superseded = last_cutover_start is not None and started_at < last_cutover_start
        droppable = cutover_at is not None or superseded
        action = None
        if fix and droppable:
            try:
                drop_migration_backup(home, digest)
                action = "removed"
            except OSError:
                action = None
        findings.append(Finding("migration-backup", agent_id, digest, action, notice=True,
                                hint_kind=None if droppable else "migration-backup-pending"))
    return findings


def _names_of(dirfd: int, name: str) -> list[str]:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def expired_revisions(catalog: apsw.Connection, agent_id: str, now: int) -> list[str]:
    """Active revisions of live notes past their validity (``writer.facts``): denied already, reported here."""
    return [str(r[0]) for r in catalog.execute(
        "SELECT v.revision_id FROM revision_validity x JOIN revisions v USING (revision_id)"
        " JOIN resources r ON r.resource_id = v.resource_id"
        " WHERE x.agent_id = ? AND x.valid_until <= ? AND v.state = 'active' AND r.state = 'live'"
        " ORDER BY x.valid_until", (agent_id, now))]


def exit_code(findings: list[Finding]) -> int:
    """0 clean; 4 an integrity failure remains; 1 other findings left unfixed."""
    if any(f.integrity for f in findings):
        return IntegrityError.exit_code
    if any(f.action is None and not f.notice for f in findings):
        return StorageError.exit_code
    return 0

