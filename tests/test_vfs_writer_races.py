"""Writes that land while a writer is let go, and writers whose sandbox went meanwhile: nothing is lost
with a close answering 0, and nothing a dismissed sandbox wrote after a refusal is committed.

Each case is an interleaving an independent review found by reading the
write path (``vfs.writers``, ``vfs.commits``); each test fails on the code
before its fix. A ``ScopeFS`` runs in this process (``tests.inprocesskit``);
the catalog thread is held inside a commit to open the window, as a busy
mount's catalog thread holds it.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
from typing import Any

import pyfuse3
import pytest
import trio
import trio.testing

from scopefs.catalog.errors import Denied, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.reader import read_note
from scopefs.catalog.reasons import Reason
from scopefs.catalog.visible import build
from scopefs.vfs import catalog_ops
from scopefs.vfs.errors import fail
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.handles import REVOKED, Handle
from scopefs.writer.transaction import write_note
from tests.conftest import ACCOUNT, ALICE_FACT, ALICE_SENDER, CHANNEL, Scenario
from tests.inprocesskit import KernelFile, Tool, as_alice, errno_of, no_kernel, run_alice_mount
from tests.mountkit import unsynced_paths
from tests.test_vfs_draft_lifetime import _drop_begun, _fails, _idle_writer, _touched, _while_committing

pytestmark = pytest.mark.usefixtures(no_kernel.__name__)

PATH = "private/notes/allergy.md"


async def _forsaken(fs: ScopeFS, handle: Handle, monkeypatch: pytest.MonkeyPatch) -> None:
    """``handle``, an idle writer, made forsaken: the settle's commit of it refused, so it is kept for a
    close to hear of it; then its sandbox dismissed (as ``HandleTable.revoke`` marks its handles)."""
    with monkeypatch.context() as patch:
        patch.setattr(catalog_ops, "commit", functools.partial(_fails, Denied(Reason.EXPLICIT_DENY)))
        await fs.commits.writers.settle()
    assert handle.kept_since is not None
    handle.pid_namespace = REVOKED


def test_writes_through_a_created_file_s_handle_while_the_settle_commits_it_are_kept(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A created file's writer pauses past ``WRITER_IDLE_S``; the settle lets go of it and commits
    what it holds; the process writes on through the handle its create gave while that commit runs.
    The old code put those bytes in the draft the release then closed: gone, the next write by inode
    started from the commit, and the gap read as zeros, the close answering 0."""
    first, during, last = b"A" * 100, b"B" * 50, b"C" * 20

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, attributes = await fs.create(folder, b"paused.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                           None)  # type: ignore[arg-type]
        fh, ino = info.fh, attributes.st_ino
        await fs.write(fh, 0, first, ino, None)
        handle = fs.mount.handles.get(fh)
        assert handle is not None
        handle.used -= 10.0  # as if its last write were long ago

        async def writes_on(nursery: trio.Nursery) -> None:
            await fs.write(fh, len(first), during, ino, None)

        await _while_committing(fs.commits.writers.settle, writes_on, monkeypatch)
        await fs.write(fh, len(first) + len(during), last, ino, None)
        await fs.flush(fh, ino, None)
        tool.check("the settle, the writes and the close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/paused.md") == first + during + last


def test_a_close_whose_release_cannot_commit_what_was_written_during_its_commit_fails(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close commits; another process writes through the same writer meanwhile; the close's
    release commits those writes once more, and that commit fails: they are gone, so the close
    must say so. The old code answered 0 (and the other process's close was answered 0 in C, its
    inode no longer wanting a close)."""
    calls: list[int] = []
    real_commit = catalog_ops.commit

    def only_the_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise StorageError("injected: the catalog cannot be written")
        return real_commit(*args, **kwargs)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, writer, _, _ = await _idle_writer(fs, tool, PATH, b"written first\n")
        other = await KernelFile.open(fs, ino, os.O_WRONLY)
        closes: list[int] = []

        async def close() -> None:
            closes.append(await errno_of(writer.flush()))

        async def writes_meanwhile(nursery: trio.Nursery) -> None:
            await other.write(0, b"SECOND")

        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "commit", only_the_first)
            await _while_committing(close, writes_meanwhile, monkeypatch)
        assert len(calls) == 2 and closes == [errno.EIO]
        tool.check("the close and its failed release")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, PATH) == ALICE_FACT + b"written first\n"  # the first commit


@pytest.mark.parametrize("by", ["an unmount's settle", "another process's close", "an fsync"])
def test_a_writer_kept_for_a_dismissed_sandbox_is_never_committed(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, by: str) -> None:
    """A sandbox's writer whose settle commit was refused is kept; then the sandbox is dismissed (an
    unmount dismisses every sandbox before its settle). Whatever comes next must let it go
    uncommitted, even once a commit would be allowed: the old code's unmount settle, and any close or
    fsync of the inode (a reader's, another sandbox's), committed what it wrote after the refusal."""
    written = b"written in a sandbox, refused, then the sandbox dismissed\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, _, node, handle = await _idle_writer(fs, tool, PATH, written)
        await _forsaken(fs, handle, monkeypatch)
        if by == "an unmount's settle":
            await fs.commits.writers.settle(everything=True)
        elif by == "another process's close":
            await KernelFile(fs, ino).flush()
        else:
            await fs.fsync(0, False, ino)
        assert fs.commits.writers.writer_of(node) is None and node.draft is None
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check(f"the dismissed sandbox's writer, then {by}")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, PATH) == ALICE_FACT


def test_a_write_whose_sandbox_is_dismissed_while_its_draft_loads_leaves_no_draft(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first write of a note loads its draft, and the sandbox that wrote is dismissed meanwhile:
    no handle is given. The draft must not stay behind: the old code kept it, with nobody to close
    it, and served it in place of the note, so a save from elsewhere never showed here (and the next
    writer would have started from it, putting the old content back over that save)."""
    saved_elsewhere = b"saved by another session of Alice's\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino = await tool.ino(PATH)
        node = fs.mount.node(ino)
        callers = fs.mount.callers

        def dismissed(handle: Any) -> int:
            raise fail(errno.EACCES)

        with monkeypatch.context() as patch:
            patch.setattr(callers, "give", dismissed)
            assert await errno_of(KernelFile(fs, ino).write(0, b"refused")) == errno.EACCES
        assert node.draft is None
        as_alice(scenario, write_note, PATH, saved_elsewhere)
        await fs.mount.sync()
        _drop_begun(node)
        assert await KernelFile(fs, ino).read() == saved_elsewhere
        tool.check("the refused write and the save from elsewhere")

    run_alice_mount(scenario, script)


def test_a_deposit_written_to_while_it_is_filed_keeps_those_writes(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deposit's close files its bytes; a write through the same file lands while the filing runs.
    The old code marked the draft clean after the filing, so that write went with nobody told, the
    close answering 0. Now the draft stays dirty, as a note's save keeps what lands during its
    commit; the release that follows the close tries to file it, which the postbox refuses (a
    message handle files once), and the close answers that refusal: what it wrote was not all filed."""
    scenario.cli.j("postbox", "enable", scenario.alice)
    handle_name = str(scenario.cli.j("message", "add", scenario.group_session, "--channel", CHANNEL,
                                     "--account", ACCOUNT, "--sender", ALICE_SENDER)["message_handle"])
    reached, go_on = threading.Event(), threading.Event()
    real_deposit = catalog_ops.deposit
    filed: list[bytes] = []

    def held(home: Any, session_id: str, handle: str, data: bytes) -> Any:
        filed.append(data)
        done = real_deposit(home, session_id, handle, data)
        if len(filed) == 1:
            reached.set()
            assert go_on.wait(timeout=60), "the test never let the catalog thread go on"
        return done

    async def script(fs: ScopeFS) -> None:
        box = (await fs.lookup(pyfuse3.ROOT_INODE, b"postbox")).st_ino
        info, attributes = await fs.create(box, f"{handle_name}.md".encode(), 0o600,
                                           os.O_WRONLY | os.O_CREAT, None)  # type: ignore[arg-type]
        fh, ino = info.fh, attributes.st_ino
        await fs.write(fh, 0, b"an observation\n", ino, None)
        node = fs.mount.layers.inodes.get(ino)
        assert node is not None and node.draft is not None
        closes: list[int] = []

        async def close() -> None:
            closes.append(await errno_of(fs.flush(fh, ino, None)))

        with monkeypatch.context() as patch:
            patch.setattr(catalog_ops, "deposit", held)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(close)
                try:
                    assert await trio.to_thread.run_sync(reached.wait, 60)
                    await fs.write(fh, 15, b"and more\n", ino, None)
                finally:
                    go_on.set()
        assert closes == [errno.EACCES]

    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.group_session, build(home, scenario.group_session))
    try:
        trio.run(script, fs)
    finally:
        fs.artifacts.close()
        home.close()
    assert filed == [b"an observation\n", b"an observation\nand more\n"]


def test_a_folder_s_fsync_waits_for_a_commit_the_settle_began_while_it_waited(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``touch a b; fsync(folder)``: the fsync waits for ``a``'s commit under way; meanwhile the settle
    lets go of ``b``'s idle writer and begins its commit. The fsync, which looked for commits under
    way only before it waited, then passed ``b`` over (no longer a registered writer) and synced
    before ``b``'s commit landed: unsynced after an fsync that answered 0."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder, first_fh, _ = await _touched(fs, tool)
        info, attributes = await fs.create(folder, b"later.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                           None)  # type: ignore[arg-type]
        await fs.flush(info.fh, attributes.st_ino, None)
        later = fs.mount.handles.get(info.fh)
        assert later is not None
        later.used -= 10.0  # idle: the settle lets go of it
        synced: list[bool] = []

        async def fsyncdir() -> None:
            await fs.fsyncdir(0, False, folder)
            synced.append(fs.mount.layers.note_of(later.node) is not None)

        async def fsync_then_settle(nursery: trio.Nursery) -> None:
            nursery.start_soon(fsyncdir)
            await trio.testing.wait_all_tasks_blocked()  # it waits for touched.md's commit
            nursery.start_soon(fs.commits.writers.settle)
            await trio.testing.wait_all_tasks_blocked()  # later.md's commit waits behind it

        await _while_committing(functools.partial(fs.release, first_fh), fsync_then_settle, monkeypatch)
        assert synced == [True]
        tool.check("the fsync of the folder and the settle")

    run_alice_mount(scenario, script)
    assert "notes/later.md" not in unsynced_paths(scenario.cli.home)


def test_a_write_into_a_writer_kept_for_a_dismissed_sandbox_starts_a_writer_of_its_own(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer kept after a refused settle belongs to a sandbox since dismissed; another process (the
    session's next sandbox, say) then writes the note. Its bytes must not land in the forsaken draft,
    which is let go uncommitted: they start a writer of their own, from the note, and its close
    commits them. (A first version of the forsaken writer's let-go dropped them, the close answering 0.)"""
    refused_bytes = b"refused, then its sandbox dismissed\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, _, _, handle = await _idle_writer(fs, tool, PATH, refused_bytes)
        await _forsaken(fs, handle, monkeypatch)
        other = await KernelFile.open(fs, ino, os.O_WRONLY)
        await other.write(0, b"NEXT")
        await other.flush()
        tool.check("the next process's write and close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, PATH) == b"NEXT" + ALICE_FACT[4:]


def test_a_backup_whose_writer_s_sandbox_is_dismissed_while_it_loads_keeps_its_content(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scratch file frozen to a revision (a backup) is written by a sandbox dismissed while its draft
    loads: the draft made is the backup's content now (it is frozen no more), so it stays. (A first
    version dropped it, leaving the backup with neither: empty, unreadable.)"""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        ino = await tool.ino("private/notes/allergy.md~")

        def dismissed(handle: Any) -> int:
            raise fail(errno.EACCES)

        with monkeypatch.context() as patch:
            patch.setattr(fs.mount.callers, "give", dismissed)
            assert await errno_of(KernelFile(fs, ino).write(0, b"refused")) == errno.EACCES
        assert await KernelFile(fs, ino).read() == ALICE_FACT
        tool.check("the refused write into the backup")

    run_alice_mount(scenario, script)


def test_a_truncation_by_path_starts_from_the_note_not_from_a_forsaken_writer_s_draft(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``truncate -s N note`` while a writer kept for a dismissed sandbox still holds its refused bytes:
    the truncation commits at once, and must commit the note cut to N, not those bytes (the old code
    truncated and committed the forsaken draft)."""
    refused_bytes = b"REFUSED, then its sandbox dismissed\n"

    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, _, _, handle = await _idle_writer(fs, tool, PATH, b"")
        await KernelFile(fs, ino).write(0, refused_bytes)
        handle.used -= 10.0
        await _forsaken(fs, handle, monkeypatch)
        await fs.commits.truncate(fs.mount.node(ino), 10, by_path=True)
        tool.check("the truncation by path")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, PATH) == ALICE_FACT[:10]


def test_a_forsaken_writer_s_draft_is_never_committed_whoever_holds_it(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that took a forsaken writer's draft over (while that writer was let go and a commit
    held the note's lock) holds the dismissed sandbox's refused bytes with its own: its close is
    refused, and nothing of it is committed."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        ino, writer, node, handle = await _idle_writer(fs, tool, PATH, b"refused\n")
        await _forsaken(fs, handle, monkeypatch)
        fs.commits.writers.unregister(node, fs.commits.writers.fh_of(node) or 0)  # as the let-go left it
        taken_over = await fs.commits.writer(node, None)  # found no writer: took the draft as it was
        assert taken_over is not handle
        assert await errno_of(writer.flush()) == errno.EACCES
        tool.check("the taken-over draft's close")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, PATH) == ALICE_FACT


def test_a_rename_of_a_note_a_forsaken_writer_held_moves_the_note_as_committed(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mv note other`` while a writer kept for a dismissed sandbox still holds refused bytes: the move
    commits the note's draft first, and must neither commit those bytes nor fail over them."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        _, _, _, handle = await _idle_writer(fs, tool, PATH, b"refused, then dismissed\n")
        await _forsaken(fs, handle, monkeypatch)
        await tool.rename("private/notes", "allergy.md", "moved.md")

    run_alice_mount(scenario, script)
    assert as_alice(scenario, read_note, "private/notes/moved.md") == ALICE_FACT


def test_a_rename_of_a_new_note_a_forsaken_writer_held_finds_nothing_to_move(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new note, never committed, whose writer was kept after a refused settle and whose sandbox was
    then dismissed: a rename of it (another process's ``mv``) must not commit those bytes at the new
    name. The writer is let go uncommitted, so the note never was: ENOENT, as after a refused first
    commit."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.folder("private/notes")
        info, attributes = await fs.create(folder, b"new.md", 0o600, os.O_WRONLY | os.O_CREAT,
                                           None)  # type: ignore[arg-type]
        await fs.write(info.fh, 0, b"refused, then its sandbox dismissed\n", attributes.st_ino, None)
        handle = fs.mount.handles.get(info.fh)
        assert handle is not None
        handle.used -= 10.0
        await _forsaken(fs, handle, monkeypatch)
        assert await errno_of(fs.rename(folder, b"new.md", folder, b"final.md", 0,
                                        None)) == errno.ENOENT  # type: ignore[arg-type]
        tool.check("the rename of the forsaken new note")

    run_alice_mount(scenario, script)
    for path in ("private/notes/new.md", "private/notes/final.md"):
        with pytest.raises(Denied):
            as_alice(scenario, read_note, path)
