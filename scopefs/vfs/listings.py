"""The names of folders being listed in pieces: one snapshot per listing, found again by its offsets.

A tool reads a folder in pieces, each a ``READDIR`` that starts where the
last one stopped (``ls`` of a folder larger than one reply, ``find``). A
listing is taken whole when it starts, so that names do not shift under a
reader that asks in pieces; and POSIX wants a name that stays in the folder
answered once, however the folder changes meanwhile.

No ``OPENDIR`` reaches a mount (``vfs.fs``), so a listing has no handle to
keep its snapshot on: all the mount ever sees of it is the offset each
piece starts from. Kept per folder, a second listing that began meanwhile
replaced the first one's snapshot, and if the view had moved in between,
the first listing's next piece read its places in the other's names: a
name removed before the place made it skip one that stayed. So each
listing that starts takes its own snapshot under a number, and every
offset it answers carries that number above ``PLACE_BITS`` and its place in
the snapshot below. The kernel hands those offsets back as they are (and
also to a reader it serves from its cached copy of a listing, which then
goes on in that listing's snapshot).

Offsets stay below 2**31, as ext4 keeps its own for 32-bit callers: FUSE
passes them through unchanged, and a 32-bit program's ``readdir`` drops
(or fails on) an entry whose offset does not fit its ``off_t``. So numbers
wrap at 127, and a place above ``MAX_PLACE`` (16,777,215 names in one
folder, or a note's revision of that number in ``.history``) ends the
listing there rather than answering an offset that would not fit.

``KEEP`` snapshots are kept, the least recently read forgotten first; a
listing whose snapshot was forgotten (or whose number a newer listing of
the same folder took, 127 listings later) goes on from its place in a
fresh one, as every listing did before snapshots were per listing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

KEEP = 64  # listings being read in pieces, the least recently read forgotten first
PLACE_BITS = 24  # an offset's place in its listing's snapshot; the listing's number is above
MAX_PLACE = (1 << PLACE_BITS) - 1
_NUMBERS = 1 << 7  # numbers wrap below this: an offset stays below 2**31 (the module docstring says why)


class Listings(Generic[T]):
    """Snapshots of the listings of one mount's folders that are being read, by listing number."""

    def __init__(self) -> None:
        self._taken: OrderedDict[int, tuple[int, T]] = OrderedDict()  # number -> (folder inode, snapshot)
        self._last = 0

    def find(self, ino: int, offset: int) -> tuple[int, T] | None:
        """The listing of ``ino`` that answered ``offset`` and its snapshot, if it is still kept (never
        for offset 0, where every listing starts)."""
        number = offset >> PLACE_BITS
        taken = self._taken.get(number)
        if offset <= 0 or taken is None or taken[0] != ino:
            return None
        self._taken.move_to_end(number)
        return number, taken[1]

    def start(self, ino: int, snapshot: T) -> int:
        """Keep ``snapshot`` for a listing of ``ino`` starting now; its number."""
        self._last = self._last % (_NUMBERS - 1) + 1  # 1 .. _NUMBERS - 1: offset 0 is every listing's start
        self._taken.pop(self._last, None)
        self._taken[self._last] = (ino, snapshot)
        while len(self._taken) > KEEP:
            self._taken.popitem(last=False)
        return self._last

    def drop(self, ino: int, which: Callable[[T], bool] = lambda _snapshot: True) -> None:
        """Forget the snapshots of ``ino``'s listings (``which`` of them): their rest is read afresh."""
        for number in [n for n, (at, snapshot) in self._taken.items() if at == ino and which(snapshot)]:
            del self._taken[number]


def offset(number: int, place: int) -> int | None:
    """The offset a listing answers for the entry whose successor is at ``place`` (from 1); None if the
    place does not fit (``MAX_PLACE``): the listing ends before that entry."""
    return (number << PLACE_BITS) | place if place <= MAX_PLACE else None


def place(offset: int) -> int:
    """Where in its listing's snapshot the piece that starts at ``offset`` goes on (0: the start)."""
    return offset & MAX_PLACE
