"""``scopefs restore SRC --home NEW``: a backup back into a home, verified whole before any store is readable.

Everything happens in a 0700 sibling of NEW that nothing serves and no
session names; only a restore that verified whole is renamed onto NEW, so
NEW holds a complete home or nothing:

1. SRC must be ours alone (as a home must be): a backup with loosened
   permissions is refused (exit 2); the manifest must be of a known format
   version, and the one expected when the caller kept its digest apart
   (``--expect-manifest``): the manifest proves the backup whole, not who
   made it;
2. every database is copied and must match the manifest's SHA-256; each
   copy then passes ``PRAGMA integrity_check`` and ``foreign_key_check``,
   has a known schema (a newer one is refused: upgrade scopefs first)
   whose tables, indexes, triggers and views are exactly those this scopefs
   builds for its version, whatever their names (a dropped trigger, under
   which a row could have been edited, or an added one, which would run on
   every later write, is an integrity failure), and the cells agree (each catalog is the cell it is filed as, and the
   state database registers exactly the manifest's cells); the key has
   its length and hash;
3. every artifact is copied while hashed, and must match both the manifest
   and the restored catalog (size and SHA-256); every committed revision
   (active or superseded) must have one. Any that does not verify or is
   missing fails the restore with their counts only (exit 4): never a
   path, a name or a byte of content;
4. the restored home is settled as a start would settle it: its artifacts
   are all synced, so no revision is "unsynced"; a write that was in flight
   at the snapshot (never acknowledged) is rolled back, the audit outbox is
   drained, a forget that had not scrubbed is scrubbed, stale index rows
   are reindexed (``writer.recovery``). It must then pass doctor clean;
5. the directory is synced and renamed onto NEW.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from scopefs.catalog.audit import AuditEvent, record
from scopefs.catalog.db import immediate, one, scalar
from scopefs.catalog.errors import BadInput, IntegrityError, ScopefsError, StorageError
from scopefs.catalog.fsafe import UnsafeEntry, fsync_dir, open_dir, open_dir_beneath, open_regular
from scopefs.catalog.home import HMAC_KEY_BYTES, POOL_CELL_PREFIX, Home, validate_agent_name, validate_pool_name
from scopefs.catalog.reasons import Reason
from scopefs.catalog.schema import SchemaKind, ensure_schema, schema_text
from scopefs.catalog.schema.agent import AGENT_SCHEMA
from scopefs.catalog.schema.state import STATE_SCHEMA
from scopefs.writer.backup import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    Artifact,
    artifacts_of,
    cell_dir,
    check_apart,
    check_private_dir,
    check_target,
    copy_hashed,
    put_atomically,
    work_folder,
)

MAX_MANIFEST = 256 << 20  # read whole: millions of artifacts fit, a runaway file does not
SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RestoreReport:
    home: Path
    cells: tuple[str, ...]
    artifacts: int
    artifact_bytes: int
    database_bytes: int
    settled: int  # findings a start would have settled (an interrupted write rolled back, audit drained, ...)
    manifest_sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"home": str(self.home), "cells": list(self.cells), "artifacts": self.artifacts,
                "artifact_bytes": self.artifact_bytes, "database_bytes": self.database_bytes,
                "settled": self.settled, "manifest_sha256": self.manifest_sha256}


def _damaged() -> IntegrityError:
    return IntegrityError("the backup's manifest is damaged; nothing was restored")


def _check_tree(src: Path) -> None:
    """Every directory and file of the backup is ours alone, as the home's must be (symlinks are refused later)."""
    for dirpath, dirnames, filenames in os.walk(src):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise BadInput("the backup holds files accessible to others or owned by another user;"
                               " refusing to use it")


