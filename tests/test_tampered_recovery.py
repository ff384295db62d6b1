"""``doctor --fix`` on a tampered artifact: the revision is retired, the home is whole again, a forget clears all.

Real homes, real files changed behind the broker's back. After the fix the
changed bytes are in the agent's quarantine (named after their revision)
and nowhere a reader reaches; the note is back at its newest intact
revision (or gone, with none); ``doctor`` is clean and ``scopefs backup``
works; a ``forget`` of the note leaves none of its text in the quarantine.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from scopefs.writer.steps import Step
from tests.conftest import ALICE_FACT, BOB_FACT, Scenario, artifact_path
from tests.test_sharing_crash import _crash_at

NOTE = "private/notes/allergy.md"
ALICE_V2 = b"Updated private fact: allergic to hazelnuts and pecans (canary A2v2)\n"


def _tamper(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x20  # same size: only the hash can tell
    path.write_bytes(bytes(data))
    return bytes(data)


def _quarantine(scenario: Scenario) -> Path:
    return scenario.cli.home / "agents" / "main" / "quarantine"


def _audit_reasons(scenario: Scenario) -> list[str]:
    conn = apsw.Connection(str(scenario.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [str(r[0]) for r in conn.execute("SELECT reason FROM audit WHERE operation = 'recover'")]
    finally:
        conn.close()


def test_a_fixed_tamper_leaves_doctor_clean_and_backups_working(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2)  # alice: v1 superseded, v2 active
    alice_v2 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    bob = artifact_path(cli.home, scenario.bob, "notes/allergy.md")  # bob: one revision only
    changed = {_tamper(alice_v2), _tamper(bob)}
    assert cli("--json", "doctor").code == 4
    assert cli("backup", str(tmp_path / "refused")).code == 4

    fixed = cli("--json", "doctor", "--fix")
    assert fixed.code == 4, fixed.text  # what was found was an integrity failure
    actions = sorted((f["kind"], f["action"]) for f in fixed.json()["findings"])
    assert actions == [("tampered-artifact", "quarantined, rolled back")] * 2, actions
    clean = cli("--json", "doctor")
    assert clean.code == 0 and clean.json()["findings"] == [], clean.text
    assert _audit_reasons(scenario).count("revision-tampered") == 2
    retired = sorted(f"tampered-{f['ref_id']}" for f in fixed.json()["findings"])
    assert sorted(p.name for p in _quarantine(scenario).iterdir()) == retired

    # alice's note is back at its intact revision; bob's had none, so it is gone; never the changed bytes
    assert cli("read", scenario.alice_session, NOTE).out == ALICE_FACT
    assert cli("read", scenario.bob_session, NOTE).code != 0
    for session in (scenario.alice_session, scenario.bob_session):
        assert cli("read", session, NOTE).out not in changed
    report = cli.j("backup", str(tmp_path / "backup"))
    assert report["artifacts"] == 2  # alice's first revision and the channel's note: no retired one is required
    cli.j("write", scenario.bob_session, NOTE, stdin=BOB_FACT)  # written again: a new revision, served
    assert cli("read", scenario.bob_session, NOTE).out == BOB_FACT
    assert cli("--json", "doctor").code == 0
    cli.j("backup", str(tmp_path / "backup2"))


def test_a_tampered_superseded_revision_stops_being_required(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    v1 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2)
    _tamper(v1)  # now superseded
    assert cli("--json", "doctor", "--fix").code == 4
    assert cli("--json", "doctor").code == 0
    assert cli("read", scenario.alice_session, NOTE).out == ALICE_V2
    cli.j("backup", str(tmp_path / "backup"))


def test_a_forget_removes_the_quarantined_copy_of_its_note(scenario: Scenario) -> None:
    cli = scenario.cli
    canary = b"Quarantined then forgotten: the safe combination (canary Q4rn)\n"
    cli.j("write", scenario.alice_session, "private/notes/safe.md", stdin=canary)
    cli.j("write", scenario.alice_session, "private/notes/safe.md", stdin=canary + b"and more\n")
    artifact = artifact_path(cli.home, scenario.alice, "notes/safe.md")
    changed = _tamper(artifact)
    cli("doctor", "--fix")
    quarantine = _quarantine(scenario)
    assert [p.read_bytes() for p in quarantine.iterdir()] == [changed]
    assert cli("read", scenario.alice_session, "private/notes/safe.md").out == canary
    cli.j("forget", scenario.alice_session, "private/notes/safe.md")
    for path in quarantine.iterdir():
        data = path.read_bytes()
        assert b"Q4rn" not in data and b"safe combination" not in data.lower(), path
    assert list(quarantine.iterdir()) == []
    assert cli("--json", "doctor").code == 0


def _revision_of(scenario: Scenario, artifact: Path) -> str:
    conn = apsw.Connection(str(scenario.cli.home / "agents" / "main" / "catalog.sqlite"),
                           flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return str(conn.execute("SELECT revision_id FROM revisions WHERE locator = ?", (artifact.name,)
                                ).fetchall()[0][0])
    finally:
        conn.close()


def test_a_fix_killed_after_moving_under_a_taken_name_is_finished(scenario: Scenario) -> None:
    """``tampered-<id>`` was taken, so the fix moved the artifact to ``tampered-<id>-<token>`` and died before
    the roll-back: the next fix recognises that name too and finishes (never a missing-artifact left for good)."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2)
    v2 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    _tamper(v2)
    revision_id = _revision_of(scenario, v2)
    v2.rename(_quarantine(scenario) / f"tampered-{revision_id}-a1b2c3")  # what _to_quarantine did, then died
    fixed = cli("--json", "doctor", "--fix")
    assert [(f["kind"], f["ref_id"], f["action"]) for f in fixed.json()["findings"]] == [
        ("tampered-artifact", revision_id, "rolled back")], fixed.text
    clean = cli("--json", "doctor")
    assert clean.code == 0 and clean.json()["findings"] == [], clean.text
    assert cli("read", scenario.alice_session, NOTE).out == ALICE_FACT
    cli.j("forget", scenario.alice_session, NOTE)  # and the forget finds it by the same name
    assert list(_quarantine(scenario).iterdir()) == []


