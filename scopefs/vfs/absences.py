"""The names a mount told the kernel are absent, so that it can take each back when the name appears.

A lookup of a name the view lacks is answered with a negative entry that
the kernel keeps for ``ABSENT_KEPT_S`` without asking again (``rg`` looks
for five ignore files in every folder it walks, editors for swap files).
The kernel drops such an entry only when told to, so each one handed out
is recorded here by folder inode until one of these ends it:

* the view comes to show the name (a note, or a folder that came with
  one): the entry is invalidated with the rest of the change (``shown``;
  ``everything`` when the view's roots or its usability change);
* this mount makes the name itself (create, mkdir, rename): the kernel
  replaced the entry on its own (``named_here``);
* the kernel forgets the folder, and every entry below it with it
  (``folder_forgotten``);
* two timeouts pass: the kernel asks again after one, and a new answer is
  a new record (``_expire``, only once the record is full).

The record is bounded (``ABSENT_NAMES_MAX``); a name that finds it full is
answered ``ENOENT`` uncached, as every absent name once was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scopefs.catalog.paths import Parts

ABSENT_KEPT_S = 30.0  # how long the kernel keeps an absent entry (the positive ones' timeout too)
ABSENT_NAMES_MAX = 16_384  # absences recorded at once (about 1.5 MiB of names at most)
NO_INODE = 0  # FUSE never numbers an inode 0 (the root is 1)


@dataclass(frozen=True)
class Dropped:
    """An absent entry the kernel must drop: ``name`` in the folder ``folder_ino``."""
    folder_ino: int
    name: str


class Absences:
    """The record of one mount: folder inode -> name -> when it was handed out (``time.monotonic``)."""

    def __init__(self) -> None:
        self._names: dict[int, dict[str, float]] = {}
        self.count = 0
        self._expire_after = 0.0  # a full record is swept again no sooner than this

    def remember(self, folder_ino: int, name: str) -> bool:
        """Record ``name`` as handed out absent now; False (not to be kept by the kernel) if the record is full."""
        now = time.monotonic()
        if self.count >= ABSENT_NAMES_MAX and now >= self._expire_after:
            self._expire(now)
        names = self._names.get(folder_ino)
        if names is None or name not in names:
            if self.count >= ABSENT_NAMES_MAX:
                return False
            names = self._names.setdefault(folder_ino, {})
            self.count += 1
        names[name] = now
        return True

    def named_here(self, folder_ino: int, name: str) -> bool:
        """Whether ``name`` was recorded in ``folder_ino`` (it is not any more)."""
        return self._take(folder_ino, name)

    def folder_forgotten(self, folder_ino: int) -> None:
        self.count -= len(self._names.pop(folder_ino, ()))

    def shown(self, came: Iterable[Parts], folder_ino_of: Callable[[Parts], int | None]) -> list[Dropped]:
        """The recorded entries of the paths that ``came`` (notes, and the folders that came with them),
        taken out of the record. A name that was there already was never recorded absent, so only the
        last name of each path is looked at. ``folder_ino_of``: the inode of a folder the kernel was
        told of (None for any other path)."""
        out: list[Dropped] = []
        if not self.count:
            return out
        for parts in came:
            folder_ino = folder_ino_of(parts[:-1]) if parts else None
            if folder_ino is not None and self._take(folder_ino, parts[-1]):
                out.append(Dropped(folder_ino, parts[-1]))
        return out

    def everything(self) -> list[Dropped]:
        """Every recorded entry, taken out of the record."""
        out = [Dropped(ino, name) for ino, names in self._names.items() for name in names]
        self._names.clear()
        self.count = 0
        return out

    def _take(self, folder_ino: int, name: str) -> bool:
        names = self._names.get(folder_ino)
        if names is None or names.pop(name, None) is None:
            return False
        self.count -= 1
        if not names:
            del self._names[folder_ino]
        return True

    def _expire(self, now: float) -> None:
        """Forget entries handed out two timeouts ago (the kernel has asked again after one, if it still
        wanted them); a sweep that frees nothing is not repeated for a timeout, so a full record of fresh
        names costs one sweep, not one per lookup."""
        before = now - 2 * ABSENT_KEPT_S
        for folder_ino in list(self._names):
            names = self._names[folder_ino]
            for name in [name for name, at in names.items() if at < before]:
                self._take(folder_ino, name)
        if self.count >= ABSENT_NAMES_MAX:
            self._expire_after = now + ABSENT_KEPT_S
