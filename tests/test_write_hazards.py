"""Hazards around a write in flight, each found by review and fixed.

* A deny added while a write is staging wins at commit time.
* A failed activation commit, then death before the rollback, never leaves
  an active revision without its artifact.
* A first write that fails leaves no name behind.
* doctor neither reports nor disturbs a write still reading its input, and
  never waits for it.
* A note hidden from its store's own writer cannot exist (the policy is
  refused), and a note one may not read is never listed or replaced.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scopefs.catalog.errors import BadInput, Denied, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Op
from scopefs.catalog.reader import read_note
from scopefs.writer import steps
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, SCOPEFS, Scenario, table_dump
from tests.faultkit import COMMIT

NOTE = "private/notes/allergy.md"


def _store_and_resource(scenario: Scenario, audience: str, path: str) -> tuple[str, str | None]:
    catalog = table_dump(scenario.cli.home / "agents" / "main" / "catalog.sqlite")
    store = next(r[0] for r in catalog["stores"] if r[4] == audience)
    resource = next((r[0] for r in catalog["resources"] if r[2] == store and r[3] == path and r[4] == "live"), None)
    return store, resource


def _no_pending(scenario: Scenario) -> None:
    catalog = table_dump(scenario.cli.home / "agents" / "main" / "catalog.sqlite")
    assert all(r[8] != "pending" for r in catalog["revisions"])
    assert list((scenario.cli.home / "agents" / "main" / "staging").iterdir()) == []


DENY_CASES = {
    # name: (when the deny lands, note written, deny on, capability denied, audience)
    "while-staging": (steps.Step.STAGED, "private/notes/late.md", "store", Op.APPEND, "alice"),
    "between-commits": (steps.Step.FINALIZED, NOTE, "store", Op.REPLACE, "any"),
    "on-the-new-note": (steps.Step.FINALIZED, "private/notes/fresh.md", "resource", Op.APPEND, "any"),
}


# A close has no resource before its one commit: a deny on the new note cannot land while it is written.
DENY_RUNS = [pytest.param(case, durable, id=f"{case}-{'durable' if durable else 'close'}")
             for durable in (True, False) for case in DENY_CASES if durable or case != "on-the-new-note"]


@pytest.mark.parametrize(("case", "durable"), DENY_RUNS)
def test_a_deny_added_during_a_write_wins_at_commit(scenario: Scenario, case: str, durable: bool) -> None:
    """The policy is re-evaluated inside every commit (a close's one, a durable write's two); the refusal
    is audited once, and a close leaves neither its placed file nor its marker."""
    step, path, target_kind, capability, audience = DENY_CASES[case]
    old = read_note(Home.open(scenario.cli.home), scenario.alice_session, path) if path == NOTE else None
    home = Home.open(scenario.cli.home)

    def deny_now(reached: steps.Step) -> None:
        if reached is step:
            steps.set_hook(None)
            store, resource = _store_and_resource(scenario, scenario.alice, path.removeprefix("private/"))
            target = store if target_kind == "store" else resource
            assert target is not None
            kind, who = ((AudienceKind.ANY, "") if audience == "any"
                         else (AudienceKind.PRINCIPAL, scenario.alice))
            add_entry(Home.open(scenario.cli.home).catalog("main"), "main", target_kind=target_kind,
                      target_id=target, effect=Effect.DENY, capability=capability, audience_kind=kind, audience_id=who)

    start = len(table_dump(scenario.cli.home / "state.sqlite")["audit"])
    steps.set_hook(deny_now)
    try:
        with pytest.raises(Denied):
            write_note(home, scenario.alice_session, path, b"refused\n", durable=durable)
    finally:
        steps.set_hook(None)
    _no_pending(scenario)
    new_rows = sorted(table_dump(scenario.cli.home / "state.sqlite")["audit"], key=lambda r: r[0])[start:]
    assert [(r[10], r[11]) for r in new_rows] == [("deny", "explicit-deny")]
    assert scenario.cli.j("doctor")["findings"] == []
    result = scenario.cli("read", scenario.alice_session, path)
    assert (result.code, result.out) == ((0, old) if old is not None else (3, b""))


_DIE_AFTER_A_FAILED_COMMIT = r"""
import os, sys
from scopefs.catalog.home import Home
from tests.faultkit import FaultPlan, faulty_vfs
from scopefs.writer import steps, transaction

