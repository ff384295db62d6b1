"""Scoped search: the index follows revisions, and nothing denied shows.

Why: search is a read path that ranks, counts and quotes, so it can leak in
ways a plain read cannot: a denied nearest neighbour that pushes an allowed
note out, a score that moves because denied notes exist, a snippet cut from
index text whose artifact was tampered with. Each test here builds that
situation on a real home with real writes and checks the caller's output.
The prefilter's superset property has its own file
(tests/test_search_prefilter.py); the mount's ``.search`` folder is tested
with the mount (tests/test_search_mount.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

import apsw
import pytest

from scopefs.catalog.home import Home
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Op
from scopefs.catalog.search import search
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_note
from tests.conftest import Cli, Scenario, artifact_path, diff_snapshots, snapshot
from tests.test_vfs_isolation import publish_shared

RESULT_KEYS = {"path", "start_line", "end_line", "score", "snippet", "citation"}


def catalog_of(scenario: Scenario) -> apsw.Connection:
    return apsw.Connection(str(scenario.cli.home / "agents" / scenario.agent / "catalog.sqlite"))


def run_sql(scenario: Scenario, *statements: str) -> None:
    """Change the catalog behind the broker's back, as an operator or an attacker with the file could."""
    conn = catalog_of(scenario)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def chunk_rows(scenario: Scenario) -> list[tuple[Any, ...]]:
    conn = catalog_of(scenario)
    try:
        return conn.execute("SELECT revision_id, ordinal, start_line, end_line, body, embedding, model"
                            " FROM search_chunks ORDER BY revision_id, ordinal").fetchall()
    finally:
        conn.close()


