"""What an agent's quarantine holds, and the quarantined copies of tampered artifacts (named after their
revision, so a forget can find them).

``doctor --fix`` moves an artifact that no longer hashes to its catalog out
of the artifact area (``writer.recovery``). Its bytes are still (a changed
version of) the note's text; a random name would keep them on disk, tied to
nothing, after the note is forgotten. Named ``tampered-<revision_id>`` (ids
are opaque and path-safe; ``-<token>`` is added if that name is taken),
they leave with the revision's own artifact when
``writer.forget`` forgets it (or, if that forget was killed after its
commit, when ``doctor --fix`` removes what it left).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Collection
from typing import Any

from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home

PREFIX = "tampered-"
_SAFE_ID = re.compile(r"[a-z0-9_]{1,100}")


def tampered_name(revision_id: str) -> str | None:
    """The quarantine name of ``revision_id``'s tampered artifact; None for an id unfit for a file name."""
    return PREFIX + revision_id if _SAFE_ID.fullmatch(revision_id) else None


def tampered_revision(name: str) -> str | None:
    """The revision a quarantine name is the tampered copy of; None for any other name.

    ``tampered-<id>``, or ``tampered-<id>-<token>`` when that name was taken
    (``writer.recovery``); ids never hold a ``-``, so the id ends at the first one.
    """
    if not name.startswith(PREFIX):
        return None
    revision_id = name[len(PREFIX):].partition("-")[0]
    return revision_id if _SAFE_ID.fullmatch(revision_id) else None


def tampered_copies(home: Home, agent_id: str, revision_ids: Collection[str] | None = None) -> dict[str, list[str]]:
    """The quarantined tampered copies present (of ``revision_ids`` only, unless None): revision id -> names.

    The one matcher for a forget removing its notes' copies, for doctor
    finding those a forget killed after its commit left, and for doctor
    resuming a fix that died between the move and the roll-back.
    """
    wanted = None if revision_ids is None else set(revision_ids)
    if wanted is not None and not wanted:
        return {}
    try:
        qfd = open_dir(home.quarantine_dir(agent_id))
    except FileNotFoundError:
        return {}
    try:
        names = os.listdir(qfd)
    finally:
        os.close(qfd)
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        revision_id = tampered_revision(name)
        if revision_id is not None and (wanted is None or revision_id in wanted):
            found.setdefault(revision_id, []).append(name)
    return found


def remove_tampered(home: Home, agent_id: str, revision_ids: list[str]) -> int:
    """Unlink the quarantined copies of ``revision_ids`` (a forget's); how many were there."""
    present = [name for names in tampered_copies(home, agent_id, revision_ids).values() for name in names]
    if not present:
        return 0
    qfd = open_dir(home.quarantine_dir(agent_id))
    removed = 0
    try:
        for name in present:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=qfd)
                removed += 1
        if removed:
            os.fsync(qfd)
    finally:
        os.close(qfd)
    return removed


_NOTES = (
    "SELECT res.path, v.revision_id, v.size, v.activated_at, m.class FROM resources res"
    " JOIN stores s ON s.store_id = res.store_id"
    " JOIN revisions v ON v.resource_id = res.resource_id AND v.state = 'active'"
    " LEFT JOIN migration_items m ON m.revision_id = v.revision_id"
    " WHERE res.agent_id = ? AND res.state = 'live' AND s.scope_kind = 'quarantine' AND s.audience_id = ''"
    " ORDER BY res.path")


def quarantine_listing(home: Home, agent_id: str) -> dict[str, list[dict[str, Any]]]:
    """Everything ``agent_id``'s quarantine holds, for an operator to review (``scopefs quarantine list``).

    Four kinds, none of which any session's view shows:

    * ``migrated``: notes ``scopefs migrate`` could not give a person (the quarantine store: its path
      under ``migration/``, the migration's class, the active revision and its size);
    * ``derived``: derivations filed there for mixing audiences (``derived/``; never released);
    * ``tampered``: artifacts ``doctor --fix`` found changed and moved aside (``tampered-<revision>``);
    * ``files``: anything else ``doctor --fix`` moved out of the artifact area (orphans).

    Names, sizes and ids only: no byte of content is read. Postbox deposits wait in their owner's
    own quarantine store and are reviewed with ``scopefs postbox``.
    """
    migrated: list[dict[str, Any]] = []
    derived: list[dict[str, Any]] = []
    for path, revision_id, size, at, klass in home.catalog(agent_id).execute(_NOTES, (agent_id,)):
        note = {"path": str(path), "revision_id": str(revision_id), "size": int(size)}
        if klass is None:  # no migration item: a derivation filed for mixing audiences (``writer.derive``)
            derived.append({**note, "filed_at_us": None if at is None else int(at)})
        else:
            migrated.append({**note, "migrated_at_us": None if at is None else int(at), "class": str(klass)})
    tampered: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    for name, size in folder_entries(home, agent_id).items():
        entry: dict[str, Any] = {"name": name, "size": size}
        revision_id = tampered_revision(name)
        if revision_id is not None:
            tampered.append({**entry, "revision_id": revision_id})
        else:
            files.append(entry)
    return {"migrated": migrated, "derived": derived, "tampered": tampered, "files": files}


def folder_entries(home: Home, agent_id: str) -> dict[str, int | None]:
    """What the quarantine folder holds, by name: a regular file's size, None for anything else."""
    try:
        qfd = open_dir(home.quarantine_dir(agent_id))
    except FileNotFoundError:
        return {}
    found: dict[str, int | None] = {}
    try:
        for name in sorted(os.listdir(qfd)):
            try:
                st = os.stat(name, dir_fd=qfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile (a forget, doctor)
            found[name] = st.st_size if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(qfd)
    return found
