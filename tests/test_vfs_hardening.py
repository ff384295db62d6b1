"""What an adversarial review of the mount found, each pinned so it cannot come back.

In-process (``inprocesskit``) where the order of two sessions' steps must
be exact; through a real mount where the kernel's answer is the point:

* a held ``.search`` results file follows the resources it quotes, not the
  paths the view happened to show when it was searched;
* once the view is revoked, ``write``, ``fsync`` and ``close`` of a note
  open for writing fail: success is never reported for bytes that were
  not committed;
* a name the writer would refuse (too deep, too long as a virtual path) is
  refused where it is made, with ENAMETOOLONG, never at the close that
  would lose its data;
* a note whose index rows a search retired (its artifact was tampered
  with) becomes searchable again at the first read that verifies the
  restored artifact, and ``doctor`` says so meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from scopefs.catalog.paths import MAX_DEPTH, MAX_PATH_BYTES
from scopefs.vfs import writers
from scopefs.vfs.fs import ScopeFS
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, SCOPEFS, Scenario, artifact_path
from tests.inprocesskit import KernelFile, Tool, as_alice, errno_of, no_kernel, run_alice_mount
from tests.mountkit import Mounts, catalog, mounts, wait_until

__all__ = ["mounts", "no_kernel"]  # fixtures, named as parameters below


# -- .search results follow resource ids -------------------------------------

@pytest.mark.usefixtures("no_kernel")
def test_held_search_results_stop_quoting_a_note_written_elsewhere_then_deleted(scenario: Scenario) -> None:
    """The note is committed through another session after this mount's last sync, searched here,
    held open, then tombstoned: the held results must stop serving its snippet."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        as_alice(scenario, write_note, "private/notes/zebra.md", b"zebras are striped (canary Z3br)\n")
        results = await tool.ino(".search/zebras")  # no sync in between: the view does not show it yet
        held = await KernelFile.open(fs, results)
        assert b"Z3br" in await held.read()  # the control: it is quoted
        as_alice(scenario, delete_note, "private/notes/zebra.md")
        await fs.sync()
        assert await errno_of(held.read()) == errno.EACCES

    run_alice_mount(scenario, script)


# -- writes while the view goes ------------------------------------------------

@pytest.mark.usefixtures("no_kernel")
def test_a_write_handle_fails_once_the_binding_is_revoked(scenario: Scenario) -> None:
    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino("private/notes/allergy.md")
        held = await KernelFile.open(fs, ino, os.O_RDWR)
        assert await held.write(0, b"written before") == len(b"written before")
        scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
        await fs.sync()
        assert not fs.mount.view.usable
        assert await errno_of(held.write(0, b"written after")) == errno.EACCES
        assert await errno_of(fs.fsync(0, False, ino)) == errno.EACCES
        assert await errno_of(held.flush()) == errno.EACCES  # close(2) reports the loss

    run_alice_mount(scenario, script)
    with catalog(scenario.cli.home) as conn:
        revisions = conn.execute("SELECT count(*) FROM revisions v JOIN resources r USING (resource_id)"
                                 " WHERE r.path = 'notes/allergy.md' AND r.store_id IN (SELECT store_id FROM stores"
                                 " WHERE audience_id = ?)", (scenario.alice,)).fetchone()
    assert revisions == (1,)  # nothing was committed after the revocation


