#!/usr/bin/env python3
"""Scoped search (issue 5): the authorized hybrid search against the unfiltered index.

What one run measures, on a corpus of 1,000 stores and 100,000 notes in one
agent cell (built once into a cache directory and reused):

* **authorized**: ``catalog.search.search(home, session, query, limit=10)``,
  the library path the CLI calls (no interpreter start-up), for user
  sessions whose views hold 2, 5, 10 and 20 stores, and for a 20-store view
  in which 99% of the notes (hence 99% of every query's nearest neighbours)
  are denied to that user by resource-level deny entries. Each arm is
  measured alone (``search(..., mode="vectors")`` / ``mode="words"``) and
  the two together (``mode="hybrid"``, the default).
* **unfiltered**: the same query as plain SQL over the whole index, with no
  prefilter and no postfilter: vectors by ``vec_distance_cosine`` over every
  chunk, words by FTS5 ``MATCH body : (terms)`` (no store restriction) with
  the same scoring function, hybrid as the real path merges them (each
  arm's top 30 keeps its own score; a chunk only one arm found is scored
  by the other with ``catalog.search``'s ``_VECTOR_SCORES`` /
  ``_WORDS_SCORES``); the top 10 artifacts are then read and hashed
  through the same ``catalog.search._read`` the real path uses, and their
  snippets cut.
* the same on a 10,000-note corpus (100 stores) whose view stores are
  byte-identical copies: whether latency grows with the view or with the
  whole corpus.
* the index build rate (``catalog.index.prepare`` + ``catalog.index.insert``
  with its commit, notes per second) and the index size per note (dbstat);
  and, for reference, ``write_note`` on 200 notes with indexing and with it
  skipped.
* where the time goes: the same searches with timers around the pipeline's
  functions (a separate pass), and each arm's SQL alone with its query plan.

Run 1 (``RESULTS.md``, "Scoped search (issue 5)") also measured two
what-ifs: the vector arm's SQL pinned to ``search_chunks_by_store``
(``pinned``) and the store as a second FTS5 column (``--what-if-fts``).
Both are now the real path (``catalog.search._VECTOR_SQL`` starts from
``search_chunks INDEXED BY search_chunks_by_store`` with ``CROSS JOIN``s;
``search_fts`` indexes ``store_id`` and the words arm matches ``body :
(terms) AND store_id : (the view's stores)``), so this script no longer
has them; run 1 holds the "before" numbers.

Every series takes turns with every other, query by query, in an order that
rotates, so a noisy stretch of the shared VM is spread over all of them.
Results are checked outside the timed region: every hit of an authorized
search must be a note the session may read, and a single arm's top-10
scores must equal a brute-force ranking of exactly the notes the session
may read.

    .venv/bin/python bench/search_bench.py [--reps 2] [--json] [--cache DIR] [--rebuild]
    .venv/bin/python bench/search_bench.py --from-json run.json

Results and their analysis: ``RESULTS.md``, section "Scoped search (issue 5)".
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import apsw

import scopefs.catalog.search as search_mod
from scopefs.catalog import ids, vectors
from scopefs.catalog.access import authorize_session
from scopefs.catalog.agents import add_agent
from scopefs.catalog.artifacts import open_store_dir
from scopefs.catalog.chunks import snippet
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.embedding import embedder_for
from scopefs.catalog.groups import add_member, add_role
from scopefs.catalog.home import Home
from scopefs.catalog.identity import add_principal, bind
from scopefs.catalog.index import PreparedIndex, current_model, insert, prepare
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Mount, Op
from scopefs.catalog.sessions import DirectMessage, open_session
from scopefs.catalog.view import READ_ONLY, READ_WRITE
from scopefs.writer.stores import ensure_store

AGENT = "main"
# Bump when the corpus or its schema changes; invalidates the cache (2: search_fts.store_id, 3: search_indexed).
CORPUS_VERSION = 3
LIMIT = 10
VIEWS = ("2", "5", "10", "20", "20-denied")  # view label -> (user, number of roles) below
ROLES_OF = {"2": 0, "5": 3, "10": 8, "20": 18, "20-denied": 19}
ARMS = ("hybrid", "vectors", "words")
DENIED_FRACTION = 0.99
MIN_SCORE = getattr(search_mod, "MIN_SCORE", 0.0)  # results below it are dropped by the real path
CHANNEL, ACCOUNT = "bench", "bench-account"

# -- the generated text ---------------------------------------------------------

VOCAB_SIZE = 6000
TOPICS = 300
TOPIC_WORDS = 30
FAVOURITES = 5  # topics a store mostly writes about


class Text:
    """Deterministic note and query text: a Zipfian vocabulary plus topics.

    Each store favours a few topics; a note mixes words of one or two
    topics with common words, so a query of topic words finds a few
    hundred notes in the corpus and a few in a view, and a query with a
    common word finds thousands.
    """

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"{seed}/vocabulary")
        onsets = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
                  "br", "cl", "dr", "fl", "gr", "pl", "pr", "st", "tr"]
        vowels = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
        words: list[str] = []
        seen: set[str] = set()
        while len(words) < VOCAB_SIZE:
            word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))
            word += rng.choice(("", "n", "r", "s", "l", "m", "t", "x"))
            if len(word) >= 3 and word not in seen:
                seen.add(word)
                words.append(word)
        self.words = words
        weights = [1.0 / (rank + 1) for rank in range(VOCAB_SIZE)]
        self.cum = list(_accumulate(weights))
        self.topics = [rng.sample(words[150:], TOPIC_WORDS) for _ in range(TOPICS)]
        self.seed = seed

    def common(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def note(self, rng: random.Random, favourites: list[int], number: int) -> bytes:
        first = rng.choice(favourites) if rng.random() < 0.7 else rng.randrange(TOPICS)
        second = rng.randrange(TOPICS) if rng.random() < 0.3 else None
        target = rng.randint(300, 800)
        lines = [f"# note {number}: " + " ".join(rng.sample(self.topics[first], 3)), ""]
        size = sum(len(line) + 1 for line in lines)
        while size < target:
            count = rng.randint(6, 14)
            background = iter(self.common(rng, count))
            tokens = []
            for _ in range(count):
                r = rng.random()
                if r < 0.4:
                    tokens.append(rng.choice(self.topics[first]))
                elif second is not None and r < 0.55:
                    tokens.append(rng.choice(self.topics[second]))
                else:
                    tokens.append(next(background))
            line = " ".join(tokens)
            lines.append(line[0].upper() + line[1:] + ".")
            size += len(lines[-1]) + 1
        return ("\n".join(lines) + "\n").encode()

    def queries(self, count: int) -> list[str]:
        rng = random.Random(f"{self.seed}/queries")
        out = []
        for i in range(count):
            topic = self.topics[rng.randrange(TOPICS)]
            terms = rng.sample(topic, 2 + i % 2)
            if i % 2:  # every other query carries a common word, as natural questions do
                terms.append(self.words[rng.randrange(10, 60)])
            rng.shuffle(terms)
            out.append(" ".join(terms))
        return out


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for v in values:
        total += v
        yield total


# -- building the corpus ----------------------------------------------------------

class BuildStats:
    def __init__(self) -> None:
        self.notes = 0
        self.chunks = 0
        self.bytes = 0
        self.prepare_s = 0.0
        self.insert_s = 0.0  # index.insert of one store's notes in one transaction, commit included
        self.rows_s = 0.0  # resources + revisions rows (pending, then active), one transaction per store
        self.files_s = 0.0  # artifact files (no fsync)
        self.stores_s = 0.0  # ensure_store
        self.text_s = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


def _store_mount(kind: str, audience: str) -> Mount:
    if kind == "user":
        return Mount("private", "user", audience, READ_WRITE, READ_WRITE)
    if kind == "role":
        return Mount("roles/x", "role", audience, READ_ONLY, READ_ONLY)
    return Mount("agent-shared", "agent-shared", "", READ_ONLY, READ_ONLY)


def fill_store(home: Home, access: Any, text: Text, store_no: int, kind: str, audience: str, notes: int,
               stats: BuildStats) -> str:
    """One store with ``notes`` notes: real store, real artifacts, bulk catalog rows, real index rows."""
    t0 = time.perf_counter()
    store = ensure_store(access, _store_mount(kind, audience))
    stats.stores_s += time.perf_counter() - t0
    rng = random.Random(f"{text.seed}/store/{store_no}")
    favourites = rng.sample(range(TOPICS), FAVOURITES)
    t0 = time.perf_counter()
    bodies = [text.note(rng, favourites, n) for n in range(notes)]
    stats.text_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    store_fd = open_store_dir(home, AGENT, store.path_key)
    rows = []
    try:
        for n, body in enumerate(bodies):
            locator = ids.random_token()
            fd = os.open(locator, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=store_fd)
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            rows.append((ids.new_id("resource"), ids.new_id("revision"), f"notes/n{n:03d}.md", locator,
                         hashlib.sha256(body).hexdigest(), len(body)))
        os.fsync(store_fd)
    finally:
        os.close(store_fd)
    stats.files_s += time.perf_counter() - t0
    conn = home.catalog(AGENT)
    t0 = time.perf_counter()
    now = now_us()
    with immediate(conn):
        conn.executemany("INSERT INTO resources (resource_id, agent_id, store_id, path, created_at)"
                         " VALUES (?, ?, ?, ?, ?)", [(r[0], AGENT, store.store_id, r[2], now) for r in rows])
        conn.executemany(
            "INSERT INTO revisions (revision_id, agent_id, resource_id, revision_no, content_sha256, size, locator,"
            " state, session_id, actor_id, trust_origin, created_at) VALUES (?, ?, ?, 1, ?, ?, ?, 'pending',"
            " NULL, ?, 'verified-user', ?)",
            [(r[1], AGENT, r[0], r[4], r[5], r[3], audience if kind == "user" else None, now) for r in rows])
        conn.executemany("UPDATE revisions SET state = 'active', activated_at = ? WHERE revision_id = ?",
                         [(now, r[1]) for r in rows])
    stats.rows_s += time.perf_counter() - t0
    # The index, exactly as the write path makes it: prepare outside the
    # transaction, insert inside one (here one per store, not one per note).
    model = current_model(conn)
    t0 = time.perf_counter()
    prepared = [prepare(body, model) for body in bodies]
    t1 = time.perf_counter()
    with immediate(conn):
        for (resource_id, revision_id, *_), index in zip(rows, prepared, strict=True):
            insert(conn, AGENT, revision_id=revision_id, resource_id=resource_id, store_id=store.store_id,
                   prepared=index)
    t2 = time.perf_counter()
    stats.prepare_s += t1 - t0
    stats.insert_s += t2 - t1
    stats.notes += notes
    stats.chunks += sum(len(p.chunks) for p in prepared)
    stats.bytes += sum(len(b) for b in bodies)
    return store.store_id


def _checkpoint(home: Home) -> None:
    for conn in (home.state(), home.catalog(AGENT)):
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def build(cache: Path, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Both corpora under ``cache``: ``small/home`` (a copy taken part-way) and ``full/home``."""
    if cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True, mode=0o700)
    text = Text(args.seed)
    root = cache / "full" / "home"
    root.parent.mkdir(mode=0o700)
    home, _ = Home.init(root)
    add_agent(home, AGENT)
    state = home.state()
    started = time.perf_counter()
    # Principals, roles, memberships and sessions through the library calls the CLI makes.
    users: dict[str, dict[str, str]] = {}
    roles = [add_role(state, f"team-{i:02d}")[0] for i in range(max(ROLES_OF.values()))]
    for view in VIEWS:
        principal = add_principal(state, f"Bench user {view}", "human")
        sender = f"bench-sender-{view}"
        bind(state, home.hmac_key(), principal, CHANNEL, ACCOUNT, sender)
        for role in roles[:ROLES_OF[view]]:
            add_member(state, role, principal, 30 * 86_400_000_000)
        session = open_session(home, AGENT, DirectMessage(CHANNEL, ACCOUNT, sender)).session_id
        users[view] = {"principal": principal, "session": session}
    access = authorize_session(home, users["2"]["session"], Op.READ)
    per_store = args.notes_per_store
    # The stores of the views, each user's private store (none for the denied
    # user, who never wrote), the agent-shared store and the roles' stores.
    plan: list[tuple[str, str]] = [("agent-shared", "")]
    plan += [("user", users[v]["principal"]) for v in VIEWS if v != "20-denied"]
    plan += [("role", r) for r in roles]
    others = args.stores - len(plan)
    other_users = [add_principal(state, f"Other user {i}", "human") for i in range(others // 2)]
    other_roles = [add_role(state, f"other-{i:03d}")[0] for i in range(others - others // 2)]
    rest: list[tuple[str, str]] = []
    for i in range(max(len(other_users), len(other_roles))):
        if i < len(other_users):
            rest.append(("user", other_users[i]))
        if i < len(other_roles):
            rest.append(("role", other_roles[i]))
    plan += rest
    log(f"build: {len(plan)} stores x {per_store} notes into {cache}")
    stats = BuildStats()
    store_ids: dict[tuple[str, str], str] = {}
    small_copied = False
    view_stores = len(plan) - len(rest)
    if args.small_stores and not view_stores < args.small_stores < len(plan):
        raise SystemExit(f"--small-stores must lie between {view_stores} and {len(plan)}")
    denied, deny_s, small_stats = 0, 0.0, None
    for number, (kind, audience) in enumerate(plan):
        if number == view_stores:  # every view's store exists: the denied user's deny entries
            deny_started = time.perf_counter()
            denied = _add_denies(home, users["20-denied"]["principal"],
                                 [store_ids[("agent-shared", "")]] + [store_ids[("role", r)] for r in roles])
            deny_s = time.perf_counter() - deny_started
            log(f"build: {denied} deny entries in {deny_s:.1f} s")
        if args.small_stores and number == args.small_stores and not small_copied:
            _checkpoint(home)
            small_stats = stats.as_dict()
            home.close()
            shutil.copytree(root, cache / "small" / "home", symlinks=True)
            os.chmod(cache / "small", 0o700)
            home = Home.open(root)
            access = authorize_session(home, users["2"]["session"], Op.READ)
            small_copied = True
            log(f"build: copied the {number}-store corpus")
        store_ids[(kind, audience)] = fill_store(home, access, text, number, kind, audience, per_store, stats)
        if number % 50 == 49:
            rate = stats.notes / (stats.prepare_s + stats.insert_s)
            log(f"build: {number + 1} stores, {stats.notes} notes, index {rate:.0f}"
                f" notes/s, elapsed {time.perf_counter() - started:.0f} s")
    _checkpoint(home)
    home.close()
    manifest = {
        "key": cache_key(args), "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "build_wall_s": time.perf_counter() - started, "stats": stats.as_dict(),
        "small_stats": small_stats, "deny_entries": denied, "deny_s": deny_s,
        "users": users, "roles": roles,
        "corpora": {"full": {"home": str(root), "stores": len(plan), "notes": stats.notes}},
    }
    if small_stats is not None:
        manifest["corpora"]["small"] = {"home": str(cache / "small" / "home"), "stores": args.small_stores,
                                        "notes": small_stats["notes"]}
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _add_denies(home: Home, principal: str, stores: list[str]) -> int:
    """Deny ``read`` to ``principal`` on 99% of the notes of these stores (all but n000 of each 100)."""
    conn = home.catalog(AGENT)
    marks = ",".join("?" for _ in stores)
    rows = conn.execute(f"SELECT resource_id, path FROM resources WHERE agent_id = ? AND store_id IN ({marks})"
                        " ORDER BY store_id, path", (AGENT, *stores)).fetchall()
    count = 0
    for resource_id, path in rows:
        if _allowed_path(path):
            continue
        add_entry(conn, AGENT, target_kind="resource", target_id=resource_id, effect=Effect.DENY,
                  capability=Op.READ, audience_kind=AudienceKind.PRINCIPAL, audience_id=principal,
                  grantor="bench")
        count += 1
    return count


def _allowed_path(path: str) -> bool:
    """The 1% the denied user keeps: note number 0, 100, 200, ... of each store."""
    return int(path.rsplit("n", 1)[1].split(".")[0]) % round(1 / (1 - DENIED_FRACTION)) == 0


def cache_key(args: argparse.Namespace) -> str:
    return f"v{CORPUS_VERSION}-s{args.stores}-n{args.notes_per_store}-small{args.small_stores}-seed{args.seed}"


# -- the measured calls ------------------------------------------------------------

def authorized(home: Home, session: str, query: str, arm: str) -> search_mod.Outcome:
    """The real path: ``search(..., mode=arm)``; "hybrid" is both arms, the default."""
    return search_mod.search(home, session, query, limit=LIMIT, mode=arm)


_UNF_VECTORS = ("SELECT chunk_id, 1.0 - vec_distance_cosine(embedding, :q) AS s FROM search_chunks"
                " WHERE agent_id = :agent AND model = :model ORDER BY s DESC, chunk_id LIMIT :n")
_UNF_WORDS = ("SELECT rowid, scopefs_words(search_fts, :terms) AS s FROM search_fts WHERE search_fts MATCH :match"
              " ORDER BY s DESC, rowid LIMIT :n")
_UNF_ROWS = ("SELECT c.chunk_id, c.resource_id, c.store_id, c.revision_id, r.path, c.start_line, c.end_line"
             " FROM search_chunks c JOIN resources r ON r.resource_id = c.resource_id"
             " WHERE c.chunk_id IN (SELECT value FROM json_each(:ids))")


def _terms(query: str) -> list[str]:
    """The query's terms, as ``catalog.search._arms`` cuts them."""
    return list(dict.fromkeys(t.casefold() for t in search_mod._TERMS.findall(query)
                              if any(ch.isalnum() for ch in t)))[:search_mod.MAX_QUERY_TERMS]


def _match(query: str) -> dict[str, Any]:
    """The unfiltered words query's parameters: any term in the text, in any store (no store restriction)."""
    terms = _terms(query)
    return {"match": "body : (" + " OR ".join(f'"{t}"' for t in terms) + ")", "terms": len(terms)}


def _scoped_match(query: str, scope: Any) -> dict[str, Any]:
    """The real words arm's parameters for ``scope``: ``catalog.search._match`` (terms AND the view's stores)."""
    terms = _terms(query)
    return {"match": search_mod._match(terms, scope), "terms": len(terms)}


def unfiltered(home: Home, query: str, arm: str) -> list[search_mod.Hit]:
    """The same query over the whole index, no prefilter, no postfilter, then read and hash like the real path."""
    conn = home.catalog(AGENT)
    search_mod._ready(conn)
    model = current_model(conn)
    packed = vectors.pack(embedder_for(model.name).embed([query])[0])
    words = _match(query)
    n = LIMIT if arm != "hybrid" else max(3 * LIMIT, 30)
    scores: dict[int, list[float | None]] = {}
    if arm in ("hybrid", "vectors"):
        for chunk_id, s in conn.execute(_UNF_VECTORS, {"q": packed, "agent": AGENT, "model": model.name, "n": n}):
            scores.setdefault(chunk_id, [None, None])[0] = max(0.0, s)
    if arm in ("hybrid", "words") and words["terms"]:
        for chunk_id, s in conn.execute(_UNF_WORDS, {**words, "n": n}):
            scores.setdefault(chunk_id, [None, None])[1] = s
    if arm == "hybrid":  # as catalog.search._rank does: each arm keeps its own score, the other arm scores the rest
        missing = json.dumps(sorted(c for c, pair in scores.items() if pair[0] is None))
        for chunk_id, s in conn.execute(search_mod._VECTOR_SCORES, {"ids": missing, "q": packed,
                                                                     "model": model.name}):
            scores[chunk_id][0] = max(0.0, float(s))
        missing = json.dumps(sorted(c for c, pair in scores.items() if pair[1] is None))
        if words["terms"]:
            for chunk_id, s in conn.execute(search_mod._WORDS_SCORES, {"text_match": words["match"],
                                                                        "terms": words["terms"], "ids": missing}):
                scores[chunk_id][1] = float(s)

    def score(pair: list[float | None]) -> float:
        vector, word = pair[0] or 0.0, pair[1] or 0.0
        if arm == "hybrid":
            return round(search_mod.VECTOR_WEIGHT * vector + search_mod.WORDS_WEIGHT * word, 6)
        return round(vector if arm == "vectors" else word, 6)

    candidates = {row[0]: search_mod._Candidate(*row) for row in
                  conn.execute(_UNF_ROWS, {"ids": json.dumps(sorted(scores))})}
    for chunk_id, candidate in candidates.items():
        candidate.score = score(scores[chunk_id])
    kept = [c for c in candidates.values() if c.score >= MIN_SCORE]  # the real path's noise floor
    ranked = sorted(kept, key=lambda c: (-c.score, c.store_id, c.path, c.start_line))
    hits = []
    for candidate in ranked[:LIMIT]:
        data = search_mod._read(home, conn, AGENT, candidate)
        hits.append(search_mod.Hit(candidate.path, candidate.start_line, candidate.end_line, candidate.score,
                                   snippet(data, candidate.start_line, candidate.end_line), candidate.resource_id))
    return hits


# -- checks (untimed) -------------------------------------------------------------------

class Views:
    """What each bench session may read, for the checks."""

    def __init__(self, home: Home, manifest: dict[str, Any]) -> None:
        conn = home.catalog(AGENT)
        self.stores: dict[str, list[str]] = {}
        self.roots: dict[str, set[str]] = {}
        for view in VIEWS:
            access = authorize_session(home, manifest["users"][view]["session"], Op.READ)
            scope = search_mod.scope_for(conn, AGENT, access.session.subject, access.view.mounts, access.now)
            self.stores[view] = [s.store_id for s in scope.stores]
            self.roots[view] = {s.mount.root for s in scope.stores}
            expected = 2 if view == "2" else int(view.split("-")[0])
            if len(scope.stores) != expected:
                raise SystemExit(f"view {view}: {len(scope.stores)} stores, expected {expected}")

    def allowed(self, view: str, path: str) -> bool:
        root, _, inner = path.rpartition("/notes/")
        if root not in self.roots[view]:
            return False
        return view != "20-denied" or _allowed_path("notes/" + inner)


def expected_scores(home: Home, views: Views, view: str, query: str, arm: str) -> list[float]:
    """Brute force over exactly the chunks the session may read: the top-10 scores of one arm."""
    conn = home.catalog(AGENT)
    search_mod._ready(conn)
    marks = ",".join("?" for _ in views.stores[view])
    if arm == "vectors":
        model = current_model(conn)
        packed = vectors.pack(embedder_for(model.name).embed([query])[0])
        rows = conn.execute(f"SELECT r.path, 1.0 - vec_distance_cosine(c.embedding, ?) FROM search_chunks c"
                            f" JOIN resources r USING (resource_id) WHERE c.store_id IN ({marks})",
                            (packed, *views.stores[view])).fetchall()
        scores = [max(0.0, s) for path, s in rows if view != "20-denied" or _allowed_path(path)]
    else:
        words = _match(query)  # every match in the corpus; the view's stores are tested on search_chunks
        rows = conn.execute(f"SELECT r.path, scopefs_words(search_fts, ?) FROM search_fts JOIN search_chunks c"
                            f" ON c.chunk_id = search_fts.rowid JOIN resources r USING (resource_id)"
                            f" WHERE search_fts MATCH ? AND c.store_id IN ({marks})",
                            (words["terms"], words["match"], *views.stores[view])).fetchall()
        scores = [s for path, s in rows if view != "20-denied" or _allowed_path(path)]
    return sorted((r for r in (round(s, 6) for s in scores) if r >= MIN_SCORE), reverse=True)[:LIMIT]


def check(homes: dict[str, Home], views: dict[str, Views], manifest: dict[str, Any], queries: list[str],
          log: Callable[[str], None]) -> dict[str, Any]:
    """Every authorized hit readable by its session; single arms equal to the brute-force ranking."""
    summary: dict[str, Any] = {"compared": 0, "hits_checked": 0, "result_counts": {}}
    for corpus, home in homes.items():
        for view in VIEWS:
            session = manifest["users"][view]["session"]
            for arm in ARMS:
                counts = []
                for query in queries:
                    outcome = authorized(home, session, query, arm)
                    counts.append(len(outcome.hits))
                    for hit in outcome.hits:
                        if not views[corpus].allowed(view, hit.path):
                            raise SystemExit(f"LEAK: {corpus} view {view} {arm} {query!r} returned {hit.path}")
                        summary["hits_checked"] += 1
                    if arm != "hybrid":
                        want = expected_scores(home, views[corpus], view, query, arm)
                        got = [h.score for h in outcome.hits]
                        if got != want:
                            raise SystemExit(f"MISMATCH: {corpus} view {view} {arm} {query!r}: {got} != {want}")
                        summary["compared"] += 1
                summary["result_counts"][f"{corpus}/{view}/{arm}"] = [min(counts), statistics.median(counts)]
            log(f"check: {corpus} view {view} ok")
        for arm in ARMS:
            for query in queries:
                if len(unfiltered(home, query, arm)) != LIMIT:
                    log(f"note: unfiltered {corpus} {arm} {query!r}: fewer than {LIMIT} hits")
    log(f"check: {summary['hits_checked']} hits readable by their session; {summary['compared']} single-arm "
        "rankings equal to brute force over the readable notes")
    return summary


# -- where the time goes (a separate, instrumented series) ---------------------------

@contextlib.contextmanager
def phases(into: dict[str, float]) -> Iterator[None]:
    """Wrap the pipeline's steps in ``catalog.search`` with timers (this process only)."""
    names = ("authorize_session", "scope_for", "_arms", "_rank", "_verified", "record_search")
    saved = {name: getattr(search_mod, name) for name in names}
    saved_fill = search_mod._fill

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                into[name] += time.perf_counter_ns() - t0
        return wrapper

    def fill(conn: apsw.Connection, arm: Any, postfilter: Any, quota: int) -> None:
        t0 = time.perf_counter_ns()
        before = arm.offset
        try:
            saved_fill(conn, arm, postfilter, quota)
        finally:
            into[f"_fill {arm.name}"] += time.perf_counter_ns() - t0
            into[f"rows {arm.name}"] += arm.offset - before

    for name in names:
        setattr(search_mod, name, timed(name, saved[name]))
    search_mod._fill = fill
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(search_mod, name, fn)
        search_mod._fill = saved_fill


def breakdown(homes: dict[str, Home], manifest: dict[str, Any], queries: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for corpus, home in homes.items():
        for view in VIEWS:
            for arm in ARMS:
                acc: dict[str, float] = defaultdict(float)
                total = 0
                with phases(acc):
                    for query in queries:
                        t0 = time.perf_counter_ns()
                        authorized(home, manifest["users"][view]["session"], query, arm)
                        total += time.perf_counter_ns() - t0
                n = len(queries)
                row = {k: (v / n / 1e3 if not k.startswith("rows") else v / n) for k, v in acc.items()}
                row["total"] = total / n / 1e3
                out[f"{corpus}/{view}/{arm}"] = row
    return out


def _best(conn: apsw.Connection, sql: str, params: dict[str, Any], runs: int) -> tuple[float, list[Any]]:
    best, rows = math.inf, []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        rows = conn.execute(sql, params).fetchall()
        best = min(best, time.perf_counter_ns() - t0)
    return best / 1e3, rows


def anatomy(homes: dict[str, Home], views: dict[str, Views], manifest: dict[str, Any],
            queries: list[str]) -> dict[str, Any]:
    """Each arm's first page of SQL alone (us, best of 2), next to what it walks, and the query plans.

    "words rescore" / "vectors rescore" are ``_rank``'s second queries: the
    words score of the vector page's top 30 that the words page did not
    find, and the other way round.

    Three columns are diagnostics, not the real path (marked "what-if"):
    the words rescore with the body terms alone (those ids are already
    authorized, so the store phrases restrict nothing), and the
    scoped match and words page with each store named by its id's random
    part alone (``st_`` is its own token, present in every row, so each
    ``"st_..."`` phrase walks a doclist as long as the corpus). Each is
    checked to return the same rows as the real query.
    """
    out: dict[str, Any] = {}
    for corpus, home in homes.items():
        conn = home.catalog(AGENT)
        search_mod._ready(conn)
        model = current_model(conn).name
        rows = []
        for view in ("2", "20", "20-denied"):
            access = authorize_session(home, manifest["users"][view]["session"], Op.READ)
            scope = search_mod.scope_for(conn, AGENT, access.session.subject, access.view.mounts, access.now)
            marks = ",".join("?" for _ in views[corpus].stores[view])
            for query in queries:
                words = _match(query)
                scoped = _scoped_match(query, scope)
                packed = vectors.pack(embedder_for(model).embed([query])[0])
                words_params = {**scope.params(), **scoped, "n": 50, "o": 0}
                vector_params = {**scope.params(), "q": packed, "model": model, "n": 50, "o": 0}
                row: dict[str, Any] = {"view": view, "query": query}
                row["corpus_matches"] = conn.execute("SELECT count(*) FROM search_fts WHERE search_fts MATCH ?",
                                                     (words["match"],)).fetchall()[0][0]
                row["view_matches"] = conn.execute(
                    f"SELECT count(*) FROM search_fts JOIN search_chunks c ON c.chunk_id = search_fts.rowid"
                    f" WHERE search_fts MATCH ? AND c.store_id IN ({marks})",
                    (words["match"], *views[corpus].stores[view])).fetchall()[0][0]
                scoped_matches = conn.execute("SELECT count(*) FROM search_fts WHERE search_fts MATCH ?",
                                              (scoped["match"],)).fetchall()[0][0]
                if scoped_matches != row["view_matches"]:
                    raise SystemExit(f"the scoped match found {scoped_matches} rows, the view has"
                                     f" {row['view_matches']} ({corpus} {view} {query!r})")
                row["words page"], page = _best(conn, search_mod._WORDS_SQL, words_params, 2)
                row["scoped MATCH"], _ = _best(conn, "SELECT rowid FROM search_fts WHERE search_fts MATCH :match",
                                               {"match": scoped["match"]}, 2)
                row["MATCH (unfiltered)"], _ = _best(conn, "SELECT rowid FROM search_fts WHERE search_fts MATCH"
                                                           " :match", {"match": words["match"]}, 2)
                row["MATCH+score (unfiltered)"], _ = _best(conn, "SELECT scopefs_words(search_fts, :terms) FROM"
                                                                 " search_fts WHERE search_fts MATCH :match", words, 2)
                row["vectors page"], vector_page = _best(conn, search_mod._VECTOR_SQL, vector_params, 2)
                found_words = {r[0] for r in page[:30]}
                found_vectors = {r[0] for r in vector_page[:30]}
                rescore_ids = json.dumps(sorted(found_vectors - found_words))
                row["words rescore"], _ = _best(conn, search_mod._WORDS_SCORES,
                                                {"text_match": words["match"], "terms": words["terms"],
                                                 "ids": rescore_ids}, 2)
                token = {**scoped, "match": words["match"] + " AND store_id : (" + " OR ".join(
                    f'"{s.store_id.removeprefix("st_")}"' for s in scope.stores) + ")"}
                row["scoped MATCH, store token (what-if)"], token_rows = _best(
                    conn, "SELECT rowid FROM search_fts WHERE search_fts MATCH :match", {"match": token["match"]}, 2)
                row["words page, store token (what-if)"], token_page = _best(
                    conn, search_mod._WORDS_SQL, {**words_params, **token}, 2)
                if len(token_rows) != scoped_matches or [r[0] for r in token_page] != [r[0] for r in page]:
                    raise SystemExit(f"a what-if query returned other rows ({corpus} {view} {query!r})")
                row["vectors rescore"], _ = _best(conn, search_mod._VECTOR_SCORES,
                                                  {"q": packed, "model": model,
                                                   "ids": json.dumps(sorted(found_words - found_vectors))}, 2)
                rows.append(row)
        plans = {}
        access = authorize_session(home, manifest["users"]["20"]["session"], Op.READ)
        scope = search_mod.scope_for(conn, AGENT, access.session.subject, access.view.mounts, access.now)
        scoped = {"match": search_mod._match(["x"], scope), "terms": 1}
        for label, sql, p in (("words", search_mod._WORDS_SQL, {**scope.params(), **scoped, "n": 50, "o": 0}),
                              ("vectors", search_mod._VECTOR_SQL, {**scope.params(), "q": b"", "model": "m",
                                                                   "n": 50, "o": 0}),
                              ("words scores", search_mod._WORDS_SCORES, {"text_match": "body : (x)", "terms": 1,
                                                                          "ids": "[]"}),
                              ("vector scores", search_mod._VECTOR_SCORES, {"ids": "[]", "q": b"", "model": "m"}),
                              ("unfiltered words", _UNF_WORDS, {"match": "body : (x)", "terms": 1, "n": 10}),
                              ("unfiltered vectors", _UNF_VECTORS, {"q": b"", "agent": AGENT, "model": "m", "n": 10})):
            plans[label] = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, p)]
        out[corpus] = {"rows": rows, "plans": plans}
    return out


# -- the timed run ------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def timed_run(homes: dict[str, Home], manifest: dict[str, Any], queries: list[str], reps: int,
              log: Callable[[str], None]) -> dict[str, list[float]]:
    series: list[tuple[str, str, str, str]] = []  # (corpus, kind, view, arm)
    for corpus in homes:
        for arm in ARMS:
            series.append((corpus, "unfiltered", "-", arm))
            for view in VIEWS:
                series.append((corpus, "authorized", view, arm))
    samples: dict[str, list[float]] = {"/".join(s): [] for s in series}

    def run(corpus: str, kind: str, view: str, arm: str, query: str) -> None:
        if kind == "unfiltered":
            unfiltered(homes[corpus], query, arm)
        else:
            authorized(homes[corpus], manifest["users"][view]["session"], query, arm)

    for s in series:  # warm-up: one pass of a few queries through every series
        for query in queries[:5]:
            run(*s, query)
    turn = 0
    started = time.perf_counter()
    for rep in range(reps):
        for query in queries:
            k = turn % len(series)
            for s in series[k:] + series[:k]:
                t0 = time.perf_counter_ns()
                run(*s, query)
                samples["/".join(s)].append((time.perf_counter_ns() - t0) / 1e6)
            turn += 1
        log(f"timed: rep {rep + 1}/{reps} done, {time.perf_counter() - started:.0f} s")
    return samples


# -- write_note for reference ----------------------------------------------------------------

def write_note_reference(workdir: Path, notes: int, text: Text, log: Callable[[str], None]) -> dict[str, Any]:
    """write_note of ``notes`` new notes with indexing, and as many with it skipped, alternating."""
    from scopefs.writer import transaction

    root = workdir / "write-ref" / "home"
    if root.parent.exists():
        shutil.rmtree(root.parent)
    root.parent.mkdir(parents=True, mode=0o700)
    home, _ = Home.init(root)
    add_agent(home, AGENT)
    principal = add_principal(home.state(), "Writer", "human")
    bind(home.state(), home.hmac_key(), principal, CHANNEL, ACCOUNT, "writer")
    session = open_session(home, AGENT, DirectMessage(CHANNEL, ACCOUNT, "writer")).session_id
    rng = random.Random(f"{text.seed}/write-ref")
    bodies = [text.note(rng, list(range(FAVOURITES)), n) for n in range(2 * notes + 20)]
    real = transaction.prepare_from_fd

    def skipped(fd: int, model: Any) -> PreparedIndex:
        return PreparedIndex((), None, None)

    samples: dict[str, list[float]] = {"indexed": [], "not indexed": []}
    for n, body in enumerate(bodies):
        mode = "indexed" if n % 2 == 0 else "not indexed"
        transaction.prepare_from_fd = real if mode == "indexed" else skipped
        try:
            t0 = time.perf_counter_ns()
            transaction.write_note(home, session, f"private/ref/n{n:04d}.md", body)
            elapsed = (time.perf_counter_ns() - t0) / 1e6
        finally:
            transaction.prepare_from_fd = real
        if n >= 20:  # the first ten of each are warm-up
            samples[mode].append(elapsed)
    chunks = home.catalog(AGENT).execute("SELECT count(*) FROM search_chunks").fetchall()[0][0]
    home.close()
    shutil.rmtree(root.parent)
    out = {mode: {"n": len(v), "p50_ms": statistics.median(v), "p95_ms": percentile(v, 0.95),
                  "mean_ms": statistics.fmean(v), "notes_per_s": 1e3 / statistics.fmean(v)}
           for mode, v in samples.items()}
    out["indexed_chunks"] = chunks
    log(f"write_note: indexed {out['indexed']['p50_ms']:.2f} ms p50, not indexed {out['not indexed']['p50_ms']:.2f} ms")
    return out


# -- sizes and context -------------------------------------------------------------------------

def index_size(home: Home) -> dict[str, Any]:
    conn = home.catalog(AGENT)
    rows = conn.execute("SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name").fetchall()
    notes = conn.execute("SELECT count(*) FROM revisions WHERE state = 'active'").fetchall()[0][0]
    chunks = conn.execute("SELECT count(*), sum(length(body)), sum(length(embedding)) FROM search_chunks").fetchall()[0]
    by_name = {name: {"bytes": size, "payload": payload} for name, size, payload in rows}
    index_objects = [n for n in by_name if n.startswith(("search_", "sqlite_autoindex_search_"))]
    index_bytes = sum(by_name[n]["bytes"] for n in index_objects)
    page_size = conn.execute("PRAGMA page_size").fetchall()[0][0]
    file_bytes = os.path.getsize(home.catalog_path(AGENT))
    return {"notes": notes, "chunks": chunks[0], "body_bytes": chunks[1], "embedding_bytes": chunks[2],
            "objects": {n: by_name[n] for n in sorted(index_objects)}, "index_bytes": index_bytes,
            "index_bytes_per_note": index_bytes / notes, "catalog_file_bytes": file_bytes,
            "catalog_bytes_per_note": file_bytes / notes, "page_size": page_size}


def context() -> dict[str, Any]:
    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False).stdout.strip()
        except OSError:
            return ""

    import sqlite_vec

    return {"commit": sh(["git", "rev-parse", "--short=12", "HEAD"]),
            "dirty": sh(["git", "status", "--porcelain", "--untracked-files=no"]).splitlines(),
            "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(), "apsw": apsw.apsw_version(),
            "sqlite_vec": getattr(sqlite_vec, "__version__", "?"), "nproc": os.cpu_count(),
            "loadavg": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}


# -- report ------------------------------------------------------------------------------------

def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"n": len(v), "p50_ms": statistics.median(v), "p95_ms": percentile(v, 0.95)}
            for k, v in samples.items() if v}


