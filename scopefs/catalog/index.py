"""The search index's rows: made outside transactions, written with activation.

Index rows are content-bearing derived state (the seed's "Catalog rows and
derived indexes"), so they follow the revision they were cut from exactly:

* ``prepare`` cuts and embeds a revision's text *before* the activation
  transaction (embedding is slow and touches no catalog row);
* ``insert`` writes the rows *inside* that transaction, so a revision is
  never active without its rows nor indexed without being active (a
  trigger refuses rows of any other revision);
* a close through a mount leaves both to ``catch_up``: the activation
  queues the revision in ``index_backlog``, and the rows are made when the
  mount is idle or before any search reads the index, whichever is first;
* retirement needs no code: a trigger deletes a revision's rows when it
  stops being active (tombstoned, forgotten, corrupt), or queues them for
  ``catch_up`` when a save supersedes it, and ``retire`` deletes them when
  a search finds the artifact tampered;
* ``reindex`` rebuilds from the catalog and verified artifacts only.

Vectors carry the name of the model that made them. The catalog records
one current model; rows made by another (or by none, when the model could
not be loaded) are skipped by the vector arm until a reindex, so two
vector spaces are never compared.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import apsw

from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.chunks import MAX_INDEXED_BYTES, Chunk, cut, note_text
from scopefs.catalog.db import immediate, one, scalar
from scopefs.catalog.embedding import embedder_for
from scopefs.catalog.errors import BadInput, IntegrityError, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.stores import ACTIVE_WITH_STORE, RevisionRow, StoreRow
from scopefs.catalog.vectors import pack

log = logging.getLogger("scopefs.search")

EMBED_BATCH = 64


@dataclass(frozen=True)
class Model:
    name: str
    dimension: int


@dataclass(frozen=True)
class PreparedIndex:
    """One revision's rows, ready to insert; ``vectors`` is None when not embedded."""

    chunks: tuple[Chunk, ...]
    model: str | None
    vectors: tuple[bytes, ...] | None


def current_model(conn: apsw.Connection) -> Model:
    row = one(conn, "SELECT name, dimension FROM search_model WHERE singleton = 1")
    if row is None:
        raise StorageError("the catalog has no search model; run 'scopefs reindex'")
    return Model(row[0], row[1])


def prepare(data: bytes, model: Model) -> PreparedIndex:
    """Cut and embed a revision's text; no catalog access, no transaction.

    A model that cannot be loaded leaves the rows unembedded (found by words
    only) and says so once per process; the write itself never fails for it.
    """
    chunks = tuple(cut(note_text(data)))
    if not chunks:
        return PreparedIndex((), None, None)
    try:
        embedder = embedder_for(model.name)
    except (ValueError, RuntimeError) as exc:
        _warn_once(f"search index: the embedding model cannot be loaded ({exc}); "
                   "new notes are indexed by words only until 'scopefs reindex'")
        return PreparedIndex(chunks, None, None)
    vectors: list[bytes] = []
    for start in range(0, len(chunks), EMBED_BATCH):
        batch = chunks[start:start + EMBED_BATCH]
        vectors.extend(pack(v) for v in embedder.embed([c.body for c in batch]))
    return PreparedIndex(chunks, model.name, tuple(vectors))


def prepare_from_fd(fd: int, model: Model) -> PreparedIndex:
    """``prepare`` for the indexed head of an open artifact (read outside any transaction)."""
    return prepare(os.pread(fd, MAX_INDEXED_BYTES, 0), model)


