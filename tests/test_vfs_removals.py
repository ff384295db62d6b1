"""Removals through a mount: a removed note never shows again while its tombstone is committed.

An ``rm -r`` of a freshly copied tree once failed with ENOTEMPTY on a
folder that ``ls`` then showed empty: the background settle forgot each
removal as soon as its tombstone committed but read the view only after
the whole batch, so for that long the note was neither hidden nor gone.
These tests run a ``ScopeFS`` in this process (``tests.inprocesskit``) and
look at the mount between every two of the settle's steps.
"""

from __future__ import annotations

import errno

import pyfuse3
import pytest
import trio
import trio.lowlevel

from scopefs.catalog import visible
from scopefs.catalog.errors import Denied, StorageError
from scopefs.vfs import catalog_ops
from scopefs.vfs import mount as mount_module
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.layers import REMOVAL_GRACE_S
from tests.conftest import Scenario
from tests.inprocesskit import Tool, as_alice, no_kernel, run_alice_mount

pytestmark = pytest.mark.usefixtures(no_kernel.__name__)

FOLDER = ("private", "many")
NOTES = [f"n{i}.md" for i in range(8)]


async def _fill_and_remove(fs: ScopeFS, tool: Tool, names: list[str]) -> None:
    """Make ``private/many`` holding ``names``, unlink them all, and wait out their grace period."""
    await fs.mkdir(await tool.folder("private"), FOLDER[-1].encode(), 0o700, None)  # type: ignore[arg-type]
    for name in names:
        await tool.create("private/many", name, f"note {name}\n".encode())
    for name in names:
        await tool.unlink("private/many", name)
    await trio.sleep(REMOVAL_GRACE_S + 0.05)


async def _settle_watching(fs: ScopeFS) -> list[list[str]]:
    """Settle the due removals, and what the folder lists between every two steps of it."""
    seen: list[list[str]] = []
    done = trio.Event()

    async def settle() -> None:
        await fs.removals.settle()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle)
        while not done.is_set():
            seen.append(fs.mount.layers.names(FOLDER))
            await trio.lowlevel.checkpoint()
    return seen


def _read(scenario: Scenario, name: str) -> bytes:
    from scopefs.catalog.reader import read_note
    data: bytes = as_alice(scenario, read_note, "/".join(FOLDER + (name,)))
    return data


def test_a_settling_removal_is_never_shown_again(scenario: Scenario) -> None:
    """Between every two steps of a settle of many removals, the folder lists none of the notes."""
    seen: list[list[str]] = []

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await _fill_and_remove(fs, tool, NOTES)
        seen.extend(await _settle_watching(fs))
        tool.check("the settle")
        assert not fs.mount.layers.removed
        await fs.rmdir(await tool.folder("private"), FOLDER[-1].encode(), None)  # type: ignore[arg-type]

    run_alice_mount(scenario, script)
    assert len(seen) > len(NOTES)  # looked while each tombstone was on its way
    assert [names for names in seen if names] == []
    for name in NOTES:
        with pytest.raises(Denied):
            _read(scenario, name)


def test_rmdir_waits_for_a_removal_in_flight_under_it(scenario: Scenario) -> None:
    """``rmdir`` while the background settle commits the folder's last note: it returns once that note is gone."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await _fill_and_remove(fs, tool, NOTES[:1])
        (removal,) = fs.mount.layers.removed.values()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.removals.settle)
            while not removal.in_flight:  # noqa: ASYNC110 - the flag is the settle's own; nothing signals it
                await trio.lowlevel.checkpoint()
            await fs.rmdir(await tool.folder("private"), FOLDER[-1].encode(), None)  # type: ignore[arg-type]
            assert removal.settled.is_set()
            assert not fs.mount.layers.removed
            assert fs.mount.layers.lookup(FOLDER) is None
        tool.check("rmdir")

    run_alice_mount(scenario, script)
    with pytest.raises(Denied):
        _read(scenario, NOTES[0])


def test_a_rename_onto_a_note_whose_removal_is_in_flight_waits_for_it(scenario: Scenario) -> None:
    """``mv a b`` about a second after ``rm b``, while the settle commits b's tombstone: the old code answered
    EAGAIN, which ``mv`` does not retry (the tree exerciser's single writer could meet it)."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await _fill_and_remove(fs, tool, NOTES[:1])  # n0.md unlinked, its grace over
        await tool.create("private/many", "moved.md", b"moved onto n0\n")
        (removal,) = fs.mount.layers.removed.values()
        folder = await tool.folder("private/many")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fs.removals.settle)
            while not removal.in_flight:  # noqa: ASYNC110 - the flag is the settle's own; nothing signals it
                await trio.lowlevel.checkpoint()
            await fs.rename(folder, b"moved.md", folder, NOTES[0].encode(), 0, None)  # type: ignore[arg-type]
            assert removal.settled.is_set()
        tool.check("the rename")
        assert fs.mount.layers.names(FOLDER) == [NOTES[0]]

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTES[0]) == b"moved onto n0\n"
    with pytest.raises(Denied):
        _read(scenario, "moved.md")


def test_rmdir_of_a_folder_whose_removal_was_refused_is_not_empty(scenario: Scenario,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A tombstone the catalog refuses leaves the note, and so its folder: rmdir answers ENOTEMPTY."""
    async def script(fs: ScopeFS, tool: Tool) -> None:
        await _fill_and_remove(fs, tool, NOTES[:1])

        def refused(*args: object) -> bool:
            raise StorageError("injected: the tombstone's commit failed")

        monkeypatch.setattr(catalog_ops, "remove", refused)
        with pytest.raises(pyfuse3.FUSEError) as answer:
            await fs.rmdir(await tool.folder("private"), FOLDER[-1].encode(), None)  # type: ignore[arg-type]
        assert answer.value.errno == errno.ENOTEMPTY
        assert fs.mount.layers.names(FOLDER) == NOTES[:1]
        tool.check("the refused rmdir")

    run_alice_mount(scenario, script)
    assert _read(scenario, NOTES[0]) == f"note {NOTES[0]}\n".encode()


def test_a_tombstone_whose_view_refresh_failed_stays_hidden(scenario: Scenario,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The view after a tombstone could not be read: the note stays hidden until one without it is applied."""
    seen: list[list[str]] = []
    failed: list[bool] = []
    real_refresh = visible.refresh  # what the mount calls, by the name monkeypatched below

    def refresh(home: object, view: object) -> object:
        if not failed:
            failed.append(True)
            raise OSError("injected: the view refresh after the tombstone failed")
        return real_refresh(home, view)  # type: ignore[arg-type]

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await _fill_and_remove(fs, tool, NOTES[:3])
        monkeypatch.setattr(mount_module, "refresh", refresh)
        seen.extend(await _settle_watching(fs))
        await fs.mount.sync()
        assert not fs.mount.layers.removed and not fs.mount.layers.tombstoned
        tool.check("the settle")

    run_alice_mount(scenario, script)
    assert failed == [True]
    assert [names for names in seen if names] == []
    for name in NOTES[:3]:
        with pytest.raises(Denied):
            _read(scenario, name)
