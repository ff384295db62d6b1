"""The folder structure implied by a view's visible notes.

Folders are implicit in note paths. This index answers "what is in this
folder" and "is this a folder" in O(1) and is updated note by note, so a
change to one note costs a few dictionary operations, not a rescan of the
view. The view's roots (and ``roles/`` above role roots) are pinned: they
exist even while empty.
"""

from __future__ import annotations

from collections.abc import Iterable

from scopefs.catalog.paths import Parts

_PINNED = 1 << 60


class Tree:
    def __init__(self, roots: Iterable[Parts] = ()) -> None:
        self.children: dict[Parts, dict[str, bool]] = {(): {}}  # folder -> name -> is a folder
        self.below: dict[Parts, int] = {(): _PINNED}  # notes beneath each folder
        for root in roots:
            for k in range(len(root)):
                self.children.setdefault(root[:k + 1], {})
                self.children[root[:k]][root[k]] = True
                self.below[root[:k + 1]] = _PINNED

    def is_dir(self, parts: Parts) -> bool:
        return parts in self.below

    def names(self, parts: Parts) -> dict[str, bool]:
        return self.children.get(parts, {})

    def add(self, parts: Parts) -> list[Parts]:
        """Count a note in; returns the folders that appeared with it."""
        appeared: list[Parts] = []
        for k in range(len(parts)):
            folder = parts[:k]
            held = self.below.get(folder, 0)
            if not held:
                appeared.append(folder)
            self.below[folder] = held + 1
            self.children.setdefault(folder, {})[parts[k]] = k < len(parts) - 1
        return appeared

    def remove(self, parts: Parts) -> list[Parts]:
        """Forget a note; returns the folders that vanished with it."""
        vanished: list[Parts] = []
        _drop(self.children.get(parts[:-1]), parts[-1], folder=False)
        for k in range(len(parts) - 1, -1, -1):
            folder = parts[:k]
            left = self.below.get(folder, 0) - 1
            if left > 0:
                self.below[folder] = left
                continue
            self.below.pop(folder, None)
            self.children.pop(folder, None)
            _drop(self.children.get(folder[:-1]), folder[-1], folder=True)
            vanished.append(folder)
        return vanished


def _drop(names: dict[str, bool] | None, name: str, *, folder: bool) -> None:
    """Take ``name`` out of a folder's names if it is still the note (the folder) that went.

    A view change can turn a folder into a note of the same name, or the
    other way round (``a/b/c.md`` went, a note ``a/b`` came): the newcomer
    is added first (``Layers.apply``), and must keep its name.
    """
    if names is not None and names.get(name) is folder:
        del names[name]
