"""Operational numbers without content (``scopefs stats``), from data that already exists.

Nothing here is measured on a read or write path: every number is derived
afterwards from rows those paths write anyway.

* decisions by operation, decision and reason: the audit's rows;
* integrity failures (a hash mismatch or a missing artifact on a read or a
  search): the audit's ``error``/``revision-stale`` rows of those operations;
* postfilter drops and search latency: ``search_stats``, the row a search
  adds to the transaction that already audits it (``catalog.searchstats``);
* write latency: each revision's pending insert to its activation
  (``revisions.created_at`` to ``activated_at``), the whole staged-rename
  transaction of DESIGN.md §6;
* repair backlog: what ``doctor`` would find, counted from the catalogs
  (pending intents, unsynced revisions, undrained audit, unindexed
  revisions) and the quarantine folders, without hashing any artifact.

Labels come from fixed vocabularies only (operations, decisions, reason
codes, backlog kinds): an operation or reason outside them is counted as
``other``. No id of a person, session, conversation or store, no path and
no content appears in the result.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from scopefs.catalog.auditlog import DECISIONS, OTHER_OPERATIONS
from scopefs.catalog.db import scalar
from scopefs.catalog.home import Home
from scopefs.catalog.index import stale_count
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason

OPERATIONS = frozenset({str(o) for o in Op} | set(OTHER_OPERATIONS))
REASONS = frozenset(str(r) for r in Reason)
QUANTILES = (0.5, 0.95, 0.99)
LATENCY_SAMPLES = 10_000  # the newest writes (per cell) a write-latency percentile is taken over
BACKLOG_KINDS = ("pending-intents", "unsynced-revisions", "undrained-audit", "unindexed-revisions",
                 "quarantined-entries", "postbox-pending")


def _label(value: object, vocabulary: frozenset[str] | tuple[str, ...]) -> str:
    text = str(value)
    return text if text in vocabulary else "other"


def percentiles(samples: list[int]) -> dict[str, float | None]:
    """Nearest-rank p50/p95/p99 of microsecond samples, in seconds (None without samples)."""
    ordered = sorted(samples)
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        key = f"p{round(q * 100)}"
        out[key] = None if not ordered else ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1e6
    return out


@dataclass
class Metrics:
    decisions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (op, decision, reason) -> rows
    integrity_failures: int = 0
    postfilter_drops: int = 0
    searches: int = 0
    search_latency_us: list[int] = field(default_factory=list)
    writes: int = 0
    write_latency_us: list[int] = field(default_factory=list)
    backlog: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BACKLOG_KINDS, 0))
    mounts_up: dict[str, int] = field(default_factory=dict)  # filled by the caller (``sandbox.census``)

    def as_dict(self) -> dict[str, Any]:
        return {
            "decisions": [{"op": op, "decision": d, "reason": r, "count": n}
                          for (op, d, r), n in sorted(self.decisions.items())],
            "hash_mismatches": self.integrity_failures,
            "postfilter_drops": self.postfilter_drops,
            "search": {"count": self.searches, "latency_seconds": percentiles(self.search_latency_us)},
            "write": {"count": self.writes, "latency_seconds": percentiles(self.write_latency_us)},
            "repair_backlog": dict(self.backlog),
            "mounts_up": dict(self.mounts_up),
        }


def collect(home: Home) -> Metrics:
    """Every number ``scopefs stats`` shows, except the live mounts (the sandbox layer counts those)."""
    out = Metrics()
    state = home.state()
    for operation, decision, reason, count in state.execute(
            "SELECT operation, decision, reason, count(*) FROM audit GROUP BY operation, decision, reason"):
        key = (_label(operation, OPERATIONS), _label(decision, DECISIONS), _label(reason, REASONS))
        out.decisions[key] = out.decisions.get(key, 0) + int(count)
    out.integrity_failures = int(scalar(
        state, "SELECT count(*) FROM audit WHERE decision = 'error' AND reason = ? AND operation IN ('read', 'search')",
        (str(Reason.REVISION_STALE),)))
    out.postfilter_drops = int(scalar(state, "SELECT coalesce(sum(dropped), 0) FROM search_stats"))
    out.search_latency_us = [int(r[0]) for r in state.execute("SELECT latency_us FROM search_stats")]
    out.searches = len(out.search_latency_us)
    for cell in home.cells():
        _cell(home, cell, out)
    return out


def _cell(home: Home, cell: str, out: Metrics) -> None:
    catalog = home.catalog(cell)
    out.write_latency_us += [int(r[0]) for r in catalog.execute(
        "SELECT activated_at - created_at FROM revisions WHERE agent_id = ? AND activated_at IS NOT NULL"
        " ORDER BY activated_at DESC LIMIT ?", (cell, LATENCY_SAMPLES))]
    out.writes = len(out.write_latency_us)
    counts = {
        "pending-intents": "SELECT count(*) FROM write_intents WHERE agent_id = ? AND state = 'pending'",
        "unsynced-revisions": "SELECT count(*) FROM unsynced_revisions WHERE agent_id = ?",
        "undrained-audit": "SELECT count(*) FROM audit_outbox WHERE agent_id = ? AND state = 'ready'",
        "postbox-pending": "SELECT count(*) FROM postbox_items WHERE agent_id = ? AND state = 'pending'",
    }
    for kind, sql in counts.items():
        out.backlog[kind] += int(scalar(catalog, sql, (cell,)))
    out.backlog["unindexed-revisions"] += stale_count(catalog, cell)
    out.backlog["quarantined-entries"] += _entries(home.quarantine_dir(cell))


def _entries(folder: os.PathLike[str] | str) -> int:
    try:
        with os.scandir(folder) as found:
            return sum(1 for _ in found)
    except FileNotFoundError:
        return 0
