"""Revision history: ``scopefs history`` and the mount's hidden ``.history`` folder (issue 16, point 9).

What these tests hold it to (``vfs/history.py`` and ``catalog/history.py``
have the design), on real mounts, real sandboxes and real SQLite files:

* ``scopefs history SESSION PATH`` lists a note's revisions with their
  time, actor (a principal id, never a provider's raw id) and origin; it
  refuses exactly like ``scopefs read`` (exit 3, ``outside-view``, the
  same words for a denied, foreign or missing note), and audits without
  content.
* ``.history/<path>/r<N>.md`` reads an earlier revision, verified against
  its hash: a tampered artifact gives ``EIO`` (and an audited error), also
  after its pages were cached.
* A note the view cannot read has no history: its history name gives
  ``ENOENT`` exactly like a missing one, and no listing names it.
* A forgotten revision, a revision held by its lineage and one past its
  validity are never listed nor read, and a descriptor held on one stops
  reading; a tombstoned note's history leaves the mount; the copy of a
  replaced (revoked) projection never shows.
* Nothing under ``.history`` can be written (``EROFS`` on a host mount,
  refused by the modes in a sandbox), and ``.history`` is never listed.
* Inside ``scopefs run``, ``/memory/.history`` works the same.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyfuse3
import pytest

from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Op
from scopefs.vfs import listings
from scopefs.vfs.fs import ScopeFS
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_note
from tests.conftest import (
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    SCOPEFS,
    Scenario,
    db_copy,
    diff_snapshots,
    snapshot,
    sqlite_str,
)
from tests.inprocesskit import KernelFile, Tool, as_alice, listed_in_pieces, no_kernel, run_alice_mount
from tests.inprocesskit import errno_of as inprocess_errno
from tests.mountkit import Mounts, catalog, errno_of, mounts, wait_until  # noqa: F401
from tests.test_vfs_integrity import _refused_within

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 60.0
ALLERGY = "private/notes/allergy.md"
SECOND = b"Second revision: allergic to hazelnuts and pistachios (canary A2c3)\n"
THIRD = b"Third revision: allergic to hazelnuts only, confirmed (canary A3c3)\n"
SHARED = "agent-shared/team/plan.md"
SKIP_TABLES = ("audit", "exposures")  # reads are recorded there (in batches), nothing else


# -- helpers ------------------------------------------------------------------------


def history(scenario: Scenario, session: str, path: str) -> list[dict[str, Any]]:
    out = scenario.cli.j("history", session, path)
    assert out["path"] == path
    revisions: list[dict[str, Any]] = out["revisions"]
    return revisions


def three_revisions(scenario: Scenario) -> list[dict[str, Any]]:
    """Alice's allergy note with revisions 1 (the scenario's), 2 and 3 (current); their history entries."""
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=THIRD)
    found = history(scenario, scenario.alice_session, ALLERGY)
    assert [r["revision"] for r in found] == [1, 2, 3]
    return found


def artifact_of(home: Path, revision_id: str) -> Path:
    """Where one revision's artifact lives on disk (tests only)."""
    with catalog(home) as conn:
        rows = conn.execute(
            "SELECT sr.path_key, v.locator FROM revisions v JOIN resources r ON r.resource_id = v.resource_id"
            " JOIN stores s ON s.store_id = r.store_id JOIN storage_roots sr ON sr.storage_root_id = s.storage_root_id"
            " WHERE v.revision_id = ?", (revision_id,)).fetchall()
    assert len(rows) == 1, rows
    return home / "agents" / "main" / "memory-scopes" / "v1" / sqlite_str(rows[0][0]) / sqlite_str(rows[0][1])


def audit_rows(scenario: Scenario, session: str) -> list[tuple[Any, ...]]:
    with db_copy(scenario.cli.home / "state.sqlite") as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT operation, decision, reason, revision_id, actor_id FROM audit WHERE session_id = ?"
            " ORDER BY audit_id", (session,))]


def pread_result(fd: int) -> bytes | int:
    try:
        return os.pread(fd, 4096, 0)
    except OSError as exc:
        return exc.errno or 0


def forget_revision(home: Path, revision_id: str, session_id: str) -> None:
    """What ``forget`` records for one revision (schema V7), written directly."""
    with catalog(home) as conn:
        conn.execute("INSERT INTO forgets (forget_id, agent_id, session_id, actor_id, notes, claims, created_at)"
                     " VALUES ('f_test', 'main', ?, NULL, 1, 0, ?)", (session_id, now_us()))
        conn.execute("INSERT INTO forgotten_revisions (revision_id, agent_id, forget_id, forgotten_at)"
                     " VALUES (?, 'main', 'f_test', ?)", (revision_id, now_us()))


