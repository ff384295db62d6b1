"""Rewriting the catalog's files without forgotten text, after a forget.

Deleting rows does not remove their bytes unless ``secure_delete`` is on
(it is, on every connection: ``catalog.db.connect``): SQLite leaves them in
free pages and the write-ahead log, and the full-text index keeps deleted
tokens in older segments until it merges. ``scrub`` merges the index and
truncates the log; whether that finished is recorded per forget, so a crash in between
is found by doctor and finished by ``doctor --fix`` (``writer.recovery``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import apsw

from scopefs.catalog.db import immediate, scalar

log = logging.getLogger("scopefs.forget")


@contextlib.contextmanager
def secure_delete(catalog: apsw.Connection) -> Iterator[None]:
    """Deleted rows are overwritten with zeros, not left in free pages. Every connection has it on
    (``catalog.db.connect``): the text a forget removes may have left the index long before, with a
    superseded revision's rows or a reindex, and those bytes must be gone too. Checked here, so a
    connection made otherwise cannot forget without it."""
    catalog.execute("PRAGMA secure_delete = ON")
    yield


def unscrubbed(catalog: apsw.Connection, agent_id: str) -> int:
    """How many forgets have not yet rewritten the catalog's files without their text (a crash came first)."""
    return int(scalar(catalog, "SELECT count(*) FROM forgets WHERE agent_id = ? AND scrubbed = 0", (agent_id,)))


def scrub(catalog: apsw.Connection, agent_id: str) -> bool:
    """Leave no copy of forgotten text in the catalog's files; whether that is done.

    The full-text index merges away the deleted tokens it still carries in
    older segments, and the write-ahead log is checkpointed and truncated;
    then the forgets that were pending when it began are marked scrubbed. A reader holding an old
    snapshot can keep the checkpoint from completing: the forgets stay
    unscrubbed, doctor reports them, and ``doctor --fix`` (or the next
    forget) tries again. The rows themselves are gone either way.
    """
    try:
        pending = [str(r[0]) for r in catalog.execute(  # only these: a forget committing meanwhile is not ours
            "SELECT forget_id FROM forgets WHERE agent_id = ? AND scrubbed = 0", (agent_id,))]
        with secure_delete(catalog), immediate(catalog):
            catalog.execute("INSERT INTO search_fts (search_fts) VALUES ('optimize')")
        busy, _log, _done = catalog.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
        if busy:
            return False
        with immediate(catalog):
            catalog.executemany("UPDATE forgets SET scrubbed = 1 WHERE forget_id = ?", [(f,) for f in pending])
        catalog.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the mark itself needs no record
        return True
    except apsw.Error as exc:
        log.warning("the catalog was not scrubbed after a forget (%s)", type(exc).__name__)
        return False
