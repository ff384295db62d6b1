"""Reading a note through a session's view: decide, verify, audit.

The command line's read path for one note: validate the path, authorize
the session, resolve inside the view, evaluate ``read``, verify the
artifact's hash (``artifacts.verify``, the same check a mount's open makes),
and audit the outcome. A mount decides with the same evaluator once per
view (``catalog.visible``) and verifies per open (``vfs.content``). A refusal
names no other scope; an integrity failure returns no bytes.
"""

from __future__ import annotations

from scopefs.catalog.access import authorize_session, decide, resolve
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.audit import record, record_quietly
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason


def read_note(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> bytes:
    parts = split_virtual_path(path)  # BadInput before anything is looked up
    access = authorize_session(home, session_id, Op.READ, actor_id=actor_id)
    target = resolve(access, parts)
    decision = decide(access, target, Op.READ)
    store_id = target.store.store_id if target.store else None
    revision_id = target.revision.revision_id if target.revision else None
    if target.mount is None:
        raise access.refuse_outside(Op.READ, parts)
    if not decision:
        raise access.refuse(Op.READ, decision.reason, store_id=store_id, revision_id=revision_id)
    assert target.store is not None and target.revision is not None
    try:
        data = read_verified(home, access.agent_id, target.store, target.revision)
    except IntegrityError:
        record_quietly(home.state(), access.event(Op.READ, "error", Reason.REVISION_STALE, store_id=store_id,
                                                  revision_id=revision_id))
        raise
    record(home.state(), access.event(Op.READ, "allow", Reason.ALLOWED, store_id=store_id, revision_id=revision_id))
    return data
