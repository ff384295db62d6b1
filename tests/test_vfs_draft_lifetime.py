"""A close's commit keeps the draft it commits, whatever lets go of the writer meanwhile.

A ``cp -r`` through a mount once failed with "failed to close ...: No such
file or directory". The close's commit waited for the catalog thread for
more than ``WRITER_IDLE_S``; the background settle took the writer for an
idle one, let go of it and closed its draft; the commit then reopened the
draft by its descriptor number, which was gone (and could have been
another file by then). A ``ScopeFS`` runs in this process
(``tests.inprocesskit``); the catalog thread is held busy to make the
commit wait, as a busy mount does.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio
import trio.testing

from scopefs.catalog import visible
from scopefs.catalog.errors import Denied, StorageError
from scopefs.catalog.reader import read_note
from scopefs.catalog.reasons import Reason
from scopefs.vfs import catalog_ops, currency, reads, writers
from scopefs.vfs import mount as mount_module
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.handles import REVOKED, Handle
from scopefs.vfs.inodes import Node
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario
from tests.inprocesskit import KernelFile, Tool, as_alice, errno_of, no_kernel, run_alice_mount
from tests.mountkit import catalog, unsynced_paths

pytestmark = pytest.mark.usefixtures(no_kernel.__name__)

CONTENT = b"written, then closed while the catalog was busy\n"


def test_a_writer_let_go_while_its_close_commits_is_still_committed_whole(scenario: Scenario) -> None:
    closed: list[bool] = []

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, _ = await fs.create(folder, b"raced.md", 0o600, os.O_WRONLY | os.O_CREAT, None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, CONTENT)
        handle = fs.mount.handles.get(info.fh)
        assert handle is not None
        node = handle.node
        busy = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.mount.catalog, busy.wait)  # the catalog thread is taken

            async def close() -> None:
                await fs.flush(info.fh, node.ino, None)
                closed.append(True)

            nursery.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()  # the close's commit waits for the catalog thread
            handle.used -= 10.0  # as if its last write were long ago
            nursery.start_soon(fs.commits.writers.settle)  # lets go of the "idle" writer
            await trio.testing.wait_all_tasks_blocked()
            busy.set()
        await fs.release(info.fh)
        tool.check("the close and the settle")

    run_alice_mount(scenario, script)
    assert closed == [True]
    assert as_alice(scenario, read_note, "private/notes/raced.md") == CONTENT


async def _draft_read(read_the_draft: threading.Event) -> None:
    assert await trio.to_thread.run_sync(read_the_draft.wait, 60), "no commit read the draft"



async def _while_committing(commits: Callable[[], Awaitable[object]],
                           during: Callable[[trio.Nursery], Awaitable[None]],
                           monkeypatch: pytest.MonkeyPatch, *, refused: bool = False) -> None:
    """Run ``commits`` (a RELEASE or a FLUSH that commits a draft), its commit held on the catalog thread
    once it has read the draft, then done (or refused, if ``refused``); meanwhile run ``during``, which
    starts what must wait for that commit in the nursery it is given and checks it waits. Back once all
    of it ended. Later commits go through. (The test's events are set in a ``finally`` inside the
    nursery, which cannot end while a task waits on the parked thread.)"""
    reached, go_on = threading.Event(), threading.Event()
    commit = catalog_ops.commit

    def held(*args: Any, **kwargs: Any) -> Any:
        if reached.is_set():
            return commit(*args, **kwargs)
        done = None if refused else commit(*args, **kwargs)
        reached.set()
        assert go_on.wait(timeout=60), "the test never let the catalog thread go on"
        if refused:
            raise Denied(Reason.EXPLICIT_DENY)
        return done

    with monkeypatch.context() as patch:  # undoes only this, not the fixtures' own patches
        patch.setattr(catalog_ops, "commit", held)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(commits)
            try:
                await _draft_read(reached)
                await during(nursery)
            finally:
                go_on.set()



def _waiting(request: Callable[..., Awaitable[object]], *args: object) -> Callable[[trio.Nursery], Awaitable[None]]:
    """What ``_while_committing`` runs meanwhile: ``request(*args)`` started, and waiting for the commit."""
    async def started(nursery: trio.Nursery) -> None:
        nursery.start_soon(request, *args)
        await trio.testing.wait_all_tasks_blocked()  # it waits for the commit held on the catalog thread

    return started


def _drop_begun(node: Node) -> None:
    """As the invalidation worker does when it sends the drops queued for ``node`` (none runs here)."""
    node.invalidations_begun = node.invalidations_ended = node.invalidations_queued


async def _idle_writer(fs: ScopeFS, tool: Tool, path: str, added: bytes) -> tuple[int, KernelFile, Node, Handle]:
    """``path`` open for writing, ``added`` written after its content, and its writer left alone long
    enough for the settle to commit it: the inode, the open file, its node and the writer's handle."""
    ino = await tool.ino(path)
    writer = await KernelFile.open(fs, ino, os.O_RDWR)
    await writer.write(len(ALICE_FACT), added)
    node = fs.mount.node(ino)
    handle = fs.commits.writers.writer_of(node)
    assert handle is not None
    handle.used -= 10.0  # as if its last write were long ago
    return ino, writer, node, handle


def _fails(error: Exception, *args: Any, **kwargs: Any) -> Any:
    """A catalog call that fails with ``error`` (patched in for one)."""
    raise error


def _refused_counted(tries: list[int], *args: Any, **kwargs: Any) -> Any:
    """A commit the catalog refuses, each try noted in ``tries`` (patched in for ``catalog_ops.commit``)."""
    tries.append(1)
    raise Denied(Reason.EXPLICIT_DENY)


