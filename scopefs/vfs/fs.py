"""The FUSE filesystem of one session view: the pyfuse3 request handlers.

``ScopeFS`` is a thin adapter. Each handler turns a failure into an errno
(``guarded``), lets the gate check who asks (a sandbox's mount answers only
its admitted sandboxes), and hands the request to the room that owns it:

    mount.py      the lowest floor: the view's layers, the handle table, the
                  catalog thread, the view refreshed and applied, the checks
                  every request makes, and the order of the three locks;
                  with how current the view is (currency.py) and the
                  kernel's side, its drops and when to cut it (kernel.py)
    attributes.py what stat and statfs say
    reads.py      serving only verified bytes, by inode
    commits.py    drafts, and the one revision each close makes of them
    writers.py    which handle writes each inode, and the settle of those no close follows
    owed.py       what those saves leave to do between requests
    renames.py    renames, as editors and ``mv`` use them
    removals.py   unlink, and the tombstones it becomes after a grace period
    folders.py    mkdir, rmdir, readdir
    queries.py    the hidden, read-only ``.search`` folder
    history.py    the hidden, read-only ``.history`` folder: earlier revisions of the view's notes
    follow.py     between requests: following the catalog and other sessions

Requests are answered from memory (``vfs.layers``) wherever possible; the
catalog is only asked on its thread, one call at a time, for commits,
removals, renames, permission checks of removals and the periodic sync
with the change log.

``open`` and ``opendir`` answer ``ENOSYS``. The kernel then stops sending
them, and their releases, for the whole connection, keeps every page and
listing it was given across opens (until the mount drops them), and sends
reads, writes, closes and listings with the inode instead of a file handle
(the vendored pyfuse3 passes it on: ``vendor/pyfuse3``). That is what makes
a warm ``grep -r`` cost what the disk does: a file already read is served
by the kernel without a single request. ``create`` still answers with a
handle of its own. Since no open reaches the mount, ``O_TRUNC`` comes as a
truncation first (``enable_atomic_o_trunc`` off), and the server waits for
the next request polling rather than through the event loop for a short
while (``POLL_NS``), because one trip through trio costs more than most
requests.

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
  nothing makes no revision. The kernel does not say which descriptor a
  close or a write comes from, so within one mount any close of a note
  commits what was written to it through any descriptor; a file only
  created or truncated is committed by the close after its writes, or
  once left alone for a second.
* Opening a note for writing is not refused by the server (no open
  reaches it): under a read-only root the modes refuse a sandbox's uid
  (``EACCES``), and root's first write is refused (``EROFS``). Likewise a
  note tombstoned or revoked under an open descriptor fails at its next
  read or write, not at open.
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
from scopefs.vfs.attributes import absent, attributes, statfs
from scopefs.vfs.callers import is_writeback
from scopefs.vfs.commits import Commits
from scopefs.vfs.content import Artifacts
from scopefs.vfs.errors import fail, guarded
from scopefs.vfs.folders import Folders
from scopefs.vfs.follow import Follow
from scopefs.vfs.gate import Gate
from scopefs.vfs.handles import HandleTable
from scopefs.vfs.history import History
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState
from scopefs.vfs.names import BadName, decode
from scopefs.vfs.queries import Queries
from scopefs.vfs.reads import Reads
from scopefs.vfs.removals import Removals
from scopefs.vfs.renames import Renames

POLL_NS = 200_000  # after a request, poll this long for the next before sleeping in the event loop


class ScopeFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False
    enable_atomic_o_trunc = False  # no open comes to truncate: the kernel truncates with setattr first
    inode_requests = True  # reads, writes, closes and listings come by inode (no open, no opendir)

    def __init__(self, home: Home, session_id: str, view: VisibleView, *, gate: Gate | None = None,
                 owner: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.mount = mount = MountState(home, session_id, view, gate=gate, owner=owner)
        self.queries = Queries(mount.layers.inodes, functools.partial(mount.catalog, search, home, session_id),
                               lambda: mount.view, mount.sync, mount.shows, lambda: mount.suspended)
        self.history = History(mount)
        self.reads = Reads(mount, self.queries, self.history)
        self.queries.expose = self.reads.expose
        self.commits = Commits(mount, self.reads)
        self.flush_wanted = self.commits.writers.writing  # a close of any other inode needs no answer from Python
        self.renames = Renames(mount, self.commits)
        self.removals = Removals(mount)
        self.folders = Folders(mount, self.removals)
        self.follow = Follow(mount, self.reads, self.removals, self.commits)
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
        nursery.start_soon(self.history.expire)

    async def shutdown(self) -> None:
        await self.follow.shutdown()

    def _revoke(self, pid_namespace: int) -> None:
        """A sandbox is gone: the files and folders it opened never work again (``vfs.gate``), and no
        writeback is taken as its any more, even once the kernel gives its number to another sandbox."""
        self.mount.handles.revoke(pid_namespace)
        self.mount.callers.forget(pid_namespace)

    async def close_view(self) -> None:
        """Before the server lets go of the kernel (``vfs.server``): see ``MountState.close_view``."""
        await self.mount.close_view()

    # -- attributes ----------------------------------------------------------

    @guarded
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx, root_attributes=inode == pyfuse3.ROOT_INODE)
        node = self.mount.node(inode)
        if node.kind is not Kind.DIR:  # a folder's attributes are constant (the gate's launch needs the root's)
            self.mount.check_current()
        return attributes(self.mount, node)

    @guarded
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        node = self.mount.node(inode)
        if node.kind is not Kind.SCRATCH:
            self.mount.check_writable(node.parts if node.kind is not Kind.DIR else node.parts + ("x",))
        if fields.update_size:
            # An O_TRUNC open arrives as a truncation to 0 without a handle, like truncate(2) by path:
            # it starts a writer whose close commits; a path truncation to any other size commits now.
            by_path = fh is None and attr.st_size > 0
            # A create's handle that a close already let go (any close of the inode commits) is no
            # handle any more: the truncation needs a writer like one by inode, or no close commits it.
            if not by_path and (not fh or self.mount.handles.get(fh) is None):
                await self.commits.writer(node, self.mount.callers.opener(ctx), truncate=attr.st_size == 0)
            await self.commits.truncate(node, attr.st_size, by_path=by_path)
        return attributes(self.mount, node)  # chmod, chown and times: accepted, ignored (Caveats)

    @guarded
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self.mount.callers.admit(ctx)
        return statfs()

    # -- names ---------------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        self.mount.check_current()
        parent = self.mount.folder(parent_inode)
        if self.queries.covers(parent, name):
            node = await self.queries.lookup(parent, name)
            if node.kind is Kind.RESULTS:  # new results: the kernel keeps no page of the last ones
                await self.mount.kernel.drop_pages_now([node], in_handler=True)
        elif self.history.covers(parent, name):
            node = await self.history.lookup(parent, name)
        else:
            text = _text(name)
            if text is None:
                raise fail(errno.ENOENT)  # a name that cannot exist is simply not there
            found = self.mount.layers.lookup(parent.parts + (text,))
            if found is None:
                if self.mount.layers.remember_absent(parent, text):
                    return absent()
                raise fail(errno.ENOENT)
            node = found
        node.lookups += 1
        return attributes(self.mount, node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        layers = self.mount.layers
        for inode, count in inode_list:
            node = layers.inodes.get(inode)  # before the forget, which may let go of it
            layers.inodes.forget(inode, count)
            if node is not None and node.kind is Kind.DIR and node.lookups == 0 and inode != pyfuse3.ROOT_INODE:
                layers.absences.folder_forgotten(inode)  # its entries below went with it
            self.queries.forget(inode)
            self.history.forget(inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        raise fail(errno.ENOSYS)  # the kernel lists by inode from now on, and keeps what it was given

    @guarded
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken, inode: int = 0,
                      ctx: pyfuse3.RequestContext | None = None) -> None:
        self.mount.callers.admit(ctx)
        self.mount.check_current()
        folder = self.mount.folder(inode)
        if folder.kind is Kind.HISTORY:
            await self.history.readdir(folder, start_id, token)
        else:
            self.folders.readdir(inode, start_id, token)

    async def releasedir(self, fh: int, inode: int = 0) -> None:
        pass  # never sent once opendir answered ENOSYS

    @guarded
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        node = self.folders.mkdir(parent_inode, name)
        self._named_here(parent_inode, _text(name))
        return attributes(self.mount, node)

    @guarded
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.mount.callers.admit(ctx)
        await self.folders.rmdir(parent_inode, name)

    @guarded
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.mount.callers.admit(ctx)
        await self.removals.unlink(parent_inode, name)

    @guarded
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        self.mount.callers.admit(ctx)
        # Out of the record first: a rename that commits applies the view showing the new name, which must
        # not drop the entry the rename is about to give it; a rename refused leaves the absent entry to drop.
        taken = self._named_here(parent_inode_new, _text(name_new))
        try:
            with self.mount.kernel.waiting_on_refresh():  # a rename holds folder locks only, never a note's page
                await self.renames.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)
        except BaseException:
            if taken is not None:
                self.mount.drop_absence(parent_inode_new, taken)
            raise

    def _named_here(self, parent_inode: int, text: str | None) -> str | None:
        """The kernel's entry for ``text`` is (about to be) this mount's own: out of the record of absences.
        The name, if it was in it (a name that cannot exist, None, never was)."""
        if text is None or not self.mount.layers.absences.named_here(parent_inode, text):
            return None
        return text

    # -- content ---------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        raise fail(errno.ENOSYS)  # see the module docstring: no open, no release, reads by inode

    @guarded
    async def read(self, fh: int, off: int, size: int, inode: int = 0,
                   ctx: pyfuse3.RequestContext | None = None) -> bytes:
        handle = self.mount.handles.get(fh) if fh else None
        if handle is not None:  # a file this mount created, still writing
            self.mount.callers.check_handle(handle)
            if handle.node.deposit is not None:
                raise fail(errno.EACCES)  # a deposit is never read back, not even by its writer
            return await self.reads.read(handle, off, size)
        caller = self.mount.callers.opener(ctx)  # EACCES unless admitted (``admit``)
        node = self.mount.node(inode)
        data = await self.reads.read_inode(node, off, size)
        self.mount.callers.read_by(node, caller)
        return data

    @guarded
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        pid_namespace = self.mount.callers.opener(ctx)
        text = _text(name)
        shown = None if flags & os.O_EXCL or text is None else self._shown_child(parent_inode, text)
        if shown is not None:
            await self._open_shown(shown, flags, pid_namespace)
            fh = 0  # what the kernel sends when no open was asked: writes and closes come by inode
        else:
            shown, fh = await self.commits.create(parent_inode, name, pid_namespace)
        self._named_here(parent_inode, text)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False), attributes(self.mount, shown)

    def _shown_child(self, parent_inode: int, text: str) -> Node | None:
        """The note or scratch file the view shows at ``text``, for a create that may open it."""
        node = self.mount.layers.lookup(self.mount.folder(parent_inode).parts + (text,))
        if node is not None and node.kind is Kind.DIR:
            raise fail(errno.EISDIR)
        return node if node is not None and node.kind in (Kind.NOTE, Kind.SCRATCH) else None

    async def _open_shown(self, node: Node, flags: int, pid_namespace: int | None) -> None:
        """``open(O_CREAT)`` without ``O_EXCL`` of a name the kernel still held absent, which the view now
        shows (another session made it, and the kernel's entry is not dropped yet): POSIX opens the file
        that is there. The kernel counts it as created, so it neither checks the mode nor truncates: the
        server does both, as a write by inode and the truncation of an ``O_TRUNC`` open would."""
        writes = flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC  # Linux: O_TRUNC asks to write
        if writes and node.kind is not Kind.SCRATCH:
            self.mount.check_writable(node.parts)
        if flags & os.O_TRUNC:
            await self.commits.writer(node, pid_namespace, truncate=True)
            await self.commits.truncate(node, 0, by_path=False)  # a writer that was there already
        node.lookups += 1

    @guarded
    async def write(self, fh: int, off: int, buf: bytes, inode: int = 0,
                    ctx: pyfuse3.RequestContext | None = None) -> int:
        mount = self.mount
        writers = self.commits.writers
        found_by_fh = mount.handles.get(fh) if fh else None
        if found_by_fh is not None and writers.fh_of(found_by_fh.node) == fh:
            handle = found_by_fh  # a file this mount created, until its first close committed it
            mount.callers.check_handle(handle)
        else:
            # By inode; so too through a created file's handle that a release is letting go of (the
            # settle's, while the process still writes): its draft may be closed once that commit is
            # done, and a write landing in it meanwhile would go with it, its close answering 0.
            node = found_by_fh.node if found_by_fh is not None else mount.node(inode)
            found = writers.writer_of(node)
            if found is None or writers.forsaken(found):  # (a forsaken one is let go: ``Commits.writer``)
                handle = await self.commits.writer(node, mount.callers.writeback_opener(node, ctx))
            else:
                handle = found
                if not mount.callers.allows(ctx):  # only the kernel writing back a mapping, for the writer's sandbox
                    if not is_writeback(ctx):
                        raise fail(errno.EACCES)
                    mount.callers.check_handle(handle)
        return self.commits.write(handle, off, buf)

    @guarded
    async def flush(self, fh: int, inode: int = 0, ctx: pyfuse3.RequestContext | None = None) -> None:
        handle = self.mount.handles.get(fh) if fh else None
        node = handle.node if handle is not None else self.mount.layers.inodes.get(inode)
        if node is not None:
            await self.commits.flush_inode(node)

    @guarded
    async def fsync(self, fh: int, datasync: bool, inode: int = 0) -> None:
        handle = self.mount.handles.get(fh) if fh else None
        node = handle.node if handle is not None else self.mount.layers.inodes.get(inode)
        if node is None:
            return
        if node.commit_lock.locked():
            # A commit whose close returned (``touch f``'s, by the settle or by a RELEASE, which the
            # kernel does not wait for), or one another process's close awaits (a writer the settle let go of): the
            # note may not be in the view until it is done, and what it commits is this fsync's to sync.
            # If it failed, those bytes are gone, and the fsync says so (as Linux reports a failed
            # writeback), rather than sync what was there before.
            failed = node.failed_commits
            await self.mount.commit_over(node)
            if node.failed_commits != failed:
                raise fail(errno.EIO)
        # A RELEASE the kernel has not sent yet (it sends them in the background, and a full background
        # queue can hold one behind this FSYNC) has not let go of its writer: found below, and committed.
        writers = self.commits.writers
        await writers.forsake(node)  # a dismissed sandbox's refused writes are not this fsync's to commit
        handle = self.mount.handles.get(fh) if fh else None  # (let go with them, if it was that writer)
        if handle is not None or writers.writer_of(node) is not None:
            await self.commits.commit(node, durable=True)
        await self.commits.sync(node)  # what earlier closes committed without a sync

    async def release(self, fh: int, inode: int = 0) -> None:  # not ``guarded``: see ``errors.ANSWERING``
        if fh:
            await self.commits.release(fh)

    @guarded
    async def fsyncdir(self, fh: int, datasync: bool, inode: int = 0) -> None:
        parts = self.mount.folder(inode).parts
        await self.commits.committed_under(parts)  # files closed here whose releases commit them, or will
        await self.removals.settle(prefix=parts)
        await self.commits.sync(None)

    # -- refused ---------------------------------------------------------------

    @guarded
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        raise fail(errno.EPERM)  # notes are plain files; Emacs then locks with a plain file

    @guarded
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        raise fail(errno.EPERM)

    @guarded
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self.mount.callers.admit(ctx)
        raise fail(errno.EPERM)


def _text(name: bytes) -> str | None:
    """A name the kernel sent, decoded; None for one that cannot exist here (``vfs.names``)."""
    try:
        return decode(name)
    except BadName:
        return None
