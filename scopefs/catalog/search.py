"""Scoped hybrid search: authorize, rank, verify, cite.

The order is the seed's authoritative pipeline, and it is the point:

1. the session is authorized and its view computed, as for a read;
2. each arm (words through FTS5, meaning through sqlite-vec distances)
   walks only candidates the prefilter admits, in its own score order;
3. every candidate is decided by the pure evaluator (``Postfilter``)
   before it may count for anything; an arm keeps fetching pages until it
   holds its quota of *authorized* candidates or the eligible corpus is
   exhausted, so a denied nearest neighbour can never push an allowed one
   out;
4. the authorized candidates are scored by both arms and ranked;
5. each result's revision is verified against its hash at query time and
   its snippet cut from those verified bytes; a tampered artifact drops
   out (audited, its index rows retired) and the next candidate moves up.

Scores must not depend on anything denied. Both arms' scores are
therefore per chunk: cosine similarity, and a saturating term-frequency
score computed by our own FTS5 function from the chunk alone (FTS5's bm25
would weigh terms by how many *other* chunks, denied ones included,
contain them). Ranks depend only on authorized chunks' scores, and ties
are broken by path and line, never by row id.

Nothing here logs or audits a query, a snippet or a path: an arm that
degrades says which arm and why; the audit gets one row per revision whose
content was returned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import apsw

from scopefs.catalog import vectors
from scopefs.catalog.access import Access, authorize_session
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.audit import record_quietly
from scopefs.catalog.chunks import MAX_INDEXED_BYTES, snippet
from scopefs.catalog.clock import now_us
from scopefs.catalog.embedding import embedder_for
from scopefs.catalog.errors import BadInput, IntegrityError, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.identity import get_principal
from scopefs.catalog.index import catch_up, current_model, retire
from scopefs.catalog.policy import Op
from scopefs.catalog.postfilter import Postfilter
from scopefs.catalog.prefilter import Scope, predicate, scope_for
from scopefs.catalog.printable import printable
from scopefs.catalog.reasons import Reason
from scopefs.catalog.searchstats import SearchStat, record_search
from scopefs.catalog.stores import active_with_store

log = logging.getLogger("scopefs.search")

MAX_QUERY_CHARS = 1000
MAX_QUERY_TERMS = 32
MAX_LIMIT = 100
DEFAULT_LIMIT = 10
VECTOR_WEIGHT, WORDS_WEIGHT = 0.7, 0.3  # OpenClaw's hybrid defaults
MIN_SCORE = 0.1  # below this a chunk is noise (unrelated texts share a few hashed features), not a result
_TERMS = re.compile(r"\w{1,64}", re.UNICODE)  # bounded, like the embedder's

# The words score: BM25's saturation and length normalization without its
# corpus-wide IDF, so a chunk's score is a function of the chunk alone.
_K1, _B, _AVG_TOKENS = 1.2, 0.75, 150.0


@dataclass(frozen=True)
class Hit:
    """One result, in the shape OpenClaw's memory_search returns."""

    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    resource_id: str  # whose words these are: never printed, but held results follow it (``vfs.queries``)
    revision_id: str = ""  # the immutable revision quoted: for exposure receipts, never printed

    @property
    def citation(self) -> str:
        return f"{self.path}#L{self.start_line}-L{self.end_line}"

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "start_line": self.start_line, "end_line": self.end_line, "score": self.score,
                "snippet": self.snippet, "citation": self.citation}


@dataclass(frozen=True)
class Outcome:
    """A search's results, and the two ways every caller prints them.

    The command line and the mount's ``.search`` folder both print these,
    so a tool can parse either and get the same thing.
    """

    hits: tuple[Hit, ...]
    arms: tuple[str, ...]  # the arms that answered: "words", "vectors"

    def payload(self) -> dict[str, object]:
        """The JSON object (``--json``): the results in OpenClaw's shape, and the arms that answered."""
        return {"results": [hit.as_dict() for hit in self.hits], "arms": list(self.arms)}

    def lines(self) -> list[str]:
        """For people: a citation and score line per hit, then its snippet indented.

        Escaped (``catalog.printable``): a snippet is someone's note, and it
        must not drive the reader's terminal or split a line.
        """
        lines: list[str] = []
        for hit in self.hits:
            lines.append(printable(f"{hit.citation}  score {hit.score:.4f}"))
            lines.extend("    " + printable(line) for line in hit.snippet.split("\n"))
        return lines or ["no results"]


