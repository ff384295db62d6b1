"""What one mount shows: the catalog's view plus this mount's own overlay.

Three layers, looked up in this order:

1. the overlay of this mount: scratch files, notes created here and not yet
   committed, folders made with ``mkdir`` and not yet holding a note;
2. pending removals: notes unlinked or renamed away here, hidden at once and
   tombstoned in the catalog after a short grace period (so that an editor's
   unlink-then-create, or ``mv``'s copy over a note, becomes one new
   revision of the same note instead of a delete and a stranger);
3. the view: every note the session may read, and the folders they imply.

A name found in none of them may be kept by the kernel as absent
(``remember_absent``; ``vfs.absences`` says why and until when); a view
that comes to show one drops it with the rest of the change (``apply``).

Nothing here touches the catalog; the filesystem calls it with new views
and applies the answers. All of it runs on the trio thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import trio

from scopefs.catalog.paths import Parts
from scopefs.catalog.policy import Mount, Op
from scopefs.catalog.visible import VisibleNote, VisibleView
from scopefs.vfs.absences import NO_INODE, Absences
from scopefs.vfs.inodes import Inodes, Kind, Node
from scopefs.vfs.tree import Tree

REMOVAL_GRACE_S = 1.0


@dataclass
class Removal:
    resource_id: str
    due: float  # monotonic time at which the tombstone is committed
    in_flight: bool = False  # being committed right now: too late to cancel
    settled: trio.Event = field(default_factory=trio.Event)  # committed (or refused) and the view applied


@dataclass(frozen=True)
class Invalidation:
    ino: int  # NO_INODE: only the directory entry below (a name the kernel keeps as absent)
    parent_ino: int | None = None  # with name: forget this directory entry too
    name: str | None = None
    listing_grew: bool = False  # a folder that only gained names: its attributes go, its pages may stay


class Layers:
    """The three layers of one mount and the lookups through them (the module docstring says how)."""

    def __init__(self, view: VisibleView) -> None:
        self.inodes = Inodes()
        self.root = self.inodes.new(Kind.DIR, ())
        self.view = view
        self.tree = self._tree(view)
        self.by_resource: dict[str, Node] = {}
        self.dirs: dict[Parts, Node] = {(): self.root}
        self.local: dict[Parts, Node] = {}
        self.local_children: dict[Parts, set[str]] = {}
        self.removed: dict[Parts, Removal] = {}
        self.tombstoned: set[Parts] = set()  # removals committed that the view still shows (``Removals.settle``)
        self.absences = Absences()  # names the kernel was told are absent

    @staticmethod
    def _tree(view: VisibleView) -> Tree:
        if not view.usable:
            return Tree()
        tree = Tree(tuple(root.split("/")) for root in view.access.view.roots())  # a delegated view: its caps
        for parts in view.notes:
            tree.add(parts)
        return tree

    # -- lookups -----------------------------------------------------------

    def lookup(self, parts: Parts) -> Node | None:
        if parts and not self.view.usable:
            return None  # evidence gone: not even this mount's own scratch files remain
        node = self.local.get(parts)
        if node is not None:
            return node
        if parts in self.removed:
            return None
        note = self.view.notes.get(parts)
        if note is not None:
            return self._note_node(note)
        if self.tree.is_dir(parts):
            return self._dir_node(parts)
        return None

    def remember_absent(self, folder: Node, name: str) -> bool:
        """Whether the kernel may keep ``name`` in ``folder`` as absent; recorded if so.

        Only names the view and this mount's overlay lack are kept: a name
        hidden by a removal not yet committed shows again if the commit is
        refused, with no view change that could drop the kernel's entry.
        The caller looked the name up in this same turn of the trio thread.
        """
        if folder.parts + (name,) in self.removed or self.dirs.get(folder.parts) is not folder:
            return False
        return self.absences.remember(folder.ino, name)

    def _absences_dropped(self, came: list[Parts], *, everything: bool) -> list[Invalidation]:
        """What the kernel must forget of the absences it keeps, for a view in which the notes and
        folders ``came``."""
        dropped = self.absences.everything() if everything else self.absences.shown(came, self._folder_ino)
        return [Invalidation(NO_INODE, item.folder_ino, item.name) for item in dropped]

    def _folder_ino(self, parts: Parts) -> int | None:
        node = self.dirs.get(parts)
        return node.ino if node is not None else None

    def _note_node(self, note: VisibleNote) -> Node:
        node = self.by_resource.get(note.resource_id)
        if node is None or not node.attached or node.kind is not Kind.NOTE:
            node = self.inodes.new(Kind.NOTE, note.parts, resource_id=note.resource_id)
            self.by_resource[note.resource_id] = node
        node.parts = note.parts
        node.shown = note
        return node

    def _dir_node(self, parts: Parts) -> Node:
        node = self.dirs.get(parts)
        if node is None:
            node = self.dirs[parts] = self.inodes.new(Kind.DIR, parts)
        return node

    def child_names(self, parts: Parts) -> set[str]:
        """Every name the folder may hold: the view's and local ones, shown or not (``names``)."""
        return set(self.tree.names(parts)) | self.local_children.get(parts, set())

    def names(self, parts: Parts) -> list[str]:
        return [n for n in sorted(self.child_names(parts)) if self.lookup(parts + (n,)) is not None]

    def note_of(self, node: Node) -> VisibleNote | None:
        """The committed revision a note node shows, if the view still has it."""
        return self.note_for(node.resource_id)

    def note_for(self, resource_id: str | None) -> VisibleNote | None:
        """The revision the view shows of ``resource_id``, if it shows one."""
        if resource_id is None:
            return None
        parts = self.view.by_resource.get(resource_id)
        return self.view.notes.get(parts) if parts is not None else None

    def mount_for(self, parts: Parts) -> tuple[Mount, Parts] | None:
        if not self.view.usable:
            return None
        return self.view.access.view.mount_for(parts)

    def writable(self, parts: Parts) -> bool:
        """Whether a note or scratch file may be made or changed at ``parts``."""
        found = self.mount_for(parts)
        return found is not None and bool(found[1]) and Op.APPEND in found[0].placement

    def depositable(self, parts: Parts) -> bool:
        """Whether ``parts`` names a file a deposit may be made as: right under a deposit-only root."""
        found = self.mount_for(parts)
        return found is not None and _deposit_at(found)

    def takes_new(self, parts: Parts) -> bool:
        """Whether something may be made at ``parts``: a note or scratch file, or a deposit (one lookup)."""
        found = self.mount_for(parts)
        return found is not None and bool(found[1]) and (Op.APPEND in found[0].placement or _deposit_at(found))

    # -- the overlay -------------------------------------------------------

    def add_local(self, node: Node) -> None:
        self.local[node.parts] = node
        self.local_children.setdefault(node.parts[:-1], set()).add(node.name)

    def drop_local(self, parts: Parts) -> Node | None:
        node = self.local.pop(parts, None)
        if node is not None:
            names = self.local_children.get(parts[:-1])
            if names is not None:
                names.discard(parts[-1])
                if not names:
                    del self.local_children[parts[:-1]]
        return node

    def detach(self, node: Node) -> None:
        """``node`` no longer has a name here (unlinked, renamed over, removed)."""
        node.attached = False
        if node.resource_id is not None and self.by_resource.get(node.resource_id) is node:
            del self.by_resource[node.resource_id]
        self.inodes.lost_name(node)

    def schedule_removal(self, parts: Parts, resource_id: str) -> None:
        self.keep_folders(parts[:-1])
        self.removed[parts] = Removal(resource_id, time.monotonic() + REMOVAL_GRACE_S)
        node = self.by_resource.get(resource_id)
        if node is not None:
            self.detach(node)

    def keep_folders(self, parts: Parts) -> None:
        """Keep ``parts`` and its folders up to the root in this mount, even once empty.

        Folders exist in the catalog only through their notes, so removing
        or moving away a folder's last note would make it vanish, under a
        shell whose working directory it is. As on any filesystem, a folder
        this mount emptied stays (until it is removed or the mount ends).
        """
        found = self.mount_for(parts)
        if found is None:
            return
        root_length = len(parts) - len(found[1])
        for length in range(len(parts), root_length, -1):
            folder = self.dirs.get(parts[:length])
            if folder is not None and parts[:length] not in self.local:
                self.add_local(folder)

    def shows_at(self, parts: Parts, resource_id: str) -> bool:
        """Whether the view shows the note ``resource_id`` at ``parts``."""
        note = self.view.notes.get(parts)
        return note is not None and note.resource_id == resource_id

    def cancel_removal(self, parts: Parts) -> Removal | None:
        self.tombstoned.discard(parts)
        return self.removed.pop(parts, None)

    def due_removals(self, everything: bool = False) -> list[tuple[Parts, Removal]]:
        now = time.monotonic()
        return [(p, r) for p, r in self.removed.items() if everything or r.due <= now]

    # -- following the catalog ---------------------------------------------

    def apply(self, new: VisibleView) -> list[Invalidation]:
        """Switch to ``new``; returns what the kernel must forget.

        Only notes whose entry differs between the two views are looked at,
        so a change costs in proportion to what changed. A note this mount
        has just committed itself needs no invalidation: the kernel's pages
        were written through this mount.
        """
        old = self.view
        if new is old or new.seq < old.seq:
            return []
        rebuild = rebuilt(old, new)
        self.view = new
        out: list[Invalidation | None] = []
        appeared: list[Parts] = []
        folders_came: list[Parts] = []  # folders that appeared with those notes
        folders_went: list[Parts] = []  # folders that vanished with the notes that left
        changed = changed_notes(old, new)
        if rebuild:
            self.tree = self._tree(new)
        else:
            if new.base_seq == old.seq:  # derived from this very picture: only its delta can differ
                appeared = [p for p in new.delta if p in new.notes and p not in old.notes]
            else:
                appeared = list(new.notes.keys() - old.notes.keys())
            # The tree changes only for paths that appear or disappear, and
            # additions go first: a folder whose only note got a new revision
            # must never look empty, even for a moment (its node would die).
            for parts in appeared:
                folders_came += self.tree.add(parts)
            for note in changed:
                if note.parts not in new.notes:
                    folders_went += self.tree.remove(note.parts)
        for note in changed:
            if note.resource_id not in new.by_resource:  # it left the view: the pages of nodes of it
                for unnamed in self.inodes.unnamed_of(note.resource_id):  # without a name go too
                    out.append(Invalidation(unnamed.ino))
                    unnamed.forget_pages()  # (their READs find no note: ENOENT, as after this mount's unlink)
            node = self.by_resource.get(note.resource_id)
            if node is None:
                continue
            current = self.note_of(node)
            if current is not None and current.revision_id == node.committed_revision \
                    and current.parts == node.parts:
                continue
            parent = self.dirs.get(note.parts[:-1])
            out.append(Invalidation(node.ino, parent.ino if parent else None, note.parts[-1]))
            node.forget_pages()
            if current is None:
                node.left_view = True
                self.detach(node)
            else:
                node.parts = current.parts
        # The folders that went with those notes are forgotten only now: the first dropped entry on a
        # path makes the path unknown at once, and by then each note's pages must be gone already (the
        # worker sends in this order), or a reader holding a note open would be served its cached
        # pages after its name is gone.
        out.extend(self._forget_dir(folder) for folder in folders_went)
        if rebuild:
            for parts in list(self.dirs):
                if parts and not self.tree.is_dir(parts) and parts not in self.local:
                    out.append(self._forget_dir(parts))
        gone = [note.parts for note in changed
                if (now := new.notes.get(note.parts)) is None or now.resource_id != note.resource_id]
        came = appeared + folders_came
        out.extend(self._listings_changed(gone + folders_went, came, everything=rebuild))
        out.extend(self._absences_dropped(came, everything=rebuild))
        for parts in list(self.tombstoned):
            removal = self.removed.get(parts)
            if removal is None or not self.shows_at(parts, removal.resource_id):
                self.tombstoned.discard(parts)  # a view without the note at last: nothing to hide any more
                self.removed.pop(parts, None)
        return [i for i in out if i is not None]

    def _listings_changed(self, gone: list[Parts], appeared: list[Parts], *,
                          everything: bool) -> list[Invalidation]:
        """The folders whose cached listings may hold a name that came or went.

        The kernel keeps a folder's listing until it is dropped (no
        ``opendir`` reaches the mount), so the folder that holds a path
        that appeared or disappeared is listed again: its mtime moves and
        its attributes go (``MountState._apply``). ``gone`` are the notes
        whose name went or now names another note, and the folders that
        vanished with them; ``appeared`` the notes and folders that came.
        Only the folder that holds one changed: a folder whose names
        stayed keeps its attributes: with ``default_permissions`` the
        kernel would ask for those of every folder on each path it walks.
        A folder that lost a name loses its cached pages too, as a
        listing continued from an offset reads them unchecked; one that
        only gained names keeps them: such a listing may miss a name that
        came meanwhile, as on any filesystem, and a ``cp -r`` into the
        mount does not pay a page drop on the worker for every note.
        """
        if everything:
            lost, grew = list(self.dirs.values()), []
        else:
            lost_parts = {parts[:-1] for parts in gone if parts}
            lost = [node for folder in lost_parts if (node := self.dirs.get(folder)) is not None]
            grew = [node for folder in {parts[:-1] for parts in appeared if parts} - lost_parts
                    if (node := self.dirs.get(folder)) is not None]
        for node in (*lost, *grew):
            node.listing_version += 1
        return [Invalidation(node.ino) for node in lost] + [Invalidation(node.ino, listing_grew=True) for node in grew]

    def _forget_dir(self, parts: Parts) -> Invalidation | None:
        if parts in self.local:
            return None  # a folder this mount emptied itself: see keep_folders
        node = self.dirs.pop(parts, None)
        if node is None:
            return None
        node.attached = False
        self.absences.folder_forgotten(node.ino)  # the entry's invalidation drops every entry below it
        parent = self.dirs.get(parts[:-1])
        return Invalidation(node.ino, parent.ino if parent else None, parts[-1])


def rebuilt(old: VisibleView, new: VisibleView) -> bool:
    """Whether ``new`` is a new picture for the layers, not a change of ``old``'s notes: evidence came or
    went, or the roots moved."""
    return new.usable != old.usable or new.access.view.mounts != old.access.view.mounts


def changed_notes(old: VisibleView, new: VisibleView) -> list[VisibleNote]:
    """The notes of ``old`` whose entry ``new`` no longer holds as it was (every one, if ``rebuilt``).

    Only ``new``'s delta is looked at when it was derived from ``old``, so
    a change costs in proportion to what changed, not to the view.
    """
    if rebuilt(old, new):
        return list(old.notes.values())
    if new.base_seq == old.seq:
        return [old.notes[p] for p in new.delta if p in old.notes and new.notes.get(p) is not old.notes[p]]
    return [n for p, n in old.notes.items() if new.notes.get(p) is not n]


def _deposit_at(found: tuple[Mount, Parts]) -> bool:
    """A path one level under a deposit-only root (a group's ``postbox/``)."""
    return len(found[1]) == 1 and Op.DEPOSIT in found[0].placement