def test_a_forget_killed_after_its_commit_leaves_no_quarantined_copy_after_doctor(scenario: Scenario) -> None:
    """The forget committed, then died before its files went (``Step.FORGOTTEN``): doctor reports the tampered
    copy in quarantine as a forgotten artifact, and ``--fix`` removes it with the store's own."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2)
    v2 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    changed = _tamper(v2)
    revision_id = _revision_of(scenario, v2)
    assert cli("doctor", "--fix").code == 4
    assert [p.name for p in _quarantine(scenario).iterdir()] == [f"tampered-{revision_id}"]
    _crash_at(scenario, Step.FORGOTTEN, "forget", scenario.alice_session, NOTE)
    found = cli("--json", "doctor")
    assert found.code == 1, found.text
    forgotten = [(f["ref_id"], f["action"]) for f in found.json()["findings"] if f["kind"] == "forgotten-artifact"]
    assert (revision_id, None) in forgotten, found.text
    fixed = cli("--json", "doctor", "--fix")
    assert (revision_id, "removed") in [(f["ref_id"], f["action"]) for f in fixed.json()["findings"]
                                        if f["kind"] == "forgotten-artifact"], fixed.text
    assert list(_quarantine(scenario).iterdir()) == []
    leftovers = [p for p in (cli.home / "agents").rglob("*") if p.is_file() and p.read_bytes() == changed]
    assert leftovers == []
    clean = cli("--json", "doctor")
    assert clean.code == 0 and clean.json()["findings"] == [], clean.text


def _state_of(scenario: Scenario, revision_id: str) -> str:
    conn = apsw.Connection(str(scenario.cli.home / "agents" / "main" / "catalog.sqlite"),
                           flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return str(conn.execute("SELECT state FROM revisions WHERE revision_id = ?", (revision_id,)).fetchall()[0][0])
    finally:
        conn.close()


def test_the_roll_back_never_activates_a_predecessor_whose_artifact_is_missing(scenario: Scenario) -> None:
    """v1 intact, v2's artifact lost, v3 tampered: the note returns to v1, past v2; with no intact predecessor at
    all it is removed. Never an active revision nobody can read (doctor would report it missing for good)."""
    cli = scenario.cli
    v1 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2)
    v2 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    cli.j("write", scenario.alice_session, NOTE, stdin=ALICE_V2 + b"third\n")
    v3 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    ids = [_revision_of(scenario, v) for v in (v1, v2, v3)]
    v2.unlink()
    _tamper(v3)
    assert cli("doctor", "--fix").code == 4
    assert [_state_of(scenario, r) for r in ids] == ["active", "corrupt", "corrupt"]  # v2 passed over, retired
    assert cli("read", scenario.alice_session, NOTE).out == ALICE_FACT
    assert sorted(_audit_reasons(scenario)) == ["revision-lost", "revision-tampered"]
    clean = cli("--json", "doctor")
    assert clean.code == 0 and clean.json()["findings"] == [], clean.text

    v1.unlink()  # now no predecessor is intact: the tampered active one's note is removed
    cli.j("write", scenario.alice_session, NOTE, stdin=b"fourth\n")
    v4 = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    _tamper(v4)
    assert cli("doctor", "--fix").code == 4
    assert "active" not in [_state_of(scenario, r) for r in (*ids, _revision_of(scenario, v4))]
    assert cli("read", scenario.alice_session, NOTE).code != 0
    after = cli("--json", "doctor").json()["findings"]
    assert [(f["kind"], f["ref_id"]) for f in after] == [("missing-artifact", ids[0])], after
    assert _state_of(scenario, ids[0]) == "superseded"  # no note went back to it: left to restore from a backup
