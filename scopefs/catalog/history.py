"""Earlier revisions of a note: which ones a session may be shown, and what ``scopefs history`` lists.

A note's history is shown only to a session that may read the note now:
the note's current revision must pass the same decision a read makes
(``access.decide`` on the command line, the picture of ``visible`` in a
mount), so a note the view cannot read has no history, and asking for it
is refused exactly like a read of a missing note. Of that note, a
revision is shown only if

* it was committed and is still one of the note's revisions (``active`` or
  ``superseded``; never pending, rolled back, tombstoned or corrupt),
* it was not forgotten (``forgotten_revisions``: forgetting removes a
  revision from everything, history included),
* it is not held by its lineage (``lineage_holds``: an ancestor it was
  derived from was retired),
* it is not past its validity (``revision_validity``: denied once
  ``now >= valid_until``), and
* it is not the copy of a projection that was revoked or ran out. A
  projection's audience may read the copy only while its projection
  lives; a projection made again replaces the last one by revoking it and
  adding a revision to the same copy, so without this rule the audience
  would read, through the history, a copy its owner took back.

The content of a shown revision is served only after its artifact matched
the catalog's SHA-256, as for any read (the mount's ``vfs.reads``). The
listing itself carries ids, times, sizes and hashes, never content; the
command line audits it as ``history`` (an allow with the note's current
revision), refusals as the read refusals they are.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog.audit import record
from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.reader import readable
from scopefs.catalog.reasons import Reason

AUDIT_OPERATION = "history"  # a listing shows no content: it is not recorded as a read of any revision

_SHOWN = """
SELECT v.revision_id, v.revision_no, v.state, v.content_sha256, v.size, v.locator, v.created_at, v.activated_at,
       v.actor_id, v.session_id, v.trust_origin, x.valid_until
FROM revisions v LEFT JOIN revision_validity x ON x.revision_id = v.revision_id
WHERE v.agent_id = :agent AND v.resource_id = :resource AND v.state IN ('active', 'superseded')
  AND NOT EXISTS (SELECT 1 FROM forgotten_revisions f WHERE f.revision_id = v.revision_id)
  AND NOT EXISTS (SELECT 1 FROM lineage_holds h WHERE h.revision_id = v.revision_id)
  AND (x.valid_until IS NULL OR x.valid_until > :now)
  AND NOT EXISTS (SELECT 1 FROM projections p WHERE p.copy_revision_id = v.revision_id AND p.agent_id = :agent
                  AND (p.revoked_at IS NOT NULL OR (p.expires_at IS NOT NULL AND p.expires_at <= :now)))
ORDER BY v.revision_no
"""


@dataclass(frozen=True)
class Revision:
    """One revision of a note that may be shown, with what the listing says about it."""

    revision_id: str
    revision_no: int
    state: str  # active | superseded
    sha256: str
    size: int
    locator: str
    created_at: int
    activated_at: int | None
    actor_id: str | None  # a principal id (never a provider's raw id), or None when unattributed
    session_id: str | None  # kept for the audit's questions; never printed (another subject's session, say)
    origin: str  # the revision's trust origin
    valid_until: int | None  # shown until then (``revision_validity``)

    @property
    def time_us(self) -> int:
        """When it became the note's content (its activation), else when it was written."""
        return self.activated_at if self.activated_at is not None else self.created_at

    def as_dict(self) -> dict[str, Any]:
        return {"revision": self.revision_no, "revision_id": self.revision_id, "state": self.state,
                "created_at_us": self.created_at, "activated_at_us": self.activated_at,
                "actor_id": self.actor_id, "origin": self.origin,
                "bytes": self.size, "sha256": self.sha256}


def shown_revisions(conn: apsw.Connection, agent_id: str, resource_id: str, now: int) -> list[Revision]:
    """The revisions of ``resource_id`` that may be shown at ``now``, oldest first (the rules above).

    Decides nothing about the note itself: the caller has established that
    the session may read its current revision.
    """
    rows = conn.execute(_SHOWN, {"agent": agent_id, "resource": resource_id, "now": now})
    return [Revision(*row) for row in rows]


def revisions_shown(home: Home, cell: str, resource_id: str) -> list[Revision]:
    """``shown_revisions`` now, in the catalog of ``cell`` (a mount calls it on its catalog thread)."""
    return shown_revisions(home.catalog(cell), cell, resource_id, now_us())


@dataclass(frozen=True)
class NoteHistory:
    """What ``scopefs history`` prints."""

    path: str
    revisions: tuple[Revision, ...]

    def payload(self) -> dict[str, Any]:
        return {"path": self.path, "revisions": [r.as_dict() for r in self.revisions]}

    def lines(self) -> list[str]:
        return [f"r{r.revision_no}  {r.state}  {_when(r.time_us)}  actor {r.actor_id or '-'}"
                f"  origin {r.origin}  {r.size} bytes  sha256 {r.sha256}"
                for r in self.revisions]


def _when(at_us: int) -> str:
    return datetime.datetime.fromtimestamp(at_us / 1e6, tz=datetime.UTC).isoformat(timespec="seconds")


def note_history(home: Home, session_id: str, path: str, *, actor_id: str | None = None) -> NoteHistory:
    """The revisions of the note at ``path`` that the session may be shown.

    Authorized exactly as ``reader.read_note`` authorizes a read, with the
    same refusals (audited with the true reason, raised with the public
    one): a note outside the view, denied, tombstoned or missing is
    ``outside-view`` alike.
    """
    access, target = readable(home, session_id, path, actor_id)
    assert target.resource is not None
    store_id = target.store.store_id if target.store else None
    revision_id = target.revision.revision_id if target.revision else None
    found = shown_revisions(home.catalog(access.agent_id), access.agent_id, target.resource.resource_id, access.now)
    record(home.state(), access.event(AUDIT_OPERATION, "allow", Reason.ALLOWED, store_id=store_id,
                                      revision_id=revision_id))
    return NoteHistory("/".join(split_virtual_path(path)), tuple(found))
