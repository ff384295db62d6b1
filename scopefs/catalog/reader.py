"""Reading a note through a session's view: decide, verify, audit.

The command line's read path for one note: validate the path, authorize
the session, resolve inside the view, evaluate ``read``, verify the
artifact's hash (``artifacts.verify``, the same check a mount's open makes),
and audit the outcome. ``read_note`` returns the bytes; ``stream_note``
hands them on in chunks, for notes too large to hold. A mount decides with
the same evaluator once per view (``catalog.visible``) and verifies per
open (``vfs.content``). A refusal names no other scope; an integrity
failure returns no bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from scopefs.catalog.access import Access, Target, authorize_session, decide, resolve
from scopefs.catalog.artifacts import StopCopy, copy_verified, opened_verified, read_verified
from scopefs.catalog.audit import record, record_quietly
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.excerpt import Excerpt, Window
from scopefs.catalog.exposures import Exposed
from scopefs.catalog.home import Home
from scopefs.catalog.index import index_again
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason

log = logging.getLogger("scopefs.search")


def read_note(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> bytes:
    return read_target(home, session_id, path, actor_id=actor_id)[2]


def read_target(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> tuple[Access, Target, bytes]:
    """``read_note``, with the access and the resolved note it read (the revision a copy is made from)."""
    access, target = readable(home, session_id, path, actor_id)
    assert target.store is not None and target.revision is not None
    try:
        data = read_verified(home, access.agent_id, target.store, target.revision)
    except IntegrityError:
        _audit(home, access, target, "error", Reason.REVISION_STALE, quietly=True)
        raise
    _audit(home, access, target, "allow", Reason.ALLOWED)
    _searchable_again(home, access, target)
    return access, target, data


def stream_note(home: Home, session_id: str, path: str, write: Callable[[bytes], object], *,
                actor_id: str | None = None, expose: Callable[[Access, Exposed], object] | None = None) -> Exposed:
    """``read_note`` for a note of any size: its bytes go to ``write`` in chunks.

    The whole artifact is hashed (keeping nothing) before the first byte
    reaches ``write``, then copied from the same descriptor, re-checked
    chunk by chunk (``artifacts.copy_verified``), so memory stays at a
    chunk or two where ``read_note`` holds the note twice over. A file
    that changes during the copy stops it with IntegrityError; what
    ``write`` received by then was verified. Returns the revision read
    (for an exposure receipt). ``expose`` records that exposure once the
    artifact verified and before its first byte reaches ``write``.
    """
    access, target = readable(home, session_id, path, actor_id)
    assert target.store is not None and target.revision is not None
    try:
        with opened_verified(home, access.agent_id, target.store, target.revision) as artifact:
            _audit(home, access, target, "allow", Reason.ALLOWED)
            if expose is not None:
                expose(access, Exposed(target.revision.revision_id, target.revision.resource_id))
            copy_verified(artifact, write)
    except IntegrityError:
        _audit(home, access, target, "error", Reason.REVISION_STALE, quietly=True)
        raise
    _searchable_again(home, access, target)
    return Exposed(target.revision.revision_id, target.revision.resource_id)


def read_window(home: Home, session_id: str, path: str, window: Window, *,
                actor_id: str | None = None) -> tuple[Excerpt, Exposed]:
    """A bounded window of a note (``catalog.excerpt``): ``stream_note``, read only as far as it needs;
    and the revision it came from."""

    def feed(chunk: bytes) -> None:
        if window.feed(chunk):
            raise StopCopy

    exposed = stream_note(home, session_id, path, feed, actor_id=actor_id)
    return window.result(), exposed


def _searchable_again(home: Home, access: Access, target: Target) -> None:
    """A revision just verified gets its search rows back if a search had retired them
    (``index.index_again``); a failure here never fails the read that succeeded."""
    assert target.revision is not None
    try:
        index_again(home, access.agent_id, [target.revision.revision_id])
    except Exception as exc:  # noqa: BLE001 - doctor reports what stays unindexed
        log.warning("a verified note was not indexed again (%s)", type(exc).__name__)


def readable(home: Home, session_id: str, path: str, actor_id: str | None) -> tuple[Access, Target]:
    """The session's access and the note at ``path``, once ``read`` of it is allowed (else raise, audited)."""
    parts = split_virtual_path(path)  # BadInput before anything is looked up
    access = authorize_session(home, session_id, Op.READ, actor_id=actor_id, parts=parts)
    target = resolve(access, parts)
    decision = decide(access, target, Op.READ)
    if target.mount is None:
        raise access.refuse_outside(Op.READ, parts)
    if not decision:
        raise access.refuse(Op.READ, decision.reason, store_id=target.store.store_id if target.store else None,
                            revision_id=target.revision.revision_id if target.revision else None)
    return access, target


def _audit(home: Home, access: Access, target: Target, decision: str, reason: Reason, *,
           quietly: bool = False) -> None:
    """Record the read's outcome; ``quietly`` for an error already on its way to the caller."""
    event = access.event(Op.READ, decision, reason,
                         store_id=target.store.store_id if target.store else None,
                         revision_id=target.revision.revision_id if target.revision else None)
    if quietly:
        record_quietly(home.state(), event)
    else:
        record(home.state(), event)