def print_report(result: dict[str, Any]) -> None:
    m = result["manifest"]
    s = m["stats"]
    ctx = result["context"]
    print(f"commit {ctx['commit']} ({len(ctx['dirty'])} modified tracked files), Python {ctx['python']},"
          f" SQLite {ctx['sqlite']}, sqlite-vec {ctx['sqlite_vec']}, load {ctx['loadavg_before'][0]:.2f} ->"
          f" {ctx['loadavg'][0]:.2f}")
    start = ctx.get("at_start")
    if start and (start["commit"], start["dirty"]) != (ctx["commit"], ctx["dirty"]):
        print(f"WARNING: the tree changed during the run: commit {start['commit']} ({len(start['dirty'])} modified"
              f" tracked files) at the start ({start['when']}); the code measured is the one at the start")
    for name, c in m["corpora"].items():
        print(f"corpus {name}: {c['stores']} stores, {c['notes']} notes ({c['home']})")
    print(f"queries: {result['queries']} x {result['reps']} reps; top {LIMIT}")
    print()
    print("index build (prepare + insert with its commit, one transaction per store of"
          f" {m['args']['notes_per_store']} notes):")
    index_s = s["prepare_s"] + s["insert_s"]
    print(f"  {s['notes']} notes, {s['chunks']} chunks, {s['bytes'] / s['notes']:.0f} bytes/note:"
          f" {s['notes'] / index_s:,.0f} notes/s (prepare {s['prepare_s'] / s['notes'] * 1e6:.0f} us/note,"
          f" insert {s['insert_s'] / s['notes'] * 1e6:.0f} us/note)")
    print(f"  rest of the build: files {s['files_s']:.1f} s, catalog rows {s['rows_s']:.1f} s, stores"
          f" {s['stores_s']:.1f} s, text {s['text_s']:.1f} s; {m['deny_entries']} deny entries in {m['deny_s']:.1f} s;"
          f" wall {m['build_wall_s']:.0f} s (built {m['built_at']})")
    for name, size in result["sizes"].items():
        print(f"  index size ({name}): {size['index_bytes'] / 2**20:.1f} MiB = {size['index_bytes_per_note']:,.0f}"
              f" bytes/note (catalog file {size['catalog_bytes_per_note']:,.0f} bytes/note)")
        for obj, v in size["objects"].items():
            print(f"      {obj:34} {v['bytes'] / size['notes']:8,.0f} bytes/note")
    w = result.get("write_note")
    if w:
        print(f"  write_note ({w['indexed']['n']} notes each, alternating): indexed p50 {w['indexed']['p50_ms']:.2f} ms"
              f" ({w['indexed']['notes_per_s']:.0f} notes/s mean), not indexed p50 {w['not indexed']['p50_ms']:.2f} ms"
              f" ({w['not indexed']['notes_per_s']:.0f} notes/s mean)")
    print()
    summary = result["summary"]
    corpora = sorted(m["corpora"], key=lambda c: -m["corpora"][c]["notes"])  # full first
    label = {c: f"{m['corpora'][c]['notes'] / 1000:g}k" for c in corpora}
    print(f"latency of one top-{LIMIT} search, ms (x = p50 / the unfiltered p50 of the same arm and corpus;"
          f" growth = {' / '.join(label[c] for c in corpora)} p50)")
    head = "| series | arm | " + " | ".join(f"{label[c]} p50 | {label[c]} p95 | x unf" for c in corpora)
    print(head + (" | growth |" if len(corpora) == 2 else " |"))
    print("|" + "---|" * (2 + 3 * len(corpora) + (1 if len(corpora) == 2 else 0)))
    for arm in ARMS:
        rows = [("unfiltered", "unfiltered", "-")]
        rows += [(f"view {v}" if v != "20-denied" else "view 20, 99% denied", "authorized", v) for v in VIEWS]
        for name, k, view in rows:
            cells = []
            p50s = []
            for c in corpora:
                row = summary.get(f"{c}/{k}/{view}/{arm}")
                base = summary[f"{c}/unfiltered/-/{arm}"]
                if row is None:
                    cells.append(" | | ")
                    continue
                p50s.append(row["p50_ms"])
                ratio = "" if k == "unfiltered" else f"{row['p50_ms'] / base['p50_ms']:.2f}x"
                cells.append(f"{row['p50_ms']:,.1f} | {row['p95_ms']:,.1f} | {ratio}")
            growth = f" | {p50s[0] / p50s[1]:.1f}x |" if len(p50s) == 2 else " |"
            print(f"| {name} | {arm} | " + " | ".join(cells) + growth)
    print()
    b = result.get("breakdown")
    if b:
        print("where an authorized search spends its time (mean us per search, instrumented series;"
              " rows = arm rows decided by the postfilter):")
        cols = ("authorize_session", "scope_for", "_arms", "_fill vectors", "_fill words", "_rank", "_verified",
                "record_search", "total")
        print("| series | " + " | ".join(cols) + " | rows vectors / words |")
        print("|" + "---|" * (len(cols) + 2))
        for key, row in b.items():
            print(f"| {key} | " + " | ".join(f"{row.get(c, 0):,.0f}" for c in cols)
                  + f" | {row.get('rows vectors', 0):.0f} / {row.get('rows words', 0):.0f} |")
        print()
    a = result.get("anatomy")
    if a:
        cols = ("corpus_matches", "view_matches", "words page", "scoped MATCH", "MATCH (unfiltered)",
                "MATCH+score (unfiltered)", "words rescore", "vectors page", "vectors rescore",
                "scoped MATCH, store token (what-if)",
                "words page, store token (what-if)")
        print("each arm's SQL alone (median over the queries of the best of 2; us; matches = FTS rows):")
        print("| corpus | view | " + " | ".join(cols) + " |")
        print("|" + "---|" * (len(cols) + 2))
        for corpus in corpora:
            for view in ("2", "20", "20-denied"):
                rows = [r for r in a[corpus]["rows"] if r["view"] == view]
                print(f"| {label[corpus]} | {view} | " + " | ".join(
                    f"{statistics.median(r[c] for r in rows):,.0f}" if c in rows[0] else "" for c in cols) + " |")
        for corpus in corpora:
            for name, plan in a[corpus]["plans"].items():
                print(f"  plan {label[corpus]} {name}: " + " | ".join(plan))
        print()
    c = result.get("check")
    if c:
        print(f"checked (untimed): {c['hits_checked']} hits all readable by their session;"
              f" {c['compared']} single-arm top-{LIMIT} rankings equal to brute force over the readable notes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=1000)
    parser.add_argument("--notes-per-store", type=int, default=100)
    parser.add_argument("--small-stores", type=int, default=100,
                        help="also measure a copy taken after this many stores (0: none)")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--reps", type=int, default=2, help="timed passes over the query list")
    parser.add_argument("--check-queries", type=int, default=10,
                        help="queries of the untimed check (every series, every arm)")
    parser.add_argument("--breakdown-queries", type=int, default=10,
                        help="queries of the instrumented series and the per-arm SQL anatomy")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--cache", default="/tmp/scopefs-search-bench",
                        help="where the corpus is built once and reused (a real disk)")
    parser.add_argument("--rebuild", action="store_true", help="build the corpus even if the cache matches")
    parser.add_argument("--write-notes", type=int, default=200, help="write_note reference sample (0: skip)")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout (samples included)")
    parser.add_argument("--from-json", help="print the report of a saved --json run")
    args = parser.parse_args()
    if args.from_json:
        print_report(json.loads(Path(args.from_json).read_text()))
        return 0

    def log(message: str) -> None:
        print(f"search_bench: {message}", file=sys.stderr, flush=True)

    loadavg_before = os.getloadavg()
    started = context()  # the code is imported once, now: a commit landing mid-run is not what ran
    cache = Path(args.cache).absolute() / cache_key(args)
    manifest_path = cache / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    if manifest is None or manifest.get("key") != cache_key(args) or args.rebuild:
        manifest = build(cache, args, log)
    else:
        log(f"reusing the corpus built {manifest['built_at']} in {cache}")
    manifest["args"] = vars(args)
    homes = {name: Home.open(Path(c["home"])) for name, c in
             sorted(manifest["corpora"].items(), key=lambda kv: kv[1]["notes"])}
    text = Text(args.seed)
    queries = text.queries(args.queries)
    views = {name: Views(home, manifest) for name, home in homes.items()}
    result: dict[str, Any] = {"manifest": manifest, "queries": len(queries), "reps": args.reps,
                              "query_list": queries}
    result["check"] = check(homes, views, manifest, queries[:args.check_queries], log)
    samples = timed_run(homes, manifest, queries, args.reps, log)
    result["samples"] = samples
    result["summary"] = summarize(samples)
    if not args.no_breakdown:
        result["breakdown"] = breakdown(homes, manifest, queries[:args.breakdown_queries])
        result["anatomy"] = anatomy(homes, views, manifest, queries[:args.breakdown_queries])
        log("breakdown and anatomy done")
    result["sizes"] = {name: index_size(home) for name, home in homes.items()}
    for home in homes.values():
        home.close()
    if args.write_notes:
        result["write_note"] = write_note_reference(Path(args.cache).absolute(), args.write_notes, text, log)
    result["context"] = {**context(), "loadavg_before": loadavg_before,
                         "at_start": {k: started[k] for k in ("commit", "dirty", "when")}}
    if args.json:
        json.dump(result, sys.stdout)
        print()
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