def refusal(scenario: Scenario, *args: str) -> tuple[int, str, str]:
    """(exit code, stderr, --json stdout) of a refused command."""
    plain = scenario.cli(*args)
    as_json = scenario.cli("--json", *args)
    assert plain.code == as_json.code
    return plain.code, plain.err, as_json.text


def sandboxed(scenario: Scenario, session: str, script: str) -> str:
    result = scenario.cli("run", session, "--", "sh", "-c", script, timeout=RUN_TIMEOUT_S)
    assert result.code == 0, f"the sandbox exited {result.code}: {result.err} {result.out!r}"
    return result.text


# -- the command line -------------------------------------------------------------


def test_history_lists_revisions_with_time_actor_and_origin(scenario: Scenario) -> None:
    found = three_revisions(scenario)
    contents = [ALICE_FACT, SECOND, THIRD]
    with catalog(scenario.cli.home) as conn:
        origins = {row[0]: row[1] for row in conn.execute("SELECT revision_id, trust_origin FROM revisions").fetchall()}
    assert [r["state"] for r in found] == ["superseded", "superseded", "active"]
    for entry, content in zip(found, contents, strict=True):
        assert entry["actor_id"] == scenario.alice and "session_id" not in entry
        assert entry["origin"] == origins[entry["revision_id"]] == "verified-user"
        assert entry["bytes"] == len(content) and entry["sha256"] == hashlib.sha256(content).hexdigest()
        assert entry["activated_at_us"] >= entry["created_at_us"] > 0
    assert found[0]["activated_at_us"] < found[1]["activated_at_us"] < found[2]["activated_at_us"]
    text = scenario.cli("history", scenario.alice_session, ALLERGY, check=True).text
    lines = text.splitlines()
    assert [line.split()[:2] for line in lines] == [["r1", "superseded"], ["r2", "superseded"], ["r3", "active"]]
    assert all(f"actor {scenario.alice}" in line and "origin verified-user" in line for line in lines)
    # A group note: its actor and origin are the group's, and the history is the group's to see.
    scenario.cli.j("write", scenario.group_session, "channel/offsite.md", stdin=b"Moved to Porto (canary C5an)\n")
    group = history(scenario, scenario.group_session, "channel/offsite.md")
    assert [r["revision"] for r in group] == [1, 2]
    assert {r["origin"] for r in group} == {origins.get(group[0]["revision_id"])}
    everything = text + json.dumps(group) + json.dumps(found)
    for raw in (ALICE_SENDER, "hazelnut", "Porto"):  # ids, times and hashes only: no raw sender, no content
        assert raw not in everything
    # Audited like a read of the note, without content: one allow naming its current revision.
    rows = [r for r in audit_rows(scenario, scenario.alice_session) if r[0] == "history"]
    assert rows and all(r[1:4] == ("allow", "allowed", found[2]["revision_id"]) for r in rows)


def test_history_refuses_exactly_like_read(scenario: Scenario) -> None:
    bob_only = "private/bob/peanut-diary.md"
    scenario.cli.j("write", scenario.bob_session, bob_only, stdin=b"Bob's diary (canary B0b9)\n")
    missing = refusal(scenario, "read", scenario.alice_session, "private/notes/nosuch.md")
    assert missing[0] == 3 and "outside-view" in missing[2]
    for path in (bob_only, "channel/offsite.md", "private/notes/nosuch.md", "nosuchroot/x.md"):
        assert refusal(scenario, "history", scenario.alice_session, path) == missing, path
        assert refusal(scenario, "read", scenario.alice_session, path) == missing, path
    for bad in ("/private/notes/allergy.md", "private/../x.md", ""):
        assert refusal(scenario, "history", scenario.alice_session, bad)[0] == 2
    # A tombstoned note has no history either.
    delete_note(Home.open(scenario.cli.home), scenario.alice_session, ALLERGY)
    assert refusal(scenario, "history", scenario.alice_session, ALLERGY) == missing
    assert scenario.cli("history", scenario.bob_session, ALLERGY, check=True).text.startswith("r1  active")


# -- through a mount ----------------------------------------------------------------------


