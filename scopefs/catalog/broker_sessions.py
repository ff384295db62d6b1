"""The broker's own sessions: opened by an operator's command for its run, never served, closed after it.

An operator's command on the host (``migrate``, ``quarantine release`` and
``purge``, ``unpublish``) has no person's session to act through, yet every
write goes through a session's access and every audit row names one. So
the command opens a shared-main session for its run (``writer.broker``),
whose own view holds nothing but ``agent-shared/``, and closes it when the
run ends. The ``broker_sessions`` row (schema V11), written in the same
transaction as the session, marks it for good:

* no mount, sandbox, browse or command-line write may use it
  (``catalog.human.check_served``, ``refuse_command_line_changes``), so a
  run killed before its close leaves nothing anyone can work through;
* it records the operation, the local uid that ran the command and the run
  (``catalog.boot.run_mark``), so the audit rows naming the session lead to
  who did what;
* ``doctor`` finds a broker session still open whose run is gone, and
  ``doctor --fix`` closes it (``stale``).
"""

from __future__ import annotations

import os

from scopefs.catalog import ids
from scopefs.catalog.boot import run_mark, running
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.sessions import SessionRecord, index_session, insert_session
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind


def open_broker_session(home: Home, agent_id: str, operation: str) -> SessionRecord:
    """A new shared-main session of ``agent_id``, marked as this process's own for ``operation``."""
    validate_agent_name(agent_id)
    catalog = home.catalog(agent_id)  # BadInput for an unknown agent
    now = now_us()
    record = SessionRecord(ids.new_id("session"), agent_id,
                           Subject(SubjectKind.AMBIGUOUS, reason=AmbiguousReason.SHARED_MAIN), None, now, None,
                           broker=True)
    with immediate(catalog):
        insert_session(catalog, record)
        catalog.execute("INSERT INTO broker_sessions (session_id, agent_id, operation, unix_uid, run_mark, opened_at)"
                        " VALUES (?, ?, ?, ?, ?, ?)",
                        (record.session_id, agent_id, operation, os.getuid(), run_mark(), now))
    index_session(home, record)
    return record


def broker_only() -> BadInput:
    """The refusal of every use of a broker session but its own command's."""
    return BadInput("this session is an operator command's own, used only by that command's run")


def stale(home: Home, agent_id: str) -> list[str]:
    """The agent's broker sessions still open whose run is gone (killed before it closed them)."""
    rows = home.catalog(agent_id).execute(
        "SELECT b.session_id, b.run_mark FROM broker_sessions b JOIN sessions s USING (session_id)"
        " WHERE b.agent_id = ? AND s.closed_at IS NULL ORDER BY b.opened_at, b.session_id", (agent_id,))
    return [str(session_id) for session_id, mark in rows if not running(str(mark))]
