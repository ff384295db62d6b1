"""Copies a mount holds of a note never outlive the note's place in the view.

An editor's backup (a note renamed to ``note.md~``) and a draft loaded for
a read-write open hold the note's bytes inside the mount. After the note
is tombstoned or the session revoked, neither may be read, nor committed
under another name; and a save the policy refuses is refused to the
caller's close() and never read back from the kernel's cache.
"""

from __future__ import annotations

import errno
import os
import subprocess

from scopefs.catalog.home import Home
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Op
from scopefs.writer.tombstone import delete_note
from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import Mounts, errno_of, live_notes, mounts, wait_until  # noqa: F401

NOTE = "notes/allergy.md"



def _write_into(path: os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDWR)  # the mount is not asked (no open): the write is refused
    try:
        os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)


def test_a_backup_copy_dies_with_its_note(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    folder = view / "private" / "notes"
    (folder / "other.md").write_bytes(b"keeps the folder\n")  # so the folder outlives the note
    os.rename(folder / "allergy.md", folder / "allergy.md~")  # vim's backup before a save
    (folder / "allergy.md").write_bytes(b"rewritten\n")
    assert (folder / "allergy.md~").read_bytes() == ALICE_FACT  # the mount's own backup, still allowed
    delete_note(Home.open(home), scenario.alice_session, f"private/{NOTE}")
    wait_until(lambda: errno_of(lambda: (folder / "allergy.md~").read_bytes()) == errno.EACCES)
    assert errno_of(lambda: _write_into(folder / "allergy.md~")) == errno.EACCES
    assert errno_of(lambda: os.rename(folder / "allergy.md~", folder / "restored.md")) == errno.EACCES
    assert "notes/restored.md" not in live_notes(home, scenario.alice)


def test_a_held_read_write_handle_stops_at_revocation(scenario: Scenario, mounts: Mounts) -> None:
    view = mounts.mount(scenario.alice_session)
    fd = os.open(view / "private" / NOTE, os.O_RDWR)
    try:
        assert os.pread(fd, 4096, 0) == ALICE_FACT
        scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
        wait_until(lambda: errno_of(lambda: os.pread(fd, 4096, 0)) in (errno.EACCES, errno.EIO))
    finally:
        os.close(fd)


def test_a_refused_save_fails_at_close_and_is_never_read_back(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    owner = Home.open(home)
    catalog = owner.catalog(scenario.agent)
    resource_id = live_notes(home, scenario.alice)[NOTE].resource_id
    add_entry(catalog, scenario.agent, target_kind="resource", target_id=resource_id, effect=Effect.DENY,
              capability=Op.REPLACE, audience_kind=AudienceKind.ANY)
    owner.close()
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / NOTE
    assert note.read_bytes() == ALICE_FACT  # pages cached before the refused saves
    # The shell's redirections close through dup2, which cannot report an
    # error: their refusal shows as nothing changed (checked below).
    for command in (f": > {note}", f"echo new > {note}"):
        subprocess.run(["bash", "-c", command], capture_output=True, timeout=30)
    done = subprocess.run(["truncate", "-s", "0", str(note)], capture_output=True, timeout=30)
    assert done.returncode != 0, "truncate's close must report the refusal"
    def python_save() -> None:
        with open(note, "wb") as out:
            out.write(b"XY")
    assert errno_of(python_save) in (errno.EACCES, errno.ENOENT)  # a deny on a write reads as outside-view

    def read_as_committed() -> bool:
        try:
            return note.read_bytes() == ALICE_FACT
        except PermissionError:  # refused until the kernel has dropped the refused writes' size and pages
            return False

    wait_until(read_as_committed)
    assert os.stat(note).st_size == len(ALICE_FACT)
    assert scenario.cli("read", scenario.alice_session, f"private/{NOTE}").out == ALICE_FACT
    assert live_notes(home, scenario.alice)[NOTE].revisions == 1
