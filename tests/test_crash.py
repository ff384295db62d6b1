"""Crash consistency of the write transaction (DESIGN.md §6, invariant 8).

A real writer process is SIGKILLed at every checkpoint of the staged-rename
transaction, for a note in a store that does not exist yet, a new note in an
existing store, and an overwrite of a note with committed history; both for
a durable write (two transactions) and for a close through a mount (a
marker, one transaction). Then:

* ``scopefs doctor`` names exactly the leftovers that step leaves and
  changes nothing (logical dump of every database, hash of every file);
* before any repair a reader sees only committed bytes;
* ``scopefs doctor --fix`` repairs everything it found, after which a reader
  sees the old or the new note and nothing else (the new one once the commit
  was acknowledged), nothing is pending or staged, every file in a store is
  a committed revision, no committed revision is lost, a second doctor is
  clean and normal writing resumes.

A second test tampers with, deletes and plants artifacts behind the
catalog's back and checks that doctor reports (and only partly repairs) them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import apsw
import pytest

from scopefs.catalog.home import Home
from scopefs.writer.recovery import inspect
from scopefs.writer.steps import Step
from tests.conftest import ALICE_FACT, BOB_FACT, CHANNEL_FACT, Cli, db_copy, diff_snapshots, snapshot
from tests.crashkit import (
    AFTER,
    AGENT,
    ALICE_V2,
    NEW_NOTE,
    NEW_STORE,
    OVERWRITE,
    STEPS,
    Base,
    WriteCase,
    allowed_outcomes,
    artifact_path,
    assert_consistent,
    build_base,
    case_durable_steps,
    catalog_path,
    committed,
    copy_home,
    doctor,
    locator_like_name,
    new_bytes,
    read_outcome,
    sha256,
    the_revision,
    verify_recovered,
    writer_stopped_at,
)

# What each interruption leaves behind, as doctor names it. Derived from what
# exists on disk at that point: an uncatalogued store directory, a staged file
# without an intent, a pending intent (its staged or final file is in flight),
# an activated revision whose audit row is not yet in the shared audit.
BEFORE_PLACING: dict[Step, Counter[str]] = {
    Step.STAGED: Counter({"staging-leftover": 1}),
    Step.STORE_DIR_MADE: Counter({"staging-leftover": 1, "orphan-store-dir": 1}),
    Step.STORE_ROW: Counter({"staging-leftover": 1}),  # an empty, catalogued store is a valid state
}
LEFTOVERS: dict[Step, Counter[str]] = {
    **BEFORE_PLACING,
    Step.PENDING: Counter({"pending-intent": 1}),
    Step.RENAMED: Counter({"pending-intent": 1}),
    Step.FINALIZED: Counter({"pending-intent": 1}),
    Step.ACTIVATED: Counter({"undrained-audit": 1}),
    Step.AUDITED: Counter(),
}
# A close: its marker names its file, staged or placed; it drains its audit row with the mount's next batch,
# never itself.
CLOSE_LEFTOVERS: dict[Step, Counter[str]] = {
    **BEFORE_PLACING,
    Step.MARKED: Counter({"unfinished-close": 1}),  # its staged file too: the marker names it
    Step.RENAMED: Counter({"unfinished-close": 1}),
    Step.FINALIZED: Counter({"unfinished-close": 1}),
    Step.ACTIVATED: Counter({"undrained-audit": 1, "close-marker": 1}),  # committed; its marker not yet removed
    Step.AUDITED: Counter({"undrained-audit": 1}),
}


def fixed(step: Step, durable: bool) -> Counter[str]:
    """What --fix finds: the same, and rolling back a pending intent readies its audit row (an error), which
    the same run then drains; settling an abandoned close's marker records one (``writer.placing``)."""
    found = (LEFTOVERS if durable else CLOSE_LEFTOVERS)[step]
    settled_as_error = ("pending-intent" in found or "unfinished-close" in found) and "undrained-audit" not in found
    return found + (Counter({"undrained-audit": 1}) if settled_as_error else Counter())


def test_leftover_table_covers_every_step() -> None:
    """A new checkpoint must get its own expectation (and so its own crash case)."""
    assert set(LEFTOVERS) | set(CLOSE_LEFTOVERS) == set(STEPS)
    assert set(LEFTOVERS) == set(NEW_STORE.steps(durable=True))
    assert set(CLOSE_LEFTOVERS) == set(NEW_STORE.steps(durable=False))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    return build_base(tmp_path_factory.mktemp("crash-base") / "home")


