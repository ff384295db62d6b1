"""Folders of a mount: listing them, and the ones made and removed here.

Folders exist in the catalog only through their notes. ``mkdir`` makes one
in this mount's overlay, where it stays until it holds a note or is
removed; ``rmdir`` of a folder of the view settles the removals of its
notes first, and the folder goes with them. A listing is taken whole when
it starts, so entries do not shift under a reader that asks in pieces.

An open folder is a handle of its own, like an open file: it remembers
the sandbox that opened it, and ``readdir`` (which carries no caller)
lists nothing once that sandbox is gone, so a folder descriptor passed
out of a sandbox cannot watch the folder afterwards.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import pyfuse3

from scopefs.vfs.attributes import attributes
from scopefs.vfs.handles import REVOKED
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState, fail
from scopefs.vfs.removals import Removals


@dataclass(eq=False)
class FolderHandle:
    """One open folder: which, who opened it, and the names its listing holds once it started."""

    ino: int
    pid_namespace: int | None  # on a sandbox's mount: the admitted pid namespace that opened it
    names: list[str] | None = None


class Folders:
    """``opendir``, ``readdir``, ``mkdir`` and ``rmdir`` of one mount."""

    def __init__(self, mount: MountState, removals: Removals) -> None:
        self._mount = mount
        self._removals = removals
        self._open: dict[int, FolderHandle] = {}  # folder handle number -> the open folder
        self._next_fh = 1

    def opendir(self, ino: int, pid_namespace: int | None) -> int:
        self._mount.folder(ino)
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._open[fh] = FolderHandle(ino, pid_namespace)
        return fh

    def revoke(self, pid_namespace: int) -> None:
        """Folders opened from ``pid_namespace`` (now dismissed) list nothing again (``HandleTable.revoke``)."""
        for handle in self._open.values():
            if handle.pid_namespace == pid_namespace:
                handle.pid_namespace = REVOKED

    def opened(self, fh: int) -> Node:
        """The folder an open handle is on (EBADF for an unknown handle, EACCES once its sandbox is gone)."""
        handle = self._open.get(fh)
        if handle is None:
            raise fail(errno.EBADF)
        self._mount.check_opener(handle.pid_namespace)
        return self._mount.folder(handle.ino)

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
        if layers.local.get(parts) is node:
            layers.drop_local(parts)
            layers.dirs.pop(parts, None)
            node.attached = False
            return
        # A folder of the view whose notes are all being removed here: settle
        # those removals now, and the folder goes with them.
        await self._removals.settle(prefix=parts)
        if layers.lookup(parts) is not None:
            raise fail(errno.ENOTEMPTY)

    def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        mount = self._mount
        node = self.opened(fh)
        if node.kind is Kind.QUERIES:
            return  # lists nothing: a listing must never run a search
        handle = self._open[fh]
        if start_id == 0 or handle.names is None:
            handle.names = mount.layers.names(node.parts)
        names = handle.names
        for index in range(start_id, len(names)):
            child = mount.layers.lookup(node.parts + (names[index],))
            if child is None:
                continue
            if not pyfuse3.readdir_reply(token, names[index].encode(), attributes(mount, child), index + 1):
                return
            child.lookups += 1

    def releasedir(self, fh: int) -> None:
        self._open.pop(fh, None)
