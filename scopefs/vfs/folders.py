"""Folders of a mount: listing them, and the ones made and removed here.

Folders exist in the catalog only through their notes. ``mkdir`` makes one
in this mount's overlay, where it stays until it holds a note or is
removed; ``rmdir`` of a folder of the view settles the removals of its
notes first, and the folder goes with them. A listing is taken whole when
it starts, so entries do not shift under a reader that asks in pieces
(``vfs.listings``: one snapshot per listing).

No ``opendir`` reaches the mount (``vfs.fs``): the kernel lists a folder
by inode, with the caller's context (checked by the gate like any other
request), and keeps the listing it was given until the mount drops it
(``vfs.layers`` invalidates a folder whose names changed).
"""

from __future__ import annotations

import errno

import pyfuse3

from scopefs.catalog.paths import Parts
from scopefs.vfs import listings
from scopefs.vfs.attributes import attributes
from scopefs.vfs.errors import fail
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState
from scopefs.vfs.readahead import AHEAD_NOTES
from scopefs.vfs.removals import Removals


class Folders:
    """``opendir``, ``readdir``, ``mkdir`` and ``rmdir`` of one mount."""

    def __init__(self, mount: MountState, removals: Removals) -> None:
        self._mount = mount
        self._removals = removals
        self._listings: listings.Listings[list[str]] = listings.Listings()  # names, as each listing began

    def _read_ahead(self, parts: Parts, names: list[str]) -> None:
        """A folder listed afresh is about to be walked: ask the disk for its notes (``vfs.readahead``)."""
        notes = self._mount.view.notes
        found = []
        for name in names:
            if (note := notes.get(parts + (name,))) is not None:
                found.append(note)
                if len(found) == AHEAD_NOTES:  # the rest is not asked for: a huge folder costs no more here
                    break
        if found:
            self._mount.artifacts.read_ahead(found)

    def mkdir(self, parent_ino: int, name: bytes) -> Node:
        mount = self._mount
        layers = mount.layers
        parent, text, parts = mount.new_child(parent_ino, name, folder=True)
        mount.check_new_name(parent, text)
        node = layers.inodes.new(Kind.DIR, parts)
        layers.add_local(node)
        layers.dirs[parts] = node
        node.lookups += 1
        return node

    async def rmdir(self, parent_ino: int, name: bytes) -> None:
        mount = self._mount
        layers = mount.layers
        parts, node = mount.existing(parent_ino, name)
        if node.kind is not Kind.DIR:
            raise fail(errno.ENOTDIR)
        mount.check_writable(parts)
        if layers.names(parts):
            raise fail(errno.ENOTEMPTY)
        # Notes removed here under it may still be in the catalog, waiting out
        # their grace period: settle them now, so that the folder goes with
        # them instead of coming back in its parent's listing (``rm -r``).
        await self._removals.settle(prefix=parts)
        if layers.names(parts):  # made meanwhile, or a removal refused: the note stays, so does its folder
            raise fail(errno.ENOTEMPTY)
        if layers.local.get(parts) is node:  # kept by this mount (made here, or emptied here)
            layers.drop_local(parts)
            layers.dirs.pop(parts, None)
            layers.absences.folder_forgotten(node.ino)  # the kernel's entries below it go with it
            node.attached = False
            return
        if layers.lookup(parts) is not None:
            raise fail(errno.ENOTEMPTY)

    def readdir(self, ino: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        mount = self._mount
        node = mount.folder(ino)
        if node.kind is Kind.QUERIES:
            return  # lists nothing: a listing must never run a search
        parts: Parts = node.parts
        found = self._listings.find(ino, start_id)
        if found is None:
            names = mount.layers.names(parts)
            number = self._listings.start(ino, names)
            self._read_ahead(parts, names)
        else:
            number, names = found
        for index in range(listings.place(start_id), len(names)):
            child = mount.layers.lookup(parts + (names[index],))
            if child is None:
                continue
            next_at = listings.offset(number, index + 1)
            if next_at is None or not pyfuse3.readdir_reply(token, names[index].encode(),
                                                            attributes(mount, child), next_at):
                return
            child.lookups += 1