@dataclass
class _Candidate:
    chunk_id: int
    resource_id: str
    store_id: str
    revision_id: str
    path: str
    start_line: int
    end_line: int
    vectors: float | None = None  # each arm's score, in a field named after the arm; None until scored
    words: float | None = None
    score: float = 0.0


@dataclass
class _Arm:
    name: str  # "vectors" or "words", also the _Candidate field holding its score
    sql: str  # ordered by the arm's own score, paged with :n and :o
    rescore: str  # the same score for given chunk ids (:ids)
    params: dict[str, object]
    exhausted: bool = False
    offset: int = 0
    cursor: float = math.inf  # the arm score of the last row looked at: nothing unseen scores higher
    found: dict[int, _Candidate] = field(default_factory=dict)


_CANDIDATE_COLS = ("c.chunk_id, c.resource_id, c.store_id, c.revision_id, r.path, c.start_line, c.end_line,"
                   " r.state, v.state")
# Both arms start from the view's stores and the joins are pinned (CROSS
# JOIN, INDEXED BY): without statistics SQLite's planner preferred to walk
# every revision of the agent, so latency grew with the whole corpus
# (bench/RESULTS.md, "Scoped search"). The words arm ANDs the view's stores
# into the FTS5 match for the same reason.
_JOINS = ("CROSS JOIN resources r ON r.resource_id = c.resource_id AND r.agent_id = c.agent_id"
          " CROSS JOIN revisions v ON v.revision_id = c.revision_id AND v.agent_id = c.agent_id")
_PREDICATE = predicate(store="c.store_id", resource="c.resource_id", revision="c.revision_id")
_VECTOR_SCORE = "1.0 - vec_distance_cosine(c.embedding, :q)"
_WORDS_SCORE = "scopefs_words(search_fts, :terms)"
_VECTOR_SQL = (f"SELECT {_CANDIDATE_COLS}, {_VECTOR_SCORE} AS s"
               f" FROM search_chunks c INDEXED BY search_chunks_by_store {_JOINS}"
               f" WHERE c.agent_id = :agent AND c.model = :model AND {_PREDICATE}"
               f" ORDER BY s DESC, c.chunk_id LIMIT :n OFFSET :o")
_WORDS_SQL = (f"SELECT {_CANDIDATE_COLS}, {_WORDS_SCORE} AS s"
              f" FROM search_fts CROSS JOIN search_chunks c ON c.chunk_id = search_fts.rowid {_JOINS}"
              f" WHERE search_fts MATCH :match AND c.agent_id = :agent AND {_PREDICATE}"
              f" ORDER BY s DESC, c.chunk_id LIMIT :n OFFSET :o")
_VECTOR_SCORES = (f"SELECT c.chunk_id, {_VECTOR_SCORE} FROM search_chunks c"
                  " WHERE c.chunk_id IN (SELECT value FROM json_each(:ids)) AND c.model = :model")
_WORDS_SCORES = (f"SELECT rowid, {_WORDS_SCORE} FROM search_fts WHERE search_fts MATCH :text_match"
                 " AND rowid IN (SELECT value FROM json_each(:ids))")


def _words_score(api: apsw.FTS5ExtensionApi, terms: int) -> float:
    """Mean saturated frequency of the query's ``terms`` (the first phrases) in this chunk's text alone (0..1).

    The phrases after them name the view's stores; they only restrict the match.
    """
    terms = min(int(terms), api.phrase_count)
    if terms <= 0:
        return 0.0
    length = max(1, api.column_size(0))
    norm = _K1 * (1 - _B + _B * length / _AVG_TOKENS)
    total = 0.0
    for phrase in range(terms):
        tf = len(api.phrase_locations(phrase)[0])  # column 0 is the text
        total += tf / (tf + norm)
    return total / terms


def _match(terms: list[str], scope: Scope | None) -> str:
    """The FTS5 query: any term in the text, and (given a scope) one of the view's stores.

    Terms are ``\\w`` runs and store ids our own tokens, so nothing quoted
    here can close a quote or add an operator.
    """
    words = " OR ".join(f'"{t}"' for t in terms)
    if scope is None:
        return f"body : ({words})"
    stores = " OR ".join(f'"{s.store_id}"' for s in scope.stores)
    return f"body : ({words}) AND store_id : ({stores})"


_prepared_lock = threading.Lock()
_prepared: weakref.WeakKeyDictionary[apsw.Connection, str | None] = weakref.WeakKeyDictionary()


