"""Following the agent catalog's change log (schema V2).

A mounted view keeps its notes in memory and must learn, cheaply and
precisely, what changed underneath it: another session's write, a
tombstone, a policy entry. Triggers append one row per such change; a
follower remembers the last sequence number it applied and asks only for
what came after. Too many changes at once are reported as "rebuild
everything" rather than applied one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import apsw

from scopefs.catalog.db import scalar

MAX_CHANGES = 5000  # beyond this, a full rebuild is cheaper than per-note updates


@dataclass(frozen=True)
class Changes:
    last_seq: int
    resource_ids: frozenset[str] = field(default_factory=frozenset)
    store_ids: frozenset[str] = field(default_factory=frozenset)  # store-wide changes
    overflow: bool = False

    def __bool__(self) -> bool:
        return self.overflow or bool(self.resource_ids) or bool(self.store_ids)


def latest_seq(conn: apsw.Connection) -> int:
    return int(scalar(conn, "SELECT coalesce(max(seq), 0) FROM change_log"))


def changes_since(conn: apsw.Connection, seq: int) -> Changes:
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT seq, store_id, resource_id FROM change_log WHERE seq > ? ORDER BY seq LIMIT ?",
                        (seq, MAX_CHANGES + 1)).fetchall()
    if not rows:
        return Changes(seq)
    if len(rows) > MAX_CHANGES:
        return Changes(latest_seq(conn), overflow=True)
    return Changes(rows[-1][0], frozenset(r[2] for r in rows if r[2] is not None),
                   frozenset(r[1] for r in rows if r[2] is None))
