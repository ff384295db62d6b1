"""``lineage release``: the owner's review that makes a held derived note independent.

A note held by its lineage (a source was tombstoned, forgotten or revoked)
stays denied until its owner re-derives it or, having reviewed it, declares
it independent. The declaration never lifts the hold: it writes the same
bytes as a new revision, with no lineage edge and fresh policy, and records
which held revision it came from (``lineage_releases``), so the original
lineage and its audit trail stay whole (the specification's
"reclassification as independent ... creates a new, reviewed immutable
revision").

Declassification is the owner's: a session may release a note only when
everything that held it was retired from the note's own store, and
everything it was derived from, at any depth, lies in that store too
(Alice's digest of her own removed note, a channel digest of removed
channel notes), and it may replace the note. The new revision keeps the
held one's validity (a digest of an expiring note still expires). A digest held because a projection
was revoked, a role note removed or another store's note forgotten is
never released by the audience that held the copy: re-derive it from what
it may still read. A note the session cannot see is refused as a read is
(``outside-view``), whatever it holds.
"""

from __future__ import annotations

import apsw

from scopefs.catalog.access import authorize_session, decide, resolve
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.clock import now_us
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import ancestor_stores, held_only_from, inherited_validity, is_held
from scopefs.catalog.paths import check_parts, split_virtual_path
from scopefs.catalog.policy import Decision, Op
from scopefs.catalog.reasons import Reason
from scopefs.writer.transaction import Provenance, WriteResult, write_parts


def release(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> WriteResult:
    parts = check_parts(split_virtual_path(path))
    access = authorize_session(home, session_id, Op.REPLACE, actor_id=actor_id, parts=parts)
    target = resolve(access, parts)
    if target.mount is None:
        raise access.refuse_outside(Op.READ, parts)
    seen = decide(access, target, Op.READ)
    revision = target.revision
    if (not seen and seen.reason is not Reason.LINEAGE_DENY) or revision is None or target.store is None:
        raise access.refuse(Op.READ, seen.reason if not seen else Reason.OUTSIDE_VIEW)  # as a read is refused
    if seen:
        raise BadInput("that note is not held by its lineage; nothing to release")
    held_id = revision.revision_id
    catalog = home.catalog(access.agent_id)
    own = (target.mount.scope_kind, target.mount.audience_id)
    above = set(ancestor_stores(catalog, access.agent_id, held_id))
    if not held_only_from(catalog, held_id, target.store.store_id) or not above <= {own}:
        raise access.refuse(Op.REPLACE, Reason.NOT_OWNER, store_id=target.store.store_id, revision_id=held_id)
    data = read_verified(home, access.agent_id, target.store, revision)

    def authority(conn: apsw.Connection, _activating: bool) -> Decision:
        row = conn.execute("SELECT state FROM revisions WHERE revision_id = ?", (held_id,)).fetchall()
        ok = bool(row) and row[0][0] == "active" and is_held(conn, held_id)
        return Decision(True, Reason.ALLOWED) if ok else Decision(False, Reason.REVISION_STALE)

    def record(conn: apsw.Connection, _resource_id: str, revision_id: str) -> None:
        conn.execute("INSERT INTO lineage_releases (revision_id, held_revision_id, agent_id, session_id, actor_id,"
                     " released_at) VALUES (?, ?, ?, ?, ?, ?)",
                     (revision_id, held_id, access.agent_id, session_id, actor_id, now_us()))

    return write_parts(home, session_id, parts, data, actor_id=actor_id,
                       expected_resource_id=target.resource.resource_id if target.resource else None,
                       provenance=Provenance(Op.REPLACE, "released", authority, record,
                                             valid_until=lambda conn: inherited_validity(conn, [held_id])))
