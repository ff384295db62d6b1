"""Names looked up in vain: the kernel keeps their absence, and loses it when the view comes to show them.

A lookup of a name the view lacks is answered with a negative entry the
kernel keeps for ``CACHE_TIMEOUT_S`` (30 s): ``rg`` looks for ignore files
in every folder, editors for swap files, and each such lookup would
otherwise reach the mount. So every test here first makes the kernel keep
the absence (a ``stat`` that fails), then makes the name appear from
outside the mount and waits at most ``BOUND_S``, far below 30 s: a name
seen within that bound can only have come from an invalidation
(``vfs.layers.Layers.remember_absent``).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from scopefs.vfs import absences
from scopefs.vfs.absences import NO_INODE
from scopefs.vfs.layers import Invalidation
from tests.conftest import Scenario
from tests.inprocesskit import layers_of
from tests.mountkit import (  # noqa: F401
    Mounts,
    errno_of,
    mounts,
    patched_server,
    second_group_session,
    view_servers,
    wait_until,
)

BOUND_S = 10.0
REPOSITORY = Path(__file__).resolve().parent.parent

# Run in a process of its own while the server is stopped: a descriptor of the stopped mount in the
# test's process would be closed by every fork of it, and each close waits for the server.
STAT_ALL = """
import os, sys
for path in sys.argv[1:]:
    try:
        os.stat(path)
        print("found", flush=True)
    except OSError as exc:
        print(exc.errno, flush=True)
"""


def _line_within(stream: IO[str], seconds: float) -> str | None:
    """The next line ``stream`` gives within ``seconds``, or None."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline().strip() if ready else None


def _absent(path: Path) -> bool:
    return errno_of(lambda: os.stat(path)) == errno.ENOENT


def test_the_kernel_answers_a_name_looked_up_in_vain_without_asking(scenario: Scenario, mounts: Mounts) -> None:
    """With the server stopped, a name looked up in vain a moment ago is still absent at once (a name never
    looked up waits for the server): the absence came from the kernel's cache."""
    view = mounts.mount(scenario.alice_session)
    notes = view / "private" / "notes"
    asked, unasked = notes / ".ignore", notes / ".rgignore"
    assert _absent(asked)
    assert os.path.isdir(notes)  # the folder's own entry is cached too
    (server,) = view_servers(view)
    os.kill(server, signal.SIGSTOP)
    try:
        probe = subprocess.Popen([sys.executable, "-c", STAT_ALL, str(asked), str(unasked)], cwd=REPOSITORY,
                                 stdout=subprocess.PIPE, text=True)
        assert probe.stdout is not None
        first = _line_within(probe.stdout, 5.0)
        second = _line_within(probe.stdout, 0.5) if first is not None else None
    finally:
        os.kill(server, signal.SIGCONT)
    out, _ = probe.communicate(timeout=30)
    assert first == str(errno.ENOENT), "the name looked up in vain waited for the stopped server"
    assert second is None, "a name never looked up was answered without the server"
    assert out.strip() == str(errno.ENOENT)


def test_a_note_another_session_writes_where_a_lookup_found_none_appears(scenario: Scenario,
                                                                        mounts: Mounts) -> None:
    """A new note at a name looked up in vain, and one in a new folder looked up in vain: both appear
    (the folder's absence goes too, although only a note below it was written)."""
    watcher = mounts.mount(scenario.group_session, "watcher")
    writer = mounts.mount(second_group_session(scenario), "writer")
    agenda = watcher / "channel" / "agenda.md"
    plan = watcher / "channel" / "plans" / "q3.md"
    assert _absent(agenda) and _absent(plan.parent) and _absent(plan)
    (writer / "channel" / "agenda.md").write_bytes(b"Agenda\n")
    scenario.cli.j("write", scenario.group_session, "channel/plans/q3.md", stdin=b"Q3 plan\n")
    wait_until(lambda: not _absent(agenda), timeout=BOUND_S)
    wait_until(lambda: not _absent(plan), timeout=BOUND_S)
    assert agenda.read_bytes() == b"Agenda\n"
    assert plan.read_bytes() == b"Q3 plan\n"


