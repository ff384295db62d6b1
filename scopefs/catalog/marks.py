"""Whether anything a view is read from was committed since: one row and a pragma per database.

A mount reads its view again whenever one of its databases is written
(``vfs.follow``), and most of those writes are not about any view: every
serving mount records its reads in ``state.sqlite`` once a second, and
each such commit woke every other mount into a whole refresh (who the
session is, its evidence, its policy, the change log), about 2 ms of CPU
each, times a hundred mounts.

A ``Mark`` is what those databases looked like, taken before a refresh
reads them. Equal marks mean no commit that can change a view came in
between:

* ``state.sqlite``: its ``view_generation``, which a trigger on every
  table outside the journal counts up in the same transaction as the
  change (schema V5), whichever process or tool commits it; the journal
  (audit, exposures, search statistics, prunes) leaves it alone.
* each catalog the process has open: ``PRAGMA data_version`` (commits of
  any other connection) and the connection's own ``total_changes`` (its
  own commits: a mount saves through the very connection it reads with).

Time is the caller's part: a view also changes when a policy entry, a
lineage validity or a role membership runs out (``VisibleView.valid_until``,
``Access.evidence_until``), which no commit reports (``catalog.visible``).
Marks of different connections never compare equal, so a database opened
again, or one more catalog opened, always means "read again".
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from scopefs.catalog.db import scalar
from scopefs.catalog.home import Home


@dataclass(frozen=True, eq=False)
class Mark:
    """The databases of one process at one moment; compare with ``same_as``."""

    state: apsw.Connection
    generation: int
    catalogs: tuple[tuple[str, apsw.Connection, int, int], ...]  # (cell, connection, data_version, own changes)

    def same_as(self, other: Mark | None) -> bool:
        """Nothing a view is read from was committed between the two marks (same connections too)."""
        if other is None or self.state is not other.state or self.generation != other.generation:
            return False
        if len(self.catalogs) != len(other.catalogs):
            return False
        return all(a[0] == b[0] and a[1] is b[1] and a[2:] == b[2:]
                   for a, b in zip(self.catalogs, other.catalogs, strict=True))


def mark(home: Home) -> Mark:
    """Take a mark now. Call it on the thread that owns ``home``'s connections, before reading the view."""
    state = home.state()
    generation = int(scalar(state, "SELECT generation FROM view_generation WHERE singleton = 1"))
    catalogs = tuple((cell, conn, int(scalar(conn, "PRAGMA data_version")), conn.total_changes())
                     for cell, conn in sorted(home.open_catalogs().items()))
    return Mark(state, generation, catalogs)
