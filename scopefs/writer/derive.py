"""Derivations: a summary, compaction or digest made from notes, never wider than they are.

A derivation is the classic laundering channel: a summary of a private
note written where a group can read it is the private note, reworded.
``derive`` reads every source through a session's view (decided for
``derive``, verified, audited), works out who each source reaches
(``catalog.audiences``, from the stores alone), and writes the content
only into a target every source reaches. Sources with no common audience
(two people's private notes) are refused ``mixed-audience`` and their
derivation is quarantined in the agent's review quarantine, written into
neither store. A target broader than its sources is refused the same way.

The new revision records a lineage edge to each source revision, so
retiring any source holds it (``catalog.lineage``); the authority (every
source still the active, unheld revision the content was made from) is
decided again inside both commits, so a source forgotten meanwhile wins.
Machine writes keep the target's human-notes block (``catalog.humanblock``)
and are stripped of chat scaffolding first (``catalog.envelope``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.access import Access, Target, authorize_session, decide, resolve
from scopefs.catalog.audiences import Reach, common, inside, live_member, reach_of, reach_of_store
from scopefs.catalog.clock import now_us
from scopefs.catalog.envelope import sanitise_capture_bytes
from scopefs.catalog.errors import BadInput, Denied
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import add_lineage, ancestor_stores, inherited_validity, is_held
from scopefs.catalog.paths import check_parts, split_virtual_path
from scopefs.catalog.policy import Decision, Op
from scopefs.catalog.reader import read_target
from scopefs.catalog.reasons import Reason
from scopefs.writer.capture import kept_still_readable, previous_bytes
from scopefs.writer.transaction import Provenance, WriteResult, check_write, write_copy, write_parts

KINDS = ("summary", "compaction", "digest")
MAX_SOURCES = 64
QUARANTINE = ("quarantine", "")  # (scope, audience) of the agent's review quarantine: mounted by no view


@dataclass(frozen=True)
class _Source:
    access: Access
    target: Target
    path: str
    reaches: tuple[Reach, ...]  # its store's, then those of the stores it was made from

    @property
    def revision_id(self) -> str:
        assert self.target.revision is not None
        return self.target.revision.revision_id


@dataclass(frozen=True)
class Derived:
    result: WriteResult
    kind: str
    sources: list[dict[str, Any]]


def parse_source(session_id: str, text: str) -> tuple[str, str]:
    """``PATH`` (through the deriving session), or ``SESSION:PATH`` (an operator naming another session's view)."""
    head, sep, rest = text.partition(":")
    if sep and ids.looks_like("session", head):
        return head, rest
    return session_id, text


def derive(home: Home, session_id: str, sources: list[str], to: str, data: bytes, *, kind: str = "summary",
           actor_id: str | None = None) -> Derived:
    """Write ``data`` at ``to`` as a ``kind`` derived from ``sources`` (module docstring)."""
    if kind not in KINDS:
        raise BadInput(f"--kind must be one of {', '.join(KINDS)}")
    if not sources or len(sources) > MAX_SOURCES:
        raise BadInput(f"name 1 to {MAX_SOURCES} sources with --from")
    parts = check_parts(split_virtual_path(to))
    for text in sources:
        split_virtual_path(parse_source(session_id, text)[1])  # every path is clean before anything is read
    content = sanitise_capture_bytes(data)
    access = authorize_session(home, session_id, Op.APPEND, actor_id=actor_id, parts=parts)
    read = [_read_source(home, access, session_id, text, actor_id) for text in sources]
    target = resolve(access, parts)
    if target.mount is None:
        raise access.refuse_outside(Op.APPEND, parts)
    check_write(home, session_id, parts)  # a target the session may not write is refused as a write is
    member = live_member(home)
    reach = reach_of(target.mount)
    reaches = [r for s in read for r in s.reaches]
    if not all(inside(reach, r, member) for r in reaches):
        if common(reaches, member) is None:
            held = _quarantine(access, read, content, kind)
            access.refuse(Op.DERIVE, Reason.MIXED_AUDIENCE)
            raise Denied(Reason.MIXED_AUDIENCE, f"denied: mixed-audience: the sources share no audience; nothing was"
                                                f" written to either store; the derivation is quarantined for review"
                                                f" as {held}")
        access.refuse(Op.DERIVE, Reason.MIXED_AUDIENCE)
        raise Denied(Reason.MIXED_AUDIENCE, "denied: mixed-audience: the target reaches people a source does not;"
                                            " derive into the narrowest store of the sources")
    content, kept_from = previous_bytes(home, session_id, to).keep_block(content)
    result = write_parts(home, session_id, parts, content, actor_id=actor_id,
                         provenance=_provenance(access, read, kind, "written", kept_from))
    return Derived(result, kind, [{"path": s.path, "revision_id": s.revision_id} for s in read])


def _read_source(home: Home, deriving: Access, session_id: str, text: str, actor_id: str | None) -> _Source:
    sid, path = parse_source(session_id, text)
    access, target, _data = read_target(home, sid, path, actor_id=actor_id if sid == session_id else None)
    if access.session.agent_id != deriving.session.agent_id:
        raise BadInput("every source must belong to the deriving session's agent")
    if access.cell or target.mount is None or target.mount.cell:
        raise BadInput("deriving from a shared pool is not supported yet: copy the note into your store first")
    decision = decide(access, target, Op.DERIVE)
    if not decision:
        raise access.refuse(Op.DERIVE, decision.reason, store_id=target.store.store_id if target.store else None)
    assert target.revision is not None
    # Who the source reaches: its store, and every store it was itself made from.
    above = ancestor_stores(home.catalog(access.agent_id), access.agent_id, target.revision.revision_id)
    return _Source(access, target, path, (reach_of(target.mount), *(reach_of_store(k, a) for k, a in above)))


def _provenance(access: Access, read: list[_Source], kind: str, state: str,
                kept_from: str | None = None) -> Provenance:
    """``kept_from``: the revision whose human-notes block the new one kept, a parent like the sources."""
    parents = list(dict.fromkeys([s.revision_id for s in read] + ([kept_from] if kept_from else [])))

    def authority(conn: apsw.Connection, _activating: bool) -> Decision:
        for source in read:
            row = conn.execute("SELECT state FROM revisions WHERE revision_id = ?", (source.revision_id,)).fetchall()
            if not row or row[0][0] != "active":
                return Decision(False, Reason.REVISION_STALE)
            if is_held(conn, source.revision_id):
                return Decision(False, Reason.LINEAGE_DENY)
        return kept_still_readable(conn, kept_from)

    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        for parent in parents:
            add_lineage(conn, access.agent_id, revision_id, parent, "derive")
        conn.execute("INSERT INTO derivations (revision_id, agent_id, kind, state, created_at) VALUES (?, ?, ?, ?, ?)",
                     (revision_id, access.agent_id, kind, state, now_us()))

    def valid_until(conn: apsw.Connection) -> int | None:
        """A derivation lasts no longer than any source: its validity, or the projection it was shown by."""
        return inherited_validity(conn, parents)

    return Provenance(Op.DERIVE, "derived", authority, record, valid_until=valid_until)


def _quarantine(access: Access, read: list[_Source], content: bytes, kind: str) -> str:
    """File a refused derivation where no view reaches; its id, for the operator's review."""
    name = ids.random_token()
    write_copy(access, *QUARANTINE, ("derived", f"{name}.md"), content, _provenance(access, read, kind, "quarantined"))
    return name
