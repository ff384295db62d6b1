"""Lineage: what a revision was made from, and what is denied when a source goes.

A derived revision (a summary, a published or projected copy) must never
outlive the audience of what it was made from. When a source is
tombstoned, forgotten or revoked, ``hold_descendants`` walks the lineage
graph once, inside the transaction that retires the source, and writes a
hold for every revision downstream of it (depth and fan-in alike); readers
then need no walk: a held revision is simply not readable
(``policy.ResourceState.held``), the views drop it through the change log,
and the search index loses its rows by trigger (schema V7).

A deposit approved into the owner's ``private/`` is not followed: the
owner's review made it an independent note. A ``release`` is recorded
beside a new revision with no lineage of its own, so it is never followed
either.
"""

from __future__ import annotations

import json

import apsw

from scopefs.catalog.clock import now_us

# The relations a retired source denies its children through.
FOLLOWED = ("derive", "publish", "project")
MAX_DESCENDANTS = 100_000  # a bound on the walk; beyond it the retiring transaction fails, changing nothing

_DESCENDANTS = f"""
WITH RECURSIVE down(revision_id, depth) AS (
    SELECT e.child_revision_id, 1 FROM lineage_edges e
    WHERE e.agent_id = :agent AND e.parent_revision_id IN (SELECT value FROM json_each(:roots))
      AND e.relation IN ({", ".join(repr(r) for r in FOLLOWED)})
    UNION
    SELECT e.child_revision_id, d.depth + 1 FROM lineage_edges e JOIN down d ON e.parent_revision_id = d.revision_id
    WHERE e.agent_id = :agent AND e.relation IN ({", ".join(repr(r) for r in FOLLOWED)}) AND d.depth < 64
)
SELECT DISTINCT revision_id FROM down LIMIT {MAX_DESCENDANTS + 1}
"""


class TooMuchLineage(Exception):
    """The walk found more descendants than ``MAX_DESCENDANTS``: refuse rather than hold some of them."""


def descendants(conn: apsw.Connection, agent_id: str, roots: list[str]) -> list[str]:
    """Every revision derived, directly or not, from any of ``roots`` (not the roots themselves)."""
    found = [str(r[0]) for r in conn.execute(_DESCENDANTS, {"agent": agent_id, "roots": json.dumps(roots)})]
    if len(found) > MAX_DESCENDANTS:
        raise TooMuchLineage(f"more than {MAX_DESCENDANTS} derived revisions")
    return [r for r in found if r not in set(roots)]


def resource_revisions(conn: apsw.Connection, agent_id: str, resource_id: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT revision_id FROM revisions WHERE agent_id = ? AND resource_id = ? AND state != 'pending'",
        (agent_id, resource_id))]


def hold_descendants(conn: apsw.Connection, agent_id: str, resource_id: str, cause: str = "tombstone") -> int:
    """Inside the caller's transaction: hold every descendant of every revision of ``resource_id``.

    Every revision counts, not only the active one: a summary made from an
    older revision of a note carries that note's content too. Returns how
    many revisions were newly held.
    """
    roots = resource_revisions(conn, agent_id, resource_id)
    return hold(conn, agent_id, roots, cause)


def hold(conn: apsw.Connection, agent_id: str, roots: list[str], cause: str) -> int:
    """Hold every descendant of ``roots``; the hold names the first root found above it."""
    if not roots:
        return 0
    now = now_us()
    held = 0
    for child in descendants(conn, agent_id, roots):
        cause_revision = _nearest_root(conn, agent_id, child, roots)
        conn.execute("INSERT OR IGNORE INTO lineage_holds (revision_id, cause_revision_id, agent_id, cause, held_at)"
                     " VALUES (?, ?, ?, ?, ?)", (child, cause_revision, agent_id, cause, now))
        held += conn.changes()
    return held


def _nearest_root(conn: apsw.Connection, agent_id: str, child: str, roots: list[str]) -> str:
    """One root ``child`` descends from (for the audit trail of the hold)."""
    row = conn.execute(
        """WITH RECURSIVE up(revision_id, depth) AS (
               SELECT parent_revision_id, 1 FROM lineage_edges WHERE child_revision_id = ? AND agent_id = ?
               UNION SELECT e.parent_revision_id, u.depth + 1 FROM lineage_edges e JOIN up u
                     ON e.child_revision_id = u.revision_id WHERE e.agent_id = ? AND u.depth < 64)
           SELECT revision_id FROM up WHERE revision_id IN (SELECT value FROM json_each(?)) ORDER BY depth LIMIT 1""",
        (child, agent_id, agent_id, json.dumps(roots))).fetchall()
    return str(row[0][0]) if row else roots[0]


def is_held(conn: apsw.Connection, revision_id: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM lineage_holds WHERE revision_id = ? LIMIT 1", (revision_id,)).fetchall())


def parents(conn: apsw.Connection, agent_id: str, revision_id: str) -> list[tuple[str, str]]:
    """(parent revision, relation) of one revision."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT parent_revision_id, relation FROM lineage_edges WHERE agent_id = ? AND child_revision_id = ?",
        (agent_id, revision_id))]
