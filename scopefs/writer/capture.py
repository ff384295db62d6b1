"""Machine writes: what an agent captures from a conversation, kept apart from what people write.

A capture (``write --origin capture``; an agent's memory flush) is made by
a machine from chat, so it passes two gates a person's own edit does not:
the chat envelope is stripped, and text still mostly envelope refused
(``catalog.envelope``); and a human-notes block the note already holds is
kept byte for byte, a damaged one refusing the write
(``catalog.humanblock``). Its revision's trust origin says ``capture``.
"""

from __future__ import annotations

import apsw

from scopefs.catalog.access import authorize_session, decide, resolve
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.envelope import sanitise_capture_bytes
from scopefs.catalog.errors import BadInput, IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.humanblock import keep_human_block
from scopefs.catalog.paths import check_parts, split_virtual_path
from scopefs.catalog.policy import Decision, Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.validity import with_valid_until
from scopefs.writer.transaction import RENEWABLE, Provenance, WriteResult, write_parts


def _any(_conn: apsw.Connection, _activating: bool) -> Decision:
    return Decision(True, Reason.ALLOWED)  # no authority beyond the session's own placement


def previous_bytes(home: Home, session_id: str, path: str) -> tuple[bytes | None, str | None]:
    """The note's current bytes (whose human block a machine write keeps) and its resource id.

    Only what the session may read now: a note it may not see, or one held
    by its lineage or past its validity, has no block to keep (its bytes
    must never flow into the new revision), and the write itself is then
    decided as any write is.
    """
    parts = check_parts(split_virtual_path(path))
    access = authorize_session(home, session_id, Op.APPEND, parts=parts)
    target = resolve(access, parts)
    if target.revision is None or target.store is None or target.resource is None:
        return None, None
    readable = decide(access, target, Op.READ)
    if not readable:  # a renewable note is the one meant; any other is decided as a plain write decides it
        return None, target.resource.resource_id if readable.reason in RENEWABLE else None
    try:
        return read_verified(home, access.agent_id, target.store, target.revision), target.resource.resource_id
    except IntegrityError:
        raise BadInput("the note does not verify; repair it (doctor --fix) before a machine write over it") from None


def capture(home: Home, session_id: str, path: str, data: bytes, *, actor_id: str | None = None,
            valid_until: int | None = None) -> WriteResult:
    """Write ``data`` at ``path`` as a capture (module docstring), valid until ``valid_until`` if given."""
    content = sanitise_capture_bytes(data)
    previous, resource_id = previous_bytes(home, session_id, path)
    content = keep_human_block(previous, content)
    if valid_until is not None:
        content = with_valid_until(content, valid_until)
    return write_parts(home, session_id, check_parts(split_virtual_path(path)), content, actor_id=actor_id,
                       expected_resource_id=resource_id, provenance=Provenance(Op.APPEND, "capture", _any))