home_dir, session, path, kind, fatal, durable = sys.argv[1:7]
plan = FaultPlan(kind, 1)  # the first such catalog call after FINALIZED: the commit that activates
if fatal != "-":
    setattr(transaction, fatal, lambda *a, **k: os._exit(9))  # die exactly where the failure would be settled

def arm(step):
    if step is steps.Step.FINALIZED:
        plan.armed = True

with faulty_vfs(plan) as vfs:
    home = Home.open(__import__("pathlib").Path(home_dir), vfs=vfs)
    steps.set_hook(arm)
    try:
        transaction.write_note(home, session, path, b"new bytes\n", durable=durable == "durable")
    except Exception:
        os._exit(9)  # "-": once the write settled its failure, die with nothing closed or checkpointed
os._exit(0)
"""


def _die_after_a_failed_commit(scenario: Scenario, kind: str, fatal: str, *, durable: bool) -> None:
    """A real writer whose activating commit fails (``kind`` injected), dying at ``fatal``, before it settles
    (``"-"``: right after it settled, raising)."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _DIE_AFTER_A_FAILED_COMMIT, str(scenario.cli.home),
                           scenario.alice_session, NOTE, kind, fatal, "durable" if durable else "close"],
                          cwd=repo, capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()


@pytest.mark.parametrize("kind", ["xSync", COMMIT], ids=["sync-failed", "reached-the-log"])
def test_death_after_a_failed_activation_commit_never_loses_the_artifact(scenario: Scenario, kind: str) -> None:
    """The activation may still be replayed from the WAL: its file must stay. When its frames reached
    the log whole (``COMMIT``), the next open replays it for sure: the new revision is the note's."""
    _die_after_a_failed_commit(scenario, kind, "roll_back", durable=True)
    fixed = scenario.cli("--json", "doctor", "--fix")
    assert fixed.code == 0, fixed.out
    result = scenario.cli("read", scenario.alice_session, NOTE)
    assert result.code == 0 and result.out in ((ALICE_FACT, b"new bytes\n") if kind == "xSync" else (b"new bytes\n",))
    again = scenario.cli("--json", "doctor")
    assert again.code == 0 and again.json()["findings"] == []


def test_death_after_a_closes_failed_commit_leaves_nothing_readable(scenario: Scenario) -> None:
    """A close whose one commit failed (it syncs nothing: its log write fails), then died before telling
    whether it landed: its marker makes recovery remove the file it placed."""
    _die_after_a_failed_commit(scenario, "xWrite", "_failed", durable=False)
    report = scenario.cli("--json", "doctor")
    assert report.code == 1 and [f["kind"] for f in report.json()["findings"]] == ["unfinished-close"], report.out
    fixed = scenario.cli("--json", "doctor", "--fix")
    assert fixed.code == 0, fixed.out
    assert scenario.cli("read", scenario.alice_session, NOTE).out == ALICE_FACT
    _no_pending(scenario)
    again = scenario.cli("--json", "doctor")
    assert again.code == 0 and again.json()["findings"] == []


def test_death_after_a_closes_commit_reached_the_log_keeps_the_revision(scenario: Scenario) -> None:
    """A close whose one commit wrote its frames whole and then raised, and that died before telling
    whether it landed: the next open replays the commit, so its marker makes recovery keep the file the
    revision names and remove only the marker."""
    _die_after_a_failed_commit(scenario, COMMIT, "_failed", durable=False)
    report = scenario.cli("--json", "doctor")
    kinds = sorted(f["kind"] for f in report.json()["findings"])
    assert report.code == 1 and kinds == ["close-marker", "undrained-audit"], report.out  # its save's audit row too
    fixed = scenario.cli("--json", "doctor", "--fix")
    assert fixed.code == 0, fixed.out
    assert scenario.cli("read", scenario.alice_session, NOTE).out == b"new bytes\n"
    _no_pending(scenario)
    again = scenario.cli("--json", "doctor")
    assert again.code == 0 and again.json()["findings"] == []


