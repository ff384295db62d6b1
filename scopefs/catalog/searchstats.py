"""Each search's latency and postfilter drops, for ``scopefs stats``.

A search that returned something opens one transaction on ``state.sqlite``
to audit the revisions it exposed; its timing row rides in that same
transaction, so recording it adds no commit, no sync and no round trip of
its own. That commit stays synced (``synchronous=FULL`` is per commit, so
relaxing it would relax the audit rows too). A search that exposed nothing
has no audit row to commit: its timing row alone goes in a ``relaxed``
transaction, with no disk sync (a power loss may lose the newest timings,
which only a metric reads). The row holds numbers only: no query, no
session, no principal, no path. The table is bounded: the same transaction
deletes all but the newest rows.

Under an audit backlog (a mount: ``catalog.audit.AuditBacklog``) the
transaction waits only briefly for another process's lock; if that lock
stays taken, the audit rows are held for the mount to write at its next
tick (the results are returned meanwhile, as a mount's reads are before
their batched audit) and the timing row, a metric, is dropped. If the
backlog is full, or the storage failed, the search fails as it does
without one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import apsw

from scopefs.catalog.audit import AuditEvent, contended, insert_many, patience
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import CATALOG_FAILURES, immediate, relaxed

KEPT = 10_000  # newest rows kept: enough for stable percentiles, small enough to never matter


@dataclass(frozen=True)
class SearchStat:
    latency_us: int
    results: int
    dropped: int  # candidates the prefilter admitted and the postfilter (the evaluator) denied


def record_search(state: apsw.Connection, events: list[AuditEvent], stat: SearchStat) -> None:
    """The search's audit rows and its timing row in one transaction; the timing row alone unsynced."""
    with patience(state) as backlog:
        try:
            _record(state, events, stat)
        except CATALOG_FAILURES as exc:
            if backlog is None or not contended(exc) or not backlog.hold(events):
                raise  # the search fails: nothing it found is exposed unaudited


def _record(state: apsw.Connection, events: list[AuditEvent], stat: SearchStat) -> None:
    with contextlib.ExitStack() as stack:
        if not events:
            stack.enter_context(relaxed(state))
        stack.enter_context(immediate(state))
        insert_many(state, events)
        state.execute("INSERT INTO search_stats (at, latency_us, results, dropped) VALUES (?, ?, ?, ?)",
                      (now_us(), max(0, stat.latency_us), stat.results, stat.dropped))
        stat_id = state.last_insert_rowid()
        if stat_id > KEPT:
            state.execute("DELETE FROM search_stats WHERE stat_id <= ?", (stat_id - KEPT,))
