"""Opening a delegated child session (``scopefs session open --child-of SESSION --cap PATTERN``).

The child gets its own session id, authenticated on its own from then on,
and a subject copied from its parent's (write-once, never inferred): the
``sessions`` row and the ``session_delegations`` row are written in one
transaction, and triggers refuse any other shape (``catalog.delegation``).
The parent must be a session of the same agent whose evidence holds now
(refused with its reason, audited, otherwise), and the chain above the
child at most ``MAX_DEPTH`` long. A cap naming something the parent does
not see is accepted and grants nothing: refusing it would tell the caller
what the parent's view holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from scopefs.catalog import ids
from scopefs.catalog.access import current_access
from scopefs.catalog.broker_sessions import broker_only
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.delegation import MAX_DEPTH, Delegation, depth_of, parse_caps, record_delegation
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.sessions import SessionRecord, load_session


def open_child(home: Home, agent_id: str, parent_session_id: str,
               patterns: Sequence[str]) -> tuple[SessionRecord, Delegation]:
    """A new child session of ``parent_session_id`` limited to ``patterns``; BadInput or Denied otherwise."""
    validate_agent_name(agent_id)
    caps = parse_caps(patterns)
    catalog = home.catalog(agent_id)  # BadInput for an unknown agent
    parent = load_session(home, parent_session_id)  # BadInput for an unknown session
    if parent.agent_id != agent_id:
        raise BadInput("unknown session for this agent")
    if parent.human:
        raise BadInput("a browse session (a human at the console) delegates nothing")
    if parent.broker:
        raise broker_only()
    if depth_of(catalog, agent_id, parent.session_id) + 1 > MAX_DEPTH:
        raise BadInput(f"a delegation chain is at most {MAX_DEPTH} sessions deep")
    access, problem = current_access(home, parent.session_id)
    if problem is not None:
        raise access.refuse(Op.RETRIEVE, problem)  # a closed, rebound or revoked parent delegates nothing
    session_id = ids.new_id("session")
    now = now_us()
    subject = parent.subject
    delegation = Delegation(session_id, parent.session_id, caps, now)
    with immediate(catalog):
        row = one(catalog, "SELECT closed_at FROM sessions WHERE session_id = ? AND agent_id = ?",
                  (parent.session_id, agent_id))
        if row is None or row[0] is not None:  # closed since its access was checked
            problem = Reason.INVALID_CONTEXT
        else:
            catalog.execute(
                "INSERT INTO sessions (session_id, agent_id, subject_kind, subject_principal_id, subject_reason,"
                " binding_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session_id, agent_id, subject.kind.value, subject.principal_id,
                 subject.reason.value if subject.reason else None, parent.binding_id, now))
            record_delegation(catalog, agent_id, delegation)
    if problem is not None:
        raise access.refuse(Op.RETRIEVE, problem)
    # Indexed after the catalog commits, as ``open_session`` does: the index never names a missing session.
    with immediate(home.state()):
        home.state().execute("INSERT OR IGNORE INTO session_index (session_id, agent_id) VALUES (?, ?)",
                             (session_id, agent_id))
    return SessionRecord(session_id, agent_id, subject, parent.binding_id, now, None), delegation