def test_a_closes_commit_that_reached_the_log_and_failed_stays_undone(scenario: Scenario) -> None:
    """The same commit, settled by the close itself, which then died with nothing closed: the close may
    remove its file only once a later commit has overwritten that log tail (its error audit row), or the
    next open would replay a revision whose file is gone."""
    _die_after_a_failed_commit(scenario, COMMIT, "-", durable=False)
    report = scenario.cli("--json", "doctor")
    assert "close-marker" not in report.out.decode() and "unfinished-close" not in report.out.decode(), report.out
    fixed = scenario.cli("--json", "doctor", "--fix")
    assert fixed.code == 0, fixed.out
    assert scenario.cli("read", scenario.alice_session, NOTE).out == ALICE_FACT
    _no_pending(scenario)
    again = scenario.cli("--json", "doctor")
    assert again.code == 0 and again.json()["findings"] == []


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "close"])
def test_a_failed_first_write_leaves_no_name(scenario: Scenario, durable: bool) -> None:
    home = Home.open(scenario.cli.home)
    start = len(table_dump(scenario.cli.home / "state.sqlite")["audit"])

    def fail(step: steps.Step) -> None:
        if step is steps.Step.RENAMED:
            raise OSError(5, "injected")

    steps.set_hook(fail)
    try:
        with pytest.raises(StorageError):
            write_note(home, scenario.alice_session, "private/proj", b"x", durable=durable)
    finally:
        steps.set_hook(None)
    _no_pending(scenario)
    new_rows = sorted(table_dump(scenario.cli.home / "state.sqlite")["audit"], key=lambda r: r[0])[start:]
    assert [(r[10], r[11]) for r in new_rows] == [("error", "revision-stale")]  # one error, whichever path
    cli = scenario.cli
    assert [e["name"] for e in cli.j("ls", scenario.alice_session, "private")["entries"]] == ["notes"]
    assert cli.j("write", scenario.alice_session, "private/proj/notes.md", stdin=b"a folder now\n")["created"]
    assert cli.j("doctor")["findings"] == []


