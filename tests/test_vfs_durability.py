"""Writes through a mount are committed when the call that promises it returns.

After ``close`` or ``fsync`` reports success, a SIGKILL of the mount server
(no shutdown, no flush, no audit batch) loses nothing: every promised byte
is in the catalog's active revision, nothing is left pending, and
``scopefs doctor`` finds nothing to repair but the audit rows of closes,
which wait in the outbox until the next mount drains them (DESIGN.md §6,
vfs/server.py). A close syncs nothing to disk (the revision is listed as
unsynced); an ``fsync`` does, and leaves none of its note's revisions
unsynced. The power-loss half is ``test_powerloss.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import (  # noqa: F401
    Mounts,
    catalog,
    is_mounted,
    live_notes,
    mounts,
    pending_rows,
    unsynced_paths,
    wait_until,
)


def _process_gone(pid: int) -> bool:
    """Dead: reaped, or a zombie whose parent has not reaped it yet."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _fsync_path(path: Path) -> None:
    """``fsync`` of a file or folder through a descriptor of its own (a tool that syncs what another wrote)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_and_close(path: Path, chunks: list[bytes]) -> bytes:
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            f.flush()  # several write(2) calls, one revision at close
    return b"".join(chunks)


def test_close_and_fsync_survive_sigkill_of_the_server(scenario: Scenario, mounts: Mounts, tmp_path: Path) -> None:
    home = scenario.cli.home
    where = tmp_path / "mnt" / "durable"
    where.mkdir(parents=True)
    info = scenario.cli.j("mount", scenario.alice_session, str(where))
    mounts.active.append(where)  # the fixture unmounts it whatever happens
    pid = int(info["pid"])
    assert not _process_gone(pid)
    private = where / "private"

    promised: dict[str, bytes] = {}  # virtual path -> bytes a successful close/fsync promised
    either: dict[str, tuple[bytes, bytes]] = {}  # fsynced, then written again but never synced
    held: list[int] = []
    try:
        # fsync (and fdatasync) on descriptors that stay open until the kill.
        fd = os.open(private / "notes" / "synced.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        held.append(fd)
        os.write(fd, b"synced but never closed\n")
        os.fsync(fd)
        promised["private/notes/synced.md"] = b"synced but never closed\n"

        fd = os.open(private / "notes" / "datasynced.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        held.append(fd)
        os.write(fd, b"fdatasync promises the data too\n")
        os.fdatasync(fd)
        promised["private/notes/datasynced.md"] = b"fdatasync promises the data too\n"

        promised["private/notes/n0.md"] = _write_and_close(private / "notes" / "n0.md", [b"note 0\n"])
        fd = os.open(private / "notes" / "n0.md", os.O_WRONLY | os.O_TRUNC)
        held.append(fd)
        os.write(fd, b"rewritten and synced\n")
        os.fsync(fd)
        os.write(fd, b"written after the sync\n")  # not promised: may or may not survive
        either["private/notes/n0.md"] = (b"rewritten and synced\n",
                                         b"rewritten and synced\nwritten after the sync\n")
        del promised["private/notes/n0.md"]

        # Closed: new notes, a new folder, a new revision of an existing note;
        # the last close is followed by the kill at once.
        big = bytes(range(256)) * (2 * 4096)  # 2 MiB, above the inline threshold
        promised["private/notes/big.bin.md"] = _write_and_close(private / "notes" / "big.bin.md", [big])
        for i in range(1, 4):
            promised[f"private/notes/n{i}.md"] = _write_and_close(
                private / "notes" / f"n{i}.md", [f"note {i} line {k}\n".encode() for k in range(1 + i)])
        (private / "journal").mkdir()
        promised["private/journal/day-1.md"] = _write_and_close(private / "journal" / "day-1.md",
                                                                [b"Day one: ", b"kept a journal.\n"])
        promised["private/notes/allergy.md"] = _write_and_close(
            private / "notes" / "allergy.md", [ALICE_FACT, b"Also: mild reaction to almonds.\n"])

        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _process_gone(pid), timeout=10.0)
    finally:
        for fd in held:
            with contextlib.suppress(OSError):  # the connection is gone: ENOTCONN
                os.close(fd)

    scenario.cli("umount", str(where), check=True)  # clears the dead server's mount
    assert not is_mounted(where)

    for path, content in promised.items():
        result = scenario.cli("read", scenario.alice_session, path)
        assert result.code == 0, (path, result.code, result.err)
        assert result.out == content, path
    for path, (synced, later) in either.items():
        result = scenario.cli("read", scenario.alice_session, path)
        assert result.code == 0, (path, result.code, result.err)
        assert result.out in (synced, later), (path, result.out[:80])

    assert pending_rows(home) == 0
    closed = {p.removeprefix("private/") for p in promised} - {"notes/synced.md", "notes/datasynced.md"}
    assert unsynced_paths(home) == closed  # n0.md: fsynced, and nothing committed after the sync
    doctor = scenario.cli("--json", "doctor")
    assert doctor.code in (0, 1), (doctor.code, doctor.err, doctor.text)
    assert {f["kind"] for f in doctor.json()["findings"]} <= {"undrained-audit"}, doctor.text
    expected = {p.removeprefix("private/") for p in (*promised, *either)} | {"notes/allergy.md"}
    assert set(live_notes(home, scenario.alice)) == expected  # nothing else became a note

    # A new mount of the same session serves every promised byte.
    again = mounts.mount(scenario.alice_session)
    for path, content in promised.items():
        assert (again / path).read_bytes() == content, path
    for path, options in either.items():
        assert (again / path).read_bytes() in options, path
    doctor = scenario.cli("--json", "doctor")  # the new mount drained the outbox before it served
    assert (doctor.code, doctor.json()["findings"]) == (0, []), doctor.text


def test_an_unmount_makes_every_close_durable(scenario: Scenario, mounts: Mounts) -> None:
    """Closes commit without a sync; fsync syncs its note; the unmount's write-back syncs the rest."""
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    (view / "private" / "notes" / "a.md").write_bytes(b"closed\n")
    (view / "private" / "notes" / "b.md").write_bytes(b"closed, then synced\n")
    assert unsynced_paths(home) == {"notes/a.md", "notes/b.md"}
    _fsync_path(view / "private" / "notes" / "b.md")  # nothing to commit: what the close committed is made durable
    assert unsynced_paths(home) == {"notes/a.md"}
    mounts.umount(view)  # returns once the server has shut down
    assert unsynced_paths(home) == set()
    assert scenario.cli("read", scenario.alice_session, "private/notes/a.md").out == b"closed\n"


