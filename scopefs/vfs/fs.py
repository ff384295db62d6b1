"""The FUSE filesystem of one session view (pyfuse3 request handlers).

Requests are answered from memory (``Namespace``) wherever possible; the
catalog is only asked on a thread, one call at a time (apsw connections are
not shared across threads concurrently), for commits, removals, renames,
permission checks of removals and the periodic sync with the change log.

Reads: ``open`` resolves the note's active revision and verifies its
artifact (``Artifacts``); ``read`` serves bytes from that verified file and
re-checks, on every request, that the view still allows the note. The
kernel may keep a revision's pages (``keep_cache``) only while that
revision is the one it cached; any change is invalidated by a worker.
Bytes verified at open go to the kernel's page cache before the open is
answered, so a first read needs no READ round trip: a small revision's in
one piece once hashed, a large one's chunk by chunk while it is hashed on
a worker (``PageStream``; ``_claim_stream`` says why nobody can read those
pages before the verdict).

Writes: content goes to an in-memory draft and becomes one new revision,
through the writer's staged-rename transaction, when the file is closed
(``flush``) or synced. Scratch files of editors never leave this mount.

Searches: the hidden, read-only folder ``.search`` at the root answers each
name looked up in it with that query's results (``vfs.queries``).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyfuse3
import trio

from scopefs.catalog.audit import AuditEvent, record_many, record_quietly
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.search import search
from scopefs.catalog.visible import VisibleNote, VisibleView, refresh
from scopefs.vfs import catalog_ops, queries
from scopefs.vfs.content import Artifacts, Stamp
from scopefs.vfs.drafts import Draft
from scopefs.vfs.errors import guarded
from scopefs.vfs.gate import Gate
from scopefs.vfs.inodes import Kind, Node, Parts
from scopefs.vfs.names import BadName, confusable, decode
from scopefs.vfs.namespace import Invalidation, Namespace
from scopefs.vfs.pages import PageStream, drop_pages
from scopefs.vfs.queries import Queries, is_query_path
from scopefs.vfs.scratch import is_scratch

log = logging.getLogger("scopefs.vfs")
T = TypeVar("T")

CACHE_TIMEOUT_S = 30.0  # entries and attributes; every change is invalidated precisely
POLL_S = 0.1  # how often the change log and the session's evidence are checked
FAIL_CLOSED_S = 1.0  # a catalog unreadable for this long empties the view
AUDIT_FLUSH_S = 1.0
INLINE_BYTES = 1 << 20  # hash or load larger files on a thread, smaller ones inline
STATFS_BLOCKS = 1 << 28  # constant: free space would reveal other scopes' writes
STATFS_FILES = 1 << 24
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def _fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


@dataclass
class Handle:
    node: Node
    writable: bool = False
    note: VisibleNote | None = None  # the verified revision this handle serves, if any
    fd: int = -1
    stamp: Stamp | None = None
    wrote: bool = False  # a write() came through this handle
    namespace: int | None = None  # on a sandbox's mount: the admitted pid namespace that opened it
    results: queries.Results | None = None  # a query's results, as they were when opened


class ScopeFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, home: Home, session_id: str, view: VisibleView, *, gate: Gate | None = None,
                 owner: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.gate = gate  # set for a sandbox's mount: only that sandbox may use it
        self.home = home
        self.session_id = session_id
        self.ns = Namespace(view)
        self.queries = Queries(self.ns.inodes, functools.partial(self._catalog, search, home, session_id),
                               lambda: self.ns.view)
        self.artifacts = Artifacts(home, view.access.agent_id)
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._dir_names: dict[int, list[str]] = {}
        self._limiter = trio.CapacityLimiter(1)
        self._sync_lock = trio.Lock()
        self._inval_send, self._inval_recv = trio.open_memory_channel[Invalidation](math.inf)
        self._exposures: list[AuditEvent] = []
        self._exposed: set[str] = set()
        self._bad_revisions: set[str] = set()
        self._streams: dict[int, PageStream] = {}  # inode -> the open streaming unverified pages into it
        self._started_ns = time.time_ns()
        self._uid, self._gid = owner if owner is not None else (os.getuid(), os.getgid())
        self._last_sync_ok = time.monotonic()
        self.terminated = False

    # -- plumbing ----------------------------------------------------------

    async def _catalog(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run catalog work on a thread, one call at a time."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)

    async def sync(self) -> None:
        """Bring the view up to date with the catalog and queue invalidations.

        Fails closed: if the catalog cannot be read for longer than
        ``FAIL_CLOSED_S``, the view is emptied until it can, because a
        revocation the mount cannot see must not keep serving notes.
        """
        async with self._sync_lock:
            old = self.ns.view
            try:
                new = await self._catalog(refresh, self.home, old)
            except Exception:
                if time.monotonic() - self._last_sync_ok > FAIL_CLOSED_S and old.usable:
                    self._apply(dataclasses.replace(old, problem=Reason.INVALID_CONTEXT, stores=(), notes={},
                                                    by_resource={}, base_seq=None, delta=frozenset()))
                raise
            self._last_sync_ok = time.monotonic()
            self._apply(new)

    def _apply(self, new: VisibleView) -> None:
        old = self.ns.view
        for item in self.ns.apply(new):
            self._inval_send.send_nowait(item)
        if self.ns.view is not old:
            # Local copies of notes (a backup taken by rename, a draft loaded
            # from a note) must not outlive the note's place in the view.
            for node in self.ns.local.values():
                source = self._copied_from(node)
                if source is not None and not self._shows(source):
                    node.forget_pages()
                    self._inval_send.send_nowait(Invalidation(node.ino))

    @staticmethod
    def _copied_from(node: Node) -> str | None:
        if node.draft is not None:
            return node.draft.source_resource
        return node.frozen.resource_id if node.frozen is not None else None

    def _shows(self, resource_id: str) -> bool:
        """Whether the view still shows this resource (so its content may be served)."""
        return self.ns.view.usable and resource_id in self.ns.view.by_resource

    def _check_copy(self, node: Node) -> None:
        source = self._copied_from(node)
        if not self.ns.view.usable or (source is not None and not self._shows(source)):
            raise _fail(errno.EACCES)

    def _admit(self, ctx: pyfuse3.RequestContext | None, *, root_attributes: bool = False) -> None:
        if self.gate is not None and not self.gate.allows(ctx, root_attributes=root_attributes):
            raise _fail(errno.EACCES)

    def _opener(self, ctx: pyfuse3.RequestContext | None) -> int | None:
        """For a handle about to be given out: the admitted namespace asking (EACCES if none)."""
        if self.gate is None:
            return None
        namespace = self.gate.namespace_of(ctx)
        if namespace is None:
            raise _fail(errno.EACCES)
        return namespace

    def _usable(self, handle: Handle) -> None:
        """Reads and writes need the namespace that opened the handle to be admitted still."""
        if self.gate is not None and not self.gate.holds(handle.namespace):
            raise _fail(errno.EACCES)

    def _node(self, ino: int) -> Node:
        node = self.ns.inodes.get(ino)
        if node is None:
            raise _fail(errno.ENOENT)
        return node

    def _dir(self, ino: int) -> Node:
        node = self._node(ino)
        if node.kind is Kind.QUERIES:
            return node  # a folder of the query tree (see vfs.queries): it has no name to lose
        if node.kind is not Kind.DIR or not node.attached:
            raise _fail(errno.ENOENT if not node.attached else errno.ENOTDIR)
        return node

    def _new_fh(self, handle: Handle, stream: PageStream | None = None) -> int:
        """A file handle for ``handle``, never while another open streams into its inode.

        Every caller awaits ``_quiesce`` (or owns the stream, ``stream``)
        with no await in between; this check makes a missed one an EIO
        rather than a reader of unverified pages.
        """
        if self._streams.get(handle.node.ino, stream) is not stream:
            raise RuntimeError("a handle was about to be given out while unverified pages are cached")
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self.handles[fh] = handle
        handle.node.opens += 1
        return fh

    def _check_writable(self, parts: Parts) -> None:
        if not self.ns.view.usable:
            raise _fail(errno.EACCES)
        if not self.ns.writable(parts):
            raise _fail(errno.EROFS)

    def _child_name(self, name: bytes) -> str:
        try:
            return decode(name)
        except BadName as exc:
            raise _fail(exc.errno) from None

    def _check_new_name(self, parent: Node, name: str, *, ignore: str | None = None) -> None:
        siblings = set(self.ns.names(parent.parts)) - {ignore}
        if confusable(name, siblings):
            raise _fail(errno.EINVAL)

    def _event(self, operation: str, decision: str, reason: Reason, note: VisibleNote) -> AuditEvent:
        return self.ns.view.access.event(operation, decision, reason, store_id=note.store_id,
                                         revision_id=note.revision_id)

    # -- attributes --------------------------------------------------------

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = node.ino
        attr.generation = 0
        attr.entry_timeout = attr.attr_timeout = CACHE_TIMEOUT_S
        attr.st_uid, attr.st_gid = self._uid, self._gid
        attr.st_blksize = 4096
        mtime = self._started_ns
        if node.kind in (Kind.QUERIES, Kind.RESULTS):
            mtime = queries.attributes(node, attr, mtime)
        elif node.kind is Kind.DIR:
            writable = self.ns.writable(node.parts + ("x",))
            attr.st_mode = stat.S_IFDIR | (0o700 if writable else 0o500)
            attr.st_nlink = 2
            attr.st_size = 0
        else:
            writable = node.kind is Kind.SCRATCH or self.ns.writable(node.parts)
            attr.st_mode = stat.S_IFREG | (0o600 if writable else 0o400)
            attr.st_nlink = 1 if node.attached else 0
            note = node.frozen if node.kind is Kind.SCRATCH else (self.ns.note_of(node) or node.shown)
            if node.draft is not None:
                attr.st_size = node.draft.size
                mtime = node.draft.mtime_ns
            elif note is not None:
                attr.st_size = note.size
                mtime = note.mtime_us * 1000
            else:
                attr.st_size = 0
        attr.st_blocks = (attr.st_size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
        return attr

    @guarded
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self._admit(ctx, root_attributes=inode == pyfuse3.ROOT_INODE)
        return self._attr(self._node(inode))

    @guarded
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        node = self._node(inode)
        if node.kind is not Kind.SCRATCH:
            self._check_writable(node.parts if node.kind is not Kind.DIR else node.parts + ("x",))
        if fields.update_size:
            if node.kind is Kind.DIR:
                raise _fail(errno.EISDIR)
            await self._ensure_draft(node, truncate=False)
            assert node.draft is not None
            node.draft.truncate(attr.st_size)
            if fh is None and node.kind is Kind.NOTE:  # truncate(2) by path: nobody will close it
                await self._commit(node)
                self._drop_clean_draft(node)
        # chmod, chown and times are accepted and ignored: a note's mode
        # follows its root, its times follow its revisions.
        return self._attr(node)

    @guarded
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        self._admit(ctx)
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = data.f_bfree = data.f_bavail = STATFS_BLOCKS
        data.f_files = data.f_ffree = data.f_favail = STATFS_FILES
        data.f_namemax = 255
        return data

    # -- names -------------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        parent = self._dir(parent_inode)
        if self.queries.covers(parent, name):
            node = await self.queries.lookup(parent, name)
            node.lookups += 1
            return self._attr(node)
        try:
            text = decode(name)
        except BadName:
            raise _fail(errno.ENOENT) from None  # a name that cannot exist is simply not there
        found = self.ns.lookup(parent.parts + (text,))
        if found is None:
            raise _fail(errno.ENOENT)
        found.lookups += 1
        return self._attr(found)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.ns.inodes.forget(inode, count)
            self.queries.forget(inode)

    @guarded
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        self._admit(ctx)
        self._dir(inode)
        return inode

    @guarded
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        node = self._dir(fh)
        if node.kind is Kind.QUERIES:
            return  # lists nothing: a listing must never run a search
        if start_id == 0 or fh not in self._dir_names:
            self._dir_names[fh] = self.ns.names(node.parts)
        names = self._dir_names[fh]
        for index in range(start_id, len(names)):
            child = self.ns.lookup(node.parts + (names[index],))
            if child is None:
                continue
            if not pyfuse3.readdir_reply(token, names[index].encode(), self._attr(child), index + 1):
                return
            child.lookups += 1

    async def releasedir(self, fh: int) -> None:
        self._dir_names.pop(fh, None)

    @guarded
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        parent = self._dir(parent_inode)
        text = self._child_name(name)
        parts = parent.parts + (text,)
        self._check_writable(parts)
        if self.ns.lookup(parts) is not None:
            raise _fail(errno.EEXIST)
        self._check_new_name(parent, text)
        node = self.ns.inodes.new(Kind.DIR, parts)
        self.ns.add_local(node)
        self.ns.dirs[parts] = node
        node.lookups += 1
        return self._attr(node)

    def _existing(self, parent_inode: int, name: bytes) -> tuple[Parts, Node]:
        """The path and node of an existing child (ENOENT otherwise), for changes to it."""
        parts = self._dir(parent_inode).parts + (self._child_name(name),)
        if is_query_path(parts):
            self._check_writable(parts)  # the query tree is read-only: refused like a read-only root
        node = self.ns.lookup(parts)
        if node is None:
            raise _fail(errno.ENOENT)
        return parts, node

    @guarded
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._admit(ctx)
        parts, node = self._existing(parent_inode, name)
        if node.kind is not Kind.DIR:
            raise _fail(errno.ENOTDIR)
        self._check_writable(parts)
        if self.ns.names(parts):
            raise _fail(errno.ENOTEMPTY)
        if self.ns.local.get(parts) is node:
            self.ns.drop_local(parts)
            self.ns.dirs.pop(parts, None)
            node.attached = False
            return
        # A folder of the view whose notes are all being removed here: settle
        # those removals now, and the folder goes with them.
        await self._flush_removals(prefix=parts)
        if self.ns.lookup(parts) is not None:
            raise _fail(errno.ENOTEMPTY)

    @guarded
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._admit(ctx)
        parts, node = self._existing(parent_inode, name)
        if node.kind is Kind.DIR:
            raise _fail(errno.EISDIR)
        self._check_writable(parts)
        if self.ns.local.get(parts) is node:  # scratch, or a note never committed
            self.ns.drop_local(parts)
            self.ns.detach(node)
            self._release_detached(node)
            return
        assert node.resource_id is not None
        await self._catalog(catalog_ops.check_remove, self.home, self.session_id, parts)
        self.ns.schedule_removal(parts, node.resource_id)

    # -- reading -------------------------------------------------------------

    def _claim_stream(self, node: Node, note: VisibleNote) -> PageStream | None:
        """A stream of ``note``'s chunks into ``node``'s pages while this open
        hashes it on a worker, or None to hash without one (as for a note
        hashed inline, or remembered as verified).

        The chunks stored are not verified until the hash, the size and the
        stamp re-check matched at the end, so nobody may read them before:

        * the open that streams is not answered yet, so its caller cannot;
        * any other file of the kernel on this inode (an open handle, or a
          mapping, which keeps its handle open) reads the page cache, so a
          stream starts only when the handle table holds none for the node,
          and the node has no draft (a writer's content);
        * no handle on the inode is given out while the stream is in flight
          (until the streaming open has its own handle or has failed):
          every ``_new_fh`` is preceded, with no await in between, by
          ``_quiesce``, which waits for the stream; so a second open that
          arrives meanwhile is answered after the verdict, with
          ``keep_cache`` only if the revision it cached is its own and not
          refused; and another stream into the same inode never starts;
        * if the verification fails in any way after a chunk was stored,
          the pages are dropped (``invalidate_inode``, waited for on a
          worker) before the open answers EIO and before the stream lets
          anyone else in (``_verify_streaming``).

        The claim is taken with no await between the checks and the
        registration, so two opens cannot both take one.
        """
        if (note.size <= INLINE_BYTES or not self.artifacts.needs_hash(note) or node.ino in self._streams
                or node.draft is not None or node.opens > 0
                or any(handle.node is node for handle in self.handles.values())):
            return None
        stream = self._streams[node.ino] = PageStream(node.ino, note.size)
        return stream

    def _release_stream(self, stream: PageStream) -> None:
        """The streaming open answered (with its handle) or failed: let others in."""
        del self._streams[stream.ino]
        stream.settled.set()

    async def _quiesce(self, node: Node) -> None:
        """Wait until no open streams unverified pages into ``node``'s inode."""
        while (stream := self._streams.get(node.ino)) is not None:
            await stream.settled.wait()

    async def _open_artifact(self, node: Node, note: VisibleNote,
                             stream: PageStream | None = None) -> tuple[int, Stamp, bytes | None]:
        if note.revision_id in self._bad_revisions:
            raise _fail(errno.EIO)
        try:
            if stream is not None:
                return await self._verify_streaming(node, note, stream)
            if note.size > INLINE_BYTES and self.artifacts.needs_hash(note):
                return await trio.to_thread.run_sync(functools.partial(self.artifacts.open, note, keep=False))
            return self.artifacts.open(note)
        except IntegrityError:
            await self._integrity_failure(note, node)
            raise _fail(errno.EIO) from None

    async def _verify_streaming(self, node: Node, note: VisibleNote,
                                stream: PageStream) -> tuple[int, Stamp, bytes | None]:
        """Hash ``note`` on a worker, storing its chunks as they come.

        Pages an older revision left beyond this one's end must not outlive
        it under ``keep_cache``: they are dropped first. On any failure
        (IntegrityError, OSError, cancellation) after something was stored,
        the pages are dropped before this returns: ``invalidate_inode``
        returns once the kernel has dropped them, and it is awaited here
        rather than queued for the invalidation worker, so the EIO is
        answered, and the inode opened to others, only after that.
        """
        await trio.to_thread.run_sync(drop_pages, node.ino)
        try:
            return await trio.to_thread.run_sync(functools.partial(self.artifacts.open, note, keep=False,
                                                                   sink=stream))
        except BaseException:
            if stream.touched:
                node.forget_pages()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(drop_pages, node.ino)
            raise

    async def _integrity_failure(self, note: VisibleNote, opened: Node | None = None) -> None:
        """Refuse the revision from now on, drop the kernel's pages, audit.

        The pages of the node that was opened go too when it is not the
        note's own node (a scratch file frozen to the revision: vim's backup).
        """
        self._bad_revisions.add(note.revision_id)
        own = self.ns.by_resource.get(note.resource_id)
        for node in (own, opened if opened is not own else None):
            if node is not None:
                node.forget_pages()
                self._inval_send.send_nowait(Invalidation(node.ino))
        event = self._event(Op.READ, "error", Reason.REVISION_STALE, note)
        await self._catalog(record_quietly, self.home.state(), event)

    def _expose(self, note: VisibleNote) -> None:
        """Record that this session saw a revision: once per mount, in batches.

        One row per revision and mount says what the audit needs (which
        session was shown which immutable revision, and when first); a row
        per open would cost more than the read itself for ``grep -r``.
        """
        if note.revision_id not in self._exposed:
            self._exposed.add(note.revision_id)
            self._exposures.append(self._event(Op.READ, "allow", Reason.ALLOWED, note))

    async def _load(self, note: VisibleNote) -> bytes:
        try:
            if note.size > INLINE_BYTES:
                return await trio.to_thread.run_sync(functools.partial(self.artifacts.read_all, note, keep=False))
            return self.artifacts.read_all(note)
        except IntegrityError:
            await self._integrity_failure(note)
            raise _fail(errno.EIO) from None

    async def _ensure_draft(self, node: Node, *, truncate: bool) -> None:
        """Give ``node`` a draft holding its current content (or none)."""
        if node.draft is not None:
            if truncate and node.draft.size:
                node.draft.truncate(0)
            return
        source = node.frozen if node.kind is Kind.SCRATCH else self.ns.note_of(node)
        if source is None or truncate:
            data, loaded_from = b"", None
        elif not self._shows(source.resource_id):
            raise _fail(errno.EACCES)
        else:
            data = await self._load(source)
            loaded_from = source.resource_id if data else None
        node.draft = Draft(data, source_resource=loaded_from)
        node.frozen = None if node.kind is Kind.SCRATCH else node.frozen
        if truncate and source is not None and source.size:
            node.draft.dirty = True

    @guarded
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        namespace = self._opener(ctx)
        node = self._node(inode)
        if node.kind is Kind.DIR:
            raise _fail(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            if node.kind is not Kind.SCRATCH:
                self._check_writable(node.parts)
            await self._ensure_draft(node, truncate=bool(flags & os.O_TRUNC))
            await self._quiesce(node)
            return pyfuse3.FileInfo(fh=self._new_fh(Handle(node, writable=True, namespace=namespace)),
                                    keep_cache=False)
        if node.kind is Kind.RESULTS:
            handle = Handle(node, namespace=namespace, results=self.queries.opened(node))
            return pyfuse3.FileInfo(fh=self._new_fh(handle), direct_io=True,
                                    keep_cache=False)  # the kernel keeps nothing: each cat searches anew
        if node.draft is not None:
            self._check_copy(node)
            await self._quiesce(node)
            return pyfuse3.FileInfo(fh=self._new_fh(Handle(node, namespace=namespace)), keep_cache=False)
        note = node.frozen if node.kind is Kind.SCRATCH else self.ns.note_of(node)
        if note is None or not self.ns.view.usable:
            raise _fail(errno.ENOENT)
        if not self._shows(note.resource_id):
            raise _fail(errno.EACCES)
        stream = self._claim_stream(node, note)
        try:
            return await self._open_verified(node, note, stream, namespace)
        finally:
            if stream is not None:
                self._release_stream(stream)

    async def _open_verified(self, node: Node, note: VisibleNote, stream: PageStream | None,
                             namespace: int | None = None) -> pyfuse3.FileInfo:
        fd, stamp, verified = await self._open_artifact(node, note, stream)
        try:
            if stream is None:
                if verified and (node.stale_pages or node.cached_revision not in (None, note.revision_id)):
                    # An older revision's pages may outlive it past the new end of
                    # file (a store never shrinks the kernel's size): drop them first.
                    await trio.to_thread.run_sync(drop_pages, node.ino)
                    node.stale_pages = False
                await self._quiesce(node)  # another open's stream settles first: see _claim_stream
            keep = self._keep_cache(node, note, verified, stream)
            node.cached_revision = note.revision_id
            self._expose(note)
            fh = self._new_fh(Handle(node, note=note, fd=fd, stamp=stamp, namespace=namespace), stream)
        except BaseException:
            os.close(fd)
            raise
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    def _keep_cache(self, node: Node, note: VisibleNote, verified: bytes | None, stream: PageStream | None) -> bool:
        """Whether the kernel may keep ``node``'s pages when this open is answered.

        A stream that stored the whole revision, now verified, is exactly
        its pages; a partial one is not trusted to be. Otherwise the pages
        may stay only if they are this revision's, or are made so now.
        """
        if stream is not None:
            return stream.complete
        keep = node.cached_revision == note.revision_id
        if verified and not keep:
            # Bytes just verified go straight into the kernel's page cache:
            # the first read then needs no round trip (a cold grep's READ).
            try:
                pyfuse3.notify_store(node.ino, 0, verified)
                keep = True
            except OSError:
                pass
        return keep

    @guarded
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.handles[fh]
        self._usable(handle)
        if handle.results is not None:
            return self.queries.read(handle.results, off, size)
        if handle.note is None:
            self._check_copy(handle.node)
            draft = handle.node.draft
            return draft.read(off, size) if draft is not None else b""
        note = handle.note
        if not self.ns.view.usable or note.resource_id not in self.ns.view.by_resource:
            raise _fail(errno.EACCES)  # revoked, tombstoned or denied since the open
        if note.revision_id in self._bad_revisions:
            raise _fail(errno.EIO)
        assert handle.stamp is not None
        try:
            return self.artifacts.read(handle.fd, handle.stamp, off, size)
        except IntegrityError:
            await self._integrity_failure(note, handle.node)
            raise _fail(errno.EIO) from None

    # -- writing -------------------------------------------------------------

    @guarded
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        namespace = self._opener(ctx)
        parent = self._dir(parent_inode)
        text = self._child_name(name)
        parts = parent.parts + (text,)
        self._check_writable(parts)
        if self.ns.lookup(parts) is not None:
            raise _fail(errno.EEXIST)
        removal = self.ns.removed.get(parts)
        if removal is not None and not removal.in_flight:
            # Unlinked or renamed away a moment ago: this is a new revision of
            # the same note (an editor's save, mv's copy over it).
            self.ns.cancel_removal(parts)
            node = self.ns.lookup(parts)
            assert node is not None
            node.draft = Draft()
            node.draft.dirty = True
        else:
            self._check_new_name(parent, text)
            kind = Kind.SCRATCH if is_scratch(text) else Kind.NOTE
            node = self.ns.inodes.new(kind, parts, draft=Draft())
            node.draft.dirty = kind is Kind.NOTE  # type: ignore[union-attr]
            self.ns.add_local(node)
        await self._quiesce(node)
        node.lookups += 1
        fh = self._new_fh(Handle(node, writable=True, namespace=namespace))
        return pyfuse3.FileInfo(fh=fh, keep_cache=False), self._attr(node)

    @guarded
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles[fh]
        self._usable(handle)
        if not handle.writable or handle.node.draft is None:
            raise _fail(errno.EBADF)
        handle.wrote = True
        return handle.node.draft.write(off, buf)

    async def _commit(self, node: Node) -> None:
        """Make a note's dirty draft its next revision (one writer transaction)."""
        async with node.commit_lock:
            draft = node.draft
            if draft is None or not draft.dirty or not node.attached or node.kind is not Kind.NOTE:
                return
            current = self.ns.note_of(node)
            if current is not None and draft.holds(current.size, current.sha256):
                draft.dirty = False  # an unchanged save is not a new revision
                return
            self._check_copy(node)
            draft.dirty = False  # writes landing during the commit mark it dirty again
            try:
                result = await self._catalog(catalog_ops.commit, self.home, self.session_id, node.parts, draft,
                                             node.resource_id)
            except BaseException:
                draft.dirty = True
                self._forget_pages(node)  # the kernel holds refused bytes: they must not be read back
                raise
            node.committed_revision = result.revision_id
            await self.sync()
            self._bind(node, result.resource_id)

    def _forget_pages(self, node: Node) -> None:
        node.forget_pages()
        self._inval_send.send_nowait(Invalidation(node.ino))

    def _bind(self, node: Node, resource_id: str) -> None:
        """``node`` is now the catalog resource ``resource_id``."""
        if self.ns.local.get(node.parts) is node:
            self.ns.drop_local(node.parts)
        other = self.ns.by_resource.get(resource_id)
        if other is not None and other is not node:
            self.ns.detach(other)
        node.kind = Kind.NOTE
        node.resource_id = resource_id
        node.attached = True
        node.forget_pages()
        self.ns.by_resource[resource_id] = node

    @guarded
    async def flush(self, fh: int) -> None:
        """Commit on close, so that a successful close(2) means durable.

        Except for a handle that has only truncated or created an empty
        file: the shell's ``> note`` opens, duplicates the descriptor and
        closes the original before anything is written, and committing
        that close would make every redirect two revisions (an empty one,
        then the content). Such a draft is committed by the close that
        follows the writes, or at release if none come.
        """
        handle = self.handles.get(fh)
        if handle is None or not handle.writable:
            return
        draft = handle.node.draft
        if handle.wrote or (draft is not None and draft.size > 0):
            await self._commit(handle.node)
        elif draft is not None and draft.dirty and handle.node.kind is Kind.NOTE:
            # Deferred, but a refusal must still reach this close().
            try:
                await self._catalog(catalog_ops.check_save, self.home, self.session_id, handle.node.parts)
            except BaseException:
                self._forget_pages(handle.node)
                raise

    @guarded
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self.handles.get(fh)
        if handle is not None and handle.writable:
            await self._commit(handle.node)

    def _drop_clean_draft(self, node: Node) -> None:
        if node.kind is Kind.NOTE and node.opens == 0 and node.draft is not None and not node.draft.dirty:
            node.draft.close()
            node.draft = None

    def _release_detached(self, node: Node) -> None:
        if not node.attached and node.opens == 0 and node.draft is not None:
            node.draft.close()
            node.draft = None

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if handle is None:
            return
        if handle.fd >= 0:
            os.close(handle.fd)
        node = handle.node
        if handle.writable and node.opens == 1 and node.draft is not None and node.draft.dirty:
            try:
                await self._commit(node)  # an empty file created or truncated and closed unwritten
            except Exception as exc:  # noqa: BLE001 - nobody is left to tell
                log.warning("a note was not committed at release (%s)", type(exc).__name__)
        node.opens -= 1
        if node.opens == 0 and node.kind is Kind.NOTE and node.draft is not None:
            if node.draft.dirty:
                self._forget_pages(node)  # a draft whose commit failed is discarded: so are its pages
            node.draft.close()  # committed by flush
            node.draft = None
            if node.resource_id is None and self.ns.local.get(node.parts) is node:
                self.ns.drop_local(node.parts)  # a new note whose first commit failed never existed
                self.ns.detach(node)
        self._release_detached(node)

    @guarded
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self._flush_removals(prefix=self._dir(fh).parts)

    # -- rename ------------------------------------------------------------

    @guarded
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        self._admit(ctx)
        if flags & RENAME_EXCHANGE:
            raise _fail(errno.EINVAL)
        src, node = self._existing(parent_inode_old, name_old)
        old_parent, new_parent = self._dir(parent_inode_old), self._dir(parent_inode_new)
        dst_name = self._child_name(name_new)
        dst = new_parent.parts + (dst_name,)
        self._check_writable(src)
        self._check_writable(dst)
        src_mount, dst_mount = self.ns.mount_for(src), self.ns.mount_for(dst)
        if src_mount is None or dst_mount is None or src_mount[0] != dst_mount[0]:
            raise _fail(errno.EXDEV)
        target = self.ns.lookup(dst)
        if target is node:
            return
        if target is not None and flags & RENAME_NOREPLACE:
            raise _fail(errno.EEXIST)
        if target is None:
            self._check_new_name(new_parent, dst_name, ignore=src[-1] if new_parent is old_parent else None)
        if node.kind is Kind.DIR or (target is not None and target.kind is Kind.DIR):
            await self._rename_dir(node, src, dst, target)
            return
        to_scratch = is_scratch(dst_name) and not (target is not None and target.resource_id is not None)
        if node.resource_id is None:  # scratch, or a note not committed yet
            await self._rename_local(node, src, dst, target, to_scratch)
        elif to_scratch:
            await self._rename_away(node, src, dst, target)
        else:
            await self._rename_note(node, src, dst, target)

    async def _rename_dir(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        """Only folders made here and still empty move; others are copied by the tool."""
        if node.kind is not Kind.DIR:
            raise _fail(errno.EISDIR)
        if target is not None and target.kind is not Kind.DIR:
            raise _fail(errno.ENOTDIR)
        if self.ns.local.get(src) is not node or self.ns.names(src) or target is not None:
            raise _fail(errno.EXDEV)
        self.ns.drop_local(src)
        self.ns.dirs.pop(src, None)
        node.parts = dst
        self.ns.add_local(node)
        self.ns.dirs[dst] = node

    def _replace_target(self, target: Node | None, dst: Parts) -> None:
        if target is None:
            return
        if self.ns.local.get(dst) is target:
            self.ns.drop_local(dst)
        self.ns.detach(target)
        self._release_detached(target)

    async def _rename_local(self, node: Node, src: Parts, dst: Parts, target: Node | None,
                            to_scratch: bool) -> None:
        if to_scratch:
            self.ns.drop_local(src)
            self._replace_target(target, dst)
            node.parts, node.kind = dst, Kind.SCRATCH
            self.ns.add_local(node)
            return
        removal = self.ns.removed.get(dst)
        frozen = node.frozen
        if (target is None and removal is not None and frozen is not None and node.draft is None
                and removal.resource_id == frozen.resource_id and not removal.in_flight):
            # A backup renamed back over the note it was taken from: undo.
            self.ns.cancel_removal(dst)
            self.ns.drop_local(src)
            node.parts, node.frozen = dst, None
            self._bind(node, frozen.resource_id)
            return
        await self._ensure_draft(node, truncate=False)
        assert node.draft is not None
        self._check_copy(node)
        replacing = target.resource_id if target is not None else None  # the note saved over, if any
        if removal is not None and not removal.in_flight:
            self.ns.cancel_removal(dst)
            replacing = removal.resource_id
        result = await self._catalog(catalog_ops.commit, self.home, self.session_id, dst, node.draft, replacing)
        self.ns.drop_local(src)
        self._replace_target(target, dst)
        node.parts = dst
        node.draft.dirty = False
        node.committed_revision = result.revision_id
        await self.sync()
        self._bind(node, result.resource_id)
        if node.opens == 0:
            self._drop_clean_draft(node)

    async def _rename_away(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        """A note renamed to a scratch name (vim's and Emacs's backup before a save)."""
        await self._commit(node)
        await self._catalog(catalog_ops.check_remove, self.home, self.session_id, src)
        note = self.ns.note_of(node)
        assert node.resource_id is not None
        self.ns.schedule_removal(src, node.resource_id)
        self._replace_target(target, dst)
        node.kind, node.parts, node.frozen, node.resource_id = Kind.SCRATCH, dst, note, None
        node.attached = True
        self.ns.add_local(node)

    async def _rename_note(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        await self._commit(node)
        removal = self.ns.removed.get(dst)
        if removal is not None and removal.in_flight:
            raise _fail(errno.EAGAIN)
        assert node.resource_id is not None
        await self._catalog(catalog_ops.rename, self.home, self.session_id, src, dst, node.resource_id)
        self.ns.keep_folders(src[:-1])
        self.ns.cancel_removal(dst)
        self._replace_target(target, dst)
        note = self.ns.note_of(node)
        node.committed_revision = note.revision_id if note else None
        node.parts = dst
        await self.sync()

    # -- refused operations --------------------------------------------------

    @guarded
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        raise _fail(errno.EPERM)  # notes are plain files; Emacs then locks with a plain file

    @guarded
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        raise _fail(errno.EPERM)

    @guarded
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._admit(ctx)
        raise _fail(errno.EPERM)

    # -- background work -----------------------------------------------------

    async def _flush_removals(self, *, prefix: Parts | None = None, everything: bool = False) -> None:
        """Tombstone notes removed here whose grace period is over (or all of them)."""
        due = self.ns.due_removals(everything=everything or prefix is not None)
        if prefix is not None:
            due = [(p, r) for p, r in due if p[:len(prefix)] == prefix]
        for parts, removal in due:
            if removal.in_flight or self.ns.removed.get(parts) is not removal:
                continue
            removal.in_flight = True
            try:
                await self._catalog(catalog_ops.remove, self.home, self.session_id, parts,
                                    removal.resource_id)
            except Exception as exc:  # noqa: BLE001 - logged by type; the note stays
                log.warning("a removal was not committed (%s); the note stays", type(exc).__name__)
            finally:
                if self.ns.removed.get(parts) is removal:
                    del self.ns.removed[parts]
        if due:
            await self.sync()

    async def _flush_audit(self) -> None:
        batch, self._exposures = self._exposures, []
        if batch:
            try:
                await self._catalog(record_many, self.home.state(), batch)
            except Exception as exc:  # noqa: BLE001
                log.warning("read audit batch not recorded (%s)", type(exc).__name__)

    async def _every(self, seconds: float, work: Callable[[], Any]) -> None:
        while True:
            await trio.sleep(seconds)
            try:
                await work()
            except Exception as exc:  # noqa: BLE001 - a background failure must not end the mount
                log.warning("background %s failed (%s)", getattr(work, "__name__", "task"), type(exc).__name__)

    async def _invalidate(self) -> None:
        """Send invalidations from their own thread, never from a handler."""
        async for item in self._inval_recv:
            await trio.to_thread.run_sync(_send_invalidation, item)

    async def background(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._every, POLL_S, self.sync)
        nursery.start_soon(self._every, POLL_S, self._flush_removals)
        nursery.start_soon(self._every, AUDIT_FLUSH_S, self._flush_audit)
        nursery.start_soon(self._invalidate)

    async def shutdown(self) -> None:
        """After the kernel let go: settle removals and the audit batch."""
        await self._flush_removals(everything=True)
        await self._flush_audit()
        self.artifacts.close()


def _send_invalidation(item: Invalidation) -> None:
    try:
        pyfuse3.invalidate_inode(item.ino)
    except OSError:
        pass  # the kernel does not know this inode (ENOENT): nothing cached
    if item.parent_ino is not None and item.name is not None:
        try:
            pyfuse3.invalidate_entry(item.parent_ino, item.name.encode())
        except OSError:
            pass
