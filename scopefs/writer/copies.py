"""What publishing and projecting have in common: a verified source and its preview.

Both take one revision of a note from the session's own view, show the
person sharing it what would go where, and only with ``--yes`` write a
copy. The source is read like any read (decided, verified against its
hash, audited); the preview holds the first lines of the caller's own
note, for the caller's own terminal, and is never logged or audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog.access import Access, Target
from scopefs.catalog.audiences import inside, live_member, reach_of_store
from scopefs.catalog.db import one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.lineage import ancestor_stores, is_held
from scopefs.catalog.paths import Parts, split_virtual_path
from scopefs.catalog.policy import Decision
from scopefs.catalog.reader import read_target
from scopefs.catalog.reasons import Reason

PREVIEW_LINES = 5
PREVIEW_LINE_CHARS = 160


@dataclass(frozen=True)
class Source:
    """One verified revision of a note of the session's view."""

    access: Access
    target: Target
    data: bytes
    path: str  # the virtual path it was named by

    @property
    def revision_id(self) -> str:
        assert self.target.revision is not None
        return self.target.revision.revision_id

    @property
    def revision_no(self) -> int:
        assert self.target.revision is not None
        return self.target.revision.revision_no

    def own(self) -> bool:
        """Whether the note is in the subject's own store (a user's private/, a service's agent/), of its own
        cell: the only notes a subject may copy out to an audience. Everything else it reads was shared
        with it (a projection, a role note, a pool, agent-shared) or is held for its review (the postbox)."""
        mount = self.target.mount
        subject = self.access.session.subject
        return (mount is not None and not self.access.cell and mount.scope_kind in ("user", "agent")
                and subject.principal_id is not None and mount.audience_id == subject.principal_id)

    def copy_name(self, name: str | None) -> Parts:
        """Where the copy goes inside its target store: ``--as NAME``, else the source's path inside its root."""
        if name is None:
            return self.target.inner
        parts = split_virtual_path(name)
        if not parts:
            raise BadInput("--as names a note, e.g. notes/x.md")
        return parts

    def first_lines(self) -> list[str]:
        text = self.data[: PREVIEW_LINES * PREVIEW_LINE_CHARS * 4].decode("utf-8", "replace")
        return [line[:PREVIEW_LINE_CHARS] for line in text.splitlines()[:PREVIEW_LINES]]

    def preview(self, **more: Any) -> dict[str, Any]:
        """What ``--yes`` would do, for the person deciding: source, revision, size, first lines, and ``more``."""
        return {"source": self.path, "source_revision": self.revision_no, "source_revision_id": self.revision_id,
                "bytes": len(self.data), "first_lines": self.first_lines(), **more}


def read_source(home: Home, session_id: str, path: str) -> Source:
    """The note at ``path`` as the session's view shows it now, verified (refusals as for ``read``)."""
    access, target, data = read_target(home, session_id, path)
    return Source(access, target, data, path)


def source_still_active(catalog: apsw.Connection, revision_id: str) -> Decision:
    """Inside a commit: the copy is of the revision the person saw, which nobody retired meanwhile
    (nor held: a copy made while its source's lineage is retired would escape the hold)."""
    row = one(catalog, "SELECT state FROM revisions WHERE revision_id = ?", (revision_id,))
    if row is None or row[0] != "active":
        return Decision(False, Reason.REVISION_STALE)
    if is_held(catalog, revision_id):
        return Decision(False, Reason.LINEAGE_DENY)
    return Decision(True, Reason.ALLOWED)


def lineage_allows(catalog: apsw.Connection, source: Source, scope_kind: str, audience_id: str) -> Decision:
    """Whether a copy for (``scope_kind``, ``audience_id``) reaches no one the source's own sources did not.

    A note of one's own store may still be a digest of a role note or a
    projection: copying it out is as wide as publishing those, so every
    store up its lineage must reach the copy's whole audience
    (``catalog.audiences``), else ``mixed-audience``.
    """
    target = reach_of_store(scope_kind, audience_id)
    member = live_member(source.access.home)
    own = source.target.mount
    for kind, audience in ancestor_stores(catalog, source.access.agent_id, source.revision_id):
        if own is not None and (kind, audience) == (own.scope_kind, own.audience_id):
            continue  # the owner's own notes: sharing them is what publishing is for
        if not inside(target, reach_of_store(kind, audience), member):
            return Decision(False, Reason.MIXED_AUDIENCE)
    return Decision(True, Reason.ALLOWED)