def test_a_root_the_view_gains_appears_where_a_lookup_found_none(scenario: Scenario, mounts: Mounts) -> None:
    """A role membership gives the view a new root: a name looked up in vain at the top appears."""
    view = mounts.mount(scenario.alice_session)
    assert _absent(view / "roles")
    role_id = scenario.cli.j("role", "add", "ops")["role_id"]
    scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "7d")
    wait_until(lambda: os.path.isdir(view / "roles" / "ops"), timeout=BOUND_S)


def test_a_name_hidden_by_an_unlink_is_not_kept_absent(scenario: Scenario, mounts: Mounts) -> None:
    """A note unlinked here is hidden for a grace period before its tombstone; if the tombstone is not
    committed (another session put another note there meanwhile), the name shows again with no lookup
    the kernel kept: the other session's note is what it finds."""
    view = mounts.mount(scenario.group_session)
    note = view / "channel" / "offsite.md"
    assert note.read_bytes()
    os.unlink(note)
    assert _absent(note)  # hidden, and not kept absent
    scenario.cli.j("rm", second_group_session(scenario), "channel/offsite.md")
    scenario.cli.j("write", scenario.group_session, "channel/offsite.md", stdin=b"another note\n")
    wait_until(lambda: not _absent(note), timeout=BOUND_S)
    assert note.read_bytes() == b"another note\n"


# -- the record of absences, on its own (``vfs.layers``) -----------------------------

def _names_dropped(out: list[Invalidation]) -> set[tuple[int | None, str | None]]:
    return {(item.parent_ino, item.name) for item in out if item.ino == NO_INODE}


def test_only_an_absence_handed_out_and_then_shown_is_dropped(scenario: Scenario) -> None:
    """The view coming to show a name kept absent drops that entry once; a name this mount made
    itself (the kernel replaced the absent entry) and a name never kept absent drop nothing."""
    with layers_of(scenario) as (layers, refresh):
        folder = layers.lookup(("private", "notes"))
        assert folder is not None
        assert layers.remember_absent(folder, "kept.md") and layers.remember_absent(folder, "made.md")
        layers.absences.named_here(folder.ino, "made.md")
        for name in ("kept.md", "made.md", "never.md"):
            scenario.cli.j("write", scenario.alice_session, f"private/notes/{name}", stdin=b"x\n")
        assert _names_dropped(refresh()) == {(folder.ino, "kept.md")}
        assert layers.absences.count == 0


def test_a_name_hidden_by_a_pending_removal_is_not_kept_absent(scenario: Scenario) -> None:
    with layers_of(scenario) as (layers, _):
        folder = layers.lookup(("private", "notes"))
        note = layers.lookup(("private", "notes", "allergy.md"))
        assert folder is not None and note is not None and note.resource_id is not None
        layers.schedule_removal(("private", "notes", "allergy.md"), note.resource_id)
        assert layers.lookup(("private", "notes", "allergy.md")) is None
        assert not layers.remember_absent(folder, "allergy.md")
        assert layers.absences.count == 0


def test_a_full_record_keeps_no_more_until_its_oldest_entries_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full: a new name is answered uncached, a name already kept is renewed; two timeouts later the
    old entries go (the kernel has asked again since), once, and new names are kept again."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])  # the clock absences reads
    monkeypatch.setattr(absences, "ABSENT_NAMES_MAX", 3)
    record = absences.Absences()
    assert all(record.remember(7, name) for name in ("a", "b", "c"))
    assert not record.remember(7, "d") and record.count == 3
    now[0] += 2 * absences.ABSENT_KEPT_S - 1
    assert record.remember(7, "c")  # renewed, not added
    assert not record.remember(7, "d")  # swept: nothing old enough yet
    now[0] += 2
    assert not record.remember(9, "e")  # a, b are old enough, but the last sweep freed nothing a moment ago
    now[0] += absences.ABSENT_KEPT_S
    assert record.remember(9, "e") and record.count == 2  # a and b expired; c renewed, e new
    assert {(item.folder_ino, item.name) for item in record.everything()} == {(7, "c"), (9, "e")}
    assert record.count == 0