def test_touch_then_an_fsync_of_its_folder_is_durable(scenario: Scenario, mounts: Mounts) -> None:
    """``touch f`` and ``: > g`` leave empty notes whose close commits nothing (no RELEASE comes once
    OPEN answered ENOSYS: the settle commits them a second later). An fsync of their folder right after
    must make them durable: the old code answered before they were committed, and the settle's commits
    then landed unsynced."""
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    folder = view / "private" / "notes"
    assert (view / "private" / "notes" / "allergy.md").read_bytes() == ALICE_FACT  # an OPEN: ENOSYS from here
    (folder / "touched.md").touch()
    (folder / "emptied.md").open("wb").close()
    _fsync_path(folder)
    made = {"notes/touched.md", "notes/emptied.md"}
    with catalog(home) as conn:  # committed before the fsync answered, not by the settle after it
        committed = {str(row[0]) for row in conn.execute("SELECT path FROM resources").fetchall()}
    assert made <= committed
    assert not made & unsynced_paths(home)


def test_touch_then_an_fsync_of_the_file_itself_is_durable(scenario: Scenario, mounts: Mounts) -> None:
    """The file's own fsync, through a new descriptor, after ``touch f`` or ``: > g`` on a note that held
    bytes: the empty revision is committed and synced before it answers (the real path, where no RELEASE
    comes: the writer of the create or the truncation is still registered, and the fsync commits it)."""
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    folder = view / "private" / "notes"
    assert (folder / "allergy.md").read_bytes() == ALICE_FACT  # an OPEN: ENOSYS from here
    (folder / "touched.md").touch()
    (folder / "allergy.md").open("wb").close()  # emptied: its next revision is empty
    for name in ("touched.md", "allergy.md"):
        _fsync_path(folder / name)
    with catalog(home) as conn:  # committed before the fsyncs answered, not by the settle after them
        active = {(str(path), size) for path, size in conn.execute(  # (Bob has a notes/allergy.md of his own)
            "SELECT r.path, v.size FROM revisions v JOIN resources r USING (resource_id) WHERE v.state = 'active'")}
    assert {("notes/touched.md", 0), ("notes/allergy.md", 0)} <= active, active
    assert not {"notes/touched.md", "notes/allergy.md"} & unsynced_paths(home)
    for name in ("touched.md", "allergy.md"):
        read = scenario.cli("read", scenario.alice_session, f"private/notes/{name}")
        assert (read.code, read.out) == (0, b"")
