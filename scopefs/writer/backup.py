"""``scopefs backup``: a consistent snapshot of a live home, while its mounts keep serving and writing.

What a backup holds, laid out like a home (``catalog.home``) plus a manifest:

* every database through SQLite's online backup, each in one step (one
  read transaction, so one consistent point per file; writers are never
  blocked under WAL). The catalogs go first and ``state.sqlite`` last: an
  audit row a catalog's outbox handed on meanwhile is then in the state
  copy or still "ready" in the catalog copy (delivery is idempotent), never
  lost between the two; a cell the state copy names that was added after
  the first look is snapshotted after it;
* the artifact of every committed revision a restored home could serve or
  show in history (active and superseded), and the kept files of removed
  notes (tombstoned, not forgotten) when they still verify. Artifacts are
  immutable per locator, so copying them after their catalog's snapshot is
  consistent; each is hashed as it is copied and must match the snapshot.
  One that no longer does because the live catalog moved on (a ``forget``
  unlinked it between the snapshot and the copy) makes that cell snapshot
  again, and what the new snapshot no longer names leaves the backup. After
  the state snapshot, and again as the last step before DEST is put in
  place, every cell's live forgets are compared with its copy's; a cell
  that forgot something since is taken again (then the state database),
  until nothing moved (bounded: ``SNAPSHOT_ATTEMPTS``). So a forget
  acknowledged before that last look is never undone by the backup; a
  revocation made later may or may not be in it. A committed
  artifact that does not verify in the live home fails the backup (exit 4):
  a backup that could not be restored is never written. Staging files,
  quarantine, locks, mount registries and ``api.key`` are never copied;
* ``hmac.key``, so a restored home resolves the same bindings;
* ``manifest.json``: the format and version, the cells, the schema versions,
  and the SHA-256 and size of every database, the key and every artifact
  (an artifact's hash is its catalog's). Its own SHA-256 is the digest the
  command reports.

The backup is built in a 0700 sibling of DEST and renamed onto it at the
end: DEST holds a whole backup or nothing. Files are 0600. A sibling a
killed run left is removed by the next run to the same DEST
(``work_folder``). A DEST that is
not empty, or whose permissions were loosened, is refused before anything
is written (exit 2). A forget done after a backup does not reach into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.artifacts import check_locator, check_path_key, open_artifact_stat, open_store_dir
from scopefs.catalog.audit import AuditEvent, record
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import STORAGE_FAILURES, one
from scopefs.catalog.digests import HASH_CHUNK
from scopefs.catalog.errors import BadInput, IntegrityError, StorageError
from scopefs.catalog.fsafe import fsync_dir
from scopefs.catalog.home import HMAC_KEY_BYTES, Home, pool_cell, read_secret
from scopefs.catalog.readjournal import replay
from scopefs.catalog.reasons import Reason
from scopefs.catalog.schema import current_version
from scopefs.writer.scrub import scrub, unscrubbed
from scopefs.writer.steps import Step, checkpoint

FORMAT = "scopefs-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SNAPSHOT_ATTEMPTS = 5  # per cell: a forget racing every attempt is an operator to ask, not a loop to spin
Progress = Callable[[str], None]

# What a backup carries of one cell: (store key, locator, sha256, size, required).
# Required: active and superseded revisions (what doctor checks, what can be served or shown in history).
_ARTIFACTS = (
    "SELECT r.path_key, v.locator, v.content_sha256, v.size, v.state IN ('active', 'superseded')"
    " FROM revisions v JOIN resources res ON res.resource_id = v.resource_id"
    " JOIN stores s ON s.store_id = res.store_id JOIN storage_roots r ON r.storage_root_id = s.storage_root_id"
    " WHERE v.agent_id = ? AND v.state IN ('active', 'superseded', 'tombstoned')"
    " AND NOT EXISTS (SELECT 1 FROM forgotten_revisions f WHERE f.revision_id = v.revision_id)"
    " ORDER BY r.path_key, v.locator"
)


@dataclass(frozen=True)
class Artifact:
    cell: str
    store_key: str
    locator: str
    sha256: str
    size: int
    required: bool


@dataclass(frozen=True)
class BackupReport:
    dest: Path
    cells: tuple[str, ...]
    artifacts: int  # copied
    artifact_bytes: int
    database_bytes: int
    skipped: int  # kept files of removed notes that no longer verify in the live home: left out
    resnapshots: int  # cells snapshotted again because a forget moved them on during the copy
    manifest_sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"dest": str(self.dest), "cells": list(self.cells), "artifacts": self.artifacts,
                "artifact_bytes": self.artifact_bytes, "database_bytes": self.database_bytes,
                "skipped": self.skipped, "resnapshots": self.resnapshots, "manifest_sha256": self.manifest_sha256,
                "format_version": FORMAT_VERSION}


def check_private_dir(path: Path, what: str) -> None:
    """Refuse (bad input) a directory that is not ours alone, as the home refuses its own (``catalog.home``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise BadInput(f"{what} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{what} is not a directory")
    if st.st_uid != os.geteuid():
        raise BadInput(f"{what} is owned by another user; refusing to use it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise BadInput(f"{what} is accessible to others (mode {stat.S_IMODE(st.st_mode):o}, want 700);"
                       " refusing to use it")


def check_target(target: Path, what: str) -> None:
    """A place a backup or a restored home may be made: absent, or an empty private directory; its parent exists."""
    if not target.parent.is_dir():
        raise BadInput(f"the folder that should hold the {what} does not exist")
    if not os.path.lexists(target):
        return
    check_private_dir(target, f"the {what}")
    if any(True for _ in os.scandir(target)):
        raise BadInput(f"the {what} is not empty; refusing to write into it")


def check_apart(target: Path, other: Path, what: str, other_what: str) -> None:
    """Refuse a target inside (or holding) a directory it must stay apart from: the home, the backup."""
    a, b = Path(os.path.realpath(target)), Path(os.path.realpath(other))
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        raise BadInput(f"the {what} must not be inside {other_what} (or hold it)")


LEFTOVER_AGE_S = 600  # a ".new" folder older than this is no run's in the making: a killed one left it


@contextlib.contextmanager
def work_folder(target: Path, purpose: str, say: Progress) -> Iterator[Path]:
    """A fresh 0700 directory next to ``target`` to build the result in (same filesystem, so the final
    rename is atomic); removed if the block raises. The caller renames it onto ``target``.

    A run killed before that rename (SIGKILL, a power cut) leaves the folder behind, and it holds a
    whole copy of the memory. So the folder is locked (``flock``) for as long as the block runs, and
    every run first removes the folders for the same ``target`` and ``purpose`` that no live run
    holds (``_sweep_unheld``). The folder gets its name only once locked: it is made under a
    ``.new`` name that the sweep leaves alone while it is young. On a filesystem without locks
    (``ENOLCK``) the run goes on unlocked, and no sweep there can lock, so none removes anything.
    """
    removed = _sweep_unheld(target, purpose)
    if removed:
        say(f"removed {removed} unfinished {purpose} folder(s) a killed run left beside {target.name}")
    token = ids.random_token()
    fresh = target.parent / f".{target.name}.{purpose}-{token}.new"
    path = target.parent / f".{target.name}.{purpose}-{token}"
    fresh.mkdir(mode=0o700)
    fd = -1
    try:
        fd = os.open(fresh, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # BlockingIOError cannot be (the folder is new): ENOLCK
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(fresh, path)  # the lock goes with the directory, under every later name too
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            fresh.rmdir()
        raise
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def _sweep_unheld(target: Path, purpose: str) -> int:
    """Remove the work folders of ``target`` and ``purpose`` that no live run holds; how many.

    Only names of exactly the shape ``work_folder`` gives (its prefix and a ``random_token``) are
    looked at, and only folders of this user that can be locked now and are still, by name, the
    folder that was locked. Never fails the run: what cannot be looked at or removed stays."""
    shape = re.compile(re.escape(f".{target.name}.{purpose}-") + f"[a-z2-7]{{{len(ids.random_token())}}}"
                       + r"(\.new)?")
    try:
        parent = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0  # the target's parent is checked (and reported) by the caller
    removed = 0
    try:
        for name in os.listdir(parent):
            if shape.fullmatch(name) is None:
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError:
                continue  # not a folder (a link, a file): nothing of ours
            try:
                held = os.fstat(fd)
                if held.st_uid != os.geteuid():
                    continue
                if name.endswith(".new"):  # a run in the making, or an empty one a killed run left
                    if time.time() - held.st_mtime > LEFTOVER_AGE_S:
                        os.rmdir(name, dir_fd=parent)  # fails, and stays, unless empty
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a run in progress
                if not os.path.samestat(held, os.stat(name, dir_fd=parent, follow_symlinks=False)):
                    continue  # renamed away and replaced since it was opened: not what was locked
                shutil.rmtree(name, dir_fd=parent)
                removed += 1
            except OSError:
                continue  # removing a leftover is a courtesy: it never fails the run
            finally:
                os.close(fd)
    finally:
        os.close(parent)
    return removed


def put_atomically(built: Path, target: Path) -> None:
    """Rename ``built`` onto ``target`` (absent, or an empty directory) and make the name durable."""
    fsync_dir(built)
    try:
        os.rename(built, target)
    except OSError as exc:  # someone filled the target meanwhile: nothing of ours is there
        raise BadInput(f"cannot put the result in place ({os.strerror(exc.errno or 0)}); nothing was changed") from exc
    fsync_dir(target.parent)


def new_file(path: Path) -> int:
    """A new 0600 file, created exclusively, never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def copy_hashed(src: int, src_size: int, target: Path, size: int | None, sha256: str) -> bool:
    """Copy the open file ``src`` to a new file at ``target`` while hashing it; whether it was exactly
    ``size`` bytes (None: any) hashing to ``sha256``, and then synced. A failed copy leaves no file: a
    backup or a restored home never holds bytes that did not verify."""
    ok = False
    out = new_file(target)
    try:
        if size is None or src_size == size:
            digest, offset = hashlib.sha256(), 0
            while chunk := os.pread(src, HASH_CHUNK, offset):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
                offset += len(chunk)
                if size is not None and offset > size:  # grew meanwhile: not the snapshot's
                    break
            ok = (size is None or offset == size) and digest.hexdigest() == sha256
        if ok:
            os.fsync(out)
    finally:
        os.close(out)
        if not ok:
            os.unlink(target)
    return ok


def write_file(path: Path, data: bytes) -> None:
    fd = new_file(path)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def cell_dir(root: Path, cell: str) -> Path:
    """A cell's directory under ``root``, exactly where ``Home.agent_dir`` puts it."""
    return Home(root).agent_dir(cell)


def snapshot_db(source: apsw.Connection, target: Path) -> None:
    """SQLite's online backup of ``source`` into a new 0600 file, in one step: one consistent point.

    The copy is left in rollback-journal mode, one self-contained file; a
    restored home's first open turns it back to WAL (``catalog.db``).
    """
    os.close(new_file(target))
    dest = apsw.Connection(str(target), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        try:
            with dest.backup("main", source, "main") as step:
                while not step.done:
                    step.step(-1)
        except STORAGE_FAILURES as exc:
            raise StorageError(f"cannot snapshot a database: {exc.__class__.__name__}") from exc
        dest.execute("PRAGMA journal_mode=DELETE").fetchall()
    finally:
        dest.close()


def _scrub_snapshot(path: Path, cell: str) -> None:
    """Leave no forgotten text in a snapshot taken before its forget finished scrubbing (``writer.scrub``)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        conn.execute("PRAGMA trusted_schema=OFF")
        if unscrubbed(conn, cell):
            scrub(conn, cell)
            conn.execute("VACUUM")
    finally:
        conn.close()


def artifacts_of(catalog_path: Path, cell: str) -> tuple[list[str], list[Artifact]]:
    """The store keys of a catalog copy, and the artifacts a backup of it carries."""
    conn = apsw.Connection(str(catalog_path), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        keys = [check_path_key(str(r[0])) for r in conn.execute(
            "SELECT path_key FROM storage_roots WHERE agent_id = ? ORDER BY path_key", (cell,))]
        found = [Artifact(cell, check_path_key(str(r[0])), check_locator(str(r[1])), str(r[2]), int(r[3]), bool(r[4]))
                 for r in conn.execute(_ARTIFACTS, (cell,))]
    finally:
        conn.close()
    return keys, found


def _cells_of(state_path: Path) -> list[str]:
    conn = apsw.Connection(str(state_path), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        agents = [str(r[0]) for r in conn.execute("SELECT agent_id FROM agents ORDER BY agent_id")]
        pools = [pool_cell(str(r[0])) for r in conn.execute("SELECT pool_name FROM pools ORDER BY pool_name")]
    finally:
        conn.close()
    return [*agents, *pools]


class _Moved(Exception):
    """The live catalog moved on past the snapshot (a forget): snapshot the cell again."""


@dataclass
class _Copier:
    """Copies one cell's artifacts from the live home, hashing each against the snapshot."""

    home: Home
    root: Path
    copied: dict[tuple[str, str, str], Artifact] = field(default_factory=dict)
    failed: int = 0
    skipped: int = 0

    def copy_cell(self, cell: str, keys: list[str], wanted: list[Artifact]) -> None:
        scopes = cell_dir(self.root, cell) / "memory-scopes" / "v1"
        for key in keys:
            (scopes / key).mkdir(mode=0o700, exist_ok=True)
        names = {(a.cell, a.store_key, a.locator) for a in wanted}
        for name in [n for n in self.copied if n[0] == cell and n not in names]:  # no longer named: out
            with contextlib.suppress(FileNotFoundError):
                os.unlink(scopes / name[1] / name[2])
            del self.copied[name]
        moved = False
        for artifact in wanted:
            name = (cell, artifact.store_key, artifact.locator)
            if name in self.copied:
                continue  # immutable per locator: the copy made before the resnapshot stands
            if self._copy_one(artifact, scopes / artifact.store_key / artifact.locator):
                self.copied[name] = artifact
            elif self._still_committed(artifact):
                if artifact.required:
                    self.failed += 1
                else:
                    self.skipped += 1
            else:
                moved = True
        for key in keys:
            fsync_dir(scopes / key)
        if moved:
            raise _Moved()

    def _copy_one(self, artifact: Artifact, target: Path) -> bool:
        """Copy while hashing; whether the bytes were the snapshot's. A failed copy leaves no file."""
        try:
            store_fd = open_store_dir(self.home, artifact.cell, artifact.store_key)
        except IntegrityError:
            return False
        try:
            src, st = open_artifact_stat(store_fd, artifact.locator)
        except IntegrityError:
            return False
        finally:
            os.close(store_fd)
        try:
            return copy_hashed(src, st.st_size, target, artifact.size, artifact.sha256)
        finally:
            os.close(src)

    def _still_committed(self, artifact: Artifact) -> bool:
        """Whether the live catalog still keeps this revision's file (not forgotten, not lost meanwhile)."""
        row = one(self.home.catalog(artifact.cell),
                  "SELECT v.state, EXISTS (SELECT 1 FROM forgotten_revisions f WHERE f.revision_id = v.revision_id)"
                  " FROM revisions v WHERE v.agent_id = ? AND v.locator = ?", (artifact.cell, artifact.locator))
        return row is not None and row[0] in ("active", "superseded", "tombstoned") and not row[1]


def _catalog_path(root: Path, cell: str) -> Path:
    return cell_dir(root, cell) / "catalog.sqlite"


def _make_cell_dirs(root: Path, cell: str) -> None:
    path = cell_dir(root, cell)
    for folder in (path.parent, path, path / "memory-scopes", path / "memory-scopes" / "v1"):
        folder.mkdir(mode=0o700, exist_ok=True)


def _snapshot_cell(home: Home, root: Path, cell: str) -> tuple[list[str], list[Artifact]]:
    _make_cell_dirs(root, cell)
    target = _catalog_path(root, cell)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    snapshot_db(home.catalog(cell), target)
    _scrub_snapshot(target, cell)
    found = artifacts_of(target, cell)
    checkpoint(Step.BACKUP_SNAPSHOT)
    return found


def _back_up_cell(home: Home, root: Path, cell: str, copier: _Copier) -> int:
    """Snapshot one cell and copy its artifacts, again while a forget keeps moving it on; how many resnapshots."""
    for attempt in range(SNAPSHOT_ATTEMPTS):
        keys, wanted = _snapshot_cell(home, root, cell)
        try:
            copier.copy_cell(cell, keys, wanted)
            checkpoint(Step.BACKUP_CELL_DONE)
            return attempt
        except _Moved:
            continue
    raise StorageError("the home kept changing under the backup (notes forgotten during every attempt); try again")


_FORGET_MARK = "SELECT (SELECT count(*) FROM forgets), (SELECT count(*) FROM forgotten_revisions)"


def _forget_mark(conn: apsw.Connection) -> tuple[int, int]:
    """How far a catalog's forgets have gone: both counts only grow (a forget is never undone)."""
    row = one(conn, _FORGET_MARK)
    assert row is not None
    return int(row[0]), int(row[1])


def _copy_forget_mark(root: Path, cell: str) -> tuple[int, int]:
    conn = apsw.Connection(str(_catalog_path(root, cell)), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        return _forget_mark(conn)
    finally:
        conn.close()


def _forgotten_since(home: Home, root: Path, cells: list[str]) -> list[str]:
    """The cells whose live catalog forgot something after their copy was taken."""
    return [c for c in cells if _forget_mark(home.catalog(c)) != _copy_forget_mark(root, c)]


def _back_up_databases(home: Home, root: Path, copier: _Copier, say: Progress, cells: list[str],
                       pending: list[str]) -> int:
    """The ``pending`` catalogs, then ``state.sqlite``, until no forget moved a copied cell on; resnapshots.

    ``cells`` (the cells copied so far) grows with every cell taken.

    A cell is never looked at again once copied unless this asks: a forget
    acknowledged while later cells (or the state database) were copied
    would otherwise be missing from the backup and its note restored whole.
    A cell taken again is taken before a new state snapshot, so the state
    copy stays the newest file (an audit row handed on meanwhile is in one
    of the two copies).
    """
    resnapshots = 0
    say(f"snapshotting {len(pending)} catalog(s) and copying their artifacts")
    for _ in range(SNAPSHOT_ATTEMPTS):
        for cell in pending:
            resnapshots += cell in cells
            resnapshots += _back_up_cell(home, root, cell, copier)
            if cell not in cells:
                cells.append(cell)
        say("snapshotting the state database")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / "state.sqlite")
        snapshot_db(home.state(), root / "state.sqlite")
        # A cell added after the first look: its catalog is taken after the state copy names it.
        late = [c for c in _cells_of(root / "state.sqlite") if c not in cells]
        pending = late + _forgotten_since(home, root, cells)
        if not pending:
            return resnapshots
        say(f"{len(pending)} cell(s) changed meanwhile (added, or a note forgotten): taking them again")
    raise StorageError("the home kept changing under the backup (notes forgotten during every attempt); try again")


def build_manifest(root: Path, cells: list[str], artifacts: list[Artifact]) -> dict[str, Any]:
    databases = []
    for rel in ["state.sqlite", *(str(_catalog_path(root, c).relative_to(root)) for c in cells)]:
        sha, size = file_sha256(root / rel)
        databases.append({"path": rel, "sha256": sha, "size": size})
    key_sha, _ = file_sha256(root / "hmac.key")
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "created_at_us": now_us(),
        "schemas": {"state": _version(root / "state.sqlite"),
                    "catalog": {c: _version(_catalog_path(root, c)) for c in cells}},
        "cells": cells, "databases": databases, "key": {"path": "hmac.key", "sha256": key_sha},
        "artifacts": [{"cell": a.cell, "store": a.store_key, "locator": a.locator, "sha256": a.sha256,
                       "size": a.size} for a in sorted(artifacts, key=lambda a: (a.cell, a.store_key, a.locator))],
    }


def _version(path: Path) -> int:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        return current_version(conn)
    finally:
        conn.close()


def backup_home(home: Home, dest: Path, *, progress: Progress | None = None) -> BackupReport:
    """Write a consistent backup of ``home`` (live: mounts may serve and write meanwhile) to ``dest``.

    ``dest`` must be absent or an empty 0700 directory of ours (else BadInput,
    nothing written), outside the home, except in the home's own
    ``migrations/`` folder (a migration backs the home up there first; a
    backup copies only the home's databases, key and artifacts, so it never
    holds another). IntegrityError if a committed artifact of the home
    does not verify (``scopefs doctor`` names the revisions); nothing is
    left at ``dest`` then.
    """
    say = progress or (lambda _line: None)
    dest = dest.absolute()
    check_target(dest, "backup destination")
    migrations = Path(os.path.realpath(home.root / "migrations"))
    if not Path(os.path.realpath(dest)).is_relative_to(migrations):  # where ``writer.migrate`` backs up first
        check_apart(dest, home.root, "backup destination", "the home")
    home.state()  # the home opens (and its schema is current) before anything is made
    replay(home)  # the reads a killed mount served are in the state copy too (``catalog.readjournal``)
    # A whole copy of every note, out of forget's reach, is about to exist: the home's audit says when. Written
    # before the first snapshot (which then holds it too), never between the last look for forgets and the
    # rename that puts the backup in place; a run that fails after it leaves a row for a backup not made.
    record(home.state(), AuditEvent("backup", "allow", Reason.ALLOWED))
    with work_folder(dest, "backup", say) as root:
        (root / "agents").mkdir(mode=0o700)
        copier = _Copier(home, root)
        cells: list[str] = []
        pending, resnapshots = home.cells(), 0
        for attempt in range(SNAPSHOT_ATTEMPTS + 1):
            if attempt == SNAPSHOT_ATTEMPTS:
                raise StorageError("the home kept changing under the backup (notes forgotten during every attempt);"
                                   " try again")
            resnapshots += _back_up_databases(home, root, copier, say, cells, pending)
            if copier.failed:
                raise IntegrityError(f"{copier.failed} committed artifact(s) of the home do not verify; run"
                                     " 'scopefs doctor'. No backup was written")
            for name in ("hmac.key", MANIFEST):  # written again when a late forget made the cells go again
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(root / name)
            write_file(root / "hmac.key", read_secret(home.key_path, HMAC_KEY_BYTES))
            say(f"writing the manifest ({len(copier.copied)} artifact(s))")
            manifest = build_manifest(root, cells, list(copier.copied.values()))
            data = (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode()
            write_file(root / MANIFEST, data)
            pending = _forgotten_since(home, root, cells)  # the last look, just before DEST is put in place
            if not pending:
                break
        for folder in {root, root / "agents", *(cell_dir(root, c).parent for c in cells),
                       *(cell_dir(root, c) for c in cells)}:
            fsync_dir(folder)
        put_atomically(root, dest)
    say("done")
    return BackupReport(
        dest=dest, cells=tuple(cells), artifacts=len(copier.copied),
        artifact_bytes=sum(a.size for a in copier.copied.values()),
        database_bytes=sum(int(d["size"]) for d in manifest["databases"]), skipped=copier.skipped,
        resnapshots=resnapshots, manifest_sha256=hashlib.sha256(data).hexdigest())

