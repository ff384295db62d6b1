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

from scopefs.vfs import reads
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.watch import ARTIFACT_EVENTS, DirectoryWatch
from scopefs.writer.transaction import write_note
from tests.conftest import ALICE_FACT, Scenario, artifact_path
from tests.inprocesskit import Tool, as_alice, errno_of, no_kernel, run_alice_mount

__all__ = ["no_kernel"]

NOTE, OTHER = "notes/allergy.md", "notes/garden.md"


def _tamper(path: Path) -> None:
    data = path.read_bytes()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([data[0] ^ 1]), 0)  # same size, in place
    finally:
        os.close(fd)


def test_a_watch_names_each_artifact_written_moved_removed_or_changed(tmp_path: Path) -> None:
    for name in ("written", "chmodded", "moved", "removed"):
        (tmp_path / name).write_bytes(b"x")

    async def main() -> set[str]:
        watch = DirectoryWatch.open(ARTIFACT_EVENTS)
        assert watch is not None, "inotify is part of every machine this runs on"
        try:
            assert watch.watch({tmp_path}) == (True, True)
            fd = os.open(tmp_path / "written", os.O_WRONLY | os.O_APPEND)
            os.write(fd, b"y")
            os.close(fd)
            os.chmod(tmp_path / "chmodded", 0o600)
            os.rename(tmp_path / "moved", tmp_path / "arrived")
            os.unlink(tmp_path / "removed")
            seen: set[str] = set()
            with trio.fail_after(5):
                while not {"written", "chmodded", "moved", "arrived", "removed"} <= seen:
                    names = await watch.changed_names()
                    assert names is not None  # no overflow with five events
                    seen |= names
            return seen
        finally:
            watch.close()

    assert trio.run(main) == {"written", "chmodded", "moved", "arrived", "removed"}


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
        assert node.verified is None  # its pages are to be dropped, and the next READ verifies afresh
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
