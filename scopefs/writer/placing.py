"""Markers of closes that placed their file and have not committed it yet.

A close through a mount commits in one transaction (``writer.transaction``,
``_commit_once``): its file is renamed into the store first, then one
commit records and activates the revision. Between the two, nothing in the
catalog names the file, so a crash there would leave an orphan that only a
scan of the whole store folder finds. Before the rename the writer leaves an
empty marker in the agent's staging folder, named after the store folder,
the file, the revision it will be and the staged file it was, and removes
it after the commit.

Under the writer's exclusive lock no marker has a live writer (a writer
holds the lock shared from before its marker until it removes it, or
leaves it behind on a failure it cannot settle), so each one left is
settled by what the catalog says: a revision by that id was committed (the
marker outlived its commit: only the marker goes), or it was not (the file
goes, wherever the crash left it, staged or placed; no one was ever told
the close succeeded). A file some revision names is never removed, whatever
a marker says. The marker costs a
close one create and one unlink, where the pending revision it replaces
cost a transaction.

A power loss may keep the rename and lose the marker only if it also loses
the marker's removal after a commit that did not reach the disk either:
that file is an orphan ``scopefs doctor`` finds in the store folder, as a
lost pending row always left one.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import apsw

from scopefs.catalog.artifacts import open_store_dir
from scopefs.catalog.audit import AuditEvent, enqueue
from scopefs.catalog.audit import settle as audit_settle
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.fsafe import lock_held
from scopefs.catalog.home import Home
from scopefs.catalog.reasons import Reason

# path key, locator, revision id, staged name: our own random tokens, never a name anyone chose.
_MARKER = re.compile(r"([a-z2-7]{26})\.([a-z2-7]{26})\.(v_[a-z2-7]{26})\.([a-z2-7]{26})")


@dataclass(frozen=True)
class Placing:
    """One marker: where the close's file was staged and went, and which revision would have named it."""

    name: str
    path_key: str
    locator: str
    revision_id: str
    staged_name: str


def mark(staging_fd: int, path_key: str, locator: str, revision_id: str, staged_name: str) -> Placing:
    """Leave the marker before the file is renamed into the store (not synced: see the module docstring)."""
    placing = Placing(f"{path_key}.{locator}.{revision_id}.{staged_name}", path_key, locator, revision_id,
                      staged_name)
    fd = os.open(placing.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=staging_fd)
    os.close(fd)
    return placing


def unmark(staging_fd: int, placing: Placing) -> None:
    """The close is settled (committed, or its file removed): the marker goes.

    Never raises: a marker that stays is settled by recovery, and a close
    that committed must not be reported as failed because of it.
    """
    with contextlib.suppress(OSError):
        os.unlink(placing.name, dir_fd=staging_fd)


def is_marker(name: str) -> bool:
    return _MARKER.fullmatch(name) is not None


def any_left(home: Home, agent_id: str) -> bool:
    """Whether the staging folder may hold a marker: the cheap look every write takes before recovery.

    Staged files are bare tokens; only a marker's name has a dot. A look by
    path is enough here: what is found is settled under the lock, through
    the folder's descriptor (``markers``).
    """
    try:
        return any("." in name for name in os.listdir(home.staging_dir(agent_id)))
    except FileNotFoundError:
        return False


def markers(staging_fd: int) -> list[Placing]:
    """Every marker in the staging folder (bounded by its names' fixed shape)."""
    found = []
    with os.scandir(staging_fd) as entries:
        for entry in entries:
            match = _MARKER.fullmatch(entry.name)
            if match is not None and entry.is_file(follow_symlinks=False):
                found.append(Placing(entry.name, *match.groups()))
    return found


def in_flight(home: Home, agent_id: str, staging_fd: int, placing: Placing) -> bool:
    """Whether a live writer still holds its file, staged or placed (the staged file's flock moves with it).

    Only a look without the exclusive lock (``doctor`` without ``--fix``) needs to ask.
    """
    if lock_held(placing.staged_name, dir_fd=staging_fd):
        return True
    try:
        store_fd = open_store_dir(home, agent_id, placing.path_key)
    except IntegrityError:
        return False
    try:
        return lock_held(placing.locator, dir_fd=store_fd)
    finally:
        os.close(store_fd)


def landed(catalog: apsw.Connection, agent_id: str, revision_id: str) -> bool:
    """Whether a close's revision is in the catalog: the one question a marker's fate turns on."""
    return one(catalog, "SELECT 1 FROM revisions WHERE agent_id = ? AND revision_id = ?",
               (agent_id, revision_id)) is not None


def committed(home: Home, agent_id: str, placing: Placing) -> bool:
    """Whether the marker's close committed (a read: what doctor without ``--fix`` reports)."""
    return landed(home.catalog(agent_id), agent_id, placing.revision_id)


def _named(home: Home, agent_id: str, placing: Placing) -> bool:
    """Whether any revision names the marker's file (a marker never removes such a file, forged or not)."""
    return one(home.catalog(agent_id), "SELECT 1 FROM revisions WHERE agent_id = ? AND locator = ?",
               (agent_id, placing.locator)) is not None


def _record_abandoned(home: Home, agent_id: str, placing: Placing) -> None:
    """Audit the abandoned close as an error, in a commit of its own.

    Besides the record (what an abandoned intent's rollback gives too),
    that commit overwrites whatever a failed commit of the close may have
    left at the end of the write-ahead log: only after it does a revision
    the catalog does not show stay absent for good.
    """
    catalog = home.catalog(agent_id)
    with immediate(catalog):
        event_id = enqueue(catalog, agent_id, AuditEvent(
            operation="recover", decision="error", reason=Reason.REVISION_STALE, agent_id=agent_id,
            revision_id=placing.revision_id))
        audit_settle(catalog, event_id, decision="error", reason=Reason.REVISION_STALE)


def settle(home: Home, agent_id: str, staging_fd: int, placing: Placing) -> str:
    """Settle one abandoned marker under the exclusive writer lock; returns what was done.

    The files go first, durably, then the marker: dying in between leaves
    the marker, and the next settle finds no file to remove. A committed
    close left no staged file (its rename came first).
    """
    landed = committed(home, agent_id, placing)
    if not landed:
        _record_abandoned(home, agent_id, placing)
        landed = committed(home, agent_id, placing)
    if not landed and not lock_held(placing.staged_name, dir_fd=staging_fd):  # a live writer stages unlocked
        with contextlib.suppress(FileNotFoundError):
            os.unlink(placing.staged_name, dir_fd=staging_fd)
    if not landed and not _named(home, agent_id, placing):
        with contextlib.suppress(IntegrityError):  # no store folder: no file in it either
            store_fd = open_store_dir(home, agent_id, placing.path_key)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(placing.locator, dir_fd=store_fd)
                os.fsync(store_fd)
            finally:
                os.close(store_fd)
    unmark(staging_fd, placing)
    os.fsync(staging_fd)
    return "removed the marker of a committed save" if landed else "removed"
