"""Listings read in pieces each go on in the names they began with (``vfs.listings``).

No OPENDIR reaches a mount, so a listing is known only by the offsets it
was given. Two listings of one folder read in pieces at once, with the
view moving between them, used to share one snapshot per folder: the
second replaced the first one's, and the first one's next piece skipped a
note that stayed.
"""

from __future__ import annotations

import pytest

from scopefs.vfs import listings
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.listings import KEEP, Listings
from scopefs.writer.tombstone import delete_note
from scopefs.writer.transaction import write_note
from tests.conftest import Scenario
from tests.inprocesskit import Tool, as_alice, listed_in_pieces, no_kernel, run_alice_mount


@pytest.mark.usefixtures(no_kernel.__name__)
@pytest.mark.parametrize("folder_path", ["private/notes", ".history/private/notes"])
def test_two_listings_read_in_pieces_each_go_on_in_their_own_names(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch, folder_path: str) -> None:
    """Listing A answers one note; another session deletes it; listing B of the same folder starts and
    answers the names left. A's next piece goes on in A's names, each looked up in the view now: the
    notes that stayed are answered, none skipped (before, B's names had replaced A's, and A's place in
    them was one too far: b.md was skipped)."""
    for name in ("b.md", "c.md"):
        as_alice(scenario, write_note, f"private/notes/{name}", b"one more note\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.ino(folder_path)
        listed, room = listed_in_pieces(monkeypatch)
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["allergy.md"]
        a_goes_on_at = listed[-1][1]
        as_alice(scenario, delete_note, "private/notes/allergy.md")
        await fs.sync()
        listed.clear()
        room[0] = 10
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["b.md", "c.md"]
        listed.clear()
        room[0] = 10
        await fs.readdir(0, a_goes_on_at, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["b.md", "c.md"]
        tool.check("two listings in pieces")

    run_alice_mount(scenario, script)


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_listing_whose_snapshot_was_forgotten_goes_on_from_its_place_in_a_fresh_one(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """``KEEP`` listings begun since forget the first one's snapshot: its next piece goes on from its
    place in the folder's names now, neither failing nor starting again."""
    for name in ("b.md", "c.md"):
        as_alice(scenario, write_note, f"private/notes/{name}", b"one more note\n")

    async def script(fs: ScopeFS, tool: Tool) -> None:
        folder = await tool.ino("private/notes")
        listed, room = listed_in_pieces(monkeypatch)
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["allergy.md"]
        goes_on_at = listed[-1][1]
        for _ in range(KEEP):
            room[0] = 1
            await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        listed.clear()
        room[0] = 10
        await fs.readdir(0, goes_on_at, None, folder)  # type: ignore[arg-type]
        assert [name for name, _ in listed] == ["b.md", "c.md"]
        assert all(listings.place(next_at) in (2, 3) for _, next_at in listed)
        assert listed[0][1] >> listings.PLACE_BITS != goes_on_at >> listings.PLACE_BITS  # a fresh snapshot's
        tool.check("a forgotten listing's rest")

    run_alice_mount(scenario, script)


def at(number: int, place: int) -> int:
    """``listings.offset``, for places that fit."""
    found = listings.offset(number, place)
    assert found is not None
    return found


def test_a_listing_is_found_again_only_by_its_own_offsets() -> None:
    kept: Listings[str] = Listings()
    first = kept.start(7, "first")
    second = kept.start(7, "second")
    assert first != second
    assert kept.find(7, at(first, 3)) == (first, "first")
    assert kept.find(7, at(second, 1)) == (second, "second")
    assert listings.place(at(second, 5)) == 5
    assert kept.find(7, 0) is None  # every listing starts at 0: a new one
    assert kept.find(8, at(first, 3)) is None  # another folder's listing
    kept.drop(7, lambda snapshot: snapshot == "first")
    assert kept.find(7, at(first, 3)) is None
    assert kept.find(7, at(second, 1)) == (second, "second")


def test_the_least_recently_read_listing_is_forgotten_first() -> None:
    kept: Listings[int] = Listings()
    numbers = [kept.start(1, n) for n in range(KEEP)]
    assert kept.find(1, at(numbers[0], 1)) is not None  # read again: kept longest now
    kept.start(1, KEEP)
    assert kept.find(1, at(numbers[1], 1)) is None
    assert kept.find(1, at(numbers[0], 1)) is not None


def test_offsets_fit_a_32_bit_program_s_off_t() -> None:
    """A 32-bit program's ``readdir`` drops an entry whose offset does not fit its ``off_t``: numbers
    wrap, and a place that does not fit ends the listing (None) rather than answering such an offset."""
    kept: Listings[str] = Listings()
    numbers = [kept.start(1, str(n)) for n in range(300)]
    assert set(numbers) == set(range(1, 128))  # 127 numbers, then the first again
    largest = listings.offset(max(numbers), listings.MAX_PLACE)
    assert largest is not None and 0 < largest < 1 << 31
    assert listings.place(largest) == listings.MAX_PLACE
    assert listings.offset(1, listings.MAX_PLACE + 1) is None


@pytest.mark.usefixtures(no_kernel.__name__)
def test_a_note_s_history_read_one_revision_a_piece_lists_each_once_in_order(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A note's ``.history`` folder is sorted once when its listing starts, and each piece goes on from
    its place by bisection (it was sorted and scanned whole for every piece: a listing of n revisions
    cost n² steps). Read one name a piece, it answers what one piece answers, once each, in order."""
    for number in range(6):
        as_alice(scenario, write_note, "private/notes/allergy.md", b"revision %d\n" % number)

    async def script(fs: ScopeFS, tool: Tool) -> None:
        await fs.sync()
        folder = await tool.ino(".history/private/notes/allergy.md")
        listed, room = listed_in_pieces(monkeypatch)
        room[0] = 100
        await fs.readdir(0, 0, None, folder)  # type: ignore[arg-type]
        whole = [name for name, _ in listed]
        assert len(whole) == 7
        listed.clear()
        goes_on_at = 0
        for _ in range(2 * len(whole)):  # bounded: a piece that answers again what it answered fails below
            room[0] = 1
            await fs.readdir(0, goes_on_at, None, folder)  # type: ignore[arg-type]
            if not listed or listed[-1][1] == goes_on_at:
                break
            goes_on_at = listed[-1][1]
        assert [name for name, _ in listed] == whole
        tool.check("a history listed one revision a piece")

    run_alice_mount(scenario, script)
