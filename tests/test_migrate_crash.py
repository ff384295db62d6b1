"""A migration killed at any point resumes cleanly: nothing duplicated, lost or exposed.

The real ``scopefs migrate --apply`` runs in a child process that SIGKILLs
itself when the run reaches one named point (``writer.steps``): inside the
write of its third item (each step of the write transaction), and between
the migration's own phases (backed up, copied, verified). Then, before any
repair, no other subject reads anything of the owner's; and the same
command, run again, finishes the plan with exactly one copy per source.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scopefs.writer.steps import MIGRATION_STEPS, Step
from tests.conftest import BOB_FACT, SCOPEFS, Scenario, db_copy, sqlite_int
from tests.crashkit import REPO, catalog_path
from tests.migratekit import CANARIES, build_layout, tree_hash
from tests.test_migrate import PRIVATE_EXPECTED, _args

_CHILD = r"""
import os, signal, sys
from scopefs.writer import steps
from scopefs.cli.main import main

target, nth = sys.argv[1], int(sys.argv[2])
seen = 0

def die_here(step):
    global seen
    if step.value == target:
        seen += 1
        if seen == nth:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no cleanup, no rollback, no flush

steps.set_hook(die_here)
sys.exit(main(sys.argv[3:]))
"""

POINTS = [(Step.STAGED, 3), (Step.PENDING, 2), (Step.RENAMED, 2), (Step.FINALIZED, 3), (Step.ACTIVATED, 2),
          *((step, 1) for step in MIGRATION_STEPS)]


def _killed_at(s: Scenario, step: Step, nth: int, argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD, step.value, str(nth), *argv], capture_output=True,
                          cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO),
                                                      "SCOPEFS_HOME": str(s.cli.home)})
    assert proc.returncode == -9, (proc.returncode, proc.stderr.decode(errors="replace")[-2000:])


def _count(s: Scenario, sql: str) -> int:
    with db_copy(catalog_path(s.cli.home)) as conn:
        return sqlite_int(conn.execute(sql).fetchall()[0][0])


@pytest.mark.parametrize(("step", "nth"), POINTS, ids=lambda p: p.value if isinstance(p, Step) else str(p))
def test_a_migration_killed_midway_resumes_without_duplicates_or_exposure(scenario: Scenario, tmp_path: Path,
                                                                          step: Step, nth: int) -> None:
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    tree_before = tree_hash(ws.parent)
    plan = s.cli.j(*_args(s, ws, state))
    copied = sum(1 for i in plan["items"] if i["destination"])
    argv = _args(s, ws, state, "--apply", "--confirm", plan["plan_digest"])
    _killed_at(s, step, nth, argv)
    # Before any repair: nothing of the owner's reaches anyone else; nothing half-written reaches the owner.
    for destination, data in PRIVATE_EXPECTED.values():
        for other in (s.bob_session, s.group_session):
            assert s.cli("read", other, destination).code == 3
        got = s.cli("read", s.alice_session, destination)
        assert (got.code, got.out) in ((0, data), (3, b"")), destination
    assert _count(s, "SELECT count(*) FROM migration_runs WHERE cutover_at IS NOT NULL") == 0
    # The same command again: it resumes and finishes.
    result = s.cli("--json", *argv)
    assert result.code == 0, result.err
    assert result.json()["cutover"] is True
    assert _count(s, "SELECT count(*) FROM migration_items") == copied
    assert _count(s, "SELECT count(*) FROM revisions WHERE trust_origin = 'migration' AND state = 'active'") == copied
    assert _count(s, "SELECT count(*) FROM revisions WHERE state = 'pending'") == 0
    assert _count(s, "SELECT count(*) FROM (SELECT resource_id FROM revisions WHERE trust_origin = 'migration'"
                     " AND state = 'active' GROUP BY resource_id HAVING count(*) > 1)") == 0
    for destination, data in PRIVATE_EXPECTED.values():
        assert s.cli("read", s.alice_session, destination, check=True).out == data
        assert s.cli("read", s.bob_session, destination).code == 3
    assert not list((s.cli.home / "migrations").glob("*/backup*"))  # past the cutover the backup is gone
    assert tree_hash(ws.parent) == tree_before
    s.cli("doctor", "--fix", check=True)  # a staged file of the killed write, if any, as after any killed write
    assert s.cli("doctor", check=True).code == 0
    audit = (s.cli.home / "state.sqlite").read_bytes()
    assert not any(c in audit for c in CANARIES)


def test_a_run_killed_while_backing_up_starts_its_backup_again(scenario: Scenario, tmp_path: Path) -> None:
    """A half-written backup (``backup.partial``) is never reused: it is removed and made again."""
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    plan = s.cli.j(*_args(s, ws, state))
    partial = s.cli.home / "migrations" / plan["plan_digest"][:32] / "backup.partial"
    partial.mkdir(parents=True, mode=0o700)
    (partial / "state.sqlite").write_bytes(b"half a database")
    report = s.cli.j(*_args(s, ws, state, "--apply", "--confirm", plan["plan_digest"]))
    assert not partial.exists() and report["cutover"] is True
    assert report["backup"] is None and not partial.parent.exists()
    shutil.rmtree(tmp_path / "legacy")


_REVOKER = r"""
import sys
from pathlib import Path
from scopefs.catalog.home import Home
from scopefs.catalog.identity import revoke_binding
from scopefs.writer import steps
from scopefs.cli.main import main

