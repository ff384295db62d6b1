"""Machine writes: what an agent captures from a conversation, kept apart from what people write.

A capture (``write --origin capture``; an agent's memory flush) is made by
a machine from chat, so it passes two gates a person's own edit does not:
the chat envelope is stripped, and text still mostly envelope refused
(``catalog.envelope``); and a human-notes block the note already holds is
kept byte for byte, a damaged one refusing the write
(``catalog.humanblock``). Its revision's trust origin says ``capture``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import apsw

from scopefs.catalog.access import authorize_session, decide, resolve
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.db import scalar
from scopefs.catalog.envelope import sanitise_capture_bytes
from scopefs.catalog.errors import BadInput, IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.humanblock import human_region, keep_human_block
from scopefs.catalog.lineage import add_lineage, inherited_validity, is_held
from scopefs.catalog.paths import check_parts, split_virtual_path
from scopefs.catalog.policy import Decision, Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.validity import with_valid_until
from scopefs.writer.transaction import RENEWABLE, Provenance, RowsHook, WriteResult, write_parts


@dataclass(frozen=True)
class Previous:
    """What a machine write may keep of the note it replaces."""

    data: bytes | None  # its bytes, when the session may read them now
    resource_id: str | None  # the note meant (for the write's conflict check)
    revision_id: str | None  # the revision ``data`` is

    def keep_block(self, new: bytes) -> tuple[bytes, str | None]:
        """``new`` with this note's human-notes block kept (``catalog.humanblock``), and the revision the
        kept block came from, if any: the new revision is then derived from it too (its lineage and its
        validity), since the block may hold what that revision was derived from."""
        kept = keep_human_block(self.data, new)
        has_block = self.data is not None and human_region(self.data)
        return kept, self.revision_id if has_block else None


def previous_bytes(home: Home, session_id: str, path: str) -> Previous:
    """The note's current bytes, whose human block a machine write keeps.

    Only what the session may read now: a note it may not see, or one held
    by its lineage or past its validity, has no block to keep (its bytes
    must never flow into the new revision), and the write itself is then
    decided as any write is.
    """
    parts = check_parts(split_virtual_path(path))
    access = authorize_session(home, session_id, Op.APPEND, parts=parts)
    target = resolve(access, parts)
    if target.revision is None or target.store is None or target.resource is None:
        return Previous(None, None, None)
    readable = decide(access, target, Op.READ)
    if not readable:  # a renewable note is the one meant; any other is decided as a plain write decides it
        return Previous(None, target.resource.resource_id if readable.reason in RENEWABLE else None, None)
    try:
        data = read_verified(home, access.agent_id, target.store, target.revision)
    except IntegrityError:
        raise BadInput("the note does not verify; repair it (doctor --fix) before a machine write over it") from None
    return Previous(data, target.resource.resource_id, target.revision.revision_id)


def kept_still_readable(conn: apsw.Connection, kept_from: str | None) -> Decision:
    """Inside a commit: the revision whose block was kept is not held meanwhile (a hold is written once,
    when a source is retired: a child made from a held revision afterwards would escape it)."""
    if kept_from is not None and is_held(conn, kept_from):
        return Decision(False, Reason.LINEAGE_DENY)
    return Decision(True, Reason.ALLOWED)


def kept_lineage(kept_from: str | None) -> tuple[RowsHook, Callable[[apsw.Connection], int | None]]:
    """The rows and the validity a revision that kept ``kept_from``'s human block inherits from it."""
    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        if kept_from is not None:  # in the cell that holds both (the catalog has exactly one agent_cell row)
            add_lineage(conn, str(scalar(conn, "SELECT agent_id FROM agent_cell")), revision_id, kept_from, "derive")

    def valid_until(conn: apsw.Connection) -> int | None:
        return inherited_validity(conn, [kept_from]) if kept_from is not None else None

    return record, valid_until


def capture(home: Home, session_id: str, path: str, data: bytes, *, actor_id: str | None = None,
            valid_until: int | None = None) -> WriteResult:
    """Write ``data`` at ``path`` as a capture (module docstring), valid until ``valid_until`` if given."""
    previous = previous_bytes(home, session_id, path)
    content, kept_from = previous.keep_block(sanitise_capture_bytes(data))
    if valid_until is not None:
        content = with_valid_until(content, valid_until)
    record, inherited = kept_lineage(kept_from)
    return write_parts(home, session_id, check_parts(split_virtual_path(path)), content, actor_id=actor_id,
                       expected_resource_id=previous.resource_id,
                       provenance=Provenance(Op.APPEND, "capture", lambda conn, _: kept_still_readable(conn, kept_from),
                                             record, valid_until=inherited))