def _ready(conn: apsw.Connection) -> str | None:
    """Register our FTS5 function and load sqlite-vec once per connection; why vectors cannot work, if so."""
    with _prepared_lock:
        if conn in _prepared:
            return _prepared[conn]
        conn.register_fts5_function("scopefs_words", cast("apsw.FTS5Function", _words_score))
        try:
            vectors.load(conn)
            problem = None
        except StorageError as exc:
            problem = str(exc)
        _prepared[conn] = problem
        return problem


def check_query(query: str, limit: int) -> tuple[str, int]:
    """Bad input fails before anything is looked up."""
    if not isinstance(query, str) or "\x00" in query:
        raise BadInput("invalid query")
    query = " ".join(query.split())
    if not query:
        raise BadInput("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise BadInput(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"--limit must be between 1 and {MAX_LIMIT}")
    return query, limit


MODES = ("hybrid", "words", "vectors")


def search(home: Home, session_id: str, query: str, *, limit: int = DEFAULT_LIMIT, about: str | None = None,
           actor_id: str | None = None, mode: str = "hybrid") -> Outcome:
    """The top ``limit`` authorized chunks for ``query`` in the session's view.

    ``mode`` picks both arms (degrading to either, loudly) or exactly one
    (failing if it cannot answer).
    """
    started = time.monotonic_ns()
    query, limit = check_query(query, limit)
    if mode not in MODES:
        raise BadInput(f"--mode must be one of {', '.join(MODES)}")
    if about is not None:
        get_principal(home.state(), about)  # BadInput for an unknown id; a display name is never resolved
    access = authorize_session(home, session_id, Op.READ, actor_id=actor_id)
    found: list[tuple[Hit, Access, str]] = []  # (hit, the access of its cell, its store)
    answered: dict[str, None] = {}
    dropped = 0
    for cell in access.cells():  # the agent's own cell, then each shared pool of the view: one index each
        inside = access.in_cell(cell)
        hits, stores, arms, denied = _search_cell(home, inside, query, limit, mode, about)
        dropped += denied
        found += [(hit, inside, store) for hit, store in zip(hits, stores, strict=True)]
        answered.update(dict.fromkeys(arms))
    found.sort(key=lambda f: (-f[0].score, f[0].path, f[0].start_line))
    kept = found[:limit]
    # Audited once merged and cut: a hit another cell outranked was never exposed.
    exposed = {(hit.revision_id, store): inside for hit, inside, store in kept}
    events = [inside.event("search", "allow", Reason.ALLOWED, store_id=store, revision_id=revision)
              for (revision, store), inside in exposed.items()]
    record_search(home.state(), events, SearchStat((time.monotonic_ns() - started) // 1000, len(kept), dropped))
    return Outcome(tuple(hit for hit, _, _ in kept), tuple(answered))


# Stores a view shows but search never looks in: a postbox deposit waits in
# its owner's quarantine, readable in review, and reaches search (or any
# prompt) only once approved into private/.
UNSEARCHED = frozenset({"quarantine"})


def _search_cell(home: Home, access: Access, query: str, limit: int, mode: str,
                 about: str | None) -> tuple[list[Hit], list[str], tuple[str, ...], int]:
    """The top ``limit`` authorized chunks of one cell's stores, each hit's store, the arms that answered,
    and how many candidates the postfilter denied (for ``scopefs stats``).

    Not audited here: the caller audits what survives the merge of every cell.
    """
    conn = home.catalog(access.agent_id)
    searched = tuple(m for m in access.view.mounts if m.scope_kind not in UNSEARCHED)
    scope = scope_for(conn, access.agent_id, access.session.subject, searched, access.now, about, access.view.caps)
    # What closes through a mount left unindexed in these stores, up to now (``catalog.index.catch_up``).
    catch_up(home, access.agent_id, [store.store_id for store in scope.stores], queued_by=now_us())
    arms = _arms(conn, scope, query, mode)
    postfilter = Postfilter(conn, scope)
    hits: list[Hit] = []
    exposed: dict[str, str] = {}
    failed: set[str] = set()  # revisions whose artifact failed verification during this search
    heads: dict[str, bytes] = {}  # verified heads of revisions, kept across rounds
    rescored: dict[tuple[str, int], float] = {}  # (arm, chunk) scores computed for the other arm's finds
    quota = max(3 * limit, 30)
    with conn:  # one read snapshot for every page of both arms: a concurrent write cannot shift a page
        while True:
            for arm in list(arms):
                try:
                    _fill(conn, arm, postfilter, quota)
                except apsw.SQLError as exc:  # this arm's index is unusable; the other one still answers
                    arms.remove(arm)
                    _degrade(arm.name, f"its index failed: {type(exc).__name__}", arms)
            ranked = _rank(conn, arms, failed, rescored)
            hits, exposed = _verified(home, access, scope, conn, ranked, limit, failed, heads)
            if _settled(arms, hits, limit):
                break
            quota *= 4  # an unseen candidate could still outrank a result: walk further
    for revision_id in failed:  # only now: deleting rows mid-search would shift the arms' pages
        retire(conn, access.agent_id, revision_id)
    return hits, [exposed[hit.revision_id] for hit in hits], tuple(arm.name for arm in arms), postfilter.denied


def _settled(arms: list[_Arm], hits: list[Hit], limit: int) -> bool:
    """Whether no candidate an arm has not reached yet could enter the results (a threshold rule).

    Each arm walks in its own score order, so anything it has not reached
    scores at most its cursor; a chunk unseen by every arm can thus score at
    most the weighted sum of the cursors. Once that bound is below the
    ``limit``-th result (or below the noise floor while results are short),
    the results are exactly the top ``limit`` of every authorized chunk.
    The rule reads only authorized results and the arms' positions, so
    the answer never depends on denied rows (how far the arms walked may).
    """
    if all(arm.exhausted for arm in arms):
        return True
    weights = {"vectors": VECTOR_WEIGHT, "words": WORDS_WEIGHT} if len(arms) == 2 else {arms[0].name: 1.0}
    bound = sum(weights[arm.name] * (0.0 if arm.exhausted else arm.cursor) for arm in arms)
    floor = hits[limit - 1].score if len(hits) >= limit else MIN_SCORE
    return round(bound, 6) < floor


def _degrade(lost: str, why: str, remaining: list[_Arm]) -> None:
    """Say that an arm is gone (never silently); fail when none is left."""
    if not remaining:
        raise StorageError(f"search is unavailable: the {lost} arm cannot answer ({why})")
    log.warning("search: %s arm unavailable (%s); searching by %s only", lost, why, remaining[0].name)


def _arms(conn: apsw.Connection, scope: Scope, query: str, mode: str) -> list[_Arm]:
    """The arms that can answer this query in ``mode``."""
    base = scope.params()
    terms = list(dict.fromkeys(t.casefold() for t in _TERMS.findall(query)
                               if any(ch.isalnum() for ch in t)))[:MAX_QUERY_TERMS]  # "___" is no word
    if not terms and mode == "words":
        raise BadInput("the query has no words to search for")
    words = None
    if terms:  # rescoring needs no store phrases: what it scores already passed the postfilter
        words = _Arm("words", _WORDS_SQL, _WORDS_SCORES, {**base, "match": _match(terms, scope), "terms": len(terms),
                                                          "text_match": _match(terms, None)})
    vector_problem = _ready(conn)
    vector = None
    if vector_problem is None and mode != "words":
        try:
            model = current_model(conn)
            embedded = embedder_for(model.name).embed([query])[0]
            if any(embedded):
                vector = _Arm("vectors", _VECTOR_SQL, _VECTOR_SCORES,
                              {**base, "q": vectors.pack(embedded), "model": model.name})
            else:
                vector_problem = "the query has nothing the model can embed"
        except (ValueError, RuntimeError) as exc:
            vector_problem = f"the embedding model cannot be loaded ({exc})"
    if mode == "words":
        assert words is not None
        return [words]
    if mode == "vectors":
        if vector is None:
            raise StorageError(f"search is unavailable: the vectors arm cannot answer ({vector_problem})")
        return [vector]
    arms = [arm for arm in (vector, words) if arm is not None]
    if not arms and not terms:
        raise BadInput("the query has no words to search for")
    if vector is None:
        _degrade("vectors", vector_problem or "unknown", arms)
    if words is None:
        _degrade("words", "the query has no words", arms)
    return arms


def _fill(conn: apsw.Connection, arm: _Arm, postfilter: Postfilter, quota: int) -> None:
    """Fetch pages in the arm's order until it holds ``quota`` authorized candidates or runs dry.

    ``arm.offset`` counts the rows already looked at, so a later, larger
    quota resumes exactly after the last decided row.
    """
    page = max(quota, 50)
    if not arm.params["stores"] or arm.params["stores"] == "[]":
        arm.exhausted = True  # a view with no store yet: nothing to walk
    while not arm.exhausted and len(arm.found) < quota:
        rows: list[tuple[Any, ...]] = conn.execute(arm.sql, {**arm.params, "n": page, "o": arm.offset}).fetchall()
        arm.exhausted = len(rows) < page
        for chunk_id, resource_id, store_id, revision_id, path, start, end, live, state, score in rows:
            if len(arm.found) >= quota:
                arm.exhausted = False
                break
            arm.offset += 1
            arm.cursor = _arm_score(arm.name, score)
            if postfilter.allows(resource_id, store_id, live == "live", state, revision_id):
                found = _Candidate(chunk_id, resource_id, store_id, revision_id, path, start, end)
                setattr(found, arm.name, _arm_score(arm.name, score))
                arm.found[chunk_id] = found
        page = min(page * 4, 20000)


def _arm_score(arm: str, raw: float | None) -> float:
    """One arm's score of one chunk, the same whichever query computed it."""
    if raw is None:
        return 0.0
    return max(0.0, float(raw)) if arm == "vectors" else float(raw)


def _rank(conn: apsw.Connection, arms: list[_Arm], failed: set[str],
          rescored: dict[tuple[str, int], float]) -> list[_Candidate]:
    """Every authorized candidate scored by every arm, best first, ties by path and line.

    An arm's page already scored what it found; only the candidates the
    other arm found alone are scored here, by the same expression.
    """
    union: dict[int, _Candidate] = {}
    for arm in arms:
        for chunk_id, candidate in arm.found.items():
            if candidate.revision_id in failed:
                continue
            merged = union.setdefault(chunk_id, dataclasses.replace(candidate))
            value = getattr(candidate, arm.name)
            if value is not None:
                setattr(merged, arm.name, value)
    if not union:
        return []
    names = {arm.name: arm for arm in arms}
    for arm in arms:
        for chunk_id, candidate in union.items():
            if getattr(candidate, arm.name) is None and (arm.name, chunk_id) in rescored:
                setattr(candidate, arm.name, rescored[(arm.name, chunk_id)])
        missing = json.dumps(sorted(c for c, cand in union.items() if getattr(cand, arm.name) is None))
        for chunk_id, raw in conn.execute(arm.rescore, {**arm.params, "ids": missing}):
            rescored[(arm.name, chunk_id)] = _arm_score(arm.name, raw)
            setattr(union[chunk_id], arm.name, rescored[(arm.name, chunk_id)])
    both = len(names) == 2

    def score(c: _Candidate) -> float:
        vector, words = c.vectors or 0.0, c.words or 0.0
        if both:
            return VECTOR_WEIGHT * vector + WORDS_WEIGHT * words
        return vector if "vectors" in names else words

    for candidate in union.values():
        candidate.score = round(score(candidate), 6)
    kept = [c for c in union.values() if c.score >= MIN_SCORE]
    return sorted(kept, key=lambda c: (-c.score, c.store_id, c.path, c.start_line))


def _verified(home: Home, access: Access, scope: Scope, conn: apsw.Connection, ranked: Iterable[_Candidate],
              limit: int, failed: set[str], content: dict[str, bytes]) -> tuple[list[Hit], dict[str, str]]:
    """Results cut from revisions verified now; a tampered one drops out, audited (and later retired).

    ``content`` keeps each verified revision's head (at most 1 MiB, all a
    snippet can need) for the rest of the search.
    """
    hits: list[Hit] = []
    exposed: dict[str, str] = {}
    for candidate in ranked:
        if len(hits) >= limit:
            break
        data = content.get(candidate.revision_id)
        if data is None:
            try:
                data = _read(home, conn, access.agent_id, candidate)
            except IntegrityError:
                failed.add(candidate.revision_id)
                record_quietly(home.state(), access.event("search", "error", Reason.REVISION_STALE,
                                                          store_id=candidate.store_id,
                                                          revision_id=candidate.revision_id))
                continue
            content[candidate.revision_id] = data
        store = scope.store(candidate.store_id)
        assert store is not None  # the postfilter admitted it: its store is in the view
        hits.append(Hit(f"{store.mount.root}/{candidate.path}", candidate.start_line, candidate.end_line,
                        candidate.score, snippet(data, candidate.start_line, candidate.end_line),
                        candidate.resource_id, candidate.revision_id))
        exposed[candidate.revision_id] = candidate.store_id
    return hits, exposed


def _read(home: Home, conn: apsw.Connection, agent_id: str, candidate: _Candidate) -> bytes:
    found = active_with_store(conn, agent_id, candidate.revision_id)
    if found is None or found[1].store_id != candidate.store_id:
        raise IntegrityError("the revision is no longer active")
    revision, store = found
    return read_verified(home, agent_id, store, revision, keep=MAX_INDEXED_BYTES)