def test_doctor_leaves_a_write_that_is_still_reading_alone(scenario: Scenario) -> None:
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    writer = subprocess.Popen([SCOPEFS, "write", scenario.alice_session, "private/slow.md"], stdin=subprocess.PIPE,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert writer.stdin is not None
        writer.stdin.write(b"first half, ")
        writer.stdin.flush()
        staging = scenario.cli.home / "agents" / "main" / "staging"
        for _ in range(200):
            if any(staging.iterdir()):
                break
            time.sleep(0.05)
        assert any(staging.iterdir()), "the writer never started staging"
        report = scenario.cli("--json", "doctor")
        assert (report.code, report.json()["findings"]) == (0, [])
        fixed = scenario.cli("--json", "doctor", "--fix", timeout=20)  # must not wait for the writer
        assert (fixed.code, fixed.json()["findings"]) == (0, [])
        writer.stdin.write(b"second half\n")
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0, writer.stderr.read() if writer.stderr else ""
    finally:
        if writer.poll() is None:
            writer.kill()
    assert scenario.cli("read", scenario.alice_session, "private/slow.md").out == b"first half, second half\n"


def test_a_deny_cannot_hide_notes_from_their_writer(scenario: Scenario) -> None:
    home = Home.open(scenario.cli.home)
    store, resource = _store_and_resource(scenario, scenario.alice, "notes/allergy.md")
    assert resource is not None
    catalog = home.catalog("main")
    for target_kind, target in (("store", store), ("resource", resource)):
        for audience_kind, audience in ((AudienceKind.ANY, ""), (AudienceKind.PRINCIPAL, scenario.alice),
                                        (AudienceKind.SUBJECT_KIND, "user")):
            for capability in (Op.RETRIEVE, Op.READ):
                with pytest.raises(BadInput):
                    add_entry(catalog, "main", target_kind=target_kind, target_id=target, effect=Effect.DENY,
                              capability=capability, audience_kind=audience_kind, audience_id=audience)
    # Denies for other audiences, or of other capabilities, are fine.
    add_entry(catalog, "main", target_kind="resource", target_id=resource, effect=Effect.DENY,
              capability=Op.READ, audience_kind=AudienceKind.PRINCIPAL, audience_id=scenario.bob)
    add_entry(catalog, "main", target_kind="resource", target_id=resource, effect=Effect.DENY,
              capability=Op.DERIVE, audience_kind=AudienceKind.ANY)
    assert read_note(home, scenario.alice_session, NOTE) == ALICE_FACT


def _raw_deny(scenario: Scenario, resource: str, capability: str, audience: str, *, legacy: bool) -> None:
    """A deny written straight into the catalog, bypassing add_entry.

    The schema refuses it; with ``legacy`` the refusing trigger is dropped
    first, standing in for rows an older release might have left, which the
    read and write paths must still treat safely.
    """
    import apsw

    conn = apsw.Connection(str(scenario.cli.home / "agents" / "main" / "catalog.sqlite"))
    try:
        if legacy:
            conn.execute("DROP TRIGGER policy_entries_never_hide_from_writer")
        conn.execute("INSERT INTO policies (policy_id, agent_id, target_kind, target_id, created_by, created_at)"
                     " VALUES ('pol_raw', 'main', 'resource', ?, 'test', 0)", (resource,))
        conn.execute("INSERT INTO policy_entries (entry_id, agent_id, policy_id, policy_revision, effect, capability,"
                     " audience_kind, audience_id, grantor, created_at) VALUES ('pe_raw', 'main', 'pol_raw', 1,"
                     " 'deny', ?, 'principal', ?, 'test', 0)", (capability, audience))
    finally:
        conn.close()


def test_the_schema_refuses_a_deny_hiding_notes_from_their_writer(scenario: Scenario) -> None:
    import apsw

    _, resource = _store_and_resource(scenario, scenario.alice, "notes/allergy.md")
    assert resource is not None
    with pytest.raises(apsw.ConstraintError):
        _raw_deny(scenario, resource, "read", scenario.alice, legacy=False)


@pytest.mark.parametrize("capability", ["read", "retrieve"])
def test_a_note_one_may_not_read_is_neither_listed_read_nor_replaced(scenario: Scenario, capability: str) -> None:
    """ls, read and write agree: a note the subject may not read does not exist for it."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/other.md", stdin=b"visible\n")
    _, resource = _store_and_resource(scenario, scenario.alice, "notes/allergy.md")
    assert resource is not None
    _raw_deny(scenario, resource, capability, scenario.alice, legacy=True)
    listed = cli.j("ls", scenario.alice_session, "private/notes")["entries"]
    assert [e["name"] for e in listed] == ["other.md"]
    hidden = cli("--json", "read", scenario.alice_session, NOTE)
    missing = cli("--json", "read", scenario.alice_session, "private/notes/never.md")
    assert hidden.code == missing.code == 3 and hidden.out == missing.out and hidden.err == missing.err
    clobber = cli("--json", "write", scenario.alice_session, NOTE, stdin=b"overwrite attempt\n")
    assert clobber.code == 3 and clobber.json()["reason"] == "outside-view"
    revisions = table_dump(cli.home / "agents" / "main" / "catalog.sqlite")["revisions"]
    assert [r[3] for r in revisions if r[2] == resource] == [1]  # no new revision of the hidden note


def test_an_exception_after_the_activation_committed_keeps_the_note(scenario: Scenario,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C landing as COMMIT returns: the write happened; its file must stay."""
    import scopefs.writer.transaction as transaction
    from scopefs.writer import commit

    real = commit.activate  # the function transaction calls (it imports it from commit, not re-exported)

    def activate_then_interrupt(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(transaction, "activate", activate_then_interrupt)
    home = Home.open(scenario.cli.home)
    with pytest.raises(KeyboardInterrupt):
        write_note(home, scenario.alice_session, NOTE, b"committed\n")
    assert scenario.cli("read", scenario.alice_session, NOTE).out == b"committed\n"
    report = scenario.cli("--json", "doctor")
    assert report.code == 0 and report.json()["findings"] == []


def test_a_crashed_first_write_does_not_block_the_next_write(scenario: Scenario) -> None:
    """Recovery runs before the plan: the dead write's name is gone at once."""
    from tests.crashkit import writer_stopped_at

    with writer_stopped_at(scenario.cli.home, scenario.alice_session, "private/proj", b"x", steps.Step.PENDING) as w:
        w.kill()
    result = scenario.cli("--json", "write", scenario.alice_session, "private/proj/notes.md", stdin=b"ok\n")
    assert result.code == 0 and result.json()["created"], result.err
    assert scenario.cli.j("doctor")["findings"] == []


