"""Quarantined copies of tampered artifacts: named after their revision, so a forget can find them.

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
from collections.abc import Collection

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
