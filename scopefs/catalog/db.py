"""SQLite connections on apsw, configured for durability and safety.

Every connection gets the same settings, so no code path can open a weaker
one by accident:

* WAL with ``synchronous=FULL``. Measured on this kind of machine with a
  simulated power loss: under WAL with ``NORMAL``, acknowledged commits were
  lost; with ``FULL`` they survived. An acknowledged write must survive.
* ``foreign_keys=ON`` (SQLite leaves it off per connection by default).
* ``trusted_schema=OFF``: schema objects cannot call application functions.
* ``recursive_triggers=ON``: rows deleted by REPLACE fire delete triggers.
* A busy timeout, so concurrent CLI processes wait instead of failing.

Transactions are explicit ``BEGIN IMMEDIATE`` blocks: the write lock is taken
at the start, so a transaction never discovers halfway that it must retry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw

from scopefs.catalog.errors import StorageError
from scopefs.catalog.fsafe import fsync_dir

BUSY_TIMEOUT_MS = 10_000

# Failures of the storage below SQLite. Anything else (constraint, misuse) is
# a bug or a policy refusal and propagates as itself.
STORAGE_FAILURES: tuple[type[BaseException], ...] = (
    apsw.IOError,
    apsw.FullError,
    apsw.CantOpenError,
    apsw.CorruptError,
    apsw.NotADBError,
    apsw.ReadOnlyError,
    apsw.BusyError,
)
# The same, or our own StorageError (a failed commit already cleaned up): what
# quiet paths (audit delivery, a rollback after a failure) swallow.
CATALOG_FAILURES: tuple[type[BaseException], ...] = (StorageError, *STORAGE_FAILURES)


def connect(path: Path, *, vfs: str | None = None, create: bool = False) -> apsw.Connection:
    """Open ``path`` with the project's pragmas applied.

    ``vfs`` selects a registered SQLite VFS; tests use it to inject write and
    sync failures at the storage layer without mocking the catalog.
    """
    flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW | (apsw.SQLITE_OPEN_CREATE if create else 0)
    try:
        conn = apsw.Connection(str(path), flags=flags, vfs=vfs)
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]
        if mode != "wal":
            conn.close()
            raise StorageError(f"cannot enable WAL on {path.name} (got {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA trusted_schema=OFF")
        # REPLACE conflict resolution then fires delete triggers too, so the
        # no-delete rules cannot be bypassed by an INSERT OR REPLACE.
        conn.execute("PRAGMA recursive_triggers=ON")
        # Every delete overwrites what it removed: a note's text leaves the index with its superseded,
        # reindexed or retired rows, so a later forget finds no old copy of it in a page's free space.
        conn.execute("PRAGMA secure_delete=ON")
    except STORAGE_FAILURES as exc:
        raise StorageError(f"cannot open {path.name}: {exc.__class__.__name__}") from exc
    # Each process that opens a database after the last one closed it creates
    # a new -wal file; SQLite fsyncs its directory on the first sync but
    # ignores the result (unixSync). A commit in a WAL whose name never
    # reached the disk can vanish on power loss, so we sync the directory
    # ourselves and fail the open if we cannot.
    try:
        fsync_dir(path.parent)
    except StorageError:
        conn.close()
        raise
    return conn


def checkpoint(paths: list[Path], *, vfs: str | None = None) -> int:
    """A ``PASSIVE`` checkpoint of each database's write-ahead log, each on a connection of its own;
    how many were not copied whole (another checkpoint was running, a reader still uses frames, or
    the storage failed): the next call, or any commit's automatic checkpoint, copies what is left.

    Why a connection of its own: a checkpoint copies the log's pages into
    the database and syncs both, 10 ms and more, and whichever commit
    crosses the automatic threshold pays for it. A process whose commits
    hold up a reader (a mount: a save's close, its view's refresh) raises
    that threshold on its connections (``PRAGMA wal_autocheckpoint``) and
    runs this on another thread instead. ``PASSIVE`` takes no lock a writer
    or a reader waits for; frames a reader still uses wait for the next one.
    """
    failed = 0
    for path in paths:
        try:
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW,
                                   vfs=vfs)
        except STORAGE_FAILURES:
            failed += 1
            continue
        try:
            # (busy, frames in the log, frames copied): busy and short copies are answers, not errors
            busy, frames, copied = (int(v or 0) for v in conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()[0])
            if busy or copied < frames:
                failed += 1
        except STORAGE_FAILURES:
            failed += 1
        finally:
            with contextlib.suppress(apsw.Error):
                conn.close()
    return failed


@contextlib.contextmanager
def immediate(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """A short write transaction that commits on success, rolls back on error.

    Storage failures (I/O error, disk full, busy past the timeout) surface as
    StorageError after the rollback, so callers never see a half-applied
    transaction and never retry an fsync that failed.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except STORAGE_FAILURES as exc:
        raise StorageError(f"catalog unavailable: {exc.__class__.__name__}") from exc
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except STORAGE_FAILURES as exc:
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")
        raise StorageError(f"catalog commit failed: {exc.__class__.__name__}") from exc


@contextlib.contextmanager
def brief_wait(conn: apsw.Connection, wait_ms: int) -> Iterator[apsw.Connection]:
    """Inside this block, wait at most ``wait_ms`` for another connection's lock (``BUSY_TIMEOUT_MS``
    again after it): a write that can be retried later gives up soon instead of holding up the
    thread it runs on, which may have more urgent reads queued behind it (a mount's view refresh
    behind its read audit: ``vfs.follow``)."""
    conn.set_busy_timeout(wait_ms)
    try:
        yield conn
    finally:
        conn.set_busy_timeout(BUSY_TIMEOUT_MS)


@contextlib.contextmanager
def relaxed(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """Commits inside this block are not synced to disk (``synchronous=NORMAL``).

    For what a power loss may lose by contract (DESIGN.md §6): a close
    through a mount, the removal of delivered audit outbox rows. Such a commit
    survives the death of any process; the next ``synchronous=FULL`` commit
    on the same database makes it durable too, since it syncs the whole
    write-ahead log.
    """
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        yield conn
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def one(conn: apsw.Connection, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> tuple[Any, ...] | None:
    """The first row of a query, or None."""
    for row in conn.execute(sql, params):
        return tuple(row)
    return None


def scalar(conn: apsw.Connection, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> Any:
    """The first column of the first row (None if there is no row): counts, maxima, pragmas."""
    row = one(conn, sql, params)
    return None if row is None else row[0]