def test_an_earlier_revision_reads_through_the_mount_hash_checked(scenario: Scenario, mounts: Mounts) -> None:
    found = three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    folder = view / ".history" / ALLERGY
    assert sorted(os.listdir(folder)) == ["r1.md", "r2.md", "r3.md"]
    assert (folder / "r1.md").read_bytes() == ALICE_FACT
    assert (folder / "r3.md").read_bytes() == THIRD == (view / ALLERGY).read_bytes()
    assert os.stat(folder / "r2.md").st_size == len(SECOND)
    assert os.stat(folder / "r1.md").st_mtime_ns == found[0]["activated_at_us"] * 1000
    # r2 tampered before it was ever read here... (same size, other bytes)
    second = artifact_of(scenario.cli.home, found[1]["revision_id"])
    os.chmod(second, 0o600)
    second.write_bytes(SECOND.replace(b"pistachios", b"walnuts!!!!"[:10]))
    # ...is refused as a note would be; r1, read and cached a moment ago, is tampered now:
    first = artifact_of(scenario.cli.home, found[0]["revision_id"])
    os.chmod(first, 0o600)
    first.write_bytes(ALICE_FACT.replace(b"hazelnuts", b"pecannuts"))

    assert errno_of(lambda: (folder / "r2.md").read_bytes()) == errno.EIO
    _refused_within(folder / "r1.md", ALICE_FACT, timeout=10.0)
    assert (view / ALLERGY).read_bytes() == THIRD  # the note itself is untouched
    mounts.umount(view)  # the read audit is written in batches: all of it by now
    rows = audit_rows(scenario, scenario.alice_session)
    assert ("read", "error", "revision-stale", found[1]["revision_id"], scenario.alice) in rows
    assert ("read", "error", "revision-stale", found[0]["revision_id"], scenario.alice) in rows
    assert ("read", "allow", "allowed", found[0]["revision_id"], scenario.alice) in rows  # before the tamper
    assert b"pecan" not in repr(rows).encode() and b"hazelnut" not in repr(rows).encode()


def test_a_note_outside_the_view_has_no_history(scenario: Scenario, mounts: Mounts) -> None:
    """A note in a shared root, denied to Bob: the group sees its history, Bob sees no trace of it."""
    scenario.cli.j("grant", "publisher", "--agent", "main", "--principal", scenario.alice, "--scope", "agent-shared")
    first = scenario.cli.j("publish", scenario.alice_session, ALLERGY, "--to", "agent-shared",
                           "--as", "team/plan.md", "--yes")
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
    second = scenario.cli.j("publish", scenario.alice_session, ALLERGY, "--to", "agent-shared",
                            "--as", "team/plan.md", "--yes")
    assert first["resource_id"] == second["resource_id"] and second["revision"] == 2
    add_entry(Home.open(scenario.cli.home).catalog("main"), "main", target_kind="resource",
              target_id=first["resource_id"], effect=Effect.DENY, capability=Op.READ,
              audience_kind=AudienceKind.PRINCIPAL, audience_id=scenario.bob)
    group_history = history(scenario, scenario.group_session, SHARED)
    assert [(r["revision"], r["origin"], r["actor_id"]) for r in group_history] == [
        (1, "publish", scenario.alice), (2, "publish", scenario.alice)]
    missing = refusal(scenario, "history", scenario.bob_session, "agent-shared/team/nosuch.md")
    assert missing[0] == 3
    assert refusal(scenario, "history", scenario.bob_session, SHARED) == missing
    assert refusal(scenario, "read", scenario.bob_session, SHARED) == missing

    group = mounts.mount(scenario.group_session)
    assert (group / ".history" / SHARED / "r1.md").read_bytes() == ALICE_FACT
    assert (group / ".history" / SHARED / "r2.md").read_bytes() == SECOND
    assert os.listdir(group / ".history" / "agent-shared") == ["team"]

    bob = mounts.mount(scenario.bob_session)
    history_root = bob / ".history"
    assert os.listdir(history_root / "agent-shared") == []
    looks: tuple[Callable[[Path], object], ...] = (os.stat, os.listdir, lambda p: open(p, "rb").close())
    for hidden, absent in ((SHARED, "agent-shared/team/nosuch.md"),
                           (f"{SHARED}/r1.md", "agent-shared/nosuch/r1.md"),
                           ("agent-shared/team", "agent-shared/nosuch"),
                           ("channel/offsite.md", "channel/nosuch.md")):
        for call in looks:
            assert errno_of(functools.partial(call, history_root / hidden)) == errno.ENOENT, hidden
            assert errno_of(functools.partial(call, history_root / absent)) == errno.ENOENT, absent
    # Bob's own note at Alice's path is his, with his revision only.
    assert os.listdir(history_root / ALLERGY) == ["r1.md"]
    assert (history_root / ALLERGY / "r1.md").read_bytes() == BOB_FACT
    seen = subprocess.run(["find", str(history_root)], capture_output=True, check=True).stdout
    assert b"team" not in seen and b"plan" not in seen and b"channel/" not in seen


