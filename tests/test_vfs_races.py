"""A mount never saves into, moves or replaces a note it did not mean, whatever another session did meanwhile.

In-process, as ``test_vfs_invariants.py``: another session of Alice's acts
through the writer between two requests of this mount, with or without the
mount's poll in between (``fs.sync()``, what its background does every
0.1 s). The writer checks the resource the mount means inside its own
transaction (``test_writer_races.py``); these tests check that the mount
means the right one at each of its save patterns.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import threading
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio

from scopefs.catalog.errors import Denied
from scopefs.catalog.reader import read_note
from scopefs.vfs import kernel as kernel_module
from scopefs.vfs import watchdog
from scopefs.vfs.errors import ANSWERING, guarded
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.invariants import inconsistencies
from scopefs.vfs.watchdog import Outcome
from scopefs.writer.rename import rename_note
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario, artifact_path, table_dump
from tests.inprocesskit import KernelFile, Tool, as_alice, errno_of, no_kernel, run_alice_mount
from tests.test_vfs_isolation import GUIDE, publish_shared

pytestmark = pytest.mark.usefixtures(no_kernel.__name__)

NOTE = "private/notes/allergy.md"
DIR = "private/notes"


def _read(scenario: Scenario, path: str) -> bytes:
    return as_alice(scenario, read_note, path)  # type: ignore[no-any-return]


def test_a_save_after_unlink_never_lands_in_the_note_moved_onto_the_name(scenario: Scenario) -> None:
    """vim unlinks R and writes the name anew; meanwhile R moved away and S moved onto the name."""
    as_alice(scenario, write_note, f"{DIR}/other.md", b"S's own content\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        await tool.unlink(DIR, "allergy.md")
        as_alice(scenario, rename_note, NOTE, f"{DIR}/moved.md")
        as_alice(scenario, rename_note, f"{DIR}/other.md", NOTE)
        await fs.sync()
        folder = await tool.folder(DIR)
        listed = fs.mount.layers.inodes.get(folder).listing_version  # type: ignore[union-attr]
        assert await errno_of(fs.create(folder, b"allergy.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                      None)) == errno.EAGAIN  # type: ignore[arg-type]
        tool.check("the refused create")
        # S shows at the name now, which the unlink hid from listings: the kernel lists the folder again
        assert fs.mount.layers.inodes.get(folder).listing_version == listed + 1  # type: ignore[union-attr]

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == b"S's own content\n"
    assert _read(scenario, f"{DIR}/moved.md") == ALICE_FACT  # R, moved, untouched


def test_a_rename_never_replaces_a_note_it_did_not_see(scenario: Scenario) -> None:
    """``mv a.md allergy.md`` means to replace R; another session put U there; U stays, the mv fails."""
    as_alice(scenario, write_note, f"{DIR}/a.md", b"a\n")
    as_alice(scenario, write_note, f"{DIR}/u.md", b"U must survive\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        await tool.ino(NOTE)
        await tool.ino(f"{DIR}/a.md")
        as_alice(scenario, rename_note, NOTE, f"{DIR}/moved.md")
        as_alice(scenario, rename_note, f"{DIR}/u.md", NOTE)
        folder = await tool.folder(DIR)  # the mount has not polled since
        assert await errno_of(fs.rename(folder, b"a.md", folder, b"allergy.md", 0, None)) == errno.EAGAIN  # type: ignore[arg-type]
        tool.check("the refused rename")

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == b"U must survive\n"
    assert _read(scenario, f"{DIR}/a.md") == b"a\n"


def test_a_rename_onto_a_name_it_saw_empty_never_replaces_a_newcomer(scenario: Scenario) -> None:
    as_alice(scenario, write_note, f"{DIR}/a.md", b"a\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        await tool.ino(f"{DIR}/a.md")
        as_alice(scenario, write_note, f"{DIR}/b.md", b"B arrived meanwhile\n")
        folder = await tool.folder(DIR)  # b.md is not in this mount's view yet
        assert await errno_of(fs.rename(folder, b"a.md", folder, b"b.md", 0, None)) == errno.EAGAIN  # type: ignore[arg-type]

    run_alice_mount(scenario, script)
    assert _read(scenario, f"{DIR}/b.md") == b"B arrived meanwhile\n"


def test_a_close_and_a_rename_of_a_new_file_at_once_make_one_note(scenario: Scenario) -> None:
    """Whichever commits first, the file becomes one note, at the name it was renamed to."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder(DIR)
        info, _ = await fs.create(folder, b"new.md", 0o600, os.O_WRONLY | os.O_CREAT, None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, b"one file\n")
        async def rename() -> None:
            await fs.rename(folder, b"new.md", folder, b"final.md", 0, None)  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rename)
            nursery.start_soon(fs.flush, info.fh)
        await fs.release(info.fh)
        tool.check("close and rename at once")

    run_alice_mount(scenario, script)
    assert _read(scenario, f"{DIR}/final.md") == b"one file\n"
    with pytest.raises(Denied):
        _read(scenario, f"{DIR}/new.md")