def _read_manifest(src: Path) -> tuple[dict[str, Any], str]:
    try:
        fd = os.open(src / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise BadInput("not a scopefs backup (it has no manifest)") from None
        raise _damaged() from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _damaged()
        data = os.read(fd, MAX_MANIFEST + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_MANIFEST:
        raise _damaged()
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        raise _damaged() from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInput("not a scopefs backup (unknown manifest format)")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise _damaged()
    if version > FORMAT_VERSION:
        raise BadInput(f"the backup is format version {version}, newer than this scopefs ({FORMAT_VERSION});"
                       " upgrade scopefs")
    return manifest, hashlib.sha256(data).hexdigest()


def _cells(manifest: dict[str, Any]) -> list[str]:
    cells = manifest.get("cells")
    if not isinstance(cells, list) or not all(isinstance(c, str) for c in cells) or len(set(cells)) != len(cells):
        raise _damaged()
    try:
        for cell in cells:
            if cell.startswith(POOL_CELL_PREFIX):
                validate_pool_name(cell[len(POOL_CELL_PREFIX):])
            else:
                validate_agent_name(cell)
    except BadInput:
        raise _damaged() from None
    return cells


def _copy(src_fd: int, rel: str, target: Path, sha256: str, size: int | None) -> str:
    """Copy ``rel`` (beneath the backup, no links) to a new 0600 file while hashing it: 'ok', 'missing' or 'bad'.

    A copy that does not verify leaves no file behind.
    """
    folder, _, name = rel.rpartition("/")
    try:
        dir_fd = open_dir_beneath(src_fd, folder) if folder else os.dup(src_fd)
    except OSError as exc:
        return "missing" if exc.errno == errno.ENOENT else "bad"
    try:
        fd, st = open_regular(dir_fd, name)
    except UnsafeEntry:
        return "bad"
    except OSError as exc:
        return "missing" if exc.errno == errno.ENOENT else "bad"
    finally:
        os.close(dir_fd)
    try:
        return "ok" if copy_hashed(fd, st.st_size, target, size, sha256) else "bad"
    finally:
        os.close(fd)


def _check_db(path: Path, kind: SchemaKind) -> None:
    """A restored database is sound, of our kind, of a schema we know, with every foreign key holding."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        conn.execute("PRAGMA trusted_schema=OFF")
        try:
            check = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
            app_id = scalar(conn, "PRAGMA application_id")
            version = scalar(conn, "PRAGMA user_version")
            broken_keys = conn.execute("PRAGMA foreign_key_check").fetchall()
        except apsw.Error as exc:
            raise IntegrityError("a database of the backup is damaged; nothing was restored") from exc
        if check != ["ok"] or app_id != kind.application_id or not isinstance(version, int) or version < 1 \
                or broken_keys:
            raise IntegrityError("a database of the backup is damaged; nothing was restored")
        if version > kind.latest:
            raise BadInput(f"the backup's {kind.name} is schema version {version}, newer than this scopefs"
                           f" ({kind.latest}); upgrade scopefs")
        if schema_text(conn) != _fresh_schema(kind, version):
            raise IntegrityError(f"a {kind.name} database of the backup does not have the schema of its version"
                                 " (a table, index or trigger was changed); nothing was restored")
    finally:
        conn.close()


def _fresh_schema(kind: SchemaKind, version: int) -> list[tuple[str, str, str]]:
    """The schema this scopefs builds for ``kind`` at ``version``: a dropped or edited trigger shows against it."""
    fresh = apsw.Connection(":memory:")
    try:
        ensure_schema(fresh, kind, upto=version)
        return schema_text(fresh)
    finally:
        fresh.close()


def _check_cells(root: Path, cells: list[str]) -> None:
    """Each catalog is the cell it is filed as; the state database registers exactly these cells."""
    conn = apsw.Connection(str(root / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        registered = {str(r[0]) for r in conn.execute("SELECT agent_id FROM agents")}
        registered |= {POOL_CELL_PREFIX + str(r[0]) for r in conn.execute("SELECT pool_name FROM pools")}
    finally:
        conn.close()
    if registered != set(cells):
        raise IntegrityError("the backup's catalogs do not match its state database; nothing was restored")
    for cell in cells:
        conn = apsw.Connection(str(cell_dir(root, cell) / "catalog.sqlite"),
                               flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
        try:
            row = one(conn, "SELECT agent_id FROM agent_cell")
        finally:
            conn.close()
        if row is None or row[0] != cell:
            raise IntegrityError("the backup's catalogs do not match its state database; nothing was restored")


def _restore_databases(src_fd: int, root: Path, manifest: dict[str, Any], cells: list[str]) -> int:
    """Copy and check the state database, every catalog and the key; their bytes."""
    entries = manifest.get("databases")
    key = manifest.get("key")
    if not isinstance(entries, list) or not isinstance(key, dict) or not isinstance(key.get("sha256"), str):
        raise _damaged()
    hashes = {e.get("path"): e for e in entries if isinstance(e, dict)}
    wanted = [("state.sqlite", STATE_SCHEMA)]
    wanted += [(str((cell_dir(root, c) / "catalog.sqlite").relative_to(root)), AGENT_SCHEMA) for c in cells]
    total = 0
    (root / "agents").mkdir(mode=0o700)
    for cell in cells:
        folder = cell_dir(root, cell)
        for path in (folder.parent, folder, folder / "memory-scopes", folder / "memory-scopes" / "v1",
                     folder / "staging", folder / "quarantine"):
            path.mkdir(mode=0o700, exist_ok=True)
    bad = 0
    for rel, _kind in wanted:
        entry = hashes.get(rel)
        if entry is None or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("size"), int):
            raise _damaged()
        bad += _copy(src_fd, rel, root / rel, entry["sha256"], entry["size"]) != "ok"
        total += entry["size"]
    bad += _copy(src_fd, "hmac.key", root / "hmac.key", key["sha256"], HMAC_KEY_BYTES) != "ok"
    if bad:
        raise IntegrityError(f"{bad} of the backup's databases and key do not verify; nothing was restored")
    for rel, kind in wanted:
        _check_db(root / rel, kind)
    _check_cells(root, cells)
    return total


def _restore_artifacts(src_fd: int, root: Path, manifest: dict[str, Any], cells: list[str]) -> list[Artifact]:
    """Copy every artifact the restored catalogs keep, verified against both the manifest and the catalog."""
    listed: dict[tuple[str, str, str], tuple[str, int]] = {}
    entries = manifest.get("artifacts")
    if not isinstance(entries, list):
        raise _damaged()
    for e in entries:
        fields = ("cell", "store", "locator", "sha256")
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in fields) \
                or not isinstance(e.get("size"), int):
            raise _damaged()
        listed[(e["cell"], e["store"], e["locator"])] = (e["sha256"], e["size"])
    bad = missing = 0
    restored: list[Artifact] = []
    named: set[tuple[str, str, str]] = set()
    for cell in cells:
        try:
            keys, kept = artifacts_of(cell_dir(root, cell) / "catalog.sqlite", cell)
        except StorageError:  # a store key or locator that is not ours ('../../x'): the backup's fault
            raise IntegrityError("the backup's catalog names a malformed store or artifact; nothing was restored") \
                from None
        scopes = cell_dir(root, cell) / "memory-scopes" / "v1"
        for key in keys:
            (scopes / key).mkdir(mode=0o700)
        for artifact in kept:
            name = (cell, artifact.store_key, artifact.locator)
            named.add(name)
            entry = listed.get(name)
            if entry is None:
                missing += artifact.required  # the kept file of a removed note may be left out; a committed one not
                continue
            if entry != (artifact.sha256, artifact.size):
                bad += 1
                continue
            rel = str((scopes / artifact.store_key / artifact.locator).relative_to(root))
            outcome = _copy(src_fd, rel, root / rel, artifact.sha256, artifact.size)
            if outcome == "ok":
                restored.append(artifact)
            elif outcome == "missing":
                missing += 1
            else:
                bad += 1
        for key in keys:
            fsync_dir(scopes / key)
    bad += len(set(listed) - named)  # the manifest names files its catalogs do not keep
    if bad or missing:
        raise IntegrityError(f"{bad} artifact{'s do' if bad != 1 else ' does'} not verify,"
                             f" {missing} {'are' if missing != 1 else 'is'} missing; nothing was restored")
    return restored


def _settle(root: Path, cells: list[str]) -> int:
    """Settle the restored home as a start would, then require doctor to find it clean; how many were settled."""
    from scopefs.writer.recovery import exit_code, inspect

    home = Home.open(root)
    try:
        for cell in cells:  # every artifact was just synced: none of them is waiting for a sync any more
            catalog = home.catalog(cell)
            with immediate(catalog):
                catalog.execute("DELETE FROM unsynced_revisions WHERE agent_id = ?", (cell,))
        settled = sum(len(inspect(home, cell, fix=True)) for cell in cells)
        left = [f for cell in cells for f in inspect(home, cell, fix=False)]
        code = exit_code(left)
        if code == IntegrityError.exit_code:
            raise IntegrityError(f"{sum(f.integrity for f in left)} artifact(s) do not verify after the restore;"
                                 " nothing was restored")
        if code:
            raise StorageError("the restored home does not pass doctor; nothing was restored")
        record(home.state(), AuditEvent("restore", "allow", Reason.ALLOWED))  # where the new home's life began
        for cell in cells:
            home.catalog(cell).execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        home.state().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return settled
    finally:
        home.close()


def check_manifest_digest(value: str) -> str:
    """A SHA-256 as ``scopefs backup`` prints it (64 hex digits), lower-cased; BadInput otherwise."""
    if not SHA256_HEX.fullmatch(value):
        raise BadInput("--expect-manifest takes the manifest_sha256 a backup printed (64 hex digits)")
    return value.lower()


def restore_home(src: Path, new: Path, *, progress: Progress | None = None,
                 expect_manifest: str | None = None) -> RestoreReport:
    """Restore the backup at ``src`` into a new home at ``new`` (absent or empty); nothing is left there on failure.

    BadInput for a backup or target refused before anything was made;
    IntegrityError (exit 4) for a backup whose content does not verify, or
    whose manifest is not ``expect_manifest`` (checked before anything is
    made: the manifest proves the backup whole, only a digest kept apart
    from it proves it is the one that was made).
    """
    say = progress or (lambda _line: None)
    src, new = src.absolute(), new.absolute()
    expected = check_manifest_digest(expect_manifest) if expect_manifest is not None else None
    check_private_dir(src, "backup")
    _check_tree(src)
    manifest, digest = _read_manifest(src)
    if expected is not None and digest != expected:
        raise IntegrityError("the backup's manifest is not the one expected (--expect-manifest); nothing was restored")
    cells = _cells(manifest)
    check_target(new, "new home")
    check_apart(new, src, "new home", "the backup")
    src_fd = open_dir(src)
    try:
        with work_folder(new, "restore", say) as root:  # removed if anything below raises
            say(f"verifying and copying the databases of {len(cells)} cell(s)")
            database_bytes = _restore_databases(src_fd, root, manifest, cells)
            say("verifying and copying the artifacts")
            restored = _restore_artifacts(src_fd, root, manifest, cells)
            say(f"settling the restored home ({len(restored)} artifact(s)) and running doctor on it")
            settled = _settle(root, cells)
            for cell in cells:
                fsync_dir(cell_dir(root, cell) / "memory-scopes" / "v1")
                fsync_dir(cell_dir(root, cell) / "memory-scopes")
                fsync_dir(cell_dir(root, cell))
                fsync_dir(cell_dir(root, cell).parent)
            put_atomically(root, new)
    except BaseException as exc:
        if isinstance(exc, (ScopefsError, KeyboardInterrupt)):
            raise
        if isinstance(exc, (OSError, apsw.Error)):
            raise StorageError(f"the restore failed ({exc.__class__.__name__}); nothing was restored") from exc
        raise
    finally:
        os.close(src_fd)
    say("done")
    return RestoreReport(home=new, cells=tuple(cells), artifacts=len(restored),
                         artifact_bytes=sum(a.size for a in restored), database_bytes=database_bytes,
                         settled=settled, manifest_sha256=digest)
