"""Exposure receipts: which revisions a response let out, recorded before it leaves.

The seed's ``memory_run_exposures``: every content-bearing answer (a
read, a search) records the immutable revisions it exposes to a session
and run, and the caller gets a receipt naming them, ids only. A gateway
merges receipts into its run's exposure set; the run's exposure revision
(how many distinct revisions the run has seen) grows with each addition,
so a later egress check can tell that a receipt is older than a read.

Recorded in ``state.sqlite`` (a pool's revision and an agent's land in one
table, across cells) in one transaction per response, committed without
a disk sync (``synchronous=NORMAL`` for that transaction only): a record
survives a crash of any scopefs process; a power loss can lose the last
few, never content, which is never stored here at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.audit import AuditEvent, insert_many
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate, relaxed, scalar
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home

_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True)
class Exposed:
    """One revision a response carries content of."""

    revision_id: str
    resource_id: str


@dataclass(frozen=True)
class Receipt:
    receipt_id: str
    run_id: str
    exposure_revision: int
    policy_revision: str | None
    exposed: tuple[Exposed, ...]
    recorded_at: int

    def as_dict(self) -> dict[str, Any]:
        return {"receipt_id": self.receipt_id, "run_id": self.run_id, "exposure_revision": self.exposure_revision,
                "policy_revision": self.policy_revision, "recorded_at_us": self.recorded_at,
                "exposed": [{"revision_id": e.revision_id, "resource_id": e.resource_id} for e in self.exposed]}


def check_run_id(run_id: object) -> str:
    """A caller's run id (e.g. OpenClaw's ``runId``): short, plain, never a path or free text."""
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise BadInput("run must be 1-128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'")
    return run_id


def record(home: Home, *, session_id: str, agent_id: str, run_id: str | None, operation: str,
           exposed: list[Exposed], policy_revision: str | None) -> Receipt:
    """Record ``exposed`` for the session's run and return the receipt (a fresh run id if none is given)."""
    run = check_run_id(run_id) if run_id is not None else ids.random_token()
    receipt_id, unique, now, revision = _insert(home.state(), session_id, agent_id, run, operation, exposed,
                                                policy_revision, count=True)
    return Receipt(receipt_id, run, revision, policy_revision, unique, now)


def record_batch(state: apsw.Connection, *, session_id: str, agent_id: str, run_id: str, operation: str,
                 exposed: list[Exposed], at: list[int] | None = None, audit: Sequence[AuditEvent] = ()) -> None:
    """Exposures of a surface without receipts (a mount's reads, the command line), in one transaction.

    ``at``: when each was exposed, parallel to ``exposed``. A mount records its reads about once a second;
    stamping them with the flush time would put a read made just before a removal after it, outside the
    window ``audit impact`` looks in.

    ``audit``: the reads' audit rows, written in the same transaction. A mount holds both in memory for
    up to a second before this, so one commit without a sync loses nothing a crash of the mount would
    not: and one commit, not two, is what every other mount wakes for (``vfs.follow``)."""
    if at is not None and len(at) != len(exposed):
        raise ValueError("record_batch: one time per exposure")
    if exposed or audit:
        _insert(state, session_id, agent_id, run_id, operation, exposed, None, count=False, at=at, audit=audit)


def _insert(state: apsw.Connection, session_id: str, agent_id: str, run: str, operation: str,
            exposed: list[Exposed], policy_revision: str | None, *, count: bool, at: list[int] | None = None,
            audit: Sequence[AuditEvent] = ()) -> tuple[str, tuple[Exposed, ...], int, int]:
    """One transaction of exposure rows (and ``audit`` rows), committed without a disk sync
    (``synchronous=NORMAL`` for this connection, this transaction): a crash of any process loses none,
    a power loss the last few, never content. With ``count``, also the run's exposure revision
    (distinct revisions it has seen)."""
    receipt_id = ids.random_token()
    now = now_us()
    when: dict[Exposed, int] = {}
    for e, t in zip(exposed, at if at is not None else [now] * len(exposed), strict=True):
        when.setdefault(e, t)  # the first exposure of a revision in this batch
    unique = tuple(when)
    revision = 0
    with relaxed(state), immediate(state):
        if audit:
            insert_many(state, list(audit))
        if unique:
            state.executemany(
                "INSERT INTO exposures (receipt_id, session_id, agent_id, run_id, operation, revision_id, resource_id,"
                " policy_revision, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(receipt_id, session_id, agent_id, run, operation, e.revision_id, e.resource_id, policy_revision,
                  when[e]) for e in unique])
        if count:
            revision = int(scalar(state, "SELECT count(DISTINCT revision_id) FROM exposures"
                                         " WHERE session_id = ? AND run_id = ?", (session_id, run)))
    return receipt_id, unique, now, revision


def exposures_of(state: apsw.Connection, agent_id: str, revision_ids: list[str]) -> list[dict[str, Any]]:
    """Who saw which of ``revision_ids``: (revision, session, run, operation, first and last time, how often)."""
    if not revision_ids:
        return []
    rows = state.execute(
        "SELECT revision_id, session_id, run_id, operation, min(at), max(at), count(*) FROM exposures"
        " WHERE agent_id = ? AND revision_id IN (SELECT value FROM json_each(?))"
        " GROUP BY revision_id, session_id, run_id, operation ORDER BY 5",
        (agent_id, json.dumps(revision_ids))).fetchall()
    return [{"revision_id": r[0], "session_id": r[1], "run_id": r[2], "operation": r[3], "first_at_us": r[4],
             "last_at_us": r[5], "count": r[6]} for r in rows]


def sessions_exposed_to(home: Home, revision_id: str) -> list[tuple[str, str, int]]:
    """(session, run, first time) of every exposure of ``revision_id``, oldest first."""
    return [(row[0], row[1], int(row[2])) for row in home.state().execute(
        "SELECT session_id, run_id, min(at) FROM exposures WHERE revision_id = ? GROUP BY session_id, run_id"
        " ORDER BY 3", (revision_id,))]