def test_a_backup_renamed_back_while_open_is_its_note_again_with_no_new_revision(scenario: Scenario) -> None:
    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino(NOTE)
        held = await KernelFile.open(fs, ino, os.O_WRONLY)
        own_size = await fs.getattr(ino, None)  # an ftruncate to its own size: the writer's handle, no change
        await fs.setattr(ino, own_size, SimpleNamespace(update_size=True), 0, None)  # type: ignore[arg-type]
        await tool.rename(DIR, "allergy.md", "allergy.md~")
        await tool.rename(DIR, "allergy.md~", "allergy.md")
        assert inconsistencies(fs.mount) == []
        await held.flush()
        tool.check("close")

    catalog = scenario.cli.home / "agents" / "main" / "catalog.sqlite"
    before, revisions = _read(scenario, NOTE), len(table_dump(catalog)["revisions"])
    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == before
    assert len(table_dump(catalog)["revisions"]) == revisions  # the same bytes are not a new revision


def test_a_create_of_a_name_another_session_just_made_opens_that_note(scenario: Scenario) -> None:
    """``echo x > new.md`` while the kernel still holds new.md absent, after the view came to show it.

    The kernel sends CREATE for a name it keeps absent (``vfs.absences``)
    without asking first; in the moment between the view showing another
    session's new note and the kernel's entry being dropped, the create
    reaches the mount for a name that is there. Without ``O_EXCL`` POSIX
    opens the file that is there: the same note gets a new revision.
    """
    path = f"{DIR}/new.md"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder(DIR)
        assert (await fs.lookup(folder, b"new.md")).st_ino == 0  # absent, and so kept by the kernel
        theirs = as_alice(scenario, write_note, path, b"written elsewhere\n")
        await fs.sync()
        info, attr = await fs.create(folder, b"new.md", 0o600, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                     None)  # type: ignore[arg-type]
        tool.check("create of a name that is there")
        assert info.fh == 0 and attr.st_ino == await tool.ino(path)
        opened = KernelFile(fs, attr.st_ino)
        assert await opened.write(0, b"mine\n") == 5
        await opened.flush()
        await fs.release(info.fh)
        tool.check("close")
        node = fs.mount.layers.lookup(tuple(path.split("/")))
        assert node is not None and node.resource_id == theirs.resource_id

    run_alice_mount(scenario, script)
    assert _read(scenario, path) == b"mine\n"


