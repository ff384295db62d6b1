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
MAX_DESCENDANTS = 100_000  # a bound on what ``descendants`` returns for a forget's report
_FOLLOWED_SQL = ", ".join(f"'{r}'" for r in FOLLOWED)

# Every revision below the roots, at any depth: UNION drops what it has seen, so the walk ends on any
# graph (lineage is acyclic anyway: a child is always newer than its parents), in time linear in the edges.
_DOWN = f"""
WITH RECURSIVE down(revision_id) AS (
    SELECT e.child_revision_id FROM lineage_edges e
    WHERE e.agent_id = :agent AND e.parent_revision_id IN (SELECT value FROM json_each(:roots))
      AND e.relation IN ({_FOLLOWED_SQL})
    UNION
    SELECT e.child_revision_id FROM lineage_edges e JOIN down d ON e.parent_revision_id = d.revision_id
    WHERE e.agent_id = :agent AND e.relation IN ({_FOLLOWED_SQL})
)
"""

# Every revision a revision was derived from, with its store: what a copy of it may never be wider
# than. Only derivations are followed: a projection or a published copy is itself the owner's reviewed
# decision to widen (its copy's store is its audience), and the walk stops there.
_UP = """
WITH RECURSIVE up(revision_id) AS (
    SELECT parent_revision_id FROM lineage_edges
    WHERE agent_id = :agent AND child_revision_id = :child AND relation = 'derive'
    UNION
    SELECT e.parent_revision_id FROM lineage_edges e JOIN up u ON e.child_revision_id = u.revision_id
    WHERE e.agent_id = :agent AND e.relation = 'derive'
)
SELECT DISTINCT s.scope_kind, s.audience_id FROM up JOIN revisions v ON v.revision_id = up.revision_id
JOIN resources r ON r.resource_id = v.resource_id JOIN stores s ON s.store_id = r.store_id
"""


class TooMuchLineage(Exception):
    """The walk found more descendants than ``MAX_DESCENDANTS``: refuse rather than report some of them."""


def descendants(conn: apsw.Connection, agent_id: str, roots: list[str]) -> list[str]:
    """Every revision derived, directly or not, from any of ``roots`` (not the roots themselves)."""
    found = [str(r[0]) for r in conn.execute(_DOWN + f"SELECT revision_id FROM down LIMIT {MAX_DESCENDANTS + 1}",
                                             {"agent": agent_id, "roots": json.dumps(roots)})]
    if len(found) > MAX_DESCENDANTS:
        raise TooMuchLineage(f"more than {MAX_DESCENDANTS} derived revisions")
    excluded = set(roots)
    return [r for r in found if r not in excluded]


def ancestor_stores(conn: apsw.Connection, agent_id: str, revision_id: str) -> list[tuple[str, str]]:
    """(scope kind, audience) of the store of every revision ``revision_id`` was derived from, at any depth."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(_UP, {"agent": agent_id, "child": revision_id})]


def resource_revisions(conn: apsw.Connection, agent_id: str, resource_id: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT revision_id FROM revisions WHERE agent_id = ? AND resource_id = ?"
        " AND state NOT IN ('pending', 'rolled-back')"
        " ORDER BY revision_no",
        (agent_id, resource_id))]


def hold_descendants(conn: apsw.Connection, agent_id: str, resource_id: str, cause: str = "tombstone") -> int:
    """Inside the caller's transaction: hold every descendant of every revision of ``resource_id``.

    Every revision counts, not only the active one: a summary made from an
    older revision of a note carries that note's content too. Returns how
    many revisions were newly held.
    """
    return hold(conn, agent_id, resource_revisions(conn, agent_id, resource_id), cause)


def hold(conn: apsw.Connection, agent_id: str, roots: list[str], cause: str) -> int:
    """Hold every descendant of ``roots``, in one statement; each hold names the newest root as its cause."""
    if not roots:
        return 0
    conn.execute(_DOWN + "INSERT OR IGNORE INTO lineage_holds (revision_id, cause_revision_id, agent_id, cause,"
                 " held_at) SELECT revision_id, :cause_revision, :agent, :cause, :now FROM down"
                 " WHERE revision_id NOT IN (SELECT value FROM json_each(:roots))",
                 {"agent": agent_id, "roots": json.dumps(roots), "cause_revision": roots[-1], "cause": cause,
                  "now": now_us()})
    return conn.changes()


def add_lineage(conn: apsw.Connection, agent_id: str, child: str, parent: str, relation: str) -> None:
    """One edge: ``child`` was made from ``parent`` (inside the transaction that activates ``child``)."""
    conn.execute("INSERT OR IGNORE INTO lineage_edges (child_revision_id, parent_revision_id, agent_id, relation,"
                 " created_at) VALUES (?, ?, ?, ?, ?)", (child, parent, agent_id, relation, now_us()))


def is_derived(conn: apsw.Connection, revision_id: str) -> bool:
    """Whether ``revision_id`` was made from another revision by a relation holds follow."""
    return bool(conn.execute(f"SELECT 1 FROM lineage_edges WHERE child_revision_id = ? AND relation IN"
                             f" ({_FOLLOWED_SQL}) LIMIT 1", (revision_id,)).fetchall())


def inherited_validity(conn: apsw.Connection, revision_ids: list[str]) -> int | None:
    """The earliest time any of ``revision_ids`` stops being valid (a copy or a digest lasts no longer)."""
    ids = json.dumps(revision_ids)
    row = conn.execute(
        "SELECT min(t) FROM (SELECT valid_until AS t FROM revision_validity WHERE revision_id IN"
        " (SELECT value FROM json_each(?)) UNION ALL SELECT expires_at FROM projections WHERE copy_revision_id IN"
        " (SELECT value FROM json_each(?)) AND expires_at IS NOT NULL)", (ids, ids)).fetchall()
    return None if not row or row[0][0] is None else int(row[0][0])


def is_held(conn: apsw.Connection, revision_id: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM lineage_holds WHERE revision_id = ? LIMIT 1", (revision_id,)).fetchall())


def _hold_stores(conn: apsw.Connection, revision_id: str) -> set[str]:
    """The stores of the retired sources that hold ``revision_id`` (empty: it is not held)."""
    return {str(r[0]) for r in conn.execute(
        "SELECT r.store_id FROM lineage_holds h JOIN revisions v ON v.revision_id = h.cause_revision_id"
        " JOIN resources r ON r.resource_id = v.resource_id WHERE h.revision_id = ?", (revision_id,))}


def held_only_from(conn: apsw.Connection, revision_id: str, store_id: str) -> bool:
    """Whether ``revision_id`` is held, and every retired source that holds it was a note of ``store_id``:
    that store's owner retired what it came from, and nobody else had a say."""
    return _hold_stores(conn, revision_id) == {store_id}


def held_from(conn: apsw.Connection, revision_id: str, store_id: str) -> bool:
    """Whether a retired source that holds ``revision_id`` was a note of ``store_id`` (whatever else holds it)."""
    return store_id in _hold_stores(conn, revision_id)


def parents(conn: apsw.Connection, agent_id: str, revision_id: str) -> list[tuple[str, str]]:
    """(parent revision, relation) of one revision."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT parent_revision_id, relation FROM lineage_edges WHERE agent_id = ? AND child_revision_id = ?",
        (agent_id, revision_id))]