home, binding = sys.argv[1], sys.argv[2]
seen = 0

def revoke_midway(step):
    global seen
    if step.value == "pending":
        seen += 1
        if seen == 2:  # between the two commits of the owner's second note
            other = Home.open(Path(home))
            revoke_binding(other.state(), binding)
            other.close()

steps.set_hook(revoke_midway)
sys.exit(main(sys.argv[3:]))
"""


def test_a_binding_revoked_mid_run_stops_the_private_copies(scenario: Scenario, tmp_path: Path) -> None:
    """The owner's evidence is decided again inside each commit: the revocation wins, nothing more lands."""
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    plan = s.cli.j(*_args(s, ws, state))
    argv = _args(s, ws, state, "--apply", "--confirm", plan["plan_digest"])
    proc = subprocess.run([sys.executable, "-c", _REVOKER, str(s.cli.home), s.alice_binding, *argv],
                          capture_output=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "SCOPEFS_HOME": str(s.cli.home)})
    assert proc.returncode == 3, proc.stderr.decode(errors="replace")
    assert _count(s, "SELECT count(*) FROM migration_items") == 1  # USER.md, before the revocation
    assert _count(s, "SELECT count(*) FROM revisions WHERE state = 'pending'") == 0
    assert _count(s, "SELECT count(*) FROM migration_runs WHERE cutover_at IS NOT NULL") == 0
    assert s.cli(*argv).code == 2  # the owner has no live binding any more: refused before anything


_EDITOR = r"""
import os, subprocess, sys
from scopefs.writer import steps
from scopefs.cli.main import main

scopefs, session, target, nth = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
seen = 0

def edit_after_the_rescan(step):
    global seen
    if step.value == target:
        seen += 1
    if step.value == target and seen == nth:
        subprocess.run([scopefs, "write", session, "private/MEMORY.md"], input=b"Alice's edit, saved mid-run\n",
                       check=True, env=os.environ, capture_output=True)

steps.set_hook(edit_after_the_rescan)
sys.exit(main(sys.argv[5:]))
"""


@pytest.mark.parametrize(("step", "nth"), [(Step.MIGRATION_BACKED_UP, 1), (Step.PENDING, 2)],
                         ids=["before-the-copy", "between-the-copys-commits"])