@pytest.mark.usefixtures("no_kernel")
def test_a_write_handle_fails_once_another_session_removed_its_note(scenario: Scenario) -> None:
    """Not this mount's own unlink (whose writes go with the note, as on any filesystem): the
    note left the view under an open handle, so its writes can no longer be saved anywhere."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino("private/notes/allergy.md")
        held = await KernelFile.open(fs, ino, os.O_RDWR)
        assert await held.write(0, b"written before") == len(b"written before")
        as_alice(scenario, delete_note, "private/notes/allergy.md")
        await fs.sync()
        assert fs.mount.view.usable  # the control: the view itself is fine
        assert await errno_of(held.write(0, b"written after")) == errno.EACCES
        assert await errno_of(fs.fsync(0, False, ino)) == errno.EACCES
        assert await errno_of(held.flush()) == errno.EACCES

    run_alice_mount(scenario, script)


def test_writes_left_alone_when_the_binding_is_revoked_fail_at_their_close_on_a_real_mount(
        scenario: Scenario, mounts: Mounts) -> None:
    """Writes with no close for ``WRITER_IDLE_S`` are committed by the settle; revoked by then, that
    commit is refused. The old code dropped them, and the close that came later answered 0 for bytes
    that were gone (fsx under revocation found it). Now the writer is kept for that close, which
    reports the refusal, and a read through another descriptor is refused meanwhile."""
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / "notes" / "allergy.md"
    # Started before the file is opened: a process forked while it is open closes the copies of its
    # descriptors at exec, and each close is a FLUSH that commits what was written so far.
    revoker = subprocess.Popen(["sh", "-c", 'read go && exec "$0" binding revoke "$1"', SCOPEFS,
                                scenario.alice_binding], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)})
    assert revoker.stdin is not None
    writer = os.open(note, os.O_RDWR)
    reader = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(reader, 4096, 0) == ALICE_FACT
        revoker.stdin.write(b"go\n")
        revoker.stdin.close()
        appended = 0

        def revoked() -> bool:  # written until a write is refused: the writes before it were not committed
            nonlocal appended
            try:
                appended += os.pwrite(writer, b"+", len(ALICE_FACT) + appended)
            except PermissionError:
                return True
            time.sleep(0.2)  # written often enough that the settle never finds the writer idle
            return False

        assert wait_until(revoked, timeout=60)
        assert revoker.wait(timeout=60) == 0 and appended > 0
        time.sleep(3 * writers.WRITER_IDLE_S)  # the settle's commit is refused meanwhile
        with pytest.raises(PermissionError):
            os.pread(reader, 4096, 0)
        # The next close of the inode hears what became of the writes (any close: the kernel does not
        # say which descriptor wrote), here the writer's; the reader's after it has nothing to hear.
        closing, writer = writer, -1
        with pytest.raises(PermissionError):
            os.close(closing)
    finally:
        for fd in (writer, reader):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if revoker.poll() is None:
            revoker.kill()
            revoker.wait()
    assert scenario.cli("read", scenario.alice_session, "private/notes/allergy.md", check=False).code != 0
    with catalog(scenario.cli.home) as conn:
        revisions = conn.execute("SELECT count(*) FROM revisions v JOIN resources r USING (resource_id)"
                                 " WHERE r.path = 'notes/allergy.md' AND r.store_id IN (SELECT store_id FROM stores"
                                 " WHERE audience_id = ?)", (scenario.alice,)).fetchone()
    assert revisions == (1,)


# -- names the writer would refuse ------------------------------------------------

def _deep(levels: int) -> list[str]:
    return [f"d{i}" for i in range(levels)]


def test_names_the_writer_would_refuse_are_refused_where_they_are_made(scenario: Scenario,
                                                                         mounts: Mounts) -> None:
    where = mounts.mount(scenario.alice_session)
    base = where / "private"
    # Depth: private/ + 30 folders + a note is 32 levels; one folder more leaves no room for a note.
    folder = base.joinpath(*_deep(MAX_DEPTH - 2))
    folder.mkdir(parents=True)
    (folder / "deep.md").write_bytes(b"at the deepest level\n")  # the control: 32 levels are fine
    assert scenario.cli("read", scenario.alice_session, str((folder / "deep.md").relative_to(where))).out \
        == b"at the deepest level\n"
    with pytest.raises(OSError) as made:
        (folder / "one-more").mkdir()
    assert made.value.errno == errno.ENAMETOOLONG
    # Bytes: components under 255 bytes each, the virtual path over 4,096 (reached by descriptors,
    # since the host's own path to it would be over PATH_MAX).
    names = [("n" * 250) + f"{i:02d}" for i in range(16)]
    used = len("private") + sum(len(name) + 1 for name in names)
    fits, too_long = "f" * (MAX_PATH_BYTES - used - 1), "f" * (MAX_PATH_BYTES - used)
    near = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=near)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=near)
            os.close(near)
            near = inner
        fd = os.open(fits, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=near)
        os.write(fd, b"exactly at the limit\n")
        os.close(fd)  # the control: committed
        for attempt in (lambda: os.open(too_long, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=near),
                        lambda: os.mkdir("g" * len(fits), dir_fd=near),  # no room left for a note in it
                        lambda: os.rename(fits, too_long, src_dir_fd=near, dst_dir_fd=near)):
            with pytest.raises(OSError) as refused:
                attempt()
            assert refused.value.errno == errno.ENAMETOOLONG
        assert too_long not in os.listdir(near)
        fd = os.open(fits, os.O_RDONLY, dir_fd=near)
        assert os.read(fd, 100) == b"exactly at the limit\n"
        os.close(fd)
    finally:
        os.close(near)


# -- search rows come back with a verified read -------------------------------------

def _tamper_and_search(scenario: Scenario) -> tuple[Path, bytes]:
    cli = scenario.cli
    assert [h["path"] for h in cli.j("search", scenario.alice_session, "hazelnuts")["results"]] \
        == ["private/notes/allergy.md"]
    artifact = artifact_path(cli.home, scenario.alice, "notes/allergy.md")
    original = artifact.read_bytes()
    os.chmod(artifact, 0o600)
    artifact.write_bytes(original.replace(b"A1c3", b"X9x9"))  # same size, another hash
    assert cli.j("search", scenario.alice_session, "hazelnuts")["results"] == []  # retired, audited
    artifact.write_bytes(original)
    assert cli.j("search", scenario.alice_session, "hazelnuts")["results"] == []  # still retired
    report = cli("--json", "doctor")
    assert report.code == 1 and [f["kind"] for f in report.json()["findings"]] == ["unindexed-revisions"]
    assert "doctor --fix" in cli("doctor").text  # it says what brings them back
    return artifact, original


def test_a_restored_note_is_searchable_again_after_the_cli_reads_it(scenario: Scenario) -> None:
    _tamper_and_search(scenario)
    assert scenario.cli("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT
    assert [h["path"] for h in scenario.cli.j("search", scenario.alice_session, "hazelnuts")["results"]] \
        == ["private/notes/allergy.md"]
    assert scenario.cli.j("doctor")["findings"] == []


def test_a_restored_note_is_searchable_again_after_a_mount_reads_it(scenario: Scenario, mounts: Mounts) -> None:
    _tamper_and_search(scenario)
    where = mounts.mount(scenario.alice_session)
    assert (where / "private" / "notes" / "allergy.md").read_bytes() == ALICE_FACT
    wait_until(lambda: scenario.cli.j("search", scenario.alice_session, "hazelnuts")["results"])
    assert scenario.cli.j("doctor")["findings"] == []
