"""Opening sessions and stamping their write-once subject.

How a session is opened decides its subject, once (DESIGN.md §4):

* ``dm``: a live binding for (channel, account, sender) gives a user
  subject, recorded with the binding it came through; anything else is
  ambiguous (``unbound``). The raw sender is hashed for the lookup and then
  forgotten.
* ``group``: a conversation registered for this agent gives a conversation
  subject.
* ``service``: an explicit service principal gives a service subject.
* ``shared-main``: a shared main DM has no coherent person: ambiguous.

The catalog refuses any later change to the subject (a trigger), so neither
this module nor any other can rewrite it.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.groups import conversation_agent
from scopefs.catalog.home import Home, validate_agent_name
from scopefs.catalog.identity import get_principal, lookup_key, resolve_binding
from scopefs.catalog.subject import AmbiguousReason, Subject, SubjectKind


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    agent_id: str
    subject: Subject
    binding_id: str | None
    created_at: int
    closed_at: int | None
    # Opened for a human at the console (``scopefs browse``, ``catalog.human``): its ``binding_id`` is the
    # evidence id of its ``human_sessions`` row, not a chat binding. Write-once, like the subject.
    human: bool = False
    # Opened by an operator's command for its own run (``catalog.broker_sessions``): never served.
    broker: bool = False


@dataclass(frozen=True)
class DirectMessage:
    channel: str
    account: str
    sender: str


@dataclass(frozen=True)
class Group:
    conversation_id: str


@dataclass(frozen=True)
class Service:
    principal_id: str


@dataclass(frozen=True)
class SharedMain:
    pass


Opening = DirectMessage | Group | Service | SharedMain


def _subject_for(home: Home, agent_id: str, opening: Opening) -> tuple[Subject, str | None]:
    state = home.state()
    if isinstance(opening, DirectMessage):
        found = resolve_binding(state, home.hmac_key(), opening.channel, opening.account, opening.sender)
        if found is None:
            return Subject(SubjectKind.AMBIGUOUS, reason=AmbiguousReason.UNBOUND), None
        binding_id, principal_id = found
        return Subject(SubjectKind.USER, principal_id), binding_id
    if isinstance(opening, Group):
        if conversation_agent(state, opening.conversation_id) != agent_id:
            raise BadInput("unknown conversation for this agent")
        return Subject(SubjectKind.CONVERSATION, opening.conversation_id), None
    if isinstance(opening, Service):
        principal = get_principal(state, opening.principal_id)
        if principal.kind != "service" or principal.state != "active":
            raise BadInput("--service needs an active service principal")
        return Subject(SubjectKind.SERVICE, principal.principal_id), None
    return Subject(SubjectKind.AMBIGUOUS, reason=AmbiguousReason.SHARED_MAIN), None


MAX_SESSION_KEY_BYTES = 512


def open_session(home: Home, agent_id: str, opening: Opening, *, session_key: str | None = None) -> SessionRecord:
    """A session for ``opening``; with ``session_key``, the one already bound to that key if it still fits.

    A key names a gateway's logical session (OpenClaw's ``sessionKey``).
    Its session is reused while it is open and the facts give the same
    subject through the same binding; otherwise a new session is opened
    and the key bound to it, and the old session is refused from then on
    (``session-rebound``, see ``rebound``): a key never carries one
    subject's session over to another subject.
    """
    validate_agent_name(agent_id)
    catalog = home.catalog(agent_id)  # BadInput for an unknown agent
    subject, binding_id = _subject_for(home, agent_id, opening)
    mac = None
    if session_key is not None:
        if not isinstance(session_key, str) or not session_key \
                or len(session_key.encode("utf-8", "replace")) > MAX_SESSION_KEY_BYTES \
                or any(0xD800 <= ord(c) <= 0xDFFF for c in session_key):
            raise BadInput(f"a session key is non-empty text of at most {MAX_SESSION_KEY_BYTES} bytes")
        mac = lookup_key(home.hmac_key(), "session-key", agent_id, session_key)
    session_id = ids.new_id("session")
    now = now_us()
    with immediate(catalog):
        reuse = None
        if mac is not None:
            bound = one(catalog, "SELECT k.key_binding_id, s.session_id, s.subject_kind, s.subject_principal_id,"
                                 " s.subject_reason, s.binding_id, s.created_at, s.closed_at"
                                 " FROM session_keys k JOIN sessions s USING (session_id)"
                                 " WHERE k.agent_id = ? AND k.key_mac = ? AND k.unbound_at IS NULL", (agent_id, mac))
            if bound is not None:
                same = (bound[2], bound[3], bound[4], bound[5]) == (
                    subject.kind.value, subject.principal_id, subject.reason.value if subject.reason else None,
                    binding_id)
                if same and bound[7] is None:
                    reuse = SessionRecord(bound[1], agent_id, subject, binding_id, bound[6], None)
                else:
                    catalog.execute("UPDATE session_keys SET unbound_at = ? WHERE key_binding_id = ?",
                                    (now, bound[0]))
        if reuse is None:
            insert_session(catalog, SessionRecord(session_id, agent_id, subject, binding_id, now, None))
            if mac is not None:
                catalog.execute("INSERT INTO session_keys (key_binding_id, agent_id, key_mac, session_id, bound_at)"
                                " VALUES (?, ?, ?, ?, ?)", (ids.random_token(), agent_id, mac, session_id, now))
    record = reuse or SessionRecord(session_id, agent_id, subject, binding_id, now, None)
    # A reused session is indexed again (no-op if it is): a crash (or a concurrent open) between the two
    # commits must not leave its key bound to a session that cannot be loaded.
    index_session(home, record)
    return record


def insert_session(catalog: apsw.Connection, record: SessionRecord) -> None:
    """The session's row, write-once from here on; the caller's transaction also writes what marks it."""
    subject = record.subject
    catalog.execute(
        "INSERT INTO sessions (session_id, agent_id, subject_kind, subject_principal_id, subject_reason,"
        " binding_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (record.session_id, record.agent_id, subject.kind.value, subject.principal_id,
         subject.reason.value if subject.reason else None, record.binding_id, record.created_at),
    )


def index_session(home: Home, record: SessionRecord) -> None:
    """Name the session's agent in the home's index, after the catalog committed its row: the index
    never names a session that does not exist."""
    with immediate(home.state()):
        home.state().execute("INSERT OR IGNORE INTO session_index (session_id, agent_id) VALUES (?, ?)",
                             (record.session_id, record.agent_id))


def close_session(home: Home, session_id: str) -> bool:
    """End the session for good: every later operation, and every mount of it, is refused.

    False if it was closed already (nothing changes). A key bound to it
    opens a new session next time (``open_session`` never reuses a closed one).
    """
    session = load_session(home, session_id)
    catalog = home.catalog(session.agent_id)
    with immediate(catalog):
        catalog.execute("UPDATE sessions SET closed_at = ? WHERE session_id = ? AND agent_id = ?"
                        " AND closed_at IS NULL", (now_us(), session_id, session.agent_id))
        return catalog.changes() > 0


def rebound(home: Home, session: SessionRecord) -> bool:
    """Whether the gateway session key this session was opened for now names another session."""
    return one(home.catalog(session.agent_id), "SELECT 1 FROM session_keys WHERE session_id = ? AND agent_id = ?"
               " AND unbound_at IS NOT NULL", (session.session_id, session.agent_id)) is not None


def load_session(home: Home, session_id: str) -> SessionRecord:
    """The session's record; BadInput for an unknown or malformed id."""
    if not ids.looks_like("session", session_id):
        raise BadInput("unknown session: (malformed id)")
    row = one(home.state(), "SELECT agent_id FROM session_index WHERE session_id = ?", (session_id,))
    if row is None:
        raise BadInput(f"unknown session: {session_id}")
    agent_id = row[0]
    rec = one(
        home.catalog(agent_id),
        "SELECT s.subject_kind, s.subject_principal_id, s.subject_reason, s.binding_id, s.created_at, s.closed_at,"
        " h.evidence_id, b.session_id FROM sessions s LEFT JOIN human_sessions h"
        " ON h.session_id = s.session_id AND h.agent_id = s.agent_id AND h.principal_id = s.subject_principal_id"
        " LEFT JOIN broker_sessions b ON b.session_id = s.session_id AND b.agent_id = s.agent_id"
        " WHERE s.session_id = ? AND s.agent_id = ?",
        (session_id, agent_id),
    )
    if rec is None:
        raise BadInput(f"unknown session: {session_id}")
    kind = SubjectKind(rec[0])
    subject = Subject(kind, rec[1], AmbiguousReason(rec[2]) if rec[2] else None)
    human = rec[6] is not None and rec[6] == rec[3] and kind is SubjectKind.USER
    return SessionRecord(session_id, agent_id, subject, rec[3], rec[4], rec[5], human, broker=rec[7] is not None)