async def _touched(fs: ScopeFS, tool: Tool) -> tuple[int, int, int]:
    """``touch private/notes/touched.md``'s create and close (nothing written, so nothing committed yet):
    the folder's inode, the file's handle (for its RELEASE) and its inode."""
    folder = await tool.folder("private/notes")
    info, attributes = await fs.create(folder, b"touched.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                       None)  # type: ignore[arg-type]
    await fs.flush(info.fh, attributes.st_ino, None)
    return folder, info.fh, attributes.st_ino


def test_writes_by_inode_while_a_created_file_s_release_commits_are_kept(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``touch f; echo x > f``: the kernel does not wait for the RELEASE of touch's create, so the shell's
    truncation and write can come while that release commits the empty note. The old code let them land
    in the releasing handle's draft, which the release then closed once its commit (of the bytes it had
    read before) was done: the write was lost, and its close said nothing (fsx found it inside
    ``scopefs run``, where the timing falls that way about once in seven runs)."""
    written = b"written while the release committed\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        _, fh, ino = await _touched(fs, tool)
        shells: list[KernelFile] = []

        async def shell_writes(nursery: trio.Nursery) -> None:
            shells.append(await KernelFile.open(fs, ino, os.O_WRONLY | os.O_TRUNC))
            await shells[0].write(0, written)

        await _while_committing(functools.partial(fs.release, fh), shell_writes, monkeypatch)  # the empty note
        await shells[0].flush()
        tool.check("the release and the shell's close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/touched.md") == written


def test_an_unlink_while_a_created_file_s_release_commits_removes_the_note(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``touch f; rm f``: the unlink can come while the release of touch's create commits the empty note.
    The old code removed only the local file and answered; the commit then made the note, which showed
    again and stayed in the catalog."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, _ = await _touched(fs, tool)
        await _while_committing(functools.partial(fs.release, fh), _waiting(fs.unlink, folder, b"touched.md", None),
                                monkeypatch)
        assert "touched.md" not in fs.mount.layers.names(("private", "notes"))
        await fs.removals.settle(everything=True)  # its grace cut short: the tombstone
        assert "touched.md" not in fs.mount.layers.names(("private", "notes"))
        tool.check("the release and the unlink")

    run_alice_mount(scenario, script)
    with pytest.raises(Denied):
        as_alice(scenario, read_note, "private/notes/touched.md")


@pytest.mark.parametrize("move", ["a note onto it", "it to a backup name"])
def test_a_rename_while_a_created_file_s_release_commits_waits_for_that_commit(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, move: str) -> None:
    """``touch f; mv g f`` and ``touch f; mv f f~`` while the release of touch's create commits the empty
    note. The old code renamed onto a name the catalog was about to take (EAGAIN for ``mv``, or, with the
    rename first on the catalog thread, the moved note saved over with the empty bytes), and renamed the
    file to a backup name that the commit then took back."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, _ = await _touched(fs, tool)
        old, new = (b"allergy.md", b"touched.md") if move == "a note onto it" else (b"touched.md", b"touched.md~")
        await _while_committing(functools.partial(fs.release, fh),
                                _waiting(fs.rename, folder, old, folder, new, 0, None), monkeypatch)
        await fs.removals.settle(everything=True)  # a rename to a backup name removes the note: now
        tool.check("the release and the rename")
        names = fs.mount.layers.names(("private", "notes"))
        assert names == (["touched.md"] if move == "a note onto it" else ["allergy.md", "touched.md~"])

    run_alice_mount(scenario, script)
    if move == "a note onto it":
        assert as_alice(scenario, read_note, "private/notes/touched.md") == ALICE_FACT
        with pytest.raises(Denied):
            as_alice(scenario, read_note, "private/notes/allergy.md")
    else:
        with pytest.raises(Denied):
            as_alice(scenario, read_note, "private/notes/touched.md")


def test_a_rename_waiting_on_a_first_commit_that_is_refused_finds_nothing_to_move(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release's commit of a created file is refused; a rename that waited for it must not commit the
    file that never was (an empty note at the new name), as the code between two reviews did."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, _ = await _touched(fs, tool)
        moved: list[int] = []

        async def move() -> None:
            moved.append(await errno_of(fs.rename(folder, b"touched.md", folder, b"moved.md", 0,
                                                  None)))  # type: ignore[arg-type]

        await _while_committing(functools.partial(fs.release, fh), _waiting(move), monkeypatch, refused=True)
        assert moved == [errno.ENOENT]
        assert not {"touched.md", "moved.md"} & set(fs.mount.layers.names(("private", "notes")))
        tool.check("the refused release and the rename")

    run_alice_mount(scenario, script)
    with pytest.raises(Denied):
        as_alice(scenario, read_note, "private/notes/moved.md")


@pytest.mark.parametrize("synced", ["the file", "its folder"])
def test_an_fsync_after_a_created_file_s_close_waits_for_its_release_s_commit(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, synced: str) -> None:
    """``touch f`` then an fsync of ``f`` (a new descriptor: by inode) or of its folder: touch's close has
    returned, and its RELEASE commits the empty note while the fsync comes. The fsync must make that
    note durable. For the file, the old code answered at once (nothing of the note's was committed yet),
    and the release's commit then landed unsynced. The folder's held only because its sync queued behind
    the commit on the catalog thread; it now waits for the release as the file's does."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, ino = await _touched(fs, tool)
        synced_at: list[bool] = []

        async def fsync() -> None:
            if synced == "the file":
                await fs.fsync(0, False, ino)
            else:
                await fs.fsyncdir(0, False, folder)
            synced_at.append(fs.mount.layers.note_of(fs.mount.node(ino)) is not None)

        async def fsync_waiting(nursery: trio.Nursery) -> None:
            nursery.start_soon(fsync)
            await trio.testing.wait_all_tasks_blocked()
            assert synced_at == [], "the fsync answered before the note it syncs was committed"

        await _while_committing(functools.partial(fs.release, fh), fsync_waiting, monkeypatch)
        assert synced_at == [True]
        tool.check("the release and the fsync")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/touched.md") == b""
    assert "notes/touched.md" not in unsynced_paths(scenario.cli.home)


@pytest.mark.parametrize("synced", ["the file", "its folder"])
def test_an_fsync_that_comes_before_a_created_file_s_release_commits_the_note_itself(
        scenario: Scenario, synced: str) -> None:
    """``touch f`` then an fsync of ``f`` (by inode) or of its folder, and the kernel sends touch's RELEASE
    only after the FSYNC (a background request queued behind a full queue): the created file's writer
    is still registered, so the fsync commits the empty note and syncs it itself, and the late release
    finds nothing left to commit."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, ino = await _touched(fs, tool)
        if synced == "the file":
            await fs.fsync(0, False, ino)
        else:
            await fs.fsyncdir(0, False, folder)
        assert fs.mount.layers.note_of(fs.mount.node(ino)) is not None, "the fsync did not commit the note"
        assert "notes/touched.md" not in unsynced_paths(scenario.cli.home)
        await fs.release(fh)
        tool.check("the fsync and the late release")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/touched.md") == b""
    assert "notes/touched.md" not in unsynced_paths(scenario.cli.home)


def test_a_folder_s_fsync_answers_for_the_folder_when_a_new_note_s_commit_is_refused(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A created file whose commit is refused never was: its folder's fsync tries it, and answers 0 for what
    the folder holds (the file's own fsync is what reports the refusal)."""
    tried: list[int] = []

    refused = functools.partial(_refused_counted, tried)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, _, ino = await _touched(fs, tool)
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", refused)
            assert await errno_of(fs.fsyncdir(0, False, folder)) == 0
            assert tried == [1], "the folder's fsync did not try the new note"
            assert await errno_of(fs.fsync(0, False, ino)) == errno.EACCES
        assert fs.mount.layers.note_of(fs.mount.node(ino)) is None
        def full(*args: Any, **kwargs: Any) -> Any:
            tried.append(2)
            raise StorageError("the catalog is full")

        with monkeypatch.context() as patch:  # the refusal above must not excuse a failure of another kind
            patch.setattr(catalog_ops, "commit", full)
            assert await errno_of(fs.fsyncdir(0, False, folder)) == errno.EIO
            assert tried == [1, 1, 2]
        tool.check("the folder's fsync and the refused one")

    run_alice_mount(scenario, script)


def test_a_folder_s_fsync_fails_when_a_new_note_under_it_could_not_be_committed(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new empty note's commit fails for another reason than a refusal (the catalog could not be
    written): its name is not durable, so the folder's fsync must not answer 0 (a review found the first
    version logged it and went on, leaving the settle to commit it unsynced)."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, ino = await _touched(fs, tool)
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", functools.partial(_fails, StorageError("cannot be written")))
            assert await errno_of(fs.fsyncdir(0, False, folder)) != 0
        assert await errno_of(fs.fsyncdir(0, False, folder)) == 0  # the catalog back: committed, synced
        assert fs.mount.layers.note_of(fs.mount.node(ino)) is not None
        assert "notes/touched.md" not in unsynced_paths(scenario.cli.home)
        await fs.release(fh)
        tool.check("the failed folder's fsync and the next")

    run_alice_mount(scenario, script)


def test_a_folder_s_fsync_shows_nothing_of_a_new_note_still_being_written(scenario: Scenario) -> None:
    """A file another process created and is still writing is not committed by its folder's fsync: a
    revision of half its bytes would show to every session before its close."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, attributes = await fs.create(folder, b"half.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                           None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, CONTENT[:10])
        await fs.fsyncdir(0, False, folder)
        assert fs.mount.layers.note_of(fs.mount.node(attributes.st_ino)) is None, "half a note was committed"
        await fs.write(info.fh, 10, CONTENT[10:])
        await fs.flush(info.fh, attributes.st_ino, None)
        await fs.release(info.fh)
        tool.check("the write, the folder's fsync and the close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/half.md") == CONTENT
    with catalog(scenario.cli.home) as conn:
        revisions = conn.execute("SELECT count(*) FROM revisions v JOIN resources r USING (resource_id)"
                                 " WHERE r.path = 'notes/half.md'").fetchall()
    assert revisions == [(1,)]


def test_a_folder_s_fsync_commits_an_empty_note_empty_whatever_is_written_meanwhile(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit a folder's fsync makes of an empty new note reads the draft on the catalog thread, while
    WRITEs still land on the trio thread: bytes written after that commit began are not in it (they would
    show part of a file to every session); they leave the draft dirty, and the writer's close commits them
    (a review found the first version read the live draft)."""
    reached, go_on = threading.Event(), threading.Event()
    commit = catalog_ops.commit

    def held(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        assert go_on.wait(timeout=60), "the test never let the catalog thread go on"
        return commit(*args, **kwargs)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, fh, ino = await _touched(fs, tool)
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", held)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fs.fsyncdir, 0, False, folder)
                try:
                    await _draft_read(reached)
                    await fs.write(fh, 0, CONTENT)
                finally:
                    go_on.set()
        shown = fs.mount.layers.note_of(fs.mount.node(ino))
        assert shown is not None and shown.size == 0, "the folder's fsync committed bytes written after it began"
        await fs.flush(fh, ino, None)
        await fs.release(fh)
        tool.check("the folder's fsync, the write meanwhile and the close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/touched.md") == CONTENT


def test_an_fsync_by_another_process_while_a_let_go_writer_s_close_commits_waits_for_it(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close's commit waits for the catalog; the settle takes its writer for an idle one and lets it go;
    another process fsyncs the file (a new descriptor: by inode). It finds no writer, and, for a new note,
    nothing in the view yet: it must wait for that commit and sync it, not answer before (a review found
    the first fix of the release's case missed this one)."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, attributes = await fs.create(folder, b"synced.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                           None)  # type: ignore[arg-type]
        ino = attributes.st_ino
        await fs.write(info.fh, 0, CONTENT)
        handle = fs.mount.handles.get(info.fh)
        assert handle is not None
        synced: list[bool] = []

        async def fsync() -> None:
            await fs.fsync(0, False, ino)
            synced.append(fs.mount.layers.note_of(fs.mount.node(ino)) is not None)

        async def let_go_then_fsync(nursery: trio.Nursery) -> None:
            handle.used -= 10.0  # as if its last write were long ago
            nursery.start_soon(fs.commits.writers.settle)  # lets go of the "idle" writer, then waits for the commit
            await trio.testing.wait_all_tasks_blocked()
            assert fs.commits.writers.writer_of(fs.mount.node(ino)) is None
            nursery.start_soon(fsync)
            await trio.testing.wait_all_tasks_blocked()
            assert synced == [], "the fsync answered before the close's commit was done"

        await _while_committing(functools.partial(fs.flush, info.fh, ino, None), let_go_then_fsync, monkeypatch)
        await fs.release(info.fh)
        assert synced == [True]
        tool.check("the close, the settle and the fsync")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/synced.md") == CONTENT
    assert "notes/synced.md" not in unsynced_paths(scenario.cli.home)


def test_an_fsync_that_waited_for_a_release_s_commit_which_was_refused_fails(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``touch f``, then an fsync of ``f`` while the release's commit of it is under way, and that commit is
    refused: the fsync answers EIO (the bytes it was to make durable are gone), not 0 for a note that
    never was, as the first version of the wait did (a review found it)."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        _, fh, ino = await _touched(fs, tool)
        synced: list[int] = []

        async def fsync() -> None:
            synced.append(await errno_of(fs.fsync(0, False, ino)))

        async def fsync_waiting(nursery: trio.Nursery) -> None:
            nursery.start_soon(fsync)
            await trio.testing.wait_all_tasks_blocked()
            assert synced == []

        await _while_committing(functools.partial(fs.release, fh), fsync_waiting, monkeypatch, refused=True)
        assert synced == [errno.EIO]
        tool.check("the refused release and the fsync")

    run_alice_mount(scenario, script)
    with pytest.raises(Denied):
        as_alice(scenario, read_note, "private/notes/touched.md")


def test_bytes_whose_commit_was_refused_are_not_read_back(scenario: Scenario) -> None:
    """An ``fsync`` refused (a forgotten claim written again) answers EACCES and keeps the writer open:
    a tool that looks at the file meanwhile reads by inode, and the draft the mount still holds must not
    answer it, nor a read through the handle. Bytes that may be saved are read back once committed
    (here by a rename, which saves a note being written)."""
    scenario.cli.j("forget", scenario.alice_session, "private/notes/allergy.md")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private")  # notes/ went with the only note it held
        info, attr = await fs.create(folder, b"again.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                     None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, ALICE_FACT)
        assert await errno_of(fs.fsync(info.fh, False)) == errno.EACCES
        assert await errno_of(fs.read(0, 0, 4096, attr.st_ino, None)) == errno.EACCES
        assert await errno_of(fs.read(info.fh, 0, 4096)) == errno.EACCES
        empty = pyfuse3.EntryAttributes()
        empty.st_size = 0
        await fs.setattr(attr.st_ino, empty, SimpleNamespace(update_size=True), info.fh, None)  # type: ignore[arg-type]
        assert await fs.read(0, 0, 4096, attr.st_ino, None) == b""  # ftruncate(fd, 0): nothing refused is left
        other = b"Something else entirely.\n".ljust(len(ALICE_FACT), b" ")
        await fs.write(info.fh, 0, other)  # written over: what it holds now may be saved, by a rename too
        await fs.rename(folder, b"again.md", folder, b"renamed.md", 0, None)  # type: ignore[arg-type]
        assert await fs.read(0, 0, 4096, attr.st_ino, None) == other
        assert await errno_of(fs.fsync(info.fh, False)) == 0
        await fs.flush(info.fh)
        await fs.release(info.fh)
        tool.check("the release")

    run_alice_mount(scenario, script)


def test_a_settle_s_refused_commit_is_heard_by_the_writer_s_close_and_nothing_older_is_read_meanwhile(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsx under revocation (once, under load): a writer left alone for ``WRITER_IDLE_S`` was committed
    by the settle, the commit refused (the binding revoked, the mount not yet refreshed), and the old
    code dropped the draft. The writer's next close then answered 0 for bytes that were gone, and its
    reads were answered from the older, shorter revision, which the kernel, still sizing the file as
    written, padded with zeros. Now the draft is kept, refused: reads are refused, the writer's close
    hears of it, and only then is the note read as committed."""
    path = "private/notes/allergy.md"
    refusals: list[int] = []

    refused = functools.partial(_refused_counted, refusals)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        assert await tool.read(path) == ALICE_FACT
        ino, writer, node, handle = await _idle_writer(fs, tool, path, b"written, then left alone\n")
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", refused)
            await fs.commits.writers.settle()
            assert refusals == [1]
            assert await errno_of(fs.read(0, 0, 4096, ino, None)) == errno.EACCES  # not the older revision
            assert fs.commits.writers.writer_of(node) is handle
            assert ino in fs.commits.writers.writing  # its close comes here
            handle.used -= 10.0
            await fs.commits.writers.settle()  # kept for the writer's close: not tried again at once
            assert refusals == [1]
            assert await errno_of(writer.flush()) == errno.EACCES  # the close hears of it
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT  # then the note, as committed
        tool.check("the refused settle and the close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, path) == ALICE_FACT


def test_a_writer_the_settle_could_not_commit_is_tried_again_then_let_go(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that come after the close (a mapping's write-back) have no close left to hear of a
    refusal: the writer is kept and tried again each ``WRITER_IDLE_S`` once the view has moved (the
    refusal may pass: then it is committed), until ``UNCOMMITTED_KEPT_S`` pass with no write; then one
    last try, and the writes go, the note as it was committed."""
    path = "private/notes/allergy.md"
    written = b"written back after the close\n"
    tries: list[int] = []

    refused = functools.partial(_refused_counted, tries)

    async def kept(fs: ScopeFS, tool: Tool) -> tuple[int, Node, Handle]:
        ino = await tool.ino(path)
        await KernelFile(fs, ino).write(0, written)
        node = fs.mount.node(ino)
        handle = fs.commits.writers.writer_of(node)
        assert handle is not None
        handle.used -= 10.0
        await fs.commits.writers.settle()
        assert handle.kept_since is not None and fs.commits.writers.writer_of(node) is handle
        assert await errno_of(fs.read(0, 0, 4096, ino, None)) == errno.EACCES
        handle.retry_at -= writers.WRITER_IDLE_S
        await fs.commits.writers.settle()  # a refusal: not tried again while the view stays as it was
        assert fs.commits.writers.writer_of(node) is handle
        return ino, node, handle

    async def view_moves(fs: ScopeFS) -> None:  # as a grant would come
        as_alice(scenario, write_note, "private/notes/elsewhere.md", b"a change in the view\n")
        await fs.mount.sync()

    async def still_refused(fs: ScopeFS, tool: Tool) -> None:
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", refused)
            ino, node, handle = await kept(fs, tool)
            assert tries == [1]
            await view_moves(fs)
            await fs.commits.writers.settle()  # tried again, refused again: still kept
            assert tries == [1, 1] and fs.commits.writers.writer_of(node) is handle
            assert handle.kept_since is not None
            handle.kept_since -= writers.UNCOMMITTED_KEPT_S
            handle.used -= writers.UNCOMMITTED_KEPT_S  # no write since either
            await fs.commits.writers.settle()  # the last try
            assert tries == [1, 1, 1]
        assert fs.commits.writers.writer_of(node) is None and node.draft is None
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the refused writer let go")

    run_alice_mount(scenario, still_refused)
    assert as_alice(scenario, read_note, path) == ALICE_FACT

    async def refusal_passed(fs: ScopeFS, tool: Tool) -> None:
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", refused)
            ino, node, handle = await kept(fs, tool)
        await view_moves(fs)
        await fs.commits.writers.settle()
        assert fs.commits.writers.writer_of(node) is None
        assert await KernelFile(fs, ino).read() == written + ALICE_FACT[len(written):]
        tool.check("the writer committed once the refusal passed")

    run_alice_mount(scenario, refusal_passed)
    assert as_alice(scenario, read_note, path) == written + ALICE_FACT[len(written):]


def test_a_writer_kept_for_a_sandbox_since_dismissed_is_let_go_uncommitted(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox's writer whose settle commit was refused, then the sandbox dismissed: no close of it
    can come any more, and a later try must not commit what it wrote once its access has ended. The
    settle lets it go, uncommitted, at its next turn, whatever the view does."""
    path = "private/notes/allergy.md"
    tries: list[int] = []

    refused = functools.partial(_refused_counted, tries)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, _, node, handle = await _idle_writer(fs, tool, path, b"written in a sandbox since gone\n")
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", refused)
            await fs.commits.writers.settle()
        assert handle.kept_since is not None and tries == [1]
        handle.pid_namespace = REVOKED  # as ``HandleTable.revoke`` marks a dismissed sandbox's handles
        as_alice(scenario, write_note, "private/notes/elsewhere.md", b"a change in the view\n")
        await fs.mount.sync()  # the view moves: a kept writer would be tried again
        await fs.commits.writers.settle()
        assert tries == [1] and fs.commits.writers.writer_of(node) is None and node.draft is None
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the dismissed sandbox's writer let go")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, path) == ALICE_FACT


def test_a_close_that_heard_a_refusal_is_not_told_it_again(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """An fsync's commit holds the node's lock while more is written; a close and then the settle queue
    behind it, all three refused. The close answers EACCES; the settle's own refusal must not keep the
    writer for another close to hear it again (nor to try later to commit bytes whose close failed):
    only a settle whose commit was the node's one failure keeps it (``failed_commits``)."""
    path = "private/notes/allergy.md"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, writer, node, handle = await _idle_writer(fs, tool, path, b"refused at the fsync\n")
        closes: list[int] = []
        fsyncs: list[int] = []

        async def fsync() -> None:
            fsyncs.append(await errno_of(fs.fsync(0, False, ino)))

        async def close_then_settle(nursery: trio.Nursery) -> None:
            await writer.write(0, b"written while the fsync commits")  # the draft is dirty again
            handle.used -= 10.0

            async def close() -> None:
                closes.append(await errno_of(writer.flush()))

            nursery.start_soon(close)  # its commit waits for the lock
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(fs.commits.writers.settle)  # so does the settle's, behind it
            await trio.testing.wait_all_tasks_blocked()
            assert closes == []

        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", functools.partial(_fails, Denied(Reason.EXPLICIT_DENY)))
            await _while_committing(fsync, close_then_settle, monkeypatch, refused=True)
        assert fsyncs == [errno.EACCES] and closes == [errno.EACCES]
        assert fs.commits.writers.writer_of(node) is None and node.draft is None
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the fsync's, the close's and the settle's refusals")

    run_alice_mount(scenario, script)


def test_a_writer_whose_settle_commit_failed_is_kept_and_its_close_says_so(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only a refusal: a commit the settle could not make (the catalog could not be written) keeps
    the writer too, its bytes still read back (they are its own, not refused), and the close that
    comes tries again: EIO if it fails, as the old code's dropped draft never said."""
    path = "private/notes/allergy.md"
    added = b"not committed: the catalog could not be written\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, writer, node, handle = await _idle_writer(fs, tool, path, added)
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", functools.partial(_fails, StorageError("cannot be written")))
            await fs.commits.writers.settle()
            assert fs.commits.writers.writer_of(node) is handle
            assert await KernelFile(fs, ino).read() == ALICE_FACT + added
            assert await errno_of(writer.flush()) == errno.EIO
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the failed settle and the close")

    run_alice_mount(scenario, script)


@pytest.mark.parametrize("refused", [True, False], ids=["refused", "committed"])
def test_a_close_while_the_settle_commits_waits_for_that_commit_and_hears_its_refusal(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, refused: bool) -> None:
    """The settle takes the writer out of the registry while its commit runs, and pyfuse3 answers a
    FLUSH of an inode with no writer in C (``flush_wanted``): the old code's close meanwhile answered 0
    at once, before the commit (which could then be refused, its writes lost). Now the inode stays
    wanted and the close waits: committed, it answers 0 after the commit; refused, it hears of it (the
    writer kept for it), and its own refusal is not kept again."""
    path = "private/notes/allergy.md"
    added = b"written, closed while the settle commits\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, writer, node, handle = await _idle_writer(fs, tool, path, added)
        closes: list[int] = []

        async def close_meanwhile(nursery: trio.Nursery) -> None:
            assert ino in fs.commits.writers.writing  # the close comes to Python
            async def close() -> None:
                closes.append(await errno_of(writer.flush()))
            nursery.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()
            assert closes == []  # it waits for the settle's commit

        with monkeypatch.context() as patch:
            if refused:  # the close's own commit is refused too
                patch.setattr(catalog_ops, "commit", functools.partial(_fails, Denied(Reason.EXPLICIT_DENY)))
            await _while_committing(fs.commits.writers.settle, close_meanwhile, monkeypatch, refused=refused)
        assert closes == [errno.EACCES if refused else 0]
        assert fs.commits.writers.writer_of(node) is None and ino not in fs.commits.writers.writing
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == (ALICE_FACT if refused else ALICE_FACT + added)
        tool.check("the close during the settle's commit")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, path) == (ALICE_FACT if refused else ALICE_FACT + added)


def test_after_a_refused_close_another_descriptor_reads_nothing_until_the_kernel_drops_the_writes(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close refused: the draft goes, and the older revision is the note again. The kernel still
    sizes the file as the writes left it until the drop queued then begins (no worker sends it here);
    a ``READ`` answered from the shorter revision meanwhile would be padded with zeros up to that size.
    Refused instead, then served once the drop has begun."""
    path = "private/notes/allergy.md"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino(path)
        writer = await KernelFile.open(fs, ino, os.O_RDWR)
        await writer.write(len(ALICE_FACT), b"written, and refused at the close\n")
        node = fs.mount.node(ino)
        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", functools.partial(_fails, Denied(Reason.EXPLICIT_DENY)))
            assert await errno_of(writer.flush()) == errno.EACCES
        assert node.draft is None and node.invalidating
        assert await errno_of(fs.read(0, 0, 4096, ino, None)) == errno.EACCES
        _drop_begun(node)
        fs.mount.kernel.forget_pages(node)  # a later drop, for another reason: reads are not refused for it
        assert node.invalidating
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the refused close and the reads after")

    run_alice_mount(scenario, script)


def test_a_refused_truncation_by_path_leaves_the_note_as_it_was(scenario: Scenario) -> None:
    """``truncate(2)`` by path commits at once, and nobody closes or releases it: refused, its draft
    goes with the refusal, and the note reads as it was committed, not as truncated, nor refused."""
    longer = ALICE_FACT + b"And a line that may stay.\n"
    as_alice(scenario, write_note, "private/notes/longer.md", longer)
    scenario.cli.j("forget", scenario.alice_session, "private/notes/allergy.md")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino("private/notes/longer.md")
        node = fs.mount.node(ino)
        queued = node.invalidations_queued
        attr = pyfuse3.EntryAttributes()
        attr.st_size = len(ALICE_FACT)
        fields = SimpleNamespace(update_size=True)  # what the kernel's SETATTR of the size carries
        assert await errno_of(fs.setattr(ino, attr, fields, None, None)) == errno.EACCES  # type: ignore[arg-type]
        assert node.invalidations_queued == queued + 1  # its pages dropped once, however many steps refused it
        assert await fs.read(0, 0, 4096, ino, None) == longer
        tool.check("the refused truncation")

    run_alice_mount(scenario, script)


LARGE = bytes(range(256)) * ((2 << 20) // 256)  # loaded on a thread (``reads.INLINE_BYTES``): writes overtake it


def _large_note_written(scenario: Scenario, script: Callable[[ScopeFS, int], Awaitable[None]],
                        writes: dict[int, bytes]) -> None:
    """``script(fs, ino)`` on a large note of Alice's, whose content must then be the note's with
    ``writes`` (offset: bytes) made."""
    assert len(LARGE) > reads.INLINE_BYTES
    as_alice(scenario, write_note, "private/notes/large.md", LARGE)

    async def run(fs: ScopeFS, tool: Tool) -> None:
        await script(fs, await tool.ino("private/notes/large.md"))
        tool.check("the writes and the close")

    run_alice_mount(scenario, run)
    expected = bytearray(LARGE)
    for offset, data in writes.items():
        expected[offset:offset + len(data)] = data
    assert as_alice(scenario, read_note, "private/notes/large.md") == bytes(expected)


def _load_overtaken_by(monkeypatch: pytest.MonkeyPatch, fs: ScopeFS,
                       meanwhile: Callable[[Any], Awaitable[None]]) -> list[Any]:
    """The mount's loads of a note's content, each noted in the list returned; the first is overtaken by
    ``meanwhile(note)`` once it has read the content, before the draft is made from it."""
    load = fs.reads.load
    loads: list[Any] = []

    async def load_overtaken(note: Any) -> bytes:
        data = await load(note)
        loads.append(note)
        if len(loads) == 1:
            await meanwhile(note)
        return data
    monkeypatch.setattr(fs.reads, "load", load_overtaken)
    return loads


def test_two_writes_that_both_load_a_large_note_keep_each_other_s_bytes(scenario: Scenario) -> None:
    """Two writes by inode reach a large note that has no draft yet (a mapping written back page by
    page sends them at once): each starts loading the note on a thread, and the one whose load ends
    last must not replace the draft the other one already wrote into. Both writes are committed."""
    async def script(fs: ScopeFS, ino: int) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.write, 0, 0, b"FIRST", ino, None)
            nursery.start_soon(fs.write, 0, 1 << 20, b"SECOND", ino, None)
        await fs.flush(0, ino, None)

    _large_note_written(scenario, script, {0: b"FIRST", 1 << 20: b"SECOND"})


def test_a_write_whose_load_a_commit_of_this_mount_overtook_starts_from_that_commit(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write by inode loads a large note on a thread; meanwhile another write of this mount to the same
    note makes its draft, closes it (committed) and lets it go. The first write's draft must start from
    that commit, not from the content it loaded: its close would otherwise put that content back over the
    other write."""
    async def script(fs: ScopeFS, ino: int) -> None:
        async def other_write(note: Any) -> None:
            await fs.write(0, 1 << 20, b"OTHER", ino, None)
            await fs.flush(0, ino, None)
            node = fs.mount.layers.inodes.get(ino)
            assert node is not None and node.draft is None  # committed and let go
        _load_overtaken_by(monkeypatch, fs, other_write)
        await fs.write(0, 0, b"WRITTEN", ino, None)
        await fs.flush(0, ino, None)

    _large_note_written(scenario, script, {0: b"WRITTEN", 1 << 20: b"OTHER"})


def _refreshes_failing(monkeypatch: pytest.MonkeyPatch, *, patient: bool = True) -> list[bool]:
    """The mount's refreshes fail while the list returned holds something, each failure taking one item;
    if ``patient``, a view that cannot be read for a while is not emptied for that alone (``FAIL_CLOSED_S``)."""
    real_refresh = visible.refresh  # what the mount calls, by the name monkeypatched below
    armed: list[bool] = []

    def refresh(home: Any, view: Any) -> Any:
        if armed:
            armed.pop()
            raise OSError("injected: the view refresh after a save failed")
        return real_refresh(home, view)

    monkeypatch.setattr(mount_module, "refresh", refresh)
    if patient:
        monkeypatch.setattr(currency, "FAIL_CLOSED_S", 3600.0)
    return armed


def test_one_failed_refresh_after_a_quiet_while_suspends_the_mount_but_keeps_its_view(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The view is emptied once the catalog has been unreadable for ``FAIL_CLOSED_S``, counted from the
    first failing refresh: not after one failure that follows a quiet while (a mount the follower reads
    every ``FOLLOW_S``), which would detach every file held open for good."""
    armed = _refreshes_failing(monkeypatch, patient=False)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        held = await KernelFile.open(fs, await tool.ino("private/notes/allergy.md"))
        await tool.create("private/notes", "saved.md", b"saved after a quiet while\n")
        writer = await KernelFile.open(fs, held.ino, os.O_WRONLY)
        await writer.write(0, b"W")
        await trio.sleep(1.1 * currency.FAIL_CLOSED_S)  # quiet for a while: the last refresh is older than that
        armed.append(True)
        await tool.overwrite("private/notes/saved.md", b"saved again\n")
        assert not armed and fs.mount.view.usable and fs.mount.suspended
        assert fs.mount.refresh_failed.is_set()  # the follower, however long it sleeps, looks again soon
        reads: list[bool] = []
        failing_refresh = getattr(mount_module, "refresh")  # noqa: B009 - the one _refreshes_failing put there

        def counted(home: Any, view: Any) -> Any:
            reads.append(True)
            return failing_refresh(home, view)
        monkeypatch.setattr(mount_module, "refresh", counted)
        assert await errno_of(writer.flush()) == errno.EACCES  # a refresh failed a moment ago: not again
        assert reads == []
        await trio.sleep(currency.RETRY_S)
        await writer.flush()  # reads the view again, resumes, commits the writer's byte
        assert reads and fs.mount.serving
        assert await held.read() == b"W" + ALICE_FACT[1:]  # the same node: it never left the view

    run_alice_mount(scenario, script)


@pytest.mark.parametrize("which", ["a note the view showed", "a new note"])
def test_a_commit_whose_view_cannot_be_read_suspends_the_mount_until_one_can(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """The refresh after a close's commit fails: the view still shows the revision the commit replaced
    (or, for a new note, no note), which a read would answer, a write would start its draft from (its
    close putting that back over the commit), a save of those bytes would take for no change, a create
    would make anew. So nothing is served, saved or made until a refresh succeeds (an fsync is refused
    too: nothing says the commit is durable); nothing is lost, and the view stays applied, so files held
    open come back with it, and the note reads as committed, a write starting from the commit."""
    armed = _refreshes_failing(monkeypatch)
    monkeypatch.setattr(currency, "RETRY_S", 0.0)  # every commit while suspended reads the view again
    new = which == "a new note"
    path = "private/notes/fresh.md" if new else "private/notes/allergy.md"
    committed = b"committed while the view could not be read\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await tool.create("private/notes", "held.md", b"held open throughout\n")
        await tool.create("private/notes", "kept.md", b"as it was\n")
        held = await KernelFile.open(fs, await tool.ino("private/notes/held.md"))
        pending = await KernelFile.open(fs, held.ino, os.O_WRONLY)
        await pending.write(0, b"HELD")  # writers whose close is still to come
        kept = await KernelFile.open(fs, await tool.ino("private/notes/kept.md"), os.O_WRONLY)
        await kept.write(0, b"IS ")
        writer = fs.commits.writers.writer_of(fs.mount.node(held.ino))
        assert writer is not None
        writer.used -= 3600.0  # as if idle: the background settle would let go of it
        folder = await tool.folder("private/notes")
        if new:
            info, attr = await fs.create(folder, b"fresh.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                         None)  # type: ignore[arg-type]
            await fs.write(info.fh, 0, committed)
            armed.append(True)
            await fs.flush(info.fh)
            await fs.release(info.fh)
            ino = attr.st_ino
        else:
            opened = await KernelFile.open(fs, await tool.ino(path), os.O_WRONLY | os.O_TRUNC)
            await opened.write(0, committed)
            armed.append(True)
            await opened.flush()
            ino = opened.ino
        node = fs.mount.layers.inodes.get(ino)
        assert node is not None and node.draft is None and not armed  # committed, let go, not refreshed
        assert fs.mount.view.usable and fs.mount.suspended
        tool.check("the mount suspended")
        assert await errno_of(fs.read(0, 0, 4096, ino, None)) == errno.EACCES
        assert await errno_of(fs.write(0, len(committed), b"lost?\n", ino, None)) == errno.EACCES
        assert node.draft is None
        assert await errno_of(fs.getattr(ino)) == errno.EACCES  # its size would be the replaced one's
        assert await errno_of(fs.lookup(folder, path.rsplit("/", 1)[1].encode())) == errno.EACCES
        assert await errno_of(fs.create(folder, b".fresh.md.tmp", 0o600, os.O_WRONLY | os.O_CREAT,
                                        None)) == errno.EACCES  # type: ignore[arg-type]
        assert await errno_of(held.read()) == errno.EACCES
        unsynced = ("SELECT count(*) FROM unsynced_revisions u JOIN revisions v USING (revision_id)"
                    " WHERE v.content_sha256 = ?")
        with catalog(scenario.cli.home) as conn:
            assert conn.execute(unsynced, (hashlib.sha256(committed).hexdigest(),)).fetchall() == [(1,)]
        assert await errno_of(fs.fsync(0, False, ino)) == 0  # synced by the note's own resource
        with catalog(scenario.cli.home) as conn:
            assert conn.execute(unsynced, (hashlib.sha256(committed).hexdigest(),)).fetchall() == [(0,)]
        assert (await fs.getattr(pyfuse3.ROOT_INODE)).st_ino == pyfuse3.ROOT_INODE  # constant: a launch needs it
        await fs.commits.writers.settle()
        assert fs.commits.writers.writer_of(fs.mount.node(held.ino)) is writer  # kept: its commit would be refused
        armed.append(True)
        assert await errno_of(kept.flush()) == errno.EACCES  # its commit reads the view first, in vain:
        assert fs.mount.suspended  # refused, its writer kept for a close once the mount resumes
        await pending.flush()  # its commit reads the view first, and resumes the mount
        assert fs.mount.serving
        await kept.flush()
        assert await held.read() == b"HELD open throughout\n"
        assert await tool.ino(path) == ino
        assert await fs.read(0, 0, 4096, ino, None) == committed
        await fs.write(0, len(committed), b"and written after\n", ino, None)
        await fs.flush(0, ino, None)
        assert await errno_of(fs.fsync(0, False, ino)) == 0
        tool.check("the write after the refresh")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, path) == committed + b"and written after\n"
    assert as_alice(scenario, read_note, "private/notes/held.md") == b"HELD open throughout\n"
    assert as_alice(scenario, read_note, "private/notes/kept.md") == b"IS it was\n"  # committed once resumed


def test_a_rename_whose_view_cannot_be_read_suspends_the_mount_until_one_can(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A note renamed here: the catalog moves it, and the refresh after that fails. The view would go on
    showing it at its old name, and none at the new one, where a create would make a new note over the
    one moved there: the rename succeeds (it happened), the mount serves nothing until a refresh
    succeeds, and then the note is at its new name, as the catalog has it."""
    armed = _refreshes_failing(monkeypatch)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        ino = await tool.ino("private/notes/allergy.md")
        armed.append(True)
        await fs.rename(folder, b"allergy.md", folder, b"moved.md", 0, None)  # type: ignore[arg-type]
        assert not armed and not fs.mount.serving
        assert await errno_of(fs.create(folder, b"moved.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                        None)) == errno.EACCES  # type: ignore[arg-type]
        tool.check("the mount suspended")
        await fs.mount.sync()
        assert await tool.ino("private/notes/moved.md") == ino
        assert await tool.read("private/notes/moved.md") == ALICE_FACT
        assert (await fs.lookup(folder, b"allergy.md")).st_ino == 0  # absent

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/moved.md") == ALICE_FACT


def test_a_search_under_way_when_the_mount_is_suspended_is_refused(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search that began before a save's refresh failed: its hits would be checked against a view
    that lacks this mount's own write (a hit on a new note left out, one on a replaced revision
    quoting it), so it is refused as every request is while the mount is suspended, not answered
    with fewer hits. Once a refresh succeeds, the same search answers."""
    armed = _refreshes_failing(monkeypatch)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.ino(".search")
        real = fs.queries._search

        async def search_then_save(text: str, *, about: Any = None) -> Any:
            outcome = await real(text, about=about)
            armed.append(True)
            await tool.create("private/notes", "meanwhile.md", b"saved while the search ran\n")
            return outcome
        monkeypatch.setattr(fs.queries, "_search", search_then_save)
        assert await errno_of(fs.lookup(folder, b"hazelnuts")) == errno.EACCES
        assert not armed and fs.mount.suspended
        monkeypatch.setattr(fs.queries, "_search", real)
        await fs.mount.sync()
        assert fs.mount.serving
        assert b"allergy.md" in await tool.read(".search/hazelnuts")

    run_alice_mount(scenario, script)


def test_a_backup_rename_whose_commit_leaves_the_view_behind_is_refused_until_it_catches_up(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """vim renames the note it is writing to its backup name: the rename commits the note's draft first,
    and the refresh after that commit fails. The backup would be frozen to the revision the view shows,
    the one that commit replaced: the rename is refused (the commit stands), and made once the view
    reads again, the backup then holding what was committed."""
    armed = _refreshes_failing(monkeypatch)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        writing = await KernelFile.open(fs, await tool.ino("private/notes/allergy.md"), os.O_WRONLY)
        await writing.write(0, b"WRITTEN ")
        armed.append(True)
        assert await errno_of(fs.rename(folder, b"allergy.md", folder, b"allergy.md~", 0,
                                        None)) == errno.EACCES  # type: ignore[arg-type]
        assert not armed and fs.mount.suspended
        await fs.mount.sync()
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        assert await KernelFile(fs, writing.ino).read() == b"WRITTEN " + ALICE_FACT[len(b"WRITTEN "):]

    run_alice_mount(scenario, script)


def test_a_file_renamed_over_a_note_is_that_note_even_when_the_view_cannot_be_read_after(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editor's save: a temp file renamed over the note commits it. The refresh after the commit fails,
    and so does the one the rename makes next: the rename succeeds (the save happened), the mount serves
    nothing until a refresh succeeds, and the file renamed is the note (the one inode a tool holding it
    open writes to), so the note's name then leads to it, with what was committed."""
    armed = _refreshes_failing(monkeypatch)
    saved = b"saved by rename while the view could not be read\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, attr = await fs.create(folder, b".allergy.md.tmp", 0o600, os.O_WRONLY | os.O_CREAT,
                                     None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, saved)
        await fs.flush(info.fh)
        await fs.release(info.fh)
        armed.extend([True, True])
        await fs.rename(folder, b".allergy.md.tmp", folder, b"allergy.md", 0, None)  # type: ignore[arg-type]
        assert not armed and not fs.mount.serving
        tool.check("the mount suspended")
        await fs.mount.sync()
        assert await tool.ino("private/notes/allergy.md") == attr.st_ino
        assert await tool.read("private/notes/allergy.md") == saved

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/allergy.md") == saved


def test_a_write_whose_load_a_save_from_elsewhere_overtook_is_not_loaded_again(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write by inode loads a large note; meanwhile a write not made through this mount (the command
    line's) saves the note, and this mount's view shows it. The load is not made again (only a commit of
    this mount's starts it over, or a note saved often elsewhere would hold the write in the loop): the
    close puts the content loaded, with the write, over the other save, as any save through a mount does
    with what it did not read."""
    async def script(fs: ScopeFS, ino: int) -> None:
        async def save_elsewhere(note: Any) -> None:
            as_alice(scenario, write_note, "private/notes/large.md", b"saved by another session\n")
            await fs.mount.sync()
            node = fs.mount.layers.inodes.get(ino)
            shown = fs.mount.layers.note_of(node) if node is not None else None
            assert shown is not None and shown.revision_id != note.revision_id
        loads = _load_overtaken_by(monkeypatch, fs, save_elsewhere)
        await fs.write(0, 0, b"WRITTEN", ino, None)
        await fs.flush(0, ino, None)
        assert len(loads) == 1

    _large_note_written(scenario, script, {0: b"WRITTEN"})
