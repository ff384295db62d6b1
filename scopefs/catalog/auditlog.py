"""Reading the redacted audit back: filtered queries, revocation impact, retention.

The audit holds ids, decisions and reason codes only (``catalog.audit``);
nothing here adds a column that could carry content, a query or a snippet,
and nothing here prints one: every value shown comes from those columns.

* ``query``: rows filtered by agent, time, operation, decision, reason and
  session, newest first. Filters are checked against fixed vocabularies
  (bad input changes nothing and says which values exist).
* ``impact``: after a binding is revoked or a member removed, which
  sessions were shown which revisions while the principal's access lasted:
  the sessions whose subject is the principal, and the group sessions of
  every conversation it was a member of, within each membership's window.
* ``prune``: retention. Audit rows older than the cutoff, and the exposure
  rows of runs of closed sessions whose newest row is older than it, go in
  one transaction, which also records the prune itself (an audit row and an
  ``audit_prunes`` row with the cutoff and the counts). Idle is not ended: a
  run of a session that is not closed (``sessions.closed_at`` in its agent's
  catalog, found through ``session_index``) may record again at any time, so
  it keeps every exposure row however old. Its exposure revision (distinct
  revisions seen) must never shrink, or a stale egress receipt could look
  current again. A session whose closure cannot be established (no index
  row, no catalog row) counts as open. Closing is final (a trigger forbids
  reopening), so the closed set read before the transaction stays true in it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, scalar
from scopefs.catalog.durations import parse_duration_us
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason

DECISIONS = ("allow", "deny", "error")
# Operations recorded besides the evaluator's own (``policy.Op``): the row names are code constants.
OTHER_OPERATIONS = ("search", "history", "rename", "forget", "recover", "subject-add", "subject-remove",
                    "projection-revoke", "postbox-approved", "postbox-rejected", "postbox-purged", "audit-prune")
PRUNE_OPERATION = "audit-prune"
MAX_LIMIT = 10_000
DEFAULT_LIMIT = 100
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:\d{2})?")
_COLUMNS = ("audit_id", "at", "agent_id", "session_id", "operation", "subject_kind", "actor_id", "store_id",
            "revision_id", "decision", "reason")


def operations(state: apsw.Connection) -> list[str]:
    """Every operation a filter may name: the fixed vocabulary and any operation already recorded."""
    found = {str(o) for o in Op} | set(OTHER_OPERATIONS)
    found |= {str(r[0]) for r in state.execute("SELECT DISTINCT operation FROM audit")}
    return sorted(found)


def parse_since(text: str, now: int) -> int:
    """``7d`` (that long ago) or an ISO date/time (UTC unless it says otherwise), in microseconds."""
    if not isinstance(text, str) or len(text) > 40:
        raise BadInput("--since takes a duration (e.g. 7d) or an ISO date (e.g. 2026-01-31)")
    if _DATE.fullmatch(text):
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise BadInput("--since: not a valid date") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return int(when.timestamp() * 1_000_000)
    try:
        return now - parse_duration_us(text)
    except BadInput:
        raise BadInput("--since takes a duration (e.g. 7d) or an ISO date (e.g. 2026-01-31)") from None


@dataclass(frozen=True)
class Filters:
    agent: str | None = None
    since: int | None = None
    operation: str | None = None
    decision: str | None = None
    reason: str | None = None
    session: str | None = None
    limit: int = DEFAULT_LIMIT


def check(state: apsw.Connection, filters: Filters) -> Filters:
    """BadInput (exit 2) for a value outside its vocabulary, naming the valid ones."""
    if filters.decision is not None and filters.decision not in DECISIONS:
        raise BadInput(f"unknown decision {filters.decision!r}; valid: {', '.join(DECISIONS)}")
    if filters.reason is not None and filters.reason not in {str(r) for r in Reason}:
        raise BadInput(f"unknown reason {filters.reason!r}; valid: {', '.join(sorted(str(r) for r in Reason))}")
    if filters.operation is not None:
        valid = operations(state)
        if filters.operation not in valid:
            raise BadInput(f"unknown op {filters.operation!r}; valid: {', '.join(valid)}")
    if filters.session is not None and not ids.looks_like("session", filters.session):
        raise BadInput("--session: not a session id")
    if not 1 <= filters.limit <= MAX_LIMIT:
        raise BadInput(f"--limit must be between 1 and {MAX_LIMIT}")
    return filters


def query(home: Home, filters: Filters) -> list[dict[str, Any]]:
    """Matching rows, newest first, at most ``filters.limit``."""
    state = home.state()
    check(state, filters)
    where: list[str] = ["1"]
    params: list[str | int] = []
    for column, value in (("agent_id", filters.agent), ("operation", filters.operation),
                          ("decision", filters.decision), ("reason", filters.reason),
                          ("session_id", filters.session)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if filters.since is not None:
        where.append("at >= ?")
        params.append(filters.since)
    rows = state.execute(f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE {' AND '.join(where)}"
                         " ORDER BY at DESC, audit_id DESC LIMIT ?", (*params, filters.limit)).fetchall()
    return [{("at_us" if c == "at" else c): v for c, v in zip(_COLUMNS, row, strict=True)} for row in rows]


# -- impact -------------------------------------------------------------------

def pruned_before(state: apsw.Connection) -> int | None:
    """The latest cutoff ``audit prune`` applied (µs), or None if the audit was never pruned.

    Every report built from the audit and the exposure receipts (``impact``, who was shown a
    projection) is complete only from then on: a prune removed older audit rows, and older exposures
    of closed sessions. Such a report says so instead of looking complete."""
    value = scalar(state, "SELECT max(cutoff) FROM audit_prunes")
    return None if value is None else int(value)


def impact(home: Home, principal_id: str, agent: str | None = None) -> dict[str, Any]:
    """Sessions and revisions exposed to ``principal_id``'s audience while its access lasted, as far as the
    audit still tells (``pruned_before_us``: a prune removed what came before)."""
    state = home.state()
    row = state.execute("SELECT kind FROM principals WHERE principal_id = ?", (principal_id,)).fetchall()
    if not row:
        raise BadInput(f"unknown principal: {principal_id}")
    agents = [agent] if agent is not None else home.agents()
    if agent is not None and not home.agent_exists(agent):
        raise BadInput(f"unknown agent: {agent}")
    windows: list[tuple[str, str, str, str, int, int | None, str | None]] = []
    # (agent, session, subject kind, via, from, until, evidence id: the binding or the membership)
    memberships = [(m, g, added, min((t for t in (removed, expires) if t is not None), default=None))
                   for m, g, added, removed, expires in state.execute(
                       "SELECT m.membership_id, m.group_id, m.added_at, m.removed_at, m.expires_at FROM memberships m"
                       " JOIN conversations c ON c.conversation_id = m.group_id WHERE m.principal_id = ?"
                       " ORDER BY m.added_at", (principal_id,))]
    for agent_id in agents:
        catalog = home.catalog(agent_id)
        for session_id, kind, binding_id in catalog.execute(
                "SELECT session_id, subject_kind, binding_id FROM sessions WHERE agent_id = ? AND"
                " subject_principal_id = ? ORDER BY created_at", (agent_id, principal_id)).fetchall():
            # A private session's access lasted until its binding was revoked (nothing after can be exposed).
            revoked = None if binding_id is None else scalar(
                state, "SELECT revoked_at FROM identity_bindings WHERE binding_id = ?", (binding_id,))
            windows.append((agent_id, str(session_id), str(kind), "subject", 0,
                            None if revoked is None else int(revoked), None if binding_id is None else str(binding_id)))
        for membership_id, conversation_id, added, until in memberships:
            for (session_id,) in catalog.execute(
                    "SELECT session_id FROM sessions WHERE agent_id = ? AND subject_kind = 'conversation'"
                    " AND subject_principal_id = ? ORDER BY created_at", (agent_id, conversation_id)):
                windows.append((agent_id, session_id, "conversation", "membership", added, until, membership_id))
    sessions: list[dict[str, Any]] = []
    revisions: dict[str, None] = {}
    for agent_id, session_id, kind, via, start, until, evidence_id in windows:
        found = [str(r[0]) for r in state.execute(
            "SELECT revision_id FROM exposures WHERE session_id = ? AND agent_id = ? AND at >= ?"
            " AND (? IS NULL OR at < ?) GROUP BY revision_id ORDER BY min(at)",
            (session_id, agent_id, start, until, until))]
        if not found:
            continue
        revisions.update(dict.fromkeys(found))
        entry: dict[str, Any] = {"session_id": session_id, "agent_id": agent_id, "subject_kind": kind, "via": via,
                                 "from_us": start or None, "until_us": until, "revision_ids": found}
        if evidence_id is not None:
            entry["membership_id" if via == "membership" else "binding_id"] = evidence_id
        sessions.append(entry)
    return {"principal_id": principal_id, "sessions": sessions, "revision_ids": list(revisions),
            "pruned_before_us": pruned_before(state)}


# -- retention ----------------------------------------------------------------

_OLD_RUNS = ("SELECT session_id, run_id FROM exposures WHERE session_id IN (SELECT value FROM json_each(?))"
             " GROUP BY session_id, run_id HAVING max(at) < ?")


def closed_sessions(home: Home) -> list[str]:
    """Every session closed for good, each checked against the agent ``session_index`` names for it."""
    index = {str(s): str(a) for s, a in home.state().execute("SELECT session_id, agent_id FROM session_index")}
    closed: list[str] = []
    for agent_id in home.agents():
        closed += [str(s) for (s,) in home.catalog(agent_id).execute(
            "SELECT session_id FROM sessions WHERE closed_at IS NOT NULL") if index.get(str(s)) == agent_id]
    return closed


def prune_counts(state: apsw.Connection, cutoff: int, closed: list[str]) -> tuple[int, int]:
    """(audit rows, exposure rows) a prune at ``cutoff`` removes, given the ``closed`` sessions."""
    audit = int(scalar(state, "SELECT count(*) FROM audit WHERE at < ?", (cutoff,)))
    exposures = int(scalar(state, f"SELECT count(*) FROM exposures WHERE (session_id, run_id) IN ({_OLD_RUNS})",
                           (json.dumps(closed), cutoff)))
    return audit, exposures


def prune(home: Home, older_than: str, *, apply: bool) -> dict[str, Any]:
    """Preview (``apply`` False: nothing changes) or remove what is older than ``older_than`` (a duration)."""
    now = now_us()
    cutoff = now - parse_duration_us(older_than)  # BadInput before anything is read
    state = home.state()
    closed = closed_sessions(home)
    if not apply:
        audit, exposures = prune_counts(state, cutoff, closed)
        return {"applied": False, "cutoff_us": cutoff, "audit_rows": audit, "exposure_rows": exposures}
    prune_id = ids.new_id("event")
    with immediate(state):
        audit, exposures = prune_counts(state, cutoff, closed)
        state.execute("DELETE FROM audit WHERE at < ?", (cutoff,))
        state.execute(f"DELETE FROM exposures WHERE (session_id, run_id) IN ({_OLD_RUNS})",
                      (json.dumps(closed), cutoff))
        state.execute("INSERT INTO audit_prunes (prune_id, at, cutoff, audit_rows, exposure_rows)"
                      " VALUES (?, ?, ?, ?, ?)", (prune_id, now, cutoff, audit, exposures))
        state.execute("INSERT INTO audit (event_id, at, operation, decision, reason) VALUES (?, ?, ?, 'allow', ?)",
                      (prune_id, now, PRUNE_OPERATION, str(Reason.ALLOWED)))
    return {"applied": True, "prune_id": prune_id, "cutoff_us": cutoff, "audit_rows": audit,
            "exposure_rows": exposures}