def test_a_root_the_view_gains_drops_every_absence(scenario: Scenario) -> None:
    with layers_of(scenario) as (layers, refresh):
        root, folder = layers.lookup(()), layers.lookup(("private", "notes"))
        assert root is not None and folder is not None
        assert layers.remember_absent(root, "roles") and layers.remember_absent(folder, "x.md")
        role_id = scenario.cli.j("role", "add", "ops")["role_id"]
        scenario.cli.j("member", "add", role_id, scenario.alice, "--expires", "7d")
        assert _names_dropped(refresh()) == {(root.ino, "roles"), (folder.ino, "x.md")}


def test_a_name_a_refused_rename_was_to_take_appears_when_the_view_shows_it(scenario: Scenario,
                                                                           mounts: Mounts) -> None:
    """A rename takes its new name out of the record before it commits (its own view change must not drop
    the entry it gives); refused (a folder that holds notes: ``EXDEV``), the kernel's absent entry is
    dropped at once, so the name appears when another session writes there."""
    scenario.cli.j("write", scenario.group_session, "channel/plans/q3.md", stdin=b"Q3 plan\n")
    view = mounts.mount(scenario.group_session)
    target = view / "channel" / "moved"
    assert _absent(target)
    assert errno_of(lambda: os.rename(view / "channel" / "plans", target)) == errno.EXDEV
    assert _absent(target)
    scenario.cli.j("write", second_group_session(scenario), "channel/moved/q4.md", stdin=b"Q4 plan\n")
    wait_until(lambda: not _absent(target / "q4.md"), timeout=BOUND_S)
    assert (target / "q4.md").read_bytes() == b"Q4 plan\n"


# -- a create that reaches the mount for a name the view has come to show ----------------------

# The moment between the view showing a new name and the worker dropping the kernel's absent entry
# for it, stretched for one name: that entry is never dropped (``late.md``; every other name is).
LATE = """
from scopefs.vfs import layers
kept = layers.Layers._absences_dropped
layers.Layers._absences_dropped = lambda self, appeared, **kw: [
    item for item in kept(self, appeared, **kw) if item.name != "late.md"]
"""


def test_a_create_the_kernel_sends_for_a_name_the_view_now_shows_opens_that_note(
        scenario: Scenario, tmp_path: Path) -> None:
    """``echo x > late.md`` where the kernel still keeps late.md absent and another session made it.

    The kernel sends CREATE without a lookup for a name it keeps absent,
    counts the file as created (no mode check, no truncation) and keeps
    the handle the reply gives. The mount opens the note that is there
    (handle 0: writes and the close come by inode), truncating it itself:
    the same note gets the new revision, and the file reads back whole.
    """
    where = tmp_path / "mnt"
    where.mkdir()
    with patched_server(scenario.cli.home, scenario.alice_session, where, LATE):
        folder = where / "private" / "notes"
        assert _absent(folder / "late.md")  # the kernel keeps it absent from now on
        scenario.cli.j("write", scenario.alice_session, "private/notes/late.md",
                       stdin=b"written by another session, longer than mine\n")
        scenario.cli.j("write", scenario.alice_session, "private/notes/after.md", stdin=b"x\n")
        wait_until(lambda: (folder / "after.md").exists())  # the view shows late.md too by now
        assert _absent(folder / "late.md")  # still, for the kernel (a listing would replace its entry)
        fd = os.open(folder / "late.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            assert os.write(fd, b"mine\n") == 5
        finally:
            os.close(fd)
        assert (folder / "late.md").read_bytes() == b"mine\n"
        assert os.stat(folder / "late.md").st_size == 5
        assert scenario.cli("read", scenario.alice_session, "private/notes/late.md", check=True).out == b"mine\n"
        history = scenario.cli.j("history", scenario.alice_session, "private/notes/late.md")
        assert len(history["revisions"]) == 2  # theirs, then mine: one note
        assert errno_of(lambda: os.open(folder / "late.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL)) == errno.EEXIST
