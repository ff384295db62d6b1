"""The broker's own sessions: opened by an operator's command for its run, never served, closed after it.

An operator's command on the host (``migrate``, ``quarantine release`` and
``purge``, ``unpublish``) has no person's session to act through, yet every
write goes through a session's access and every audit row names one. So
the command opens a shared-main session for its run (``writer.broker``),
whose own view holds nothing but ``agent-shared/``, and closes it when the
run ends. The ``broker_sessions`` row (schema V11), written in the same
transaction as the session, marks it for good:

* no mount, sandbox, delegation or other command may use it
  (``catalog.human.check_served``, ``check_command_line``), so a run killed before its
  close leaves nothing anyone can work through;
* it records the command, the local uid that ran it (and the login uid,
  which ``sudo`` keeps) and the run (``catalog.boot.run_mark``), so the audit
  rows naming the session lead to who did what;
* ``doctor`` finds a broker session still open whose run is gone, and
  ``doctor --fix`` closes it (``stale``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from scopefs.catalog import ids
from scopefs.catalog.boot import run_mark, running
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.sessions import SessionRecord, index_session, insert_session
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind


def open_broker_session(home: Home, agent_id: str, command: str) -> SessionRecord:
    """A new shared-main session of ``agent_id``, marked as this process's own for ``command``."""
    validate_agent_name(agent_id)
    catalog = home.catalog(agent_id)  # BadInput for an unknown agent
    now = now_us()
    record = SessionRecord(ids.new_id("session"), agent_id,
                           Subject(SubjectKind.AMBIGUOUS, reason=AmbiguousReason.SHARED_MAIN), None, now, None,
                           broker=True)
    with immediate(catalog):
        insert_session(catalog, record)
        catalog.execute("INSERT INTO broker_sessions (session_id, agent_id, command, unix_uid, login_uid, run_mark,"
                        " opened_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (record.session_id, agent_id, command, os.getuid(), _login_uid(), run_mark(), now))
    index_session(home, record)
    return record


def _login_uid() -> int | None:
    """The uid this process's login session began as (kept across ``sudo``); None if it has none."""
    try:
        text = open("/proc/self/loginuid", "rb").read(16).decode("ascii").strip()  # noqa: SIM115 - read at once
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) < 2**32 - 1 else None  # 4294967295: not set


def close_stale(home: Home, agent_id: str, session_id: str) -> bool:
    """Close a broker session ``stale`` found; False if it was closed meanwhile. By the catalog alone: a
    run killed before it indexed its session left a session ``load_session`` cannot find."""
    catalog = home.catalog(agent_id)
    with immediate(catalog):
        catalog.execute("UPDATE sessions SET closed_at = ? WHERE session_id = ? AND agent_id = ? AND closed_at IS NULL"
                        " AND session_id IN (SELECT session_id FROM broker_sessions WHERE agent_id = ?)",
                        (now_us(), session_id, agent_id, agent_id))
        return catalog.changes() > 0


def broker_only() -> BadInput:
    """The refusal of every use of a broker session but its own command's."""
    return BadInput("this session is an operator command's own, used only by that command's run")


@dataclass(frozen=True)
class BrokerSession:
    """What the catalog keeps of one broker session: the command's run behind the audit rows naming it."""

    session_id: str
    command: str
    unix_uid: int
    login_uid: int | None
    opened_at: int
    closed_at: int | None
    running: bool  # its run is still going


def listing(home: Home, agent_id: str) -> list[BrokerSession]:
    """The agent's broker sessions, oldest first."""
    validate_agent_name(agent_id)
    rows = home.catalog(agent_id).execute(
        "SELECT b.session_id, b.command, b.unix_uid, b.login_uid, b.opened_at, s.closed_at, b.run_mark"
        " FROM broker_sessions b JOIN sessions s USING (session_id) WHERE b.agent_id = ?"
        " ORDER BY b.opened_at, b.session_id", (agent_id,))
    return [BrokerSession(str(r[0]), str(r[1]), int(r[2]), None if r[3] is None else int(r[3]), int(r[4]),
                          None if r[5] is None else int(r[5]), r[5] is None and running(str(r[6]))) for r in rows]


def stale(home: Home, agent_id: str) -> list[str]:
    """The agent's broker sessions still open whose run is gone (killed before it closed them)."""
    rows = home.catalog(agent_id).execute(
        "SELECT b.session_id, b.run_mark FROM broker_sessions b JOIN sessions s USING (session_id)"
        " WHERE b.agent_id = ? AND s.closed_at IS NULL ORDER BY b.opened_at, b.session_id", (agent_id,))
    return [str(session_id) for session_id, mark in rows if not running(str(mark))]
