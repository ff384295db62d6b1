"""The look again at artifacts behind the kernel's cached pages (``vfs.reads``, ``vfs.watch``).

Whole mounts show that a tamper under cached pages becomes EIO
(``test_vfs_integrity``). Here, the two ways a mount learns of one: inotify
names the artifact written in its store (a real inotify on a real
directory), and the sweep's turns, which take a batch of cached inodes at a
time, reach every one in turn.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from scopefs.catalog.db import connect
from scopefs.vfs import reads
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.inodes import Node
from scopefs.vfs.watch import ARTIFACT_EVENTS, CATALOG_EVENTS, DirectoryWatch, commit_events
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario, artifact_path
from tests.inprocesskit import Tool, as_alice, errno_of, no_kernel, run_alice_mount
from tests.mountkit import Mounts, mounts

__all__ = ["mounts", "no_kernel"]  # fixtures, named as parameters below

NOTE, OTHER = "notes/allergy.md", "notes/garden.md"


def _tamper(path: Path) -> None:
    data = path.read_bytes()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([data[0] ^ 1]), 0)  # same size, in place
    finally:
        os.close(fd)


def test_a_watch_names_each_artifact_written_moved_removed_or_changed_to_its_group(tmp_path: Path) -> None:
    stores, catalogs = tmp_path / "store", tmp_path / "catalog"
    stores.mkdir()
    catalogs.mkdir()
    for name in ("written", "chmodded", "moved", "removed"):
        (stores / name).write_bytes(b"x")

    async def main() -> tuple[set[str], bool]:
        watch = DirectoryWatch.open()
        assert watch is not None, "inotify is part of every machine this runs on"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            assert watch.watch("artifacts", {stores}, ARTIFACT_EVENTS) == (True, True)
            assert watch.watch("catalog", {catalogs}, CATALOG_EVENTS) == (True, True)
            assert watch.watch("artifacts", {stores}, ARTIFACT_EVENTS) == (True, False)  # once only
            fd = os.open(stores / "written", os.O_WRONLY | os.O_APPEND)
            os.write(fd, b"y")
            os.close(fd)
            os.chmod(stores / "chmodded", 0o600)
            os.rename(stores / "moved", stores / "arrived")
            os.unlink(stores / "removed")
            seen: set[str] = set()
            with trio.fail_after(5):
                while not {"written", "chmodded", "moved", "arrived", "removed"} <= seen:
                    names = await watch.changed("artifacts")
                    assert names is not None  # no overflow with five events
                    seen |= names
            catalog_told = False
            with trio.move_on_after(0.3):
                await watch.changed("catalog")
                catalog_told = True
            nursery.cancel_scope.cancel()
        return seen, catalog_told

    seen, catalog_told = trio.run(main)
    assert seen == {"written", "chmodded", "moved", "arrived", "removed"}
    assert not catalog_told  # nothing changed among the catalogs: that group was not woken


def test_a_catalog_watch_wakes_for_commits_not_for_checkpoints_or_other_files(tmp_path: Path) -> None:
    """Only a write to a write-ahead log, or a database made or removed, wakes the catalog group.

    A checkpoint writes committed pages into the database file and
    changes nothing a view shows; counted, it woke every mount many times
    during another mount's ``grep -r``. A real SQLite database in WAL mode.

    Each act is followed by a file written in a second watched folder, and
    the test waits for that one: inotify keeps one queue per descriptor in
    the order things happened, so once the barrier is handed out, whatever
    the act reported has been too. A fixed wait instead (0.3 s) let a slow
    CI machine's commit arrive during the next act and be counted for it.
    """
    catalogs, barrier = tmp_path / "catalogs", tmp_path / "barrier"
    catalogs.mkdir()
    barrier.mkdir()
    conn = connect(catalogs / "state.sqlite", create=True)
    conn.execute("CREATE TABLE t (x)")

    async def main() -> list[str]:
        watch = DirectoryWatch.open()
        assert watch is not None, "inotify is part of every machine this runs on"
        woke: list[str] = []

        async def woken_by(what: str, act: object) -> None:
            assert callable(act)
            act()
            (barrier / what).write_text("")
            seen: set[str] = set()
            with trio.fail_after(10):
                while what not in seen:
                    seen |= await watch.changed("barrier") or {what}  # None: overflowed, so all was handed out
            if watch.consume("catalog"):
                woke.append(what)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            assert watch.watch("catalog", {catalogs}, CATALOG_EVENTS, commit_events) == (True, True)
            assert watch.watch("barrier", {barrier}, CATALOG_EVENTS) == (True, True)
            await woken_by("commit", lambda: conn.execute("INSERT INTO t VALUES (1)"))
            await woken_by("checkpoint", lambda: conn.execute("PRAGMA wal_checkpoint(PASSIVE)"))
            await woken_by("other file", lambda: (catalogs / "notes.txt").write_text("x"))
            await woken_by("another commit", lambda: conn.execute("INSERT INTO t VALUES (2)"))
            await woken_by("a database made", lambda: connect(catalogs / "other.sqlite", create=True).close())
            nursery.cancel_scope.cancel()
        return woke

    try:
        woke = trio.run(main)
    finally:
        conn.close()
    assert woke == ["commit", "another commit", "a database made"]
    assert commit_events(0x002, "state.sqlite-wal") and not commit_events(0x002, "state.sqlite")


def test_a_mount_holds_one_inotify_instance(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    """The kernel allows a user 128 instances and a gateway runs 100 mounts: a mount that could not get
    one would poll its catalog ten times a second (100 such mounts took half a CPU between them)."""
    where = mounts.mount(scenario.alice_session)
    assert (where / "private" / NOTE).read_bytes() == ALICE_FACT  # its artifact store is watched too now
    pid = _server_pid(where)
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert links.count("anon_inode:inotify") == 1


def _server_pid(where: Path) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"scopefs.vfs.server" in argv and os.fsencode(str(where)) in argv:
                return int(entry)
    raise AssertionError("no server process for the mount")


def verified(node: Node) -> object:
    """``node.verified`` read afresh: mypy would keep an ``assert`` on it narrowed across an ``await``."""
    return node.verified


@pytest.mark.usefixtures("no_kernel")
def test_a_named_artifact_is_looked_at_at_once_and_an_unrelated_name_changes_nothing(scenario: Scenario) -> None:
    home = scenario.cli.home

    async def script(fs: ScopeFS, tool: Tool) -> None:
        assert await tool.read(f"private/{NOTE}") == ALICE_FACT
        node = fs.mount.layers.inodes.get(await tool.ino(f"private/{NOTE}"))
        assert node is not None and node.verified is not None
        artifact = artifact_path(home, scenario.alice, NOTE)
        _tamper(artifact)
        await fs.reads.recheck_named({"not-an-artifact-of-this-view"})
        assert node.verified is not None  # nothing named it: still the verified pages
        await fs.reads.recheck_named({artifact.name})
        assert verified(node) is None  # its pages are to be dropped, and the next READ verifies afresh
        assert await errno_of(tool.read(f"private/{NOTE}")) == errno.EIO

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures("no_kernel")
def test_the_sweep_reaches_every_cached_artifact_in_turns(scenario: Scenario,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    home = scenario.cli.home
    as_alice(scenario, write_note, f"private/{OTHER}", b"tomatoes by the wall\n")
    monkeypatch.setattr(reads, "SWEEP_BATCH", 1)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        nodes = []
        for path in (NOTE, OTHER):
            await tool.read(f"private/{path}")
            node = fs.mount.layers.inodes.get(await tool.ino(f"private/{path}"))
            assert node is not None and node.verified is not None
            nodes.append(node)
        _tamper(artifact_path(home, scenario.alice, OTHER))
        turns = 0
        while nodes[1].verified is not None:
            await fs.reads.recheck()
            turns += 1
            assert turns <= 2, "two cached inodes, one per turn: the second turn at the latest"
        assert nodes[0].verified is not None  # the untouched note keeps its pages

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures("no_kernel")
def test_every_cached_name_of_a_named_artifact_is_looked_at(scenario: Scenario) -> None:
    """vim's backup (the note renamed to a scratch name, then written anew under its name) can hold the
    same revision, and so the same artifact, as another cached inode: inotify's name reaches them all."""
    home = scenario.cli.home
    artifact = artifact_path(home, scenario.alice, NOTE)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        assert await tool.read(f"private/{NOTE}") == ALICE_FACT
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        await tool.create("private/notes", "allergy.md", ALICE_FACT)  # the same bytes: no new revision
        assert await tool.read("private/notes/allergy.md~") == ALICE_FACT
        assert await tool.read(f"private/{NOTE}") == ALICE_FACT
        sharing = [node for node in fs.mount.layers.inodes.nodes.values()
                   if node.verified is not None and node.verified[0].locator == artifact.name]
        assert len(sharing) == 2, "the backup and the note: two cached inodes of one artifact"
        _tamper(artifact)
        await fs.reads.recheck_named({artifact.name})
        assert all(node.verified is None for node in sharing)

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures("no_kernel")
def test_a_node_read_again_after_its_pages_were_dropped_is_looked_at_again(scenario: Scenario,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's pages are dropped while its reader stays (a rename by another session, a policy change:
    ``forget_pages``), and it is read again from that reader: its pages are cached again, so its
    artifact must be looked at again. The old code left it out of the sweep and of inotify's names
    for good, so a tamper under those pages was never found."""
    home = scenario.cli.home
    artifact = artifact_path(home, scenario.alice, NOTE)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        assert await tool.read(f"private/{NOTE}") == ALICE_FACT
        node = fs.mount.node(await tool.ino(f"private/{NOTE}"))
        fs.mount.kernel.forget_pages(node)  # as a view change that keeps the revision does: verified is None
        assert await tool.read(f"private/{NOTE}") == ALICE_FACT  # from the reader it kept
        assert node.verified is not None, "its pages are cached again, but its artifact is looked at no more"
        dropped: list[Node] = []
        forget = fs.mount.kernel.forget_pages

        def recorded(dropping: Node) -> None:
            dropped.append(dropping)
            forget(dropping)
        monkeypatch.setattr(fs.mount.kernel, "forget_pages", recorded)
        _tamper(artifact)
        await fs.reads.recheck_named({artifact.name})
        assert dropped == [node], "the tamper under the pages cached again went unseen"
        assert await errno_of(tool.read(f"private/{NOTE}")) == errno.EIO

    run_alice_mount(scenario, script)