def hits(scenario: Scenario, session: str, query: str, *extra: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = scenario.cli.j("search", session, query, *extra)["results"]
    return results


# -- point 1: index rows follow the revision ----------------------------------

def test_index_rows_are_written_with_activation_and_retired_with_the_revision(scenario: Scenario) -> None:
    cli = scenario.cli
    first = cli.j("write", scenario.alice_session, "private/notes/tea.md", stdin=b"Alice drinks green tea\n")
    revisions = {row[0] for row in chunk_rows(scenario)}
    assert first["revision_id"] in revisions
    second = cli.j("write", scenario.alice_session, "private/notes/tea.md", stdin=b"Alice drinks black coffee\n")
    revisions = {row[0] for row in chunk_rows(scenario)}
    assert second["revision_id"] in revisions and first["revision_id"] not in revisions  # superseded: retired
    assert hits(scenario, scenario.alice_session, "green tea", "--mode", "words") == []
    assert [h["snippet"] for h in hits(scenario, scenario.alice_session, "coffee")] == ["Alice drinks black coffee"]

    delete_note(Home.open(cli.home), scenario.alice_session, "private/notes/tea.md")  # tombstoned: retired
    assert second["revision_id"] not in {row[0] for row in chunk_rows(scenario)}
    assert hits(scenario, scenario.alice_session, "coffee") == []

    third = cli.j("write", scenario.alice_session, "private/notes/milk.md", stdin=b"Alice takes oat milk\n")
    run_sql(scenario, f"UPDATE revisions SET state = 'corrupt' WHERE revision_id = '{third['revision_id']}'")
    assert third["revision_id"] not in {row[0] for row in chunk_rows(scenario)}  # found corrupt: retired


def test_index_rows_exist_only_for_active_revisions_and_are_never_edited(scenario: Scenario) -> None:
    cli = scenario.cli
    old = cli.j("write", scenario.alice_session, "private/notes/a.md", stdin=b"one\n")
    cli.j("write", scenario.alice_session, "private/notes/a.md", stdin=b"two\n")
    conn = catalog_of(scenario)
    try:
        row = conn.execute("SELECT r.resource_id, r.store_id FROM revisions v JOIN resources r"
                           " USING (resource_id) WHERE v.revision_id = ?", (old["revision_id"],)).fetchone()
        assert row is not None
        resource, store = row
        with pytest.raises(apsw.ConstraintError, match="active revision"):
            conn.execute("INSERT INTO search_chunks (agent_id, revision_id, resource_id, store_id, ordinal, start_line,"
                         " end_line, body) VALUES ('main', ?, ?, ?, 9, 1, 1, 'planted')",
                         (old["revision_id"], resource, store))
        with pytest.raises(apsw.ConstraintError, match="never edited"):
            conn.execute("UPDATE search_chunks SET body = 'planted'")
    finally:
        conn.close()


def test_reindex_rebuilds_the_same_rows_from_verified_artifacts_only(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/long.md",
          stdin=b"".join(b"line %d about the garden and the roses\n" % i for i in range(200)))
    before = chunk_rows(scenario)
    assert len(before) > 3
    run_sql(scenario, "DELETE FROM search_chunks")
    assert hits(scenario, scenario.alice_session, "roses") == []
    report = cli.j("reindex")
    assert report["exit_code"] == 0 and report["agents"][0]["failed_revision_ids"] == []
    assert chunk_rows(scenario) == before

    note = artifact_path(cli.home, scenario.alice, "notes/long.md")
    os.chmod(note, 0o600)
    note.write_bytes(b"tampered text about roses (canary T4mp)\n")
    result = cli("--json", "reindex")
    assert result.code == 4
    assert len(result.json()["agents"][0]["failed_revision_ids"]) == 1
    assert not any(row[4].startswith("line 0 about the garden") for row in chunk_rows(scenario))
    assert "canary T4mp" not in json.dumps(chunk_rows(scenario), default=repr)
    assert hits(scenario, scenario.alice_session, "roses") == []


def test_a_changed_model_forces_a_reindex_instead_of_mixing_spaces(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/tea.md", stdin=b"Alice drinks green tea\n")
    bad = cli("--json", "reindex", "--model", "no-such-model")
    assert bad.code == 2
    assert {row[6] for row in chunk_rows(scenario)} == {"scopefs-hashing-v2-256"}

    run_sql(scenario, "UPDATE search_model SET name = 'scopefs-hashing-v2-128', dimension = 128")
    assert hits(scenario, scenario.alice_session, "green tea", "--mode", "vectors") == []
    assert len(hits(scenario, scenario.alice_session, "green tea", "--mode", "words")) == 1

    report = cli.j("reindex", "--model", "scopefs-hashing-v2-128")
    assert report["agents"][0]["model"] == "scopefs-hashing-v2-128"
    rows = chunk_rows(scenario)
    assert {row[6] for row in rows} == {"scopefs-hashing-v2-128"} and {len(row[5]) for row in rows} == {128 * 4}
    assert len(hits(scenario, scenario.alice_session, "green tea", "--mode", "vectors")) == 1


def test_the_optional_model_ships_in_its_wheel_and_a_switch_reindexes_everything(scenario: Scenario) -> None:
    """Point 6: the [embeddings] extra (WordLlama, weights inside the PyPI wheel) works offline, end to end."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/health.md", stdin=b"Alice saw her doctor about the flu\n")
    cli.j("write", scenario.alice_session, "private/bike.md", stdin=b"Bob fixed the bicycle chain yesterday\n")
    assert hits(scenario, scenario.alice_session, "medical appointment", "--mode", "vectors") == []  # no shared words

    report = cli.j("reindex", "--model", "wordllama:l2_supercat-256")
    model = report["agents"][0]["model"]  # recorded with a fingerprint of the weights
    assert model.startswith("wordllama:l2_supercat-256@") and len(model) == len("wordllama:l2_supercat-256@") + 12
    rows = chunk_rows(scenario)
    assert {row[6] for row in rows} == {model} and {len(row[5]) for row in rows} == {256 * 4}
    found = hits(scenario, scenario.alice_session, "medical appointment", "--mode", "vectors")
    assert [h["path"] for h in found] == ["private/health.md"]

    written = cli.j("write", scenario.alice_session, "private/clinic.md", stdin=b"The clinic called back\n")
    assert {row[6] for row in chunk_rows(scenario) if row[0] == written["revision_id"]} == \
        {model}  # new writes embed with the recorded model

    # Other weights under the same package name (an upgrade) are another space: never compared.
    run_sql(scenario, "UPDATE search_model SET name = 'wordllama:l2_supercat-256@000000000000'")
    result = cli("--json", "search", scenario.alice_session, "doctor flu")
    assert result.code == 0 and result.json()["arms"] == ["words"]
    assert "weights are not the ones the index was built with" in result.err


# -- point 2: the command line ----------------------------------------------

def test_search_results_have_the_memory_search_shape_and_cite_verified_lines(scenario: Scenario) -> None:
    cli = scenario.cli
    text = b"# Trip\n\nWe fly to Porto on Friday.\nPack the blue umbrella.\n"
    cli.j("write", scenario.alice_session, "private/trips/porto.md", stdin=text)
    for mode in ("hybrid", "words", "vectors"):
        body = cli.j("search", scenario.alice_session, "umbrella Porto", "--mode", mode)
        assert body["arms"] == (["vectors", "words"] if mode == "hybrid" else [mode])
        [hit] = [h for h in body["results"] if h["path"] == "private/trips/porto.md"]
        assert set(hit) == RESULT_KEYS
        assert (hit["start_line"], hit["end_line"]) == (1, 4)
        assert hit["citation"] == "private/trips/porto.md#L1-L4"
        assert hit["snippet"] == text.decode().strip()
        assert 0 < hit["score"] <= 1
    cli.j("write", scenario.alice_session, "private/trips/lisbon.md", stdin=b"Lisbon trip: umbrella too\n")
    assert len(hits(scenario, scenario.alice_session, "umbrella", "--limit", "1")) == 1
    assert len(hits(scenario, scenario.alice_session, "umbrella")) == 2
    plain = cli("search", scenario.alice_session, "umbrella")
    assert plain.code == 0 and "private/trips/porto.md#L1-L4  score " in plain.text


@pytest.mark.parametrize("args", [
    ("",), ("   ",), ("!!! ???",), ("x" * 1001,), ("tea", "--limit", "0"), ("tea", "--limit", "101"),
    ("tea", "--limit", "ten"), ("tea", "--mode", "fuzzy"), ("tea", "--about", "p_" + "a" * 26),
    ("tea", "--about", "Mike"),
])
def test_bad_search_input_exits_2_and_changes_nothing(scenario: Scenario, args: tuple[str, ...]) -> None:
    before = snapshot(scenario.cli.home)
    result = scenario.cli("--json", "search", scenario.alice_session, *args)
    assert result.code == 2, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert diff_snapshots(before, snapshot(scenario.cli.home)) == []


def test_a_session_whose_evidence_is_gone_is_denied(scenario: Scenario) -> None:
    scenario.cli.j("binding", "revoke", scenario.alice_binding)
    result = scenario.cli("--json", "search", scenario.alice_session, "hazelnuts")
    assert result.code == 3 and result.json()["reason"] == "identity-revoked"
    assert "hazelnut" not in result.text


def test_each_arm_degrades_to_the_other_and_says_so(scenario: Scenario) -> None:
    cli = scenario.cli
    run_sql(scenario, "UPDATE search_model SET name = 'retired-model-v0'")
    result = cli("--json", "search", scenario.alice_session, "hazelnuts")
    assert result.code == 0 and result.json()["arms"] == ["words"]
    assert [h["path"] for h in result.json()["results"]] == ["private/notes/allergy.md"]
    assert "search: vectors arm unavailable" in result.err and "searching by words only" in result.err
    assert "hazelnut" not in result.err  # the log line never carries the query
    assert cli("--json", "search", scenario.alice_session, "hazelnuts", "--mode", "vectors").code == 1

    run_sql(scenario, "UPDATE search_model SET name = 'scopefs-hashing-v2-256'", "DROP TABLE search_fts")
    result = cli("--json", "search", scenario.alice_session, "hazelnuts")
    assert result.code == 0 and result.json()["arms"] == ["vectors"]
    assert [h["path"] for h in result.json()["results"]] == ["private/notes/allergy.md"]
    assert "search: words arm unavailable" in result.err and "searching by vectors only" in result.err


# -- point 3: nothing about a denied resource reaches the caller --------------

ALLOWED = [
    b"Shopping list for the weekend, and somewhere in it: lantern battery.\nAlso bread.\n",
    b"Camping gear notes.\nThe lantern needs a new battery before the trip, says the ranger.\n",
    b"Old diary entry: the lantern battery died at midnight; we sang songs in the dark.\n",
]
NEAR = b"lantern battery lantern battery lantern battery\n"  # nearer than every allowed note, in both arms


def _modes(cli: Cli, session: str, query: str) -> dict[str, bytes]:
    out = {}
    for mode in ("hybrid", "words", "vectors"):
        result = cli("--json", "search", session, query, "--mode", mode)
        assert result.code == 0 and "near/" not in result.err
        out[mode] = result.out
    return out


def _assert_nearer(scenario: Scenario, alone: dict[str, bytes], seers: list[str], query: str) -> None:
    """The test means something only if the denied notes really outrank the allowed ones, in both arms.

    ``seers`` may read the denied notes. Every near note has the same text,
    so the same score: their top 100 must be near notes (Bob's own and the
    shared ones tie), all scoring above the best note the caller may read.
    """
    best_allowed = {mode: max(h["score"] for h in json.loads(body)["results"]) for mode, body in alone.items()}
    for mode in ("words", "vectors"):
        for session in seers:
            seen = hits(scenario, session, query, "--mode", mode, "--limit", "100")
            assert len(seen) == 100 and all("/near/" in h["path"] for h in seen)
            assert all(h["score"] > best_allowed[mode] for h in seen)


def test_2000_denied_nearer_neighbours_change_nothing_for_the_caller(scenario: Scenario) -> None:
    """Denied by the view (another store) and by a resource deny the prefilter already drops."""
    cli = scenario.cli
    for i, text in enumerate(ALLOWED):
        cli.j("write", scenario.alice_session, f"private/camp/{i}.md", stdin=text)
    query = "lantern battery"
    alone = _modes(cli, scenario.alice_session, query)
    for body in alone.values():
        assert sorted(h["path"] for h in json.loads(body)["results"]) == [f"private/camp/{i}.md" for i in range(3)]

    home = Home.open(cli.home)
    for i in range(1000):  # outside Alice's view: Bob's private store
        write_note(home, scenario.bob_session, f"private/near/{i}.md", NEAR)
    catalog = home.catalog("main")
    for i in range(1000):  # inside Alice's view (agent-shared), denied to her by resource policy
        resource = publish_shared(cli.home, f"agent-shared/near/{i}.md", NEAR, scenario.alice_session)
        add_entry(catalog, "main", target_kind="resource", target_id=resource, effect=Effect.DENY,
                  capability=Op.READ, audience_kind=AudienceKind.PRINCIPAL, audience_id=scenario.alice)
    _assert_nearer(scenario, alone, [scenario.bob_session, scenario.group_session], query)

    assert _modes(cli, scenario.alice_session, query) == alone  # results, order, scores, shape: byte for byte
    assert search(home, scenario.alice_session, query, limit=100).hits == \
        search(home, scenario.alice_session, query, limit=3).hits  # exhausted, not cut: no more exist


def test_2000_candidates_only_the_evaluator_denies_change_nothing_for_the_caller(scenario: Scenario) -> None:
    """Denied where the prefilter must let them through: only the authoritative postfilter stands between.

    The ambiguous (shared-main) view is granted nothing by placement; each
    note needs allows of both ``read`` and ``retrieve``. The near notes
    carry an allow of ``retrieve`` only, which the (deliberately loose)
    prefilter admits and the evaluator refuses, so every one of the 2,000
    reaches the postfilter ahead of the 3 allowed notes.
    """
    cli = scenario.cli
    ambiguous = cli.j("session", "open", "--agent", "main", "--shared-main")["session_id"]
    catalog = Home.open(cli.home).catalog("main")

    def publish(path: str, text: bytes, caps: tuple[Op, ...]) -> None:
        resource = publish_shared(cli.home, path, text, scenario.alice_session)
        for cap in caps:
            add_entry(catalog, "main", target_kind="resource", target_id=resource, effect=Effect.ALLOW,
                      capability=cap, audience_kind=AudienceKind.SUBJECT_KIND, audience_id="ambiguous")

    for i, text in enumerate(ALLOWED):
        publish(f"agent-shared/camp/{i}.md", text, (Op.RETRIEVE, Op.READ))
    query = "lantern battery"
    alone = _modes(cli, ambiguous, query)
    for body in alone.values():
        assert sorted(h["path"] for h in json.loads(body)["results"]) == [f"agent-shared/camp/{i}.md"
                                                                          for i in range(3)]
    for i in range(2000):
        publish(f"agent-shared/near/{i}.md", NEAR, (Op.RETRIEVE,))
    _assert_nearer(scenario, alone, [scenario.alice_session], query)
    assert _modes(cli, ambiguous, query) == alone


# -- point 4: snippets come only from verified revisions ---------------------

def test_a_tampered_artifact_drops_out_audited_and_its_indexed_text_is_never_shown(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/plants.md", stdin=b"The fern likes shade (canary F3rn)\n")
    cli.j("write", scenario.alice_session, "private/notes/more.md", stdin=b"The cactus likes sun, unlike the fern\n")
    assert len(hits(scenario, scenario.alice_session, "fern")) == 2
    note = artifact_path(cli.home, scenario.alice, "notes/plants.md")
    os.chmod(note, 0o600)
    note.write_bytes(b"The fern likes shade (canary X9xx)\n")  # same size, different hash
    result = cli("--json", "search", scenario.alice_session, "fern shade")
    assert result.code == 0
    assert [h["path"] for h in result.json()["results"]] == ["private/notes/more.md"]
    assert "F3rn" not in result.text and "X9xx" not in result.text
    state = apsw.Connection(str(cli.home / "state.sqlite"))
    try:
        rows = state.execute("SELECT decision, reason FROM audit WHERE operation = 'search'").fetchall()
    finally:
        state.close()
    assert ("error", "revision-stale") in rows
    assert not any("F3rn" in row[4] for row in chunk_rows(scenario))  # its index rows are retired


def test_the_audit_of_a_search_holds_ids_never_the_query_or_snippets(scenario: Scenario) -> None:
    cli = scenario.cli
    assert len(hits(scenario, scenario.alice_session, "hazelnuts canaryquery")) == 1
    state = apsw.Connection(str(cli.home / "state.sqlite"))
    try:
        rows = state.execute("SELECT * FROM audit WHERE operation = 'search'").fetchall()
    finally:
        state.close()
    assert len(rows) == 1
    assert "canaryquery" not in repr(rows) and "hazelnut" not in repr(rows)
    assert b"canaryquery" not in b"".join(p.read_bytes() for p in cli.home.rglob("*") if p.is_file())


# -- point 7: subject lookup ---------------------------------------------------

def test_about_narrows_to_one_verified_subject_and_two_mikes_stay_apart(scenario: Scenario) -> None:
    cli = scenario.cli
    group = scenario.group_session
    cli.j("write", group, "channel/people/a.md", stdin=b"Mike likes hiking in the hills\n")
    cli.j("write", group, "channel/people/b.md", stdin=b"Mike likes hiking and hiking and hiking\n")
    cli.j("write", group, "channel/people/c.md",
          stdin=f"Mike likes hiking; subject: {scenario.mike1}\n".encode())  # text can never make a subject
    assert cli.j("subject", "add", group, "channel/people/a.md", scenario.mike1)["changed"] is True
    assert cli.j("subject", "add", group, "channel/people/b.md", scenario.mike2)["changed"] is True
    assert cli.j("subject", "list", group, "channel/people/a.md")["subjects"] == [{"principal_id": scenario.mike1}]

    everyone = [h["path"] for h in hits(scenario, group, "Mike hiking")]
    assert everyone[0] == "channel/people/b.md" and len(everyone) == 3
    assert [h["path"] for h in hits(scenario, group, "Mike hiking", "--about", scenario.mike1, "--limit", "1")] \
        == ["channel/people/a.md"]
    assert [h["path"] for h in hits(scenario, group, "Mike hiking", "--about", scenario.mike2)] \
        == ["channel/people/b.md"]
    assert hits(scenario, scenario.alice_session, "Mike hiking", "--about", scenario.mike1) == []  # not her view

    assert cli.j("subject", "remove", group, "channel/people/a.md", scenario.mike1)["changed"] is True
    assert hits(scenario, group, "Mike hiking", "--about", scenario.mike1) == []


def test_subjects_attach_only_to_notes_the_session_may_change(scenario: Scenario) -> None:
    cli = scenario.cli
    own = cli("--json", "subject", "add", scenario.bob_session, "private/notes/allergy.md", scenario.mike1)
    assert own.code == 0  # Bob's own note: allowed
    outside = cli("--json", "subject", "add", scenario.alice_session, "channel/offsite.md", scenario.mike1)
    assert outside.code == 3 and outside.json()["reason"] == "outside-view"
    missing = cli("--json", "subject", "add", scenario.alice_session, "private/notes/none.md", scenario.mike1)
    assert missing.code == 3 and missing.json()["reason"] == "outside-view"
    unknown = cli("--json", "subject", "add", scenario.alice_session, "private/notes/allergy.md", "Mike")
    assert unknown.code == 2
    publish_shared(cli.home, "agent-shared/guide.md", b"guide\n", scenario.alice_session)
    read_only = cli("--json", "subject", "add", scenario.alice_session, "agent-shared/guide.md", scenario.mike1)
    assert read_only.code == 3


def test_snippets_are_cut_from_the_artifact_never_from_index_text(scenario: Scenario) -> None:
    """A row whose indexed text disagrees with its artifact: the artifact's lines are shown, never the row's."""
    cli = scenario.cli
    written = cli.j("write", scenario.alice_session, "private/notes/x.md", stdin=b"alpha\nbeta gamma\n")
    conn = catalog_of(scenario)
    try:
        row = conn.execute("SELECT resource_id, store_id FROM search_chunks WHERE revision_id = ?",
                           (written["revision_id"],)).fetchone()
        assert row is not None
        resource, store = row
        conn.execute("INSERT INTO search_chunks (agent_id, revision_id, resource_id, store_id, ordinal, start_line,"
                     " end_line, body) VALUES ('main', ?, ?, ?, 7, 2, 2, 'planted zebra text (canary Z3br)')",
                     (written["revision_id"], resource, store))
    finally:
        conn.close()
    result = cli("--json", "search", scenario.alice_session, "zebra", "--mode", "words")
    assert [(h["snippet"], h["citation"]) for h in result.json()["results"]] == \
        [("beta gamma", "private/notes/x.md#L2-L2")]
    assert "Z3br" not in result.text and "zebra" not in result.text


# -- ranking is exact, whatever the arms' own orders --------------------------

def _write_many(scenario: Scenario, notes: dict[str, bytes]) -> None:
    home = Home.open(scenario.cli.home)
    for path, text in notes.items():
        write_note(home, scenario.alice_session, path, text)


def test_hybrid_results_are_the_exact_top_k_even_outside_both_arms_first_pages(scenario: Scenario) -> None:
    """A chunk second-best in each arm can be best combined; the threshold rule must walk far enough to see it."""
    filler = " ".join(chr(0xE000 + i) for i in range(200))  # tokens for FTS5, no words for the embedder
    notes = {f"private/a/{i}.md": f"alpha beta {filler}\n".encode() for i in range(31)}
    notes |= {f"private/b/{i}.md": b"alphas betas alphas betas alphas betas alphas betas\n" for i in range(31)}
    notes["private/target.md"] = b"alpha beta alpha beta zeta\n"
    _write_many(scenario, notes)
    [best] = hits(scenario, scenario.alice_session, "alpha beta", "--limit", "1")
    assert best["path"] == "private/target.md"


def test_equal_scores_rank_by_path_in_every_mode(scenario: Scenario) -> None:
    _write_many(scenario, {f"private/t/{i:02d}.md": b"identical tie note\n" for i in reversed(range(40))})
    for mode in ("hybrid", "words", "vectors"):
        found = hits(scenario, scenario.alice_session, "identical tie", "--mode", mode, "--limit", "10")
        assert [h["path"] for h in found] == [f"private/t/{i:02d}.md" for i in range(10)], mode


def test_a_tampered_note_with_many_chunks_hides_nothing_that_should_rank(scenario: Scenario) -> None:
    """Its rows are retired only after the search, so the arms' pages do not shift under them."""
    line = "lantern " * 140
    _write_many(scenario, {"private/x.md": ((line + "\n") * 30).encode()}
                | {f"private/n/{i:02d}.md": f"lantern {'word ' * i}\n".encode() for i in range(60)})
    note = artifact_path(scenario.cli.home, scenario.alice, "x.md")
    os.chmod(note, 0o600)
    note.write_bytes(note.read_bytes().replace(b"lantern", b"LANTERN", 1))
    first = hits(scenario, scenario.alice_session, "lantern", "--mode", "words", "--limit", "1")
    again = hits(scenario, scenario.alice_session, "lantern", "--mode", "words", "--limit", "1")
    assert first == again and first[0]["path"] == "private/n/00.md"


def test_notes_without_words_or_text_do_not_break_a_search(scenario: Scenario) -> None:
    _write_many(scenario, {"private/rule.md": b"---\n", "private/blob.bin": bytes(range(256)) * 8,
                           "private/empty.md": b""})
    for mode in ("hybrid", "words", "vectors"):
        found = hits(scenario, scenario.alice_session, "hazelnuts", "--mode", mode)
        assert [h["path"] for h in found] == ["private/notes/allergy.md"], mode


# -- revisions the index does not cover are found by doctor ------------------

def test_doctor_reports_and_fixes_revisions_the_index_never_covered(scenario: Scenario) -> None:
    """As after upgrading a home from before the index (schema V2): its notes exist but have no rows."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/empty.md", stdin=b"")  # indexed, with nothing to find
    assert cli.j("doctor")["findings"] == []
    conn = catalog_of(scenario)
    try:
        conn.execute("DELETE FROM search_chunks")
        conn.execute("DELETE FROM search_indexed WHERE revision_id IN (SELECT revision_id FROM revisions v"
                     " JOIN resources r USING (resource_id) WHERE r.path = 'notes/allergy.md')")
    finally:
        conn.close()
    assert hits(scenario, scenario.alice_session, "hazelnuts") == []
    report = cli("--json", "doctor")
    assert report.code == 1
    assert [f["kind"] for f in report.json()["findings"]] == ["unindexed-revisions"]
    fixed = cli.j("doctor", "--fix")
    assert [(f["kind"], f["action"]) for f in fixed["findings"]] == [("unindexed-revisions", "reindexed")]
    assert [h["path"] for h in hits(scenario, scenario.alice_session, "hazelnuts")] == ["private/notes/allergy.md"]
    assert cli.j("doctor")["findings"] == []


def test_rows_embedded_by_a_model_no_longer_current_are_swept_by_reindex(scenario: Scenario) -> None:
    """A writer that embedded with the old model while a switch ran leaves rows the sweep must rebuild."""
    cli = scenario.cli
    run_sql(scenario, "UPDATE search_indexed SET model = 'scopefs-hashing-v2-64' WHERE chunks > 0")
    assert [f["kind"] for f in cli("--json", "doctor").json()["findings"]] == ["unindexed-revisions"]
    cli.j("reindex")
    assert cli.j("doctor")["findings"] == []