def test_a_forgotten_revision_is_never_listed(scenario: Scenario, mounts: Mounts) -> None:
    found = three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    folder = view / ".history" / ALLERGY
    assert sorted(os.listdir(folder)) == ["r1.md", "r2.md", "r3.md"]
    assert (folder / "r2.md").read_bytes() == SECOND
    forget_revision(scenario.cli.home, found[1]["revision_id"], scenario.alice_session)
    assert [r["revision"] for r in history(scenario, scenario.alice_session, ALLERGY)] == [1, 3]
    # No change-log entry says so: every lookup asks the catalog again, and a changed list drops the listing.
    assert sorted(os.listdir(folder)) == ["r1.md", "r3.md"]
    assert errno_of(lambda: os.stat(folder / "r2.md")) == errno.ENOENT
    assert errno_of(lambda: (folder / "r2.md").read_bytes()) == errno.ENOENT
    # A mount started after the forget never shows it at all.
    later = mounts.mount(scenario.alice_session)
    assert sorted(os.listdir(later / ".history" / ALLERGY)) == ["r1.md", "r3.md"]


def test_a_lineage_held_revision_is_not_listed_and_stops_a_held_reader(scenario: Scenario, mounts: Mounts) -> None:
    found = three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    second = view / ".history" / ALLERGY / "r2.md"
    fd = os.open(second, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == SECOND
        with catalog(scenario.cli.home) as conn:  # held because an ancestor was retired (the trigger logs it)
            conn.execute("INSERT INTO lineage_holds (revision_id, cause_revision_id, agent_id, cause, held_at)"
                         " VALUES (?, ?, 'main', 'tombstone', ?)",
                         (found[1]["revision_id"], found[0]["revision_id"], now_us()))
        wait_until(lambda: pread_result(fd) == errno.EACCES)  # its cached pages went with the change log
    finally:
        os.close(fd)
    assert [r["revision"] for r in history(scenario, scenario.alice_session, ALLERGY)] == [1, 3]
    assert sorted(os.listdir(view / ".history" / ALLERGY)) == ["r1.md", "r3.md"]
    assert errno_of(lambda: os.stat(second)) == errno.ENOENT
    assert (view / ".history" / ALLERGY / "r1.md").read_bytes() == ALICE_FACT


def test_a_revision_past_its_validity_goes_when_it_runs_out(scenario: Scenario, mounts: Mounts) -> None:
    found = three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    folder = view / ".history" / ALLERGY
    assert sorted(os.listdir(folder)) == ["r1.md", "r2.md", "r3.md"]
    soon = now_us() + 3_000_000
    with catalog(scenario.cli.home) as conn:
        conn.execute("INSERT INTO revision_validity (revision_id, agent_id, valid_until) VALUES (?, 'main', ?)",
                     (found[0]["revision_id"], now_us() - 1))
        conn.execute("INSERT INTO revision_validity (revision_id, agent_id, valid_until) VALUES (?, 'main', ?)",
                     (found[1]["revision_id"], soon))
    assert sorted(os.listdir(folder)) == ["r2.md", "r3.md"]  # r1 is past its validity already
    fd = os.open(folder / "r2.md", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == SECOND
        wait_until(lambda: pread_result(fd) == errno.EACCES)  # at its time, cached pages and all
        assert now_us() >= soon
    finally:
        os.close(fd)
    assert sorted(os.listdir(folder)) == ["r3.md"]
    assert [r["revision"] for r in history(scenario, scenario.alice_session, ALLERGY)] == [3]


def test_a_tombstoned_notes_history_leaves_the_mount(scenario: Scenario, mounts: Mounts) -> None:
    three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    notes = view / ".history" / "private" / "notes"
    assert os.listdir(notes) == ["allergy.md"]
    fd = os.open(notes / "allergy.md" / "r1.md", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == ALICE_FACT
        delete_note(Home.open(scenario.cli.home), scenario.alice_session, ALLERGY)
        wait_until(lambda: pread_result(fd) == errno.EACCES)
    finally:
        os.close(fd)
    assert errno_of(lambda: os.stat(notes / "allergy.md")) == errno.ENOENT
    assert errno_of(lambda: os.stat(notes / "allergy.md" / "r2.md")) == errno.ENOENT
    assert os.listdir(view / ".history" / "private") == []  # its folder went with its only note
    # A note written again at the path is a new note: its own history starts over.
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=b"new note (canary N3w1)\n")
    wait_until(lambda: os.path.exists(notes / "allergy.md" / "r1.md"))
    assert os.listdir(notes / "allergy.md") == ["r1.md"]
    assert (notes / "allergy.md" / "r1.md").read_bytes() == b"new note (canary N3w1)\n"


def test_a_new_revision_shows_up_and_a_replaced_projection_never_does(scenario: Scenario, mounts: Mounts) -> None:
    group = mounts.mount(scenario.group_session)
    conversation = f"conversation:{scenario.conversation}"
    first = scenario.cli.j("project", scenario.alice_session, ALLERGY, "--to", conversation,
                           "--purpose", "so the group knows", "--expires", "7d", "--yes")
    target = first["preview"]["target_path"]
    wait_until(lambda: os.path.exists(group / ".history" / target / "r1.md"))
    assert os.listdir(group / ".history" / target) == ["r1.md"]
    # The owner projects again (the source moved on): the first copy's projection is revoked with it,
    # so its revision must not come back through the history.
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
    second = scenario.cli.j("project", scenario.alice_session, ALLERGY, "--to", conversation,
                            "--purpose", "so the group knows", "--expires", "7d", "--yes")
    assert second["replaced_projection_id"] == first["projection_id"]
    wait_until(lambda: (group / target).read_bytes() == SECOND)
    assert [r["revision"] for r in history(scenario, scenario.group_session, target)] == [2]
    assert os.listdir(group / ".history" / target) == ["r2.md"]
    assert errno_of(lambda: (group / ".history" / target / "r1.md").read_bytes()) == errno.ENOENT
    # A new revision of an ordinary note shows at once, in a listing already made.
    channel = group / ".history" / "channel" / "offsite.md"
    assert os.listdir(channel) == ["r1.md"]
    scenario.cli.j("write", scenario.group_session, "channel/offsite.md", stdin=b"Moved to Porto\n")
    wait_until(lambda: sorted(os.listdir(channel)) == ["r1.md", "r2.md"])
    assert (channel / "r2.md").read_bytes() == b"Moved to Porto\n"


def test_nothing_under_history_can_be_written(scenario: Scenario, mounts: Mounts) -> None:
    three_revisions(scenario)
    view = mounts.mount(scenario.alice_session)
    folder = view / ".history" / ALLERGY
    revision = folder / "r1.md"
    assert revision.read_bytes() == ALICE_FACT and (view / ALLERGY).read_bytes() == THIRD
    before = snapshot(scenario.cli.home, skip_tables=SKIP_TABLES)

    def write_one(flags: int) -> None:  # no open reaches the mount (vfs.fs): the write is what is refused
        fd = os.open(revision, flags)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)

    attempts = {
        "open for writing": lambda: write_one(os.O_WRONLY),
        "create over": lambda: os.close(os.open(revision, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)),
        "append": lambda: write_one(os.O_WRONLY | os.O_APPEND),
        "create new": lambda: os.close(os.open(folder / "r9.md", os.O_WRONLY | os.O_CREAT)),
        "mkdir": lambda: os.mkdir(folder / "d"),
        "mkdir in .history": lambda: os.mkdir(view / ".history" / "d"),
        "unlink": lambda: os.unlink(revision),
        "rmdir note folder": lambda: os.rmdir(folder),
        "rmdir .history": lambda: os.rmdir(view / ".history"),
        "rename into": lambda: os.rename(view / ALLERGY, folder / "r9.md"),
        "rename out": lambda: os.rename(revision, view / "private" / "notes" / "old.md"),
        "rename within": lambda: os.rename(revision, folder / "r9.md"),
        "truncate": lambda: os.truncate(revision, 0),
        "utime": lambda: os.utime(revision),
        "chmod folder": lambda: os.chmod(folder, 0o777),
    }
    refused = {name: errno.errorcode.get(errno_of(call), "ok") for name, call in attempts.items()}
    assert refused == dict.fromkeys(attempts, "EROFS")
    assert revision.read_bytes() == ALICE_FACT and (view / ALLERGY).read_bytes() == THIRD
    # Never listed; and inside a root ``.history`` is an ordinary (scratch) name, untouched by the tree.
    assert ".history" not in os.listdir(view)
    scratch = view / "private" / ".history"
    scratch.write_bytes(b"an editor's scratch file\n")
    assert scratch.read_bytes() == b"an editor's scratch file\n"
    assert ".history" not in os.listdir(view / ".history" / "private")
    scratch.unlink()
    assert diff_snapshots(before, snapshot(scenario.cli.home, skip_tables=SKIP_TABLES)) == []


def test_inside_scopefs_run(scenario: Scenario) -> None:
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
    out = sandboxed(scenario, scenario.alice_session,
                    "ls -a /memory; echo --list--; ls /memory/.history/private/notes/allergy.md;"
                    " echo --r1--; cat /memory/.history/private/notes/allergy.md/r1.md;"
                    " echo --write--; (echo x > /memory/.history/private/notes/allergy.md/r1.md) 2>&1;"
                    " echo rc=$?; cat /memory/.history/private/notes/allergy.md/r1.md;"
                    " echo --mode--; stat -c '%A' /memory/.history /memory/.history/private/notes/allergy.md/r1.md")
    listing, _, rest = out.partition("--list--\n")
    assert ".history" not in listing
    revisions, _, rest = rest.partition("--r1--\n")
    assert revisions.split() == ["r1.md", "r2.md"]
    first, _, rest = rest.partition("--write--\n")
    assert first.encode() == ALICE_FACT
    written, _, modes = rest.partition("--mode--\n")
    assert "rc=0" not in written and ("Permission denied" in written or "Read-only file system" in written)
    assert written.encode().endswith(ALICE_FACT)  # unchanged
    assert modes.split() == ["dr-x------", "-r--------"]
    # Bob's sandbox: Alice's first revision is nowhere, his own note's is.
    bob = sandboxed(scenario, scenario.bob_session,
                    "cat /memory/.history/private/notes/allergy.md/*; grep -r hazelnut /memory/.history; true")
    assert bob.encode() == BOB_FACT


def test_a_revoked_view_has_no_history(scenario: Scenario, mounts: Mounts) -> None:
    scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
    view = mounts.mount(scenario.alice_session)
    fd = os.open(view / ".history" / ALLERGY / "r1.md", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == ALICE_FACT
        scenario.cli.j("binding", "revoke", scenario.alice_binding)
        wait_until(lambda: errno_of(lambda: os.stat(view / ".history")) == errno.ENOENT)
        assert pread_result(fd) == errno.EACCES
    finally:
        os.close(fd)
    assert refusal(scenario, "history", scenario.alice_session, ALLERGY)[0] == 3


def test_a_revision_landing_during_a_run_shows_in_its_history(scenario: Scenario) -> None:
    """A sandbox reads revision 1, a new revision is written from outside, and the same sandbox then
    finds and reads revision 2 under ``/memory/.history`` (the mount followed the change log)."""
    script = ("cat /memory/.history/private/notes/allergy.md/r1.md; echo --next--; read line;"
              " i=0; while ! test -e /memory/.history/private/notes/allergy.md/r2.md && test $i -lt 200;"
              " do sleep 0.05; i=$((i+1)); done; cat /memory/.history/private/notes/allergy.md/r2.md; echo done")
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    launcher = subprocess.Popen([SCOPEFS, "run", scenario.alice_session, "--", "sh", "-c", script],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout is not None and launcher.stdin is not None
        first = b""
        started = time.monotonic()
        while not first.endswith(b"--next--\n"):
            line = launcher.stdout.readline()
            assert line and time.monotonic() - started < RUN_TIMEOUT_S, f"the sandbox ended early: {first!r}"
            first += line
        assert first == ALICE_FACT + b"--next--\n"
        scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=SECOND)
        launcher.stdin.write(b"go\n")
        launcher.stdin.close()
        rest = launcher.stdout.read()
        assert launcher.wait(timeout=RUN_TIMEOUT_S) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert rest == SECOND + b"done\n"


async def _second_held(fs: ScopeFS, tool: Tool) -> tuple[KernelFile, int]:
    """Revision 2 of the allergy note opened and read (its pages cached), and its history folder's inode."""
    await fs.sync()
    second = await KernelFile.open(fs, await tool.ino(f".history/{ALLERGY}/r2.md"))
    assert await second.read() == SECOND
    return second, await tool.ino(f".history/{ALLERGY}")


def _drops_seen(monkeypatch: pytest.MonkeyPatch, seen: list[Any], mark: Callable[[int], Any]) -> None:
    """The kernel's page drops, as the worker sends them, noted in ``seen`` as ``mark(ino)``."""
    def invalidate_inode(ino: int, attr_only: bool = False) -> None:
        if not attr_only:
            seen.append(mark(ino))
    monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate_inode)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_revision_s_pages_go_before_a_lookup_says_it_is_gone(scenario: Scenario,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision is forgotten while a process holds it open with its pages cached: no change-log entry
    says so, the next lookup finds it. That lookup answers ENOENT only once the kernel's pages of the
    revision are gone, so the process never reads them after it saw the name go; its ``READ`` is refused."""
    found = three_revisions(scenario)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        second, folder = await _second_held(fs, tool)
        dropped: list[int] = []
        _drops_seen(monkeypatch, dropped, lambda ino: ino)
        forget_revision(scenario.cli.home, found[1]["revision_id"], scenario.alice_session)
        assert await inprocess_errno(fs.lookup(folder, b"r2.md")) == errno.ENOENT
        assert second.ino in dropped  # sent, not queued: no worker runs in this process
        assert await inprocess_errno(second.read()) == errno.EACCES
        dropped.clear()
        assert await inprocess_errno(fs.lookup(folder, b"r2.md")) == errno.ENOENT
        assert dropped == []  # once is enough
        assert await KernelFile(fs, await tool.ino(f".history/{ALLERGY}/r3.md")).read() == THIRD
        tool.check("the forgotten revision's lookup")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_revision_that_comes_back_and_goes_again_has_its_pages_dropped_again(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision goes (past its validity), comes back (the validity row taken out, as no command does)
    and is read again through the descriptor a process kept, which caches its pages again; when it goes
    again, the lookup that says so drops them again first."""
    second_id = three_revisions(scenario)[1]["revision_id"]

    def run_out(gone: bool) -> None:
        with catalog(scenario.cli.home) as conn:
            if gone:
                conn.execute("INSERT INTO revision_validity (revision_id, agent_id, valid_until) VALUES (?, 'main', ?)",
                             (second_id, now_us() - 1))
            else:
                conn.execute("DELETE FROM revision_validity WHERE revision_id = ?", (second_id,))

    async def script(fs: ScopeFS, tool: Tool) -> None:
        second, folder = await _second_held(fs, tool)
        dropped: list[int] = []
        _drops_seen(monkeypatch, dropped, lambda ino: ino)
        for turn in ("goes", "goes again"):
            run_out(True)
            assert await inprocess_errno(fs.lookup(folder, b"r2.md")) == errno.ENOENT, turn
            assert second.ino in dropped, turn
            assert await inprocess_errno(second.read()) == errno.EACCES, turn
            run_out(False)
            await fs.lookup(folder, b"r3.md")  # reads the revisions again: r2 is back, but not looked up
            assert await second.read() == SECOND  # the kept descriptor reads, and caches, again
            dropped.clear()
        tool.check("the revision that came and went")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_listing_without_a_revision_comes_after_its_pages_are_dropped(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision a process holds open runs out; the next listing of its note's folder leaves it out, and
    the kernel's pages of it are gone before that listing is answered."""
    second_id = three_revisions(scenario)[1]["revision_id"]

    async def script(fs: ScopeFS, tool: Tool) -> None:
        second, folder = await _second_held(fs, tool)
        events: list[str] = []
        _drops_seen(monkeypatch, events, lambda ino: "dropped" if ino == second.ino else f"dropped {ino}")

        def readdir_reply(token: object, name: bytes, attr: object, next_id: int) -> bool:
            events.append(name.decode())
            return True
        monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)
        with catalog(scenario.cli.home) as conn:
            conn.execute("INSERT INTO revision_validity (revision_id, agent_id, valid_until) VALUES (?, 'main', ?)",
                         (second_id, now_us() - 1))
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert events == ["dropped", "r1.md", "r3.md"]
        assert await inprocess_errno(second.read()) == errno.EACCES
        tool.check("the listing")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_listing_read_in_pieces_continues_from_the_revisions_it_started_with(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ls`` reads a folder in pieces, each a READDIR from where the last one stopped. A revision written
    between two pieces comes in the next listing, not in this one's continuation, which goes on from the
    names it started with: no name twice, none skipped."""
    three_revisions(scenario)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.ino(f".history/{ALLERGY}")
        listed, room = listed_in_pieces(monkeypatch)
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["r1.md"]
        assert listings.place(listed[-1][1]) == 1  # a note's folder goes on by revision number
        scenario.cli.j("write", scenario.alice_session, ALLERGY, stdin=b"a fourth revision, written meanwhile\n")
        room[0] = 10
        await fs.readdir(0, listed[-1][1], None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["r1.md", "r2.md", "r3.md"]
        listed.clear()
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["r1.md", "r2.md", "r3.md", "r4.md"]
        tool.check("the listing in pieces")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
@pytest.mark.parametrize("gone", [0, 1])
def test_the_rest_of_a_listing_goes_on_after_the_last_revision_it_answered(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, gone: int) -> None:
    """A lookup finds a revision gone (forgotten) between two pieces of a listing: it drops the revision's
    pages and the listing, whose rest is read afresh. That rest goes on after the last revision answered,
    by its number: the revision that went is not named again, and none that stayed is skipped, whether
    the one that went was answered already (r1) or not yet (r2)."""
    found = three_revisions(scenario)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.ino(f".history/{ALLERGY}")
        listed, room = listed_in_pieces(monkeypatch)
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["r1.md"]
        forget_revision(scenario.cli.home, found[gone]["revision_id"], scenario.alice_session)
        assert await inprocess_errno(fs.lookup(folder, f"r{gone + 1}.md".encode())) == errno.ENOENT
        room[0] = 10
        await fs.readdir(0, listed[-1][1], None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == (["r1.md", "r3.md"] if gone else ["r1.md", "r2.md", "r3.md"])
        tool.check("the rest of the listing")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_the_rest_of_a_folder_s_listing_skips_no_note_when_the_view_moves_on(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing of a folder of ``.history`` read in pieces: the view moves on between two pieces (a
    note that was answered already is deleted). The rest goes on from the names the listing began with,
    each looked up in the view now: no note that stays is skipped, and the one that went is not named."""
    for name in ("b.md", "c.md"):
        as_alice(scenario, write_note, f"private/notes/{name}", b"one more note\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.ino(".history/private/notes")
        listed, room = listed_in_pieces(monkeypatch)
        room[0] = 2
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["allergy.md", "b.md"]
        as_alice(scenario, delete_note, "private/notes/allergy.md")
        await fs.sync()
        room[0] = 10
        await fs.readdir(0, listed[-1][1], None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["allergy.md", "b.md", "c.md"]
        listed.clear()
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["b.md", "c.md"]
        tool.check("the rest of the folder's listing")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
@pytest.mark.parametrize("goes", ["forgotten", "held by its lineage"])
def test_a_backup_of_an_earlier_revision_stops_serving_it_once_it_may_not_be_shown(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, goes: str) -> None:
    """Emacs renames a note to ``note~`` before its save and keeps the backup: a scratch file frozen to
    what was then the note's revision, an earlier one after the save. Once that revision may no
    longer be shown (forgotten, held by its lineage), the backup must stop serving it, as its
    ``.history`` file does: the old code answered only whether the note was still in the view, so
    the backup served the forgotten bytes for as long as the mount lived. A hold (the change log
    says so) also drops the backup's cached pages."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        assert await tool.read(ALLERGY) == ALICE_FACT
        first = fs.mount.layers.note_of(fs.mount.node(await tool.ino(ALLERGY)))
        assert first is not None
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        await tool.create("private/notes", "allergy.md", SECOND)  # the save: the note's next revision
        backup = fs.mount.node(await tool.ino("private/notes/allergy.md~"))
        assert backup.frozen is not None and backup.frozen.revision_id == first.revision_id
        assert await tool.read("private/notes/allergy.md~") == ALICE_FACT  # still shown, served
        dropped: list[int] = []
        _drops_seen(monkeypatch, dropped, lambda ino: ino)
        if goes == "forgotten":
            forget_revision(scenario.cli.home, first.revision_id, scenario.alice_session)
        else:
            with catalog(scenario.cli.home) as conn:
                conn.execute("INSERT INTO lineage_holds (revision_id, cause_revision_id, agent_id, cause, held_at)"
                             " VALUES (?, ?, 'main', 'tombstone', ?)", (first.revision_id, first.revision_id, now_us()))
            await fs.mount.sync()
            await fs.mount.kernel.drop_pages_now([backup], for_refresh=True)  # as the worker sends what is queued
            assert backup.ino in dropped
        assert await inprocess_errno(KernelFile(fs, backup.ino).read()) == errno.EACCES
        assert backup.verified is None  # its pages are on their way out
        assert await tool.read(ALLERGY) == SECOND  # the note itself is untouched
        tool.check(f"the backup of a revision {goes}")

    run_alice_mount(scenario, script)
