"""Human sessions: a person browsing their own memory at the console (``scopefs browse``).

A verified DM reaches a person's memory through a chat binding; a human
at the machine reaches it because the operator opened it for them. The
session's subject is that person's ordinary user subject, so the view is
exactly their DM's (``catalog.view``): ``private/`` rw, ``agent-shared/``
ro, their roles while the membership is fresh, their postbox review. What
differs is the evidence: instead of a binding id the session row carries
the id of its ``human_sessions`` row (schema V9), written once with it,
which records the principal and the one local uid the view is served to.

The evidence holds while the principal is an active human (``catalog.access``
rechecks it on every operation, as it rechecks a binding); every revision
made through such a session carries the principal as actor and the trust
origin ``human`` (``writer.transaction``). A human session delegates
nothing: a child of it would carry evidence no row vouches for.
"""

from __future__ import annotations

from collections.abc import Iterable

from scopefs.catalog import ids
from scopefs.catalog.broker_sessions import broker_only
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.identity import get_principal
from scopefs.catalog.sessions import SessionRecord, index_session, insert_session
from scopefs.catalog.subject import Subject, SubjectKind

TRUST_ORIGIN = "human"


def check_human(home: Home, principal_id: str) -> None:
    """BadInput unless ``principal_id`` names an active human principal (checked before anything is made)."""
    principal = get_principal(home.state(), principal_id)  # BadInput for an unknown or malformed id
    if principal.kind != "human" or principal.state != "active":
        raise BadInput("browse needs an active human principal (principal add NAME --kind human)")


def open_human_session(home: Home, agent_id: str, principal_id: str, unix_uid: int) -> SessionRecord:
    """A new session whose subject is ``principal_id`` itself, opened for the human at uid ``unix_uid``."""
    validate_agent_name(agent_id)
    catalog = home.catalog(agent_id)  # BadInput for an unknown agent
    check_human(home, principal_id)
    if unix_uid <= 0:
        raise BadInput("a human session is served to one unprivileged local user")
    session_id, evidence_id = ids.new_id("session"), ids.new_id("human_evidence")
    now = now_us()
    record = SessionRecord(session_id, agent_id, Subject(SubjectKind.USER, principal_id), evidence_id, now, None,
                           human=True)
    with immediate(catalog):
        insert_session(catalog, record)
        catalog.execute(
            "INSERT INTO human_sessions (session_id, agent_id, principal_id, evidence_id, unix_uid, opened_at)"
            " VALUES (?, ?, ?, ?, ?, ?)", (session_id, agent_id, principal_id, evidence_id, unix_uid, now))
    index_session(home, record)
    return record


def served_uid(home: Home, session: SessionRecord) -> int | None:
    """The local uid a human session is served to; None for any other session."""
    if not session.human:
        return None
    row = one(home.catalog(session.agent_id), "SELECT unix_uid FROM human_sessions WHERE session_id = ?"
              " AND agent_id = ?", (session.session_id, session.agent_id))
    return None if row is None else int(row[0])


def check_served(home: Home, session_id: str, uid: int | None) -> None:
    """BadInput if ``session_id`` is a human session and ``uid`` is not the one user it is for, or if it is
    a broker session (``catalog.broker_sessions``), which is never served.

    ``uid`` None: a mount or sandbox that is not served to one user (a plain
    ``scopefs mount``, ``scopefs run``): never for a human session. A
    person's view goes to that person alone, whoever asks the broker.
    """
    from scopefs.catalog.sessions import load_session

    session = load_session(home, session_id)
    if session.broker:
        raise broker_only()
    if session.human and (uid is None or served_uid(home, session) != uid):
        raise BadInput("a browse session is served only to its own local user (scopefs browse)")


def check_command_line(home: Home, named: Iterable[str], *, changing: str | None) -> None:
    """BadInput if a command may not act through the sessions it names: any broker session
    (``catalog.broker_sessions``: its own command's run's alone), or ``changing``, the session a
    command changes things as, when it is a browse session.

    A browse session's changes are the person's, made through its mount: a
    command-line ``write`` (or ``rm``, ``derive``, ``forget``, ``publish``,
    ...) with it would be the operator's act recorded as the principal's,
    with the origin ``human``. An unknown session is left to the command,
    which refuses it as it always has.
    """
    from scopefs.catalog.sessions import load_session

    for session_id in dict.fromkeys([*named, *([changing] if changing else [])]):
        try:
            session = load_session(home, session_id)
        except BadInput:
            continue
        if session.broker:
            raise broker_only()
        if session.human and session_id == changing:
            raise BadInput("a browse session writes only through its mount")
