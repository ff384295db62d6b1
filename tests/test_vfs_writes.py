"""Writable roots through the mount: every change is one writer transaction.

Create, write, truncate, rename (also over an existing note and across
roots), unlink, mkdir, rmdir, fsync, utimens and chmod on a writable root,
each checked against the catalog: the resource it lands on, its revision
count, and that nothing else changed.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import Mounts, errno_of, live_notes, mounts, pending_rows, wait_until  # noqa: F401

NOTE = "notes/allergy.md"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def test_truncate_by_path_is_one_revision(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    before = live_notes(home, scenario.alice)[NOTE]
    os.truncate(view / "private" / NOTE, 10)
    after = live_notes(home, scenario.alice)[NOTE]
    assert after.resource_id == before.resource_id
    assert after.revisions == before.revisions + 1
    assert after.active_sha256 == _sha(ALICE_FACT[:10])
    assert (view / "private" / NOTE).read_bytes() == ALICE_FACT[:10]


def test_chmod_and_utimens_are_accepted_and_change_nothing(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / NOTE
    before = live_notes(home, scenario.alice)
    os.chmod(note, 0o644)
    os.utime(note, (1_000_000, 1_000_000))
    os.utime(note)
    assert live_notes(home, scenario.alice) == before
    assert note.read_bytes() == ALICE_FACT


def test_mkdir_then_a_note_in_it_then_rmdir(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    folder = view / "private" / "plans"
    folder.mkdir()
    assert (view / "private" / "plans").is_dir()
    assert "plans/" not in {p + "/" for p in live_notes(home, scenario.alice)}  # folders are implicit
    (folder / "trip.md").write_bytes(b"go north\n")
    assert live_notes(home, scenario.alice)["plans/trip.md"].revisions == 1
    assert errno_of(lambda: os.rmdir(folder)) == errno.ENOTEMPTY
    os.unlink(folder / "trip.md")
    _fsync_dir(folder)  # removals settle now, not after the grace period
    assert "plans/trip.md" not in live_notes(home, scenario.alice)
    os.rmdir(folder)
    assert not folder.exists()
    empty = view / "private" / "empty"
    empty.mkdir()
    os.rmdir(empty)
    assert errno_of(lambda: os.stat(empty)) == errno.ENOENT
    assert errno_of(lambda: os.rmdir(view / "private")) in (errno.EROFS, errno.ENOTEMPTY, errno.EBUSY)


def test_cp_r_then_rm_r_of_a_tree_of_notes(scenario: Scenario, mounts: Mounts, tmp_path: Path) -> None:
    """``rm -r`` right after ``cp -r``: every note and folder goes, none waits out its grace period
    in the parent's listing (an emptied folder once came back there, and its parent's rmdir failed)."""
    home = scenario.cli.home
    source = tmp_path / "tree"
    for folder in range(3):
        (source / f"d{folder}").mkdir(parents=True)
        for note in range(4):
            (source / f"d{folder}" / f"n{note}.md").write_bytes(f"note {folder}.{note}\n".encode())
    view = mounts.mount(scenario.alice_session)
    subprocess.run(["cp", "-r", str(source), str(view / "private" / "copy")], check=True)
    copied = {p for p in live_notes(home, scenario.alice) if p.startswith("copy/")}
    assert len(copied) == 12
    done = subprocess.run(["rm", "-r", str(view / "private" / "copy")], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert not (view / "private" / "copy").exists()
    assert "copy" not in os.listdir(view / "private")
    assert {p for p in live_notes(home, scenario.alice) if p.startswith("copy/")} == set()


def test_unlink_is_a_tombstone_after_the_grace_period(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    os.unlink(view / "private" / NOTE)
    assert errno_of(lambda: os.stat(view / "private" / NOTE)) == errno.ENOENT  # hidden at once
    wait_until(lambda: NOTE not in live_notes(home, scenario.alice))
    assert scenario.cli("read", scenario.alice_session, f"private/{NOTE}").code == 3


def test_rename_within_a_root_moves_the_resource(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    before = live_notes(home, scenario.alice)[NOTE]
    os.rename(view / "private" / NOTE, view / "private" / "health.md")
    after = live_notes(home, scenario.alice)
    assert NOTE not in after
    assert after["health.md"].resource_id == before.resource_id
    assert after["health.md"].revisions == before.revisions
    assert (view / "private" / "health.md").read_bytes() == ALICE_FACT


def test_rename_over_an_existing_note_replaces_it(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    (view / "private" / "other.md").write_bytes(b"other\n")
    moved = live_notes(home, scenario.alice)["other.md"]
    os.rename(view / "private" / "other.md", view / "private" / NOTE)
    after = live_notes(home, scenario.alice)
    assert "other.md" not in after
    assert after[NOTE].resource_id == moved.resource_id  # POSIX: the moved file replaces the target
    assert (view / "private" / NOTE).read_bytes() == b"other\n"
    assert pending_rows(home) == 0


def test_rename_across_roots_is_a_cross_device_link(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    before = live_notes(home, scenario.alice)
    got = errno_of(lambda: os.rename(view / "private" / NOTE, view / "postbox" / "allergy.md"))
    assert got in (errno.EXDEV, errno.EROFS)
    got = errno_of(lambda: os.rename(view / "private" / NOTE, view / "agent-shared" / "allergy.md"))
    assert got in (errno.EXDEV, errno.EROFS)
    assert live_notes(home, scenario.alice) == before


def test_fsync_without_close_commits(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    fd = os.open(view / "private" / "journal.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"day one\n")
        os.fsync(fd)
        assert live_notes(home, scenario.alice)["journal.md"].active_sha256 == _sha(b"day one\n")
        os.write(fd, b"day two\n")
        os.fsync(fd)
        assert live_notes(home, scenario.alice)["journal.md"].revisions == 2
    finally:
        os.close(fd)
    assert live_notes(home, scenario.alice)["journal.md"].revisions == 2  # an unchanged close adds none


@pytest.mark.parametrize("name", ["new.md", "x.txt"])
def test_a_new_note_written_in_one_go_is_one_revision(scenario: Scenario, mounts: Mounts, name: str) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.group_session)
    (view / "channel" / name).write_bytes(b"hello\n")
    notes = live_notes(home, scenario.conversation)
    assert notes[name].revisions == 1
    assert notes[name].active_sha256 == _sha(b"hello\n")


@pytest.mark.parametrize("how", ["unlink", "rename-away"])
def test_a_folder_emptied_here_stays_under_the_shell_in_it(scenario: Scenario, mounts: Mounts, how: str) -> None:
    """Removing or moving away a folder's last note (committed: the folder fsync'd) leaves the
    folder, as on any filesystem: a shell whose working directory it is can still make a note
    there. (Folders exist in the catalog only through their notes.)"""
    home = scenario.cli.home
    scenario.cli.j("write", scenario.alice_session, "private/solo/deep/a.md", stdin=b"alone\n")
    view = mounts.mount(scenario.alice_session)
    folder = view / "private" / "solo" / "deep"
    cwd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # the shell's working directory
    try:
        if how == "unlink":
            os.unlink("a.md", dir_fd=cwd)
        else:
            os.rename(folder / "a.md", view / "private" / "moved.md")
        os.fsync(cwd)
        wait_until(lambda: "solo/deep/a.md" not in live_notes(home, scenario.alice))
        assert os.listdir(cwd) == []
        fd = os.open("b.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=cwd)
        os.write(fd, b"again\n")
        os.close(fd)
    finally:
        os.close(cwd)
    assert live_notes(home, scenario.alice)["solo/deep/b.md"].revisions == 1
    assert sorted(os.listdir(view / "private" / "solo")) == ["deep"]
    os.unlink(folder / "b.md")
    _fsync_dir(folder)  # the removal settles now (as in the rmdir test above)
    os.rmdir(folder)  # and it can still be removed like any folder
    assert not folder.exists()
