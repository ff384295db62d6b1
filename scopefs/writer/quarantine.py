"""Quarantined copies of tampered artifacts: named after their revision, so a forget can find them.

``doctor --fix`` moves an artifact that no longer hashes to its catalog out
of the artifact area (``writer.recovery``). Its bytes are still (a changed
version of) the note's text; a random name would keep them on disk, tied to
nothing, after the note is forgotten. Named ``tampered-<revision_id>`` (ids
are opaque and path-safe; ``-<token>`` is added if that name is taken),
they leave with the revision's own artifact when
``writer.forget`` forgets it.
"""

from __future__ import annotations

import contextlib
import os
import re

from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home

PREFIX = "tampered-"
_SAFE_ID = re.compile(r"[a-z0-9_]{1,100}")


def tampered_name(revision_id: str) -> str | None:
    """The quarantine name of ``revision_id``'s tampered artifact; None for an id unfit for a file name."""
    return PREFIX + revision_id if _SAFE_ID.fullmatch(revision_id) else None


def remove_tampered(home: Home, agent_id: str, revision_ids: list[str]) -> int:
    """Unlink the quarantined copies of ``revision_ids`` (a forget's); how many were there."""
    names = {n for n in (tampered_name(r) for r in revision_ids) if n is not None}
    if not names:
        return 0
    try:
        qfd = open_dir(home.quarantine_dir(agent_id))
    except OSError:
        return 0
    removed = 0
    try:
        # ``tampered-<id>``, or ``tampered-<id>-<token>`` when that name was taken (``writer.recovery``)
        present = [n for n in os.listdir(qfd) if n in names or n.rpartition("-")[0] in names]
        for name in sorted(present):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=qfd)
                removed += 1
        if removed:
            os.fsync(qfd)
    finally:
        os.close(qfd)
    return removed