@pytest.mark.parametrize("case, step, durable", case_durable_steps(NEW_STORE, NEW_NOTE, OVERWRITE))
def test_sigkill_between_steps(base: Base, tmp_path: Path, case: WriteCase, step: Step, durable: bool) -> None:
    """Kill -9 at ``step``: doctor reports without changing, --fix leaves old or new."""
    cli = Cli(copy_home(base, tmp_path / "home"))
    before = committed(cli.home)
    with writer_stopped_at(cli.home, case.session_id(base), case.path, new_bytes(step), step,
                           durable=durable) as writer:
        writer.kill()

    # doctor without --fix: reports exactly this step's leftovers, changes nothing.
    untouched = snapshot(cli.home)
    report = doctor(cli)
    assert report.kinds == (LEFTOVERS if durable else CLOSE_LEFTOVERS)[step], report.findings
    assert all(f["action"] is None for f in report.findings), report.findings
    assert report.code == (1 if report.findings else 0)
    assert diff_snapshots(untouched, snapshot(cli.home)) == []

    # Before any repair only committed bytes are served: never the pending or staged file.
    seen = read_outcome(cli, case.session_id(base), case.path, case.old, new_bytes(step))
    acknowledged = STEPS.index(step) >= STEPS.index(Step.ACTIVATED)
    assert seen == ("new" if acknowledged else ("old" if case.old is not None else "absent"))

    repaired = doctor(cli, fix=True)
    assert repaired.kinds == fixed(step, durable), repaired.findings
    assert all(f["action"] is not None for f in repaired.findings), repaired.findings
    assert repaired.code == 0, repaired.findings

    outcome = verify_recovered(cli, case, base, step, before, durable=durable)
    assert outcome in allowed_outcomes(case, step, durable=durable)


def test_doctor_reports_tampered_missing_and_orphaned_artifacts(base: Base, tmp_path: Path) -> None:
    """Damage behind the catalog's back is reported, changes nothing, and stays unreadable.

    The tamper keeps the size, so only the hash can catch it; the orphan has a
    locator-shaped name, so only the catalog can tell it apart.
    """
    cli = Cli(copy_home(base, tmp_path / "home"))
    home = cli.home
    alice_rev = the_revision(home, ALICE_V2)
    bob_rev = the_revision(home, BOB_FACT)
    channel_rev = the_revision(home, CHANNEL_FACT)
    alice_v1 = the_revision(home, ALICE_FACT, state="superseded")

    tampered = artifact_path(home, alice_rev)
    data = bytearray(tampered.read_bytes())
    data[0] ^= 0x01
    tampered.write_bytes(bytes(data))
    artifact_path(home, bob_rev).unlink()
    orphan = artifact_path(home, channel_rev).with_name(locator_like_name())
    orphan_bytes = b"not a revision: planted behind the catalog's back\n"
    orphan.write_bytes(orphan_bytes)
    orphan.chmod(0o600)

    untouched = snapshot(home)
    report = doctor(cli)
    assert report.code == 4, report
    found = sorted((f["kind"], f["ref_id"], f["action"], f["integrity"]) for f in report.findings)
    assert found == sorted([
        ("tampered-artifact", alice_rev.revision_id, None, True),
        ("missing-artifact", bob_rev.revision_id, None, True),
        ("orphan-file", channel_rev.store_id, None, False),
    ])
    assert diff_snapshots(untouched, snapshot(home)) == []

    quarantine = home / "agents" / "main" / "quarantine"
    assert list(quarantine.iterdir()) == []
    fixed = doctor(cli, fix=True)
    assert fixed.code == 4, fixed  # integrity failures cannot be repaired from here
    repaired = sorted((f["kind"], f["ref_id"], f["action"]) for f in fixed.findings)
    assert repaired == sorted([
        # moved aside, never re-hashed: the revision is retired and the note is back at the one before
        ("tampered-artifact", alice_rev.revision_id, "quarantined, rolled back"),
        ("missing-artifact", bob_rev.revision_id, None),
        ("orphan-file", channel_rev.store_id, "quarantined"),
    ])
    assert not orphan.exists() and not tampered.exists()
    assert sorted(p.read_bytes() for p in quarantine.iterdir()) == sorted([orphan_bytes, bytes(data)])
    assert (quarantine / f"tampered-{alice_rev.revision_id}").read_bytes() == bytes(data)
    # What the operator reviews: names, sizes and ids, never a byte of the content.
    listed = cli("--json", "quarantine", "list", "--agent", "main")
    assert listed.code == 0, listed.err
    assert listed.json()["tampered"] == [{"name": f"tampered-{alice_rev.revision_id}", "size": len(data),
                                          "revision_id": alice_rev.revision_id}]
    [orphan_entry] = listed.json()["files"]
    assert orphan_entry["size"] == len(orphan_bytes) and (quarantine / orphan_entry["name"]).is_file()
    assert listed.json()["migrated"] == []
    text = cli("quarantine", "list", "--agent", "main", check=True).out
    assert b"0 migrated note(s), 1 tampered copy(ies), 1 other file(s)" in text
    for content in (bytes(data), orphan_bytes, ALICE_FACT):
        assert content.strip()[:20] not in listed.out + text

    assert cli("read", base.alice_session, "private/notes/allergy.md", check=True).out == ALICE_FACT
    result = cli("read", base.bob_session, "private/notes/allergy.md")
    assert (result.code, result.out) == (4, b""), result
    assert cli("read", base.group_session, "channel/offsite.md", check=True).out == CHANNEL_FACT
    # Untouched history is not collateral damage.
    assert sha256(artifact_path(home, alice_v1).read_bytes()) == alice_v1.sha256

    again = doctor(cli)
    assert again.code == 4
    assert again.kinds == Counter({"missing-artifact": 1})  # the missing one cannot be repaired from here