def test_a_note_the_owner_saves_during_the_run_is_never_overwritten(scenario: Scenario, tmp_path: Path,
                                                                    step: Step, nth: int) -> None:
    """The destination is checked inside the commit, not only at plan time: the owner's edit stays active.

    Saved after the rescan and before MEMORY.md's copy (its first commit
    sees it), or between that copy's two commits (the activation does).
    """
    s = scenario
    ws, state = build_layout(tmp_path / "legacy")
    plan = s.cli.j(*_args(s, ws, state))
    argv = ["--json", *_args(s, ws, state, "--apply", "--confirm", plan["plan_digest"])]
    proc = subprocess.run([sys.executable, "-c", _EDITOR, SCOPEFS, s.alice_session, step.value, str(nth), *argv],
                          capture_output=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "SCOPEFS_HOME": str(s.cli.home)})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    report = json.loads(proc.stdout)
    assert report["cutover"] is True
    item = next(i for i in report["items"] if i["source"] == "workspace/MEMORY.md")
    assert item["status"] == "quarantined-destination-exists"
    assert s.cli("read", s.alice_session, "private/MEMORY.md", check=True).out == b"Alice's edit, saved mid-run\n"
    # The legacy bytes wait in quarantine, recorded as this run's item; the rest of the plan landed as planned.
    assert _count(s, "SELECT count(*) FROM migration_items") == sum(1 for i in plan["items"] if i["destination"])
    for destination, data in PRIVATE_EXPECTED.values():
        if destination != "private/MEMORY.md":
            assert s.cli("read", s.alice_session, destination, check=True).out == data
    # A new dry run plans what the run did: MEMORY.md to quarantine, already there; the edit still stands.
    again = next(i for i in s.cli.j(*_args(s, ws, state))["items"] if i["source"] == "workspace/MEMORY.md")
    assert (again["action"], again["reason"], again["status"]) == ("quarantine", "destination-exists",
                                                                   "already-migrated")
    assert s.cli("read", s.alice_session, "private/MEMORY.md", check=True).out == b"Alice's edit, saved mid-run\n"


def _homes_with(home: Path, needle: bytes) -> list[Path]:
    """Every file under the home holding ``needle`` (the bytes themselves, as grep would find them)."""
    return [path for path in home.rglob("*") if path.is_file() and not path.is_symlink()
            and needle in path.read_bytes()]


def test_an_abandoned_runs_backup_goes_once_a_later_run_cuts_over(scenario: Scenario, tmp_path: Path) -> None:
    """A run killed after its backup never cuts over; its full copy of the home keeps text forgotten later.
    Doctor says so and how to end it; once a later run of the agent has cut over, no rollback needs the old
    copy and ``doctor --fix`` removes it: no byte of the forgotten note is left anywhere under the home."""
    s = scenario
    forgotten = BOB_FACT.strip()
    ws, state = build_layout(tmp_path / "legacy")
    first = s.cli.j(*_args(s, ws, state))["plan_digest"]
    _killed_at(s, Step.MIGRATION_BACKED_UP, 1, _args(s, ws, state, "--apply", "--confirm", first))
    s.cli.j("forget", s.bob_session, "private/notes/allergy.md")
    holders = _homes_with(s.cli.home, forgotten)
    assert holders and all(p.relative_to(s.cli.home).parts[:3] == ("migrations", first[:32], "backup")
                           for p in holders), holders  # forget scrubbed the home; only the backup has it

    pending = [f for f in s.cli.j("doctor", "--fix")["findings"] if f["kind"] == "migration-backup"]
    assert len(pending) == 1 and pending[0]["action"] is None and pending[0]["ref_id"] == first  # still needed
    hint = pending[0]["hint"]
    assert "full copy of the home" in hint and "'forget' never reaches" in hint and "--apply" in hint
    assert "remove" in hint and "roll back" in hint
    assert _homes_with(s.cli.home, forgotten)

    (ws / "MEMORY.md").write_bytes(b"# Memory\n- changed since the first plan\n")  # a new plan, applied to cutover
    second = s.cli.j(*_args(s, ws, state))["plan_digest"]
    assert second != first
    assert s.cli.j(*_args(s, ws, state, "--apply", "--confirm", second))["cutover"] is True
    fixed = [f for f in s.cli.j("doctor", "--fix")["findings"] if f["kind"] == "migration-backup"]
    assert [(f["ref_id"], f["action"]) for f in fixed] == [(first, "removed")]
    assert _homes_with(s.cli.home, forgotten) == []
    grep = subprocess.run(["grep", "-rlF", forgotten.decode(), str(s.cli.home)], capture_output=True, check=False)
    assert grep.returncode == 1 and grep.stdout == b"", grep.stdout
    assert not (s.cli.home / "migrations" / first[:32]).exists()
    assert s.cli.j("doctor")["findings"] == []
