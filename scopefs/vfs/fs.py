"""The FUSE filesystem of one session view: the pyfuse3 request handlers.

``ScopeFS`` is a thin adapter. Each handler turns a failure into an errno
(``guarded``), lets the gate check who asks (a sandbox's mount answers only
its admitted sandboxes), and hands the request to the room that owns it:

    mount.py      the lowest floor: the view's layers, the handle table, the
                  catalog thread, the kernel's invalidations, the checks
                  every request makes, and the order of the three locks
    attributes.py what stat and statfs say
    reads.py      opening revisions, serving only verified bytes
    commits.py    drafts, and the one revision each close makes of them
    renames.py    renames, as editors and ``mv`` use them
    removals.py   unlink, and the tombstones it becomes after a grace period
    folders.py    mkdir, rmdir, readdir
    queries.py    the hidden, read-only ``.search`` folder
    follow.py     between requests: following the catalog and other sessions

Requests are answered from memory (``vfs.layers``) wherever possible; the
catalog is only asked on its thread, one call at a time, for commits,
removals, renames, permission checks of removals and the periodic sync
with the change log.

Caveats (what a tool may notice, all deliberate):

* Notes are plain files. ``symlink``, ``link`` and ``mknod`` are refused
  (``EPERM``), ``RENAME_EXCHANGE`` too (``EINVAL``), and extended
  attributes are not supported.
* ``chmod``, ``chown`` and ``utimes`` succeed and change nothing: a note's
  mode follows the root it is under, its times follow its revisions, and a
  folder's time is the mount's start.
* Folders exist only through their notes. A folder that holds notes cannot
  be renamed (``EXDEV``: ``mv`` then copies); an empty one made here lives
  only in this mount until a note is written in it.
* Names that editors and tools use for scratch files (vim's swap files,
  backups ending in ``~``, digit-only names like vim's ``4913`` probe,
  ``sedXXXXXX``, ``tmpXXXXXXXX``, hidden names...) are scratch files unless
  a note already has that name: they never become notes and vanish with
  the mount (``vfs.scratch``). Such a note can only be made by renaming
  onto the name.
* A new name that looks like a sibling's (case, look-alike letters) is
  refused (``EINVAL``).
* A removal becomes a tombstone about a second after ``unlink``
  (``REMOVAL_GRACE_S``); until then another session still sees the note.
* ``close`` commits: two sessions saving the same note both succeed, the
  later close is the newer revision (no merge), and a save that changed
  nothing makes no revision.
* ``statfs`` is constant, and the inode generation is always 0 (numbers
  are never reused within a mount); a mount cannot be exported over NFS.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Sequence

import pyfuse3
import trio

from scopefs.catalog.home import Home
from scopefs.catalog.search import search
from scopefs.catalog.visible import VisibleView
from scopefs.vfs.attributes import attributes, statfs
from scopefs.vfs.commits import Commits
from scopefs.vfs.content import Artifacts
from scopefs.vfs.errors import guarded
from scopefs.vfs.folders import Folders
from scopefs.vfs.follow import Follow
from scopefs.vfs.gate import Gate
from scopefs.vfs.handles import HandleTable
from scopefs.vfs.inodes import Kind
from scopefs.vfs.mount import MountState, fail
from scopefs.vfs.names import BadName, decode
from scopefs.vfs.queries import Queries
from scopefs.vfs.reads import Reads
from scopefs.vfs.removals import Removals
from scopefs.vfs.renames import Renames


class ScopeFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, home: Home, session_id: str, view: VisibleView, *, gate: Gate | None = None,
                 owner: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.mount = mount = MountState(home, session_id, view, gate=gate, owner=owner)
        self.queries = Queries(mount.layers.inodes, functools.partial(mount.catalog, search, home, session_id),
                               lambda: mount.view, mount.sync)
        self.reads = Reads(mount, self.queries)
        self.commits = Commits(mount, self.reads)
        self.renames = Renames(mount, self.commits)
        self.removals = Removals(mount)
        self.folders = Folders(mount, self.removals)
        self.follow = Follow(mount, self.reads, self.removals)
        if gate is not None:
            gate.on_gone = self._revoke
            gate.on_dismissed = mount.dismissed
        self.terminated = False  # set by the server when a signal, not the kernel, ends the mount

    @property
    def artifacts(self) -> Artifacts:
        return self.mount.artifacts

    @property
    def handles(self) -> HandleTable:
        return self.mount.handles

    async def sync(self) -> None:
        await self.mount.sync()

    async def background(self, nursery: trio.Nursery) -> None:
        await self.follow.start(nursery)

    async def shutdown(self) -> None:
        await self.follow.shutdown()

    def _revoke(self, pid_namespace: int) -> None:
        """A sandbox is gone: the files and folders it opened never work again (``vfs.gate``)."""
        self.mount.handles.revoke(pid_namespace)
        self.folders.revoke(pid_namespace)

    async def close_view(self) -> None:
        """Before the server lets go of the kernel (``vfs.server``): see ``MountState.close_view``."""
        await self.mount.close_view()

    # -- attributes ----------------------------------------------------------

    @guarded
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx, root_attributes=inode == pyfuse3.ROOT_INODE)
        return attributes(self.mount, self.mount.node(inode))

    @guarded
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        node = self.mount.node(inode)
        if node.kind is not Kind.SCRATCH:
            self.mount.check_writable(node.parts if node.kind is not Kind.DIR else node.parts + ("x",))
        if fields.update_size:
            await self.commits.truncate(node, attr.st_size, by_path=fh is None)
        return attributes(self.mount, node)  # chmod, chown and times: accepted, ignored (Caveats)

    @guarded
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self.mount.admit(ctx)
        return statfs()

    # -- names ---------------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        parent = self.mount.folder(parent_inode)
        if self.queries.covers(parent, name):
            node = await self.queries.lookup(parent, name)
        else:
            try:
                text = decode(name)
            except BadName:
                raise fail(errno.ENOENT) from None  # a name that cannot exist is simply not there
            found = self.mount.layers.lookup(parent.parts + (text,))
            if found is None:
                raise fail(errno.ENOENT)
            node = found
        node.lookups += 1
        return attributes(self.mount, node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.mount.layers.inodes.forget(inode, count)
            self.queries.forget(inode)

    @guarded
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return self.folders.opendir(inode, self.mount.opener(ctx))

    @guarded
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        self.folders.readdir(fh, start_id, token)

    async def releasedir(self, fh: int) -> None:
        self.folders.releasedir(fh)

    @guarded
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        return attributes(self.mount, self.folders.mkdir(parent_inode, name))

    @guarded
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.mount.admit(ctx)
        await self.folders.rmdir(parent_inode, name)

    @guarded
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.mount.admit(ctx)
        await self.removals.unlink(parent_inode, name)

    @guarded
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        self.mount.admit(ctx)
        await self.renames.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    # -- content ---------------------------------------------------------------

    @guarded
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        pid_namespace = self.mount.opener(ctx)
        node = self.mount.node(inode)
        if node.kind is Kind.DIR:
            raise fail(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            return await self.commits.open(node, flags, pid_namespace)
        return await self.reads.open(node, pid_namespace)

    @guarded
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.mount.handles[fh]
        self.mount.check_handle(handle)
        return await self.reads.read(handle, off, size)

    @guarded
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        pid_namespace = self.mount.opener(ctx)
        node, fh = await self.commits.create(parent_inode, name, pid_namespace)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False), attributes(self.mount, node)

    @guarded
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.mount.handles[fh]
        self.mount.check_handle(handle)
        return self.commits.write(handle, off, buf)

    @guarded
    async def flush(self, fh: int) -> None:
        handle = self.mount.handles.get(fh)
        if handle is not None:
            await self.commits.flush(handle)

    @guarded
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self.mount.handles.get(fh)
        if handle is not None and handle.writable:
            await self.commits.commit(handle.node)

    async def release(self, fh: int) -> None:
        await self.commits.release(fh)

    @guarded
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.removals.settle(prefix=self.folders.opened(fh).parts)

    # -- refused ---------------------------------------------------------------

    @guarded
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        raise fail(errno.EPERM)  # notes are plain files; Emacs then locks with a plain file

    @guarded
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        raise fail(errno.EPERM)

    @guarded
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.admit(ctx)
        raise fail(errno.EPERM)