@pytest.mark.parametrize("step", [Step.MARKED, Step.RENAMED, Step.FINALIZED, Step.ACTIVATED], ids=lambda s: s.value)
def test_doctor_leaves_a_close_in_flight_alone(base: Base, tmp_path: Path, step: Step) -> None:
    """A live close between its marker and the marker's removal is neither reported nor touched (its flock
    says so); once it is dead, its marker is what doctor reports, as committed or not."""
    cli = Cli(copy_home(base, tmp_path / "home"))
    with writer_stopped_at(cli.home, OVERWRITE.session_id(base), OVERWRITE.path, new_bytes(step), step,
                           durable=False) as writer:
        untouched = snapshot(cli.home)
        report = doctor(cli)
        # Only what is not the close's own to settle: a committed close's audit row waits for its mount's batch.
        expected = CLOSE_LEFTOVERS[step] - Counter({"close-marker": 1, "unfinished-close": 1})
        assert report.kinds == expected, report.findings
        assert diff_snapshots(untouched, snapshot(cli.home)) == []
        writer.kill()
    left = CLOSE_LEFTOVERS[step]
    assert doctor(cli).kinds == left, left


@pytest.mark.parametrize("case, step, durable", case_durable_steps(NEW_STORE, OVERWRITE))
def test_next_write_after_sigkill_recovers_by_itself(base: Base, tmp_path: Path, case: WriteCase, step: Step,
                                                     durable: bool) -> None:
    """Without any doctor, the next write settles the crashed one and succeeds.

    DESIGN.md §6.5: recovery completes abandoned intents before writing, so a
    crash is invisible to the next writer: it must not fail with "the note
    changed while it was being written" when nobody else wrote. A close's
    placed file goes with its marker: no doctor finds it afterwards.
    """
    cli = Cli(copy_home(base, tmp_path / "home"))
    before = committed(cli.home)
    with writer_stopped_at(cli.home, case.session_id(base), case.path, new_bytes(step), step,
                           durable=durable) as writer:
        writer.kill()

    result = cli("write", case.session_id(base), case.path, stdin=AFTER)
    assert result.code == 0, result.err
    assert cli("read", case.session_id(base), case.path, check=True).out == AFTER
    left = doctor(cli).kinds
    assert not left & Counter({"unfinished-close": 1, "close-marker": 1, "pending-intent": 1, "orphan-file": 1}), left
    # Whatever the write-time recovery left for doctor is repairable, and nothing committed was lost.
    assert doctor(cli, fix=True).code == 0
    assert_consistent(cli.home, before)


def test_doctor_fix_removes_the_finished_intents_older_versions_kept(base: Base, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 2026-12-03 a finished write kept its intent as 'done'; a home from then still has them. They
    are a notice (nothing is wrong), and ``--fix`` removes them in batches, touching nothing else."""
    cli = Cli(copy_home(base, tmp_path / "home"))
    monkeypatch.setattr("scopefs.writer.recovery.SWEEP_BATCH", 2)  # in-process only: the CLI keeps its own
    conn = apsw.Connection(str(catalog_path(cli.home)))
    try:
        revisions = [r[0] for r in conn.execute("SELECT revision_id FROM revisions WHERE state = 'active'")]
        store = conn.execute("SELECT store_id FROM stores LIMIT 1").fetchall()[0][0]
        with conn:
            for n, revision in enumerate(revisions):
                conn.execute("INSERT INTO write_intents (intent_id, agent_id, revision_id, store_id, staged_name,"
                             " final_locator, expected_sha256, state, created_at, finished_at)"
                             " VALUES (?, ?, ?, ?, 'x', 'y', ?, 'done', 1, 2)",
                             (f"intent_legacy{n:020d}", AGENT, revision, store, "0" * 64))
    finally:
        conn.close()
    assert len(revisions) >= 3
    before = snapshot(cli.home, skip_tables=("write_intents", "audit"))
    report = doctor(cli)
    assert (report.code, report.kinds) == (0, Counter({"finished-intents": 1}))
    assert report.findings[0]["notice"] and "doctor --fix" in report.findings[0]["hint"]
    home = Home.open(cli.home)
    try:
        findings = inspect(home, AGENT, fix=True)
    finally:
        home.close()
    assert [(f.kind, f.action) for f in findings] == [("finished-intents", f"removed {len(revisions)}")]
    with db_copy(catalog_path(cli.home)) as copy:
        assert copy.execute("SELECT count(*) FROM write_intents").fetchall() == [(0,)]
    assert diff_snapshots(before, snapshot(cli.home, skip_tables=("write_intents", "audit"))) == []
    assert doctor(cli).findings == []