def test_a_create_of_a_name_that_is_there_keeps_posix_meaning(scenario: Scenario) -> None:
    """``O_EXCL`` still refuses; without ``O_TRUNC`` the content stays; a folder is ``EISDIR``;
    a note under a read-only root is ``EROFS``, as a write to it is, and nothing changes."""
    shared = "agent-shared/docs/guide.md"
    publish_shared(scenario.cli.home, shared, GUIDE, scenario.alice_session)  # read-only for Alice

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.folder(DIR)
        ino = await tool.ino(NOTE)

        def create(where: int, name: bytes, flags: int) -> Any:
            return fs.create(where, name, 0o600, flags, None)  # type: ignore[arg-type]

        assert await errno_of(create(folder, b"allergy.md", os.O_WRONLY | os.O_CREAT | os.O_EXCL)) == errno.EEXIST
        info, attr = await create(folder, b"allergy.md", os.O_RDWR | os.O_CREAT)
        assert attr.st_ino == ino
        assert await KernelFile(fs, ino).read() == ALICE_FACT  # not truncated
        await fs.release(info.fh)
        root = await tool.folder("private")
        assert await errno_of(create(root, b"notes", os.O_WRONLY | os.O_CREAT)) == errno.EISDIR
        docs = await tool.folder("agent-shared/docs")
        assert await errno_of(create(docs, b"guide.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)) == errno.EROFS
        assert await errno_of(create(docs, b"guide.md", os.O_RDONLY | os.O_CREAT | os.O_TRUNC)) == errno.EROFS
        info, _ = await create(docs, b"guide.md", os.O_RDONLY | os.O_CREAT)  # reading it is fine
        await fs.release(info.fh)
        tool.check("the refused creates")

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == ALICE_FACT
    assert _read(scenario, shared) == GUIDE


def test_an_o_trunc_open_never_reads_what_it_throws_away(scenario: Scenario) -> None:
    """``> note`` and a create that opens a note with ``O_TRUNC`` start from nothing: the stored
    revision is neither read nor verified (a 256 MiB note is not hashed to be thrown away), so a
    note whose artifact fails verification can still be overwritten, and nothing of it is served."""
    artifact = artifact_path(scenario.cli.home, scenario.alice, "notes/allergy.md")
    artifact.write_bytes(b"tampered behind the broker's back\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        ino = await tool.ino(NOTE)
        opened = await KernelFile.open(fs, ino, os.O_WRONLY | os.O_TRUNC)
        assert await opened.write(0, b"rewritten\n") == 10
        await opened.flush()
        tool.check("close after the truncating open")
        artifact_now = artifact_path(scenario.cli.home, scenario.alice, "notes/allergy.md")
        artifact_now.write_bytes(b"tampered again\n")
        info, attr = await fs.create(await tool.folder(DIR), b"allergy.md", 0o600,
                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, None)  # type: ignore[arg-type]
        assert attr.st_ino == ino and attr.st_size == 0
        await KernelFile(fs, ino).write(0, b"and again\n")
        await KernelFile(fs, ino).flush()
        await fs.release(info.fh)
        tool.check("close after the create")

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == b"and again\n"


def test_a_backup_renamed_back_never_takes_the_name_of_a_note_moved_onto_it(scenario: Scenario) -> None:
    """vim renames R to its backup name, then back; meanwhile R moved away and S moved onto the name.
    Undoing the backup would name R where the view shows S: the rename fails instead, S stays."""
    as_alice(scenario, write_note, f"{DIR}/other.md", b"S's own content\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        await tool.rename(DIR, "allergy.md", "allergy.md~")
        as_alice(scenario, rename_note, NOTE, f"{DIR}/moved.md")
        as_alice(scenario, rename_note, f"{DIR}/other.md", NOTE)
        await fs.sync()
        folder = await tool.folder(DIR)
        assert await errno_of(fs.rename(folder, b"allergy.md~", folder, b"allergy.md", 0,
                                        None)) == errno.EAGAIN  # type: ignore[arg-type]
        tool.check("the refused rename back")
        await fs.removals.settle(everything=True)  # the unlink of R made here finds S there: nothing goes
        tool.check("the settled removal")
        shown = fs.mount.layers.lookup(tuple(NOTE.split("/")))
        assert shown is not None and shown.resource_id is not None
        assert await KernelFile(fs, shown.ino).read() == b"S's own content\n"

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTE) == b"S's own content\n"
    assert _read(scenario, f"{DIR}/moved.md") == ALICE_FACT


@pytest.mark.parametrize("how", ["deleted", "identity revoked"])
def test_a_note_that_leaves_the_view_is_refused_and_its_pages_dropped_before_its_name_goes(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Another session deletes a note this mount served, or the view goes whole: the note's pages leave
    the kernel's cache while the view still names it, and a ``READ`` that comes meanwhile is refused,
    as is one of a file this mount wrote and has not committed; only then does the name go."""
    as_alice(scenario, write_note, f"{DIR}/kept.md", b"kept\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        held = await KernelFile.open(fs, await tool.ino(NOTE))
        assert await held.read() == ALICE_FACT
        info, attr = await fs.create(await tool.folder(DIR), b"draft.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                     None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, b"not committed\n")
        draft = KernelFile(fs, attr.st_ino)
        seen: list[tuple[bool, int, int]] = []

        async def read_errnos() -> tuple[int, int]:
            return await errno_of(held.read()), await errno_of(fs.read(0, 0, 4096, draft.ino, None))

        def invalidate_inode(ino: int, attr_only: bool = False) -> None:  # on the worker, as the kernel's
            if ino == held.ino and not attr_only and not seen:
                named = fs.mount.layers.lookup(tuple(NOTE.split("/"))) is not None
                seen.append((named, *trio.from_thread.run(read_errnos)))

        assert await errno_of(fs.read(0, 0, 4096, draft.ino, None)) == 0
        monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate_inode)
        if how == "deleted":
            as_alice(scenario, delete_note, NOTE)
        else:
            scenario.cli.j("binding", "revoke", scenario.alice_binding)
        await fs.sync()
        assert seen == [(True, errno.EACCES, 0 if how == "deleted" else errno.EACCES)]
        assert fs.mount.layers.lookup(tuple(NOTE.split("/"))) is None
        assert await errno_of(held.read()) == errno.EACCES
        if how == "deleted":  # nothing else was withheld, or is now
            assert await errno_of(fs.read(0, 0, 4096, draft.ino, None)) == 0
            assert await tool.read(f"{DIR}/kept.md") == b"kept\n"
        tool.check("the note left the view")

    run_alice_mount(scenario, script)


@dataclasses.dataclass
class StuckDrop:
    """The kernel's drop of the pages of ``inos`` never ends (until ``let_go``), under a watchdog that
    gives up after ``stall_s`` of idleness: the mount's kernel counts the handlers' requests only."""

    inos: set[int] = dataclasses.field(default_factory=set)
    began: threading.Event = dataclasses.field(default_factory=threading.Event)  # a drop of one is stuck
    let_go: threading.Event = dataclasses.field(default_factory=threading.Event)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:  # on the worker, as the kernel's
        if not attr_only and ino in self.inos:
            self.began.set()
            self.let_go.wait(60)


def stuck_drop(monkeypatch: pytest.MonkeyPatch, stall_s: float) -> StuckDrop:
    monkeypatch.setattr(watchdog, "STALL_S", stall_s)
    monkeypatch.setattr(watchdog, "HARD_STALL_S", 3600.0)
    monkeypatch.setattr(watchdog, "SAMPLE_S", 0.02)
    monkeypatch.setattr(watchdog, "_abandoned", [])
    monkeypatch.setattr(kernel_module, "requests_waiting", lambda connection: ANSWERING.count)
    return StuckDrop()


@pytest.mark.parametrize("closes", [1, 2])
def test_a_stuck_drop_before_a_view_is_applied_fails_closed_however_many_saves_wait_on_it(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, closes: int) -> None:
    """Another session deletes a note this mount served, and the drop of its pages, made before the view
    that lacks it is applied, never ends (a lock of the kernel's that no request of this mount holds).
    A save waits on that refresh meanwhile (and a second close of the same file waits on the save): their
    requests are waiting, but on the drop, so the mount is idle for the watchdog, which fails it closed
    after ``STALL_S``, not ``HARD_STALL_S``."""
    drop = stuck_drop(monkeypatch, 0.3)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        drop.inos.add(await tool.ino(NOTE))
        failed: list[Outcome] = []
        monkeypatch.setattr(fs.mount.kernel, "fail_closed", failed.append)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", drop.invalidate_inode)
        info, _ = await fs.create(await tool.folder(DIR), b"saved.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                  None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, b"saved while the drop is stuck\n")
        as_alice(scenario, delete_note, NOTE)
        with trio.fail_after(30):  # HARD_STALL_S would be an hour: only the stall bound ends these closes
            async with trio.open_nursery() as nursery:
                for _ in range(closes):
                    nursery.start_soon(fs.flush, info.fh)
        await fs.release(info.fh)
        assert drop.began.is_set() and failed == [Outcome.STUCK]
        assert fs.mount.layers.lookup(tuple(NOTE.split("/"))) is None  # the view was applied after all

    try:
        run_alice_mount(scenario, script)
    finally:
        drop.let_go.set()  # the abandoned worker returns
    assert _read(scenario, f"{DIR}/saved.md") == b"saved while the drop is stuck\n"


def test_a_drop_before_a_view_is_applied_waits_while_a_request_not_waiting_on_the_refresh_is_answered(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same stuck drop, while a request that does not wait on the refresh is being answered (its
    handler may hold what the drop waits for): the mount is busy, the drop is not abandoned until the
    request ends, and then only after ``STALL_S`` of idleness."""
    drop = stuck_drop(monkeypatch, 1.0)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        drop.inos.add(await tool.ino(NOTE))
        failed: list[tuple[Outcome, bool]] = []
        answered = trio.Event()

        def fail_closed(outcome: Outcome) -> None:
            failed.append((outcome, answered.is_set()))
        monkeypatch.setattr(fs.mount.kernel, "fail_closed", fail_closed)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", drop.invalidate_inode)
        as_alice(scenario, delete_note, NOTE)

        @guarded
        async def a_request_answered_meanwhile() -> None:  # as a READ holding the page the drop waits for
            await trio.sleep(3 * watchdog.STALL_S)

        async def other() -> None:
            await trio.to_thread.run_sync(drop.began.wait, 30)  # the drop is under way, and stuck
            await a_request_answered_meanwhile()
            answered.set()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tool.create, DIR, "saved.md", b"saved\n")
                nursery.start_soon(other)
        assert drop.began.is_set() and failed == [(Outcome.STUCK, True)]

    try:
        run_alice_mount(scenario, script)
    finally:
        drop.let_go.set()


@pytest.mark.parametrize("how", ["unlinked", "kept as a save's backup, then unlinked",
                                 "kept as a save's backup, written, then unlinked"])
def test_a_node_without_a_name_here_loses_its_pages_before_another_session_s_delete_is_served(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A process holds a note open. This mount unlinks the note (within the grace period, before its own
    removal is committed), or vim saves it (the note's node becomes the backup, the new content the
    note's next revision) and unlinks the backup. Another session then deletes the note. The node has no
    name here, but the kernel may still serve the holder its pages: they go before the view without the
    note is applied, and its ``READ`` is refused from the moment the change is read."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        held = await KernelFile.open(fs, await tool.ino(NOTE))
        assert await held.read() == ALICE_FACT
        if how == "unlinked":
            await tool.unlink(DIR, "allergy.md")
        else:
            await tool.rename(DIR, "allergy.md", "allergy.md~")
            if "written" in how:  # the backup gets a draft, which its unlink then closes
                await held.write(len(ALICE_FACT), b"appended\n")
                await held.flush()
            await tool.create(DIR, "allergy.md", b"saved by vim\n")
            await tool.unlink(DIR, "allergy.md~")
        if "written" not in how:  # an unlinked file held open reads, as on any filesystem; the writes
            assert await held.read() == ALICE_FACT  # of an unlinked backup go with its draft: ENOENT
        seen: list[tuple[bool, int]] = []

        def invalidate_inode(ino: int, attr_only: bool = False) -> None:  # on the worker, as the kernel's
            if ino == held.ino and not attr_only and not seen:
                applied = fs.mount.view.notes.get(tuple(NOTE.split("/"))) is None
                seen.append((applied, trio.from_thread.run(errno_of, held.read())))

        monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate_inode)
        as_alice(scenario, delete_note, NOTE)
        await fs.sync()
        # dropped before the view was applied (the kernel may hold what it read and what was written)
        assert [applied for applied, _ in seen] == [False]
        assert seen[0][1] == (errno.ENOENT if "written" in how else errno.EACCES)  # and refused meanwhile
        assert await errno_of(held.read()) in (errno.ENOENT, errno.EACCES)  # the note is gone
        tool.check("the held note left the view")

    run_alice_mount(scenario, script)


def test_a_backup_that_became_another_note_and_lost_its_name_loses_its_pages_with_that_note(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process holds a note open; vim keeps it as a backup, the backup is written to and renamed to a
    name of its own (a new note), which is then unlinked here. The node holds both notes' content for
    the kernel: when another session deletes the new note, its pages go before that view is applied."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        held = await KernelFile.open(fs, await tool.ino(NOTE))
        assert await held.read() == ALICE_FACT
        await tool.rename(DIR, "allergy.md", "allergy.md~")
        await held.write(len(ALICE_FACT), b"appended\n")
        await tool.rename(DIR, "allergy.md~", "kept.md")
        await tool.unlink(DIR, "kept.md")
        dropped: list[bool] = []

        def invalidate_inode(ino: int, attr_only: bool = False) -> None:  # on the worker, as the kernel's
            if ino == held.ino and not attr_only:
                dropped.append(fs.mount.view.notes.get((*DIR.split("/"), "kept.md")) is None)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate_inode)
        as_alice(scenario, delete_note, f"{DIR}/kept.md")
        await fs.sync()
        assert dropped[:1] == [False]  # dropped before the view without the new note was applied
        tool.check("the new note left the view")

    run_alice_mount(scenario, script)


def test_a_stuck_drop_fails_closed_while_an_fsyncdir_waits_on_the_removal_that_refreshes(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A note unlinked here and held open is removed by the background settle, whose refresh's drop of
    the held node is stuck; an ``fsync`` of the folder waits on that removal meanwhile. It waits on the
    refresh, not on anything the drop waits for: the mount fails closed after ``STALL_S``."""
    drop = stuck_drop(monkeypatch, 0.3)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        held = await KernelFile.open(fs, await tool.ino(NOTE))
        assert await held.read() == ALICE_FACT
        drop.inos.add(held.ino)
        await tool.unlink(DIR, "allergy.md")
        failed: list[Outcome] = []
        monkeypatch.setattr(fs.mount.kernel, "fail_closed", failed.append)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", drop.invalidate_inode)
        folder = await tool.folder(DIR)
        with trio.fail_after(30):  # HARD_STALL_S would be an hour: only the stall bound ends these
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(fs.removals.settle, everything=True))  # the background's

                async def fsyncdir() -> None:
                    await trio.to_thread.run_sync(drop.began.wait, 30)  # the removal's drop is stuck
                    await fs.fsyncdir(0, False, folder)
                nursery.start_soon(fsyncdir)
        assert drop.began.is_set() and failed == [Outcome.STUCK]

    try:
        run_alice_mount(scenario, script)
    finally:
        drop.let_go.set()


def test_a_stuck_drop_fails_closed_while_a_close_waits_to_let_go_of_a_draft_another_request_commits(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A note truncated by an ``O_TRUNC`` open is synced (``fsync``, which commits it) while another
    session deletes a note this mount served: the refresh after that commit is stuck in the drop of the
    deleted note's pages. The descriptor is closed meanwhile; its FLUSH has nothing left to commit and
    lets go of the writer, which waits for the commit in flight before the draft goes. It waits on the
    refresh, not on anything the drop waits for: the mount fails closed after ``STALL_S``."""
    drop = stuck_drop(monkeypatch, 0.3)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        drop.inos.add(await tool.ino(NOTE))
        await tool.create(DIR, "emptied.md", b"emptied by the next open\n")
        opened = await KernelFile.open(fs, await tool.ino(f"{DIR}/emptied.md"), os.O_WRONLY | os.O_TRUNC)
        node = fs.mount.layers.inodes.get(opened.ino)
        assert node is not None
        failed: list[tuple[Outcome, int]] = []

        def fail_closed(outcome: Outcome) -> None:  # the close waits on the commit's lock by then
            failed.append((outcome, node.commit_lock.statistics().tasks_waiting))
        monkeypatch.setattr(fs.mount.kernel, "fail_closed", fail_closed)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", drop.invalidate_inode)
        as_alice(scenario, delete_note, NOTE)
        with trio.fail_after(30):  # HARD_STALL_S would be an hour: only the stall bound ends these
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fs.fsync, 0, False, opened.ino)

                async def close() -> None:
                    await trio.to_thread.run_sync(drop.began.wait, 30)  # the fsync's refresh is stuck
                    await opened.flush()
                nursery.start_soon(close)
        assert drop.began.is_set() and failed == [(Outcome.STUCK, 1)]

    try:
        run_alice_mount(scenario, script)
    finally:
        drop.let_go.set()
    assert _read(scenario, f"{DIR}/emptied.md") == b""
