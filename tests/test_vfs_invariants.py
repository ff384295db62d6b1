"""The node table's invariants (``scopefs.vfs.inodes``) hold after every request of the usual save patterns.

A ``ScopeFS`` runs in this process with no kernel: the requests are made
by calling its handlers in the order a tool's system calls would reach
them, and ``inconsistencies`` is asked after each one. The kernel's page
cache is replaced by a recorder (no FUSE session exists here). Real
mounts with real editors are ``test_vfs_editors.py``; this pins the state
behind them.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable

import pyfuse3
import pytest
import trio

from scopefs.catalog.errors import Denied
from scopefs.catalog.home import Home
from scopefs.catalog.reader import read_note
from scopefs.catalog.visible import build
from scopefs.vfs.fs import ScopeFS
from scopefs.writer.rename import rename_note
from tests.conftest import ALICE_FACT, Scenario
from tests.inprocesskit import KernelFile, Tool, no_kernel

pytestmark = pytest.mark.usefixtures(no_kernel.__name__)

NOTE = "private/notes/allergy.md"


def _run(scenario: Scenario, script: Callable[[Tool], Awaitable[None]]) -> Tool:
    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session))
    tool = Tool(fs)

    async def main() -> None:
        await script(tool)
        await fs.removals.settle(everything=True)
        tool.check("settling removals")
        await fs.forget([(ino, node.lookups) for ino, node in list(fs.mount.layers.inodes.nodes.items())])
        tool.check("the kernel forgetting everything")

    try:
        trio.run(main)
    finally:
        fs.artifacts.close()
        home.close()
    return tool


def _content(scenario: Scenario, path: str = NOTE) -> bytes:
    home = Home.open(scenario.cli.home)
    try:
        return read_note(home, scenario.alice_session, path)
    finally:
        home.close()


def test_vim_save_keeps_the_invariants(scenario: Scenario) -> None:
    """vim: backup by rename, write a new file under the name, drop the backup."""
    async def script(tool: Tool) -> None:
        before = await tool.read(NOTE)
        await tool.create("private/notes", "4913", b"")  # vim's write probe
        await tool.unlink("private/notes", "4913")
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        await tool.create("private/notes", "allergy.md", before + b"more\n")
        await tool.unlink("private/notes", "allergy.md~")

    tool = _run(scenario, script)
    assert tool.steps > 15
    assert _content(scenario).endswith(b"more\n")


def test_atomic_save_and_shell_redirects_keep_the_invariants(scenario: Scenario) -> None:
    """sed -i and Python's atomic save (write a temp, rename over), ``>`` and a note created and removed."""
    async def script(tool: Tool) -> None:
        await tool.create("private/notes", "sedAb12Cd", b"atomic\n")
        await tool.rename("private/notes", "sedAb12Cd", "allergy.md")
        await tool.overwrite(NOTE, b"redirected\n")
        await tool.create("private/notes", "new.md", b"fresh\n")
        await tool.rename("private/notes", "new.md", "renamed.md")
        await tool.unlink("private/notes", "renamed.md")
        assert await tool.read(NOTE) == b"redirected\n"

    _run(scenario, script)
    assert _content(scenario) == b"redirected\n"


def test_a_backup_renamed_back_keeps_the_invariants(scenario: Scenario) -> None:
    """A note renamed to a scratch name and back is the same note, with nothing committed."""
    async def script(tool: Tool) -> None:
        await tool.rename("private/notes", "allergy.md", "allergy.md~")
        assert await tool.read("private/notes/allergy.md~") == await tool.read("private/notes/allergy.md~")
        await tool.rename("private/notes", "allergy.md~", "allergy.md")

    before = _content(scenario)
    _run(scenario, script)
    assert _content(scenario) == before


def test_a_save_follows_its_note_renamed_by_another_session(scenario: Scenario) -> None:
    """The note is renamed elsewhere while a tool has it open; its close commits to the note where it now is."""
    moved = "private/notes/allergy-moved.md"

    async def script(tool: Tool) -> None:
        held = await KernelFile.open(tool.fs, await tool.ino(NOTE), os.O_WRONLY | os.O_TRUNC)
        await held.write(0, b"saved after the move\n")
        home = Home.open(scenario.cli.home)
        try:  # another session of Alice's moves the note; this mount has not synced since
            rename_note(home, scenario.alice_session, NOTE, moved)
        finally:
            home.close()
        await held.flush()
        tool.check("close after the move")

    _run(scenario, script)
    assert _content(scenario, moved) == b"saved after the move\n"
    with pytest.raises(Denied):
        _content(scenario, NOTE)


def test_folders_made_here_move_and_folders_of_notes_do_not(scenario: Scenario) -> None:
    """An empty folder made in this mount renames; one that holds notes answers EXDEV (``mv`` then copies)."""
    async def script(tool: Tool) -> None:
        private = await tool.folder("private")
        await tool.fs.mkdir(private, b"made", 0o700, None)  # type: ignore[arg-type]
        tool.check("mkdir")
        await tool.rename("private", "made", "moved")
        assert (await tool.fs.getattr(await tool.ino("private/moved"))).st_mode & 0o40000
        with pytest.raises(pyfuse3.FUSEError) as refused:
            await tool.rename("private", "notes", "elsewhere")
        assert refused.value.errno == errno.EXDEV
        tool.check("the refused folder rename")
        await tool.fs.rmdir(private, b"moved", None)  # type: ignore[arg-type]
        tool.check("rmdir")

    _run(scenario, script)
    assert _content(scenario) == ALICE_FACT