def insert(conn: apsw.Connection, agent_id: str, *, revision_id: str, resource_id: str, store_id: str,
           prepared: PreparedIndex) -> None:
    """Inside the activation transaction: the revision's rows, after it became active.

    Vectors made with a model that is no longer current (a reindex switched
    models meanwhile) are dropped, never mixed in; the reindex picks the
    rows up.
    """
    model = prepared.model if prepared.model == current_model(conn).name else None
    conn.execute("DELETE FROM search_indexed WHERE agent_id = ? AND revision_id = ?", (agent_id, revision_id))
    conn.execute("INSERT INTO search_indexed (revision_id, agent_id, model, chunks) VALUES (?, ?, ?, ?)",
                 (revision_id, agent_id, model if prepared.chunks else None, len(prepared.chunks)))
    if not prepared.chunks:
        return
    rows = [(agent_id, revision_id, resource_id, store_id, c.ordinal, c.start_line, c.end_line, c.body,
             prepared.vectors[i] if model and prepared.vectors else None, model)
            for i, c in enumerate(prepared.chunks)]
    conn.executemany(
        "INSERT INTO search_chunks (agent_id, revision_id, resource_id, store_id, ordinal, start_line, end_line,"
        " body, embedding, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def retire_rows(conn: apsw.Connection, revision_id: str) -> None:
    """Inside a transaction: delete a revision's rows and take it off the queue (``catch_up``)."""
    for table in ("search_chunks", "search_indexed", "index_backlog"):
        conn.execute(f"DELETE FROM {table} WHERE revision_id = ?", (revision_id,))


def retire(conn: apsw.Connection, agent_id: str, revision_id: str) -> None:
    """Delete a revision's rows now (its artifact failed verification)."""
    with immediate(conn):
        conn.execute("DELETE FROM search_chunks WHERE agent_id = ? AND revision_id = ?", (agent_id, revision_id))
        conn.execute("DELETE FROM search_indexed WHERE agent_id = ? AND revision_id = ?", (agent_id, revision_id))


# Active revisions whose rows are missing (never made, or retired by a search that found the
# artifact tampered), and those whose rows another model than the current one made.
_UNINDEXED = " AND NOT EXISTS (SELECT 1 FROM search_indexed i WHERE i.revision_id = v.revision_id)"
_STALE = (" AND (NOT EXISTS (SELECT 1 FROM search_indexed i WHERE i.revision_id = v.revision_id)"
          "      OR EXISTS (SELECT 1 FROM search_indexed i WHERE i.revision_id = v.revision_id AND i.chunks > 0"
          "                 AND i.model IS NOT (SELECT name FROM search_model WHERE singleton = 1)))")
_ORDER = " ORDER BY v.revision_id"
_IN_BATCH = 500  # revision ids per query (SQLite's default limit on variables is 32766)


def stale_count(conn: apsw.Connection, agent_id: str) -> int:
    """How many active revisions a search cannot fully find until ``reindex`` (doctor reports it).

    Revisions waiting in ``index_backlog`` are not stale: every search catches them up first.
    """
    return int(scalar(conn, "SELECT count(*) FROM revisions v JOIN resources r ON r.resource_id = v.resource_id"
                            " WHERE v.agent_id = ? AND v.state = 'active' AND r.state = 'live'"
                            " AND NOT EXISTS (SELECT 1 FROM lineage_holds h WHERE h.revision_id = v.revision_id)"
                            " AND NOT EXISTS (SELECT 1 FROM index_backlog b WHERE b.revision_id = v.revision_id)"
                            + _STALE, (agent_id,)))


def backlog_count(conn: apsw.Connection, agent_id: str) -> int:
    """How many revisions closes through a mount activated whose search rows are not made yet."""
    return int(scalar(conn, "SELECT count(*) FROM index_backlog WHERE agent_id = ?", (agent_id,)))


def catch_up(home: Home, agent_id: str, store_ids: Collection[str] | None = None, *,
             limit: int | None = None, queued_by: int | None = None) -> int:
    """Make the search rows of the revisions waiting in ``index_backlog``; how many left the queue.

    A close through a mount activates its revision without them (cutting
    and embedding is a third of a save); the mount calls this for its cells
    when it is idle, a few at a time (``limit``), and every search calls it
    for the stores it reads (``store_ids``; None: the whole cell) before
    reading the index, so a search still finds every committed revision
    and never waits for another scope's saves. The rows are cut from the
    artifact verified again (``index_again``): one that fails verification
    leaves the queue without rows, like a revision a search retired, and
    the first read that verifies it indexes it. A queued revision no longer
    active (superseded by the next save) loses its rows instead; held ones
    are skipped. Cheap when the queue is empty: one indexed probe per store.
    ``queued_by`` (``now_us``): only what was queued by then, so a search is
    never held in the loop by saves that keep arriving in its stores.
    """
    conn = home.catalog(agent_id)
    sql, params = "SELECT revision_id FROM index_backlog WHERE agent_id = ?", list[object]([agent_id])
    if store_ids is not None:
        stores = sorted(set(store_ids))
        if not stores:
            return 0
        sql += f" AND store_id IN ({','.join('?' * len(stores))})"
        params.extend(stores)
    if queued_by is not None:
        sql += " AND queued_at <= ?"
        params.append(queued_by)
    sql += " ORDER BY queued_at LIMIT ?"
    taken = 0
    while limit is None or taken < limit:
        batch = _IN_BATCH if limit is None else min(_IN_BATCH, limit - taken)
        queued = [row[0] for row in conn.execute(sql, (*params, batch))]
        if not queued:
            break
        index_again(home, agent_id, queued)  # the active ones
        with immediate(conn):  # the rows of those no longer active (superseded), and the queue
            retired = {row[0] for row in conn.execute(
                f"SELECT revision_id FROM revisions WHERE state != 'active' AND revision_id IN"
                f" ({','.join('?' * len(queued))})", queued)}
            for revision_id in queued:
                if revision_id in retired:
                    retire_rows(conn, revision_id)
            conn.executemany("DELETE FROM index_backlog WHERE revision_id = ?", [(r,) for r in queued])
        taken += len(queued)
    return taken


def unindexed_among(count: int) -> str:
    """The query for which of ``count`` revision ids are active and have no search rows (parameters: the
    agent id three times, then the ids). A mount runs it for every revision it verified: it must look
    the ids up, never walk the catalog (``ACTIVE_WITH_STORE`` says why it does not)."""
    return ACTIVE_WITH_STORE + f" AND v.revision_id IN ({','.join('?' * count)})" + _UNINDEXED + _ORDER


def index_again(home: Home, agent_id: str, revision_ids: Iterable[str]) -> int:
    """Index those of ``revision_ids`` that are active but have no rows; how many now have them.

    Called with revisions whose artifact a read has just verified (the
    command line's ``read``, a mount's open). A search that met a tampered
    artifact retired its rows; once the artifact is restored, the first
    read that verifies it makes the note searchable again, without waiting
    for ``doctor --fix``. The rows are cut from the artifact verified once
    more here, never from what the caller read.
    """
    conn = home.catalog(agent_id)
    wanted = sorted(set(revision_ids))
    rows: list[tuple[Any, ...]] = []
    for start in range(0, len(wanted), _IN_BATCH):
        batch = wanted[start:start + _IN_BATCH]
        rows += conn.execute(unindexed_among(len(batch)), (agent_id, agent_id, agent_id, *batch)).fetchall()
    if not rows:
        return 0
    report = ReindexReport()
    _rebuild(home, conn, agent_id, current_model(conn), rows, report, None)
    return report.revisions - len(report.failed)


@dataclass
class ReindexReport:
    revisions: int = 0
    chunks: int = 0
    failed: list[str] = field(default_factory=list)  # revision ids whose artifact failed verification
    model: str = ""



def reindex(home: Home, agent_id: str, *, model: str | None = None, only_stale: bool = False,
            progress: Callable[[int, int], None] | None = None) -> ReindexReport:
    """Rebuild every active revision's rows from its verified artifact.

    With ``model``, the catalog switches to it first (BadInput if no
    embedder answers to the name, so a typo changes nothing); the vector
    arm then ignores old rows until each is rebuilt. Rows of revisions that
    are not active, which the triggers should never leave, are removed.
    Each revision is rebuilt in its own short transaction, so searches keep
    working throughout; an artifact that fails verification keeps no rows.
    ``only_stale`` rebuilds just the revisions never indexed or indexed with
    another model (what doctor --fix does); a full run ends with that sweep
    too, for revisions a writer activated with the old model meanwhile.
    """
    conn = home.catalog(agent_id)
    if model is not None:
        try:
            embedder = embedder_for(model)
        except (ValueError, RuntimeError) as exc:
            raise BadInput(str(exc)) from None
        with immediate(conn):
            conn.execute("UPDATE search_model SET name = ?, dimension = ? WHERE singleton = 1",
                         (embedder.name, embedder.dimension))
    current = current_model(conn)
    report = ReindexReport(model=current.name)
    with immediate(conn):
        for table in ("search_chunks", "search_indexed"):
            conn.execute(f"DELETE FROM {table} WHERE agent_id = ? AND revision_id NOT IN"
                         " (SELECT revision_id FROM revisions WHERE state = 'active')", (agent_id,))
    rows = conn.execute(ACTIVE_WITH_STORE + (_STALE if only_stale else "") + _ORDER,
                        (agent_id, agent_id, agent_id)).fetchall()
    if not only_stale:  # a writer may activate with the old model while the full pass runs: sweep after it
        _rebuild(home, conn, agent_id, current, rows, report, progress)
        rows = [row for row in conn.execute(ACTIVE_WITH_STORE + _STALE + _ORDER,
                                            (agent_id, agent_id, agent_id)) if row[0] not in report.failed]
    _rebuild(home, conn, agent_id, current, rows, report, progress)
    return report


def _rebuild(home: Home, conn: apsw.Connection, agent_id: str, current: Model, rows: list[tuple[Any, ...]],
             report: ReindexReport, progress: Callable[[int, int], None] | None) -> None:
    last_report = time.monotonic()
    for done, row in enumerate(rows, start=1):
        revision, store = RevisionRow(*row[:7]), StoreRow(*row[7:])
        try:
            prepared: PreparedIndex | None = prepare(
                read_verified(home, agent_id, store, revision, keep=MAX_INDEXED_BYTES), current)
        except IntegrityError:  # no rows, and no "indexed" mark: once repaired, the next reindex finds it
            report.failed.append(revision.revision_id)
            prepared = None
        with immediate(conn):
            for table in ("search_chunks", "search_indexed"):
                conn.execute(f"DELETE FROM {table} WHERE agent_id = ? AND revision_id = ?",
                             (agent_id, revision.revision_id))
            still = one(conn, "SELECT 1 FROM revisions WHERE revision_id = ? AND state = 'active'",
                        (revision.revision_id,))
            if still is not None and prepared is not None:
                insert(conn, agent_id, revision_id=revision.revision_id, resource_id=revision.resource_id,
                       store_id=store.store_id, prepared=prepared)
                report.chunks += len(prepared.chunks)
        report.revisions += 1
        if progress is not None and (time.monotonic() - last_report >= 1.0 or done == len(rows)):
            progress(done, len(rows))
            last_report = time.monotonic()


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)
