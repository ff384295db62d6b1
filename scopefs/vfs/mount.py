"""The lowest floor of one mount: its state, and the checks every request makes against it.

Everything above (``reads``, ``commits``, ``renames``, ``removals``,
``folders``, ``follow``, and the pyfuse3 adapter ``fs``) reaches the
catalog, the view, the handle table and the kernel's caches only through
a ``MountState``, so each of those rooms imports this one and none imports
another one's caller. Three parts of that state are rooms of their own,
held here: how current the view is (``vfs.currency``), the kernel's side
of the mount, its connection and the drops queued for it
(``vfs.kernel``), and who may ask (``vfs.callers``).

Three locks, always taken in this order (S3QL's rule, for the same
reason: a fixed order cannot deadlock):

1. a node's ``commit_lock``, one node at a time, for the whole of a commit;
2. ``_sync_lock``, for one refresh of the view (``sync``);
3. the catalog limiter, only around one call on the catalog thread
   (``catalog``): nothing is awaited or acquired while it is held.

Everything else relies on trio: between two awaits no other task runs, so
a check and the change it guards are written with no await in between
(``vfs.handles`` says where that matters most).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from scopefs.catalog.audit import AuditBacklog, AuditEvent
from scopefs.catalog.home import Home
from scopefs.catalog.marks import Mark, mark
from scopefs.catalog.paths import MAX_DEPTH, MAX_PATH_BYTES, Parts
from scopefs.catalog.reasons import Reason
from scopefs.catalog.visible import VisibleNote, VisibleView, refresh
from scopefs.vfs.absences import NO_INODE
from scopefs.vfs.callers import Callers
from scopefs.vfs.content import Artifacts
from scopefs.vfs.currency import Currency
from scopefs.vfs.errors import fail
from scopefs.vfs.gate import Gate
from scopefs.vfs.handles import HandleTable
from scopefs.vfs.historytree import is_history_path
from scopefs.vfs.inodes import Kind, Node, copied_from
from scopefs.vfs.kernel import Kernel
from scopefs.vfs.layers import Invalidation, Layers, changed_notes
from scopefs.vfs.names import BadName, confusable, decode
from scopefs.vfs.pages import list_again
from scopefs.vfs.querytree import Results, is_query_path

log = logging.getLogger("scopefs.vfs")
T = TypeVar("T")

AUDIT_WAIT_MS = 50  # how long an audit write on the catalog thread waits for another process's lock
# Write-ahead log pages from which a commit of this mount checkpoints the log itself. Below it the
# follower does, on another thread, once a tick after this mount wrote (``vfs.follow``): a checkpoint
# syncs the disk twice, and the commit that crossed SQLite's threshold (1,000 pages) paid for it
# inside a save's close, or ahead of the view's refresh.
WAL_BACKSTOP_PAGES = 8_192


class MountState:
    """One session's mounted view: its layers, handles, catalog thread and kernel caches."""

    def __init__(self, home: Home, session_id: str, view: VisibleView, *, gate: Gate | None = None,
                 owner: tuple[int, int] | None = None) -> None:
        self.home = home
        self.session_id = session_id
        self.kernel = Kernel()  # its connection, the drops queued for it, when to cut it (``vfs.kernel``)
        self.layers = Layers(view)
        self.artifacts = Artifacts(home)
        self.handles = HandleTable()
        # Who may ask: everyone, or (a sandbox's mount, with a gate) that sandbox only (``vfs.callers``).
        self.callers = Callers(gate, self.handles, self.layers.inodes)
        self.uid, self.gid = owner if owner is not None else (os.getuid(), os.getgid())
        self.started_ns = time.time_ns()  # the time of every folder, constant: it says nothing of writes
        # Failed verification in this mount: EIO until the view moves on, once the event says it is audited.
        self.bad_revisions: dict[str, trio.Event] = {}
        self._limiter = trio.CapacityLimiter(1)
        self._calls = 0  # catalog calls running or queued (``catalog``)
        self._quiet = trio.Event()  # set while there are none
        self._quiet.set()
        # The audit rows catalog calls could not write yet, kept for the follower's next tick: an audit
        # write waits at most AUDIT_WAIT_MS on the catalog thread, where refreshes queue behind it.
        self.audit_backlog = AuditBacklog(AUDIT_WAIT_MS)
        home.checkpoint_later(WAL_BACKSTOP_PAGES)
        self._changes = 0  # ``home.changes()`` after the last catalog call
        self.wrote = False  # a catalog call changed rows since the follower last checkpointed
        self._sync_lock = trio.Lock()
        self.settle_wanted = trio.Event()  # set when a writer or a removal starts waiting (``vfs.follow``)
        # Set when a refresh fails, whoever asked for it: the follower, which may be asleep for
        # ``follow.FOLLOW_S``, then looks again every ``follow.POLL_S`` until one succeeds.
        self.refresh_failed = trio.Event()
        self.currency = Currency()  # how current the view applied is (``vfs.currency``; ``sync``)
        # Told the view that was left each time it moves on (``vfs.history``), right after the layers,
        # on this thread, before any request sees the new view.
        self.view_followers: list[Callable[[VisibleView], None]] = []
        # Notes the catalog no longer shows this view, refused while their pages leave the kernel's
        # cache and before the view that lacks them is applied (``_withdrawn_then_applied``).
        self._withheld: frozenset[str] = frozenset()
        self._withholding_all = False  # the same, for a view that is no longer usable: everything
        # Given the resources that leave the view, the nodes of other rooms that hold their content
        # (``vfs.history``'s revisions), for ``_holders``.
        self.page_holders: list[Callable[[set[str]], list[Node]]] = []

    # -- the catalog thread and the view -------------------------------------

    async def catalog(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run catalog work on a thread, one call at a time (apsw connections are not shared), its
        audit writes under the mount's backlog (``catalog.audit.AuditBacklog``); notes whether it wrote,
        for the follower's checkpoint."""
        def run() -> T:
            try:
                with self.audit_backlog.active():
                    return fn(*args, **kwargs)
            finally:
                changes = self.home.changes()
                if changes != self._changes:
                    self._changes, self.wrote = changes, True
        if not self._calls:
            self._quiet = trio.Event()
        self._calls += 1
        try:
            return await trio.to_thread.run_sync(run, limiter=self._limiter)
        finally:
            self._calls -= 1
            if not self._calls:
                self._quiet.set()

    async def catalog_quiet(self, patience_s: float) -> None:
        """Return once no catalog call is running or queued, or after ``patience_s`` however busy.

        The directory watch waits for this before it reads what inotify
        reported (``vfs.watch``): most of what a busy mount's watch reports
        are its own commits (a save writes its catalog's log several times),
        and handling each made the trio thread contend with the catalog
        thread for the interpreter lock mid-commit: 0.4 ms of a 4.3 ms save.
        A refresh a report asks for runs on the catalog thread, behind those
        very calls, so waiting delays no view; a changed artifact's pages
        are looked at again (``Reads.recheck_named``) up to ``patience_s``
        later, which also bounds the wait when the calls never stop."""
        with trio.move_on_after(patience_s):
            while self._calls:
                await self._quiet.wait()

    @property
    def view(self) -> VisibleView:
        return self.layers.view

    async def sync(self, *, since: int | None = None, after_write: bool = False) -> None:
        """Bring the view up to date with the catalog and queue invalidations.

        Up to date means: the view applied was read by a refresh that began
        on the catalog thread after ``since`` (``time.monotonic_ns``; the
        call, by default). Catalog calls run one at a time, so such a
        refresh sees every commit that had returned by then; when one
        already did (another task's sync, the follower's after an inotify
        wake), this returns without reading again. A save loop then reads
        the catalog once per save, not once per save and once per wake.

        Fails closed: if the catalog cannot be read for longer than
        ``currency.FAIL_CLOSED_S``, the view is emptied until it can,
        because a revocation the mount cannot see must not keep serving
        notes.

        ``after_write``: this mount has just written the catalog (a rename,
        a commit). If the refresh fails, this returns all the same, the
        mount serving nothing until one succeeds (``_refreshed``).
        """
        asked = time.monotonic_ns() if since is None else since
        if self.currency.covers(asked):
            return
        with self.kernel.waiting_on_refresh():
            async with self._sync_lock:
                if self.currency.covers(asked):  # the sync this one waited for covered it
                    return
                await self._refreshed(None, after_write=after_write)

    async def commit_and_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``catalog(fn, ...)``, then ``sync()``, in one trip to the catalog thread: a save's commit
        and the view that shows it (a trip is a tenth of a millisecond or more). If ``fn`` raises,
        nothing is read; if the refresh fails, this returns all the same (the commit stands), the mount
        serving nothing until a refresh succeeds (``_refreshed``)."""
        with self.kernel.waiting_on_refresh():
            async with self._sync_lock:
                return (await self._refreshed(functools.partial(fn, *args, **kwargs)))[0]

    async def _refreshed(self, first: Callable[[], T] | None, *, after_write: bool = False) -> list[T]:
        """Run ``first`` (if any; its result is the list's one item), then refresh the view, on the
        catalog thread; apply it. The caller holds ``_sync_lock``."""
        old = self.view
        began = time.monotonic_ns()  # replaced by the moment the refresh really starts, on the thread
        done: list[T] = []
        taken: Mark | None = None
        whole = True

        def fresh(home: Home, view: VisibleView) -> VisibleView:
            nonlocal began, taken, whole
            if first is not None:
                done.append(first())
            began = time.monotonic_ns()
            taken = mark(home)  # before anything is read: a commit landing meanwhile makes the next mark differ
            if first is None and self.currency.unmoved(taken, view):
                whole = False
                return view
            return refresh(home, view)

        try:
            new = await self.catalog(fresh, self.home, old)
        except Exception as exc:
            self.currency.forget_mark()  # whatever failed may have written: the next refresh reads whole
            self.refresh_failed.set()
            if first is not None and not done:
                raise  # the commit failed: the view was not read, and is no staler than before
            # After a write of this mount's, the view applied shows what the write replaced (a note's
            # older revision, a name moved, no new note), which no read, draft, save or name may take
            # for what is there now: the mount is suspended (``serving``). The view stays applied, so
            # open files and folders come back with it; the kernel's cache of this mount's own write
            # holds what was written.
            wrote = bool(done) or after_write
            if self.currency.failed(began, wrote=wrote) and old.usable:  # unreadable that long, not once
                await self._withdrawn_then_applied(old.emptied(Reason.INVALID_CONTEXT))
            if wrote:  # done, so the call succeeded; the follower, woken by the write, reads the view again
                log.warning("the view was not refreshed after a save (%s)", type(exc).__name__)
                return done
            raise
        self.currency.read(whole=whole)
        await self._withdrawn_then_applied(new)
        self.currency.applied(began, taken, new)  # read after every write of this mount's that had returned
        return done

    def check_current(self) -> None:
        """EACCES while the mount is ``suspended``: the names, sizes and times of the view applied are
        the ones a write of its own changed (a new note absent, a moved one where it was)."""
        if self.currency.suspended:
            raise fail(errno.EACCES)

    @property
    def suspended(self) -> bool:
        """Whether the view applied lacks a write of this mount's (``vfs.currency``): nothing is served,
        saved or made until a refresh succeeds. The kernel learns nothing of the view meanwhile (no
        name, size or listing: ``check_current``), so nothing it keeps needs dropping after."""
        return self.currency.suspended

    @property
    def failing(self) -> bool:
        """Whether the last refresh failed: the follower looks again soon (``vfs.follow``)."""
        return self.currency.failing

    async def resume(self) -> None:
        """If suspended, read the view again, unless a refresh failed less than ``currency.RETRY_S`` ago
        (a commit while suspended asks; so may every writer an unmount settles); errors are the next
        refresh's to report."""
        if self.currency.suspended and self.currency.may_retry:
            with contextlib.suppress(Exception):
                await self.sync()

    async def _withdrawn_then_applied(self, new: VisibleView) -> None:
        """Apply ``new`` once the kernel's pages of every note it no longer shows are gone.

        Applying a view changes what the server answers at once: a lookup
        of a name the kernel no longer caches, a listing, ``.history``,
        ``.search``. The kernel's cached names and pages go afterwards, in
        order, on the worker; a process that saw a note's name go must not
        then read its bytes from the cache, through a descriptor it held or
        a copy of the note. So the pages go first (invalidate, then serve the
        new view), and meanwhile the old view is served, but for the notes
        that leave it, which are refused as the new view would refuse them
        (``shows``; every content path asks it, the commit of a draft too).

        Nothing that holds a page lock waits on a refresh (``READ``,
        ``WRITE`` and a page fault never do), so the drop cannot wait on
        the refresh that waits on it. One request can: a truncation by path
        holds the kernel's writeback of its note back until it is answered,
        and commits, which refreshes; a note whose commit is under way is
        therefore left to the worker's drop after the apply, and its
        ``READ``s are refused from here on (``Node.left_view``). So the
        handlers waiting on the refresh do not make the mount busy for this
        drop (``Kernel.busy``): a drop that is stuck fails the mount closed within
        ``watchdog.STALL_S`` however many saves wait on it. If the drop
        fails otherwise, the view is still applied: the worker's drops follow
        it, as before.
        """
        try:
            old = self.view
            everything = old.usable and not new.usable
            leaving: set[str] = set()  # the notes that leave, found as ``Layers.apply`` finds what changed
            if old.usable and new.usable and new is not old:
                leaving = {n.resource_id for n in changed_notes(old, new) if n.resource_id not in new.by_resource}
            holders = self._holders(leaving, everything=everything) if leaving or everything else []
            if holders:  # the kernel caches pages only of inodes it was given
                self._withheld, self._withholding_all = frozenset(leaving), everything
                try:
                    await self.kernel.drop_pages_now(holders, for_refresh=True)
                finally:
                    self._withheld, self._withholding_all = frozenset(), False
        finally:
            self._apply(new)

    def _holders(self, leaving: set[str], *, everything: bool) -> list[Node]:
        """The nodes whose cached pages hold content of ``leaving`` (all that hold content, if
        ``everything``: a view no longer usable takes this mount's own files with it too), but
        those whose commit is under way (``_withdrawn_then_applied`` says why)."""
        layers = self.layers
        if everything:
            found = [node for node in layers.inodes.nodes.values() if _holds_content(node)]
        else:
            found = [layers.by_resource[r] for r in leaving if r in layers.by_resource]
            found += [node for r in leaving for node in layers.inodes.unnamed_of(r)]  # held open, unlinked
            found += [node for node in layers.local.values() if copied_from(node) in leaving]
            found += [node for node in layers.inodes.results.values()
                      if isinstance(node.query, Results) and not node.query.quoted.isdisjoint(leaving)]
            for holding in self.page_holders:
                found += holding(leaving)
        return list({node.ino: node for node in found if not node.commit_lock.locked()}.values())

    def withheld(self, resource_id: str | None) -> bool:
        """Whether ``resource_id`` is on its way out of the view (``_withdrawn_then_applied``), or the view
        lacks a write of this mount's (``_refreshed``)."""
        return self._withholding_all or self.currency.suspended or resource_id in self._withheld

    def _apply(self, new: VisibleView) -> None:
        old = self.view
        for item in self.layers.apply(new):
            node = self.layers.inodes.get(item.ino)
            if item.name is None and node is not None and node.kind is Kind.DIR:
                # A folder's cached listing is stale before any request sees the new view: its
                # mtime moved (``Layers.apply``) and its attributes go here, on this thread, which
                # waits for no lock (``vfs.pages.list_again``); its pages, if it lost a name, go on
                # the worker, as the kernel holds one locked while a caller's copy may wait on a READ
                # this loop answers.
                list_again(item.ino)
                if item.listing_grew:
                    continue  # its cached pages may stay (``Layers._listings_changed`` says why)
            self.kernel.queue(item, node)
        if self.view is not old:
            # Local copies of notes (a backup taken by rename, a draft loaded
            # from a note) must not outlive the note's place in the view,
            # nor may a query's results that quote one.
            for node in self.layers.local.values():
                source = copied_from(node)
                if source is not None and not self.shows(source):
                    self.kernel.forget_pages(node)
            for node in self.layers.inodes.results.values():
                if isinstance(node.query, Results) and not (
                        self.view.usable and node.query.quoted <= self.view.by_resource.keys()):
                    self.kernel.forget_pages(node)
            for follower in self.view_followers:
                follower(old)

    def shown_again(self, parts: Parts) -> None:
        """``parts`` shows again with no view change (its removal refused, or given up for a note that
        came meanwhile): a listing of its folder the kernel cached while the name was hidden lacks it,
        and would go on lacking it, since nothing else moves the folder's mtime. It gained a name: its
        pages may stay (``Layers._listings_changed``)."""
        self._list_again(parts[:-1])

    def never_was(self, node: Node) -> None:
        """``node``'s name went with no view change (a new note whose first commit failed, dropped
        from the overlay): the kernel must forget its entry, which would still answer ``stat``, and
        its folder's listing, pages too, as for any folder that lost a name (``_apply``)."""
        folder = self._list_again(node.parts[:-1])
        if folder is not None:
            self.kernel.queue(Invalidation(folder.ino), folder)
            self.kernel.queue(Invalidation(node.ino, folder.ino, node.parts[-1]), node)

    def _list_again(self, folder_parts: Parts) -> Node | None:
        """Move the folder's mtime and drop its attributes now, if the kernel knows it; the folder."""
        folder = self.layers.dirs.get(folder_parts)
        if folder is not None:
            folder.listing_version += 1
            list_again(folder.ino)
        return folder

    def drop_absence(self, folder_ino: int, name: str) -> None:
        """The kernel must forget that ``name`` is absent from the folder (queued for the invalidation
        worker): the record of it was taken out for a change that did not happen."""
        self.kernel.queue(Invalidation(NO_INODE, folder_ino, name), None)

    async def dismissed(self, pid_namespace: int) -> None:
        """A sandbox is gone: drop every page the kernel holds of this mount (``vfs.gate`` says why).

        Reads come by inode, without an open, so the mount cannot tell which
        sandbox brought a page in: all of them go.
        """
        await self.kernel.drop_pages_now(list(self.layers.inodes.nodes.values()))

    async def close_view(self) -> None:
        """Before the connection to the kernel closes (a stop by signal): no sandbox is admitted any
        more, so nothing can bring a page back, and then no page of the view may outlive the connection."""
        if self.callers.gate is not None:
            self.callers.gate.dismiss_all()
        await self.kernel.drop_pages_now(list(self.layers.inodes.nodes.values()))

    def event(self, operation: str, decision: str, reason: Reason, note: VisibleNote) -> AuditEvent:
        return self.view.access.event(operation, decision, reason, store_id=note.store_id,
                                      revision_id=note.revision_id)

    # -- what the view allows ------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether the view may serve anything: usable, not on its way out (``_withdrawn_then_applied``),
        and showing every write of this mount's (``_refreshed``)."""
        return self.view.usable and not self._withholding_all and not self.currency.suspended

    def shows(self, resource_id: str) -> bool:
        """Whether the view still shows this resource (so its content may be served)."""
        return self.serving and resource_id in self.view.by_resource and resource_id not in self._withheld

    def check_copy(self, node: Node) -> None:
        """EACCES unless the view is usable and still shows the note ``node``'s content came from."""
        source = copied_from(node)
        if not self.serving or (source is not None and not self.shows(source)):
            raise fail(errno.EACCES)

    def check_writable(self, parts: Parts) -> None:
        """EACCES without evidence, or while the view lacks a write of this mount's (``serving``); EROFS
        where the view places no writes (a read-only root)."""
        if not self.serving:
            raise fail(errno.EACCES)
        if not self.layers.writable(parts):
            raise fail(errno.EROFS)

    def check_new_name(self, parent: Node, name: str, *, ignore: str | None = None) -> None:
        """EINVAL for a new name that looks like a sibling's (``vfs.names``)."""
        layers = self.layers
        look_alikes = confusable(name, layers.child_names(parent.parts) - {ignore})
        # only those still there count (a name being removed no longer does): looked up one by one,
        # since a create must not cost a lookup of every sibling
        if any(layers.lookup(parent.parts + (other,)) is not None for other in look_alikes):
            raise fail(errno.EINVAL)

    async def first_commit_done(self, node: Node | None) -> bool:
        """Wait for ``node``'s first commit if one is under way; True if this waited.

        A created file closed unwritten is committed when the kernel
        releases it, which it does not wait for (``touch f; rm f``,
        ``touch f; mv g f``, ``touch f; mv f f~``), or when the settle
        lets go of a writer left idle. A name change made
        meanwhile would act on a local file that is about to become the
        catalog's note, which would then show again, or be saved over what
        was moved to its name. The caller looks its names up again after.
        """
        if (node is None or node.kind is not Kind.NOTE or not node.commit_lock.locked()
                or self.layers.local.get(node.parts) is not node):
            return False
        await self.commit_over(node)
        return True

    async def commit_over(self, node: Node) -> None:
        """Until the commit of ``node`` under way (if any) is over. Counted as waiting on a refresh,
        since that commit waits on one: the caller holds no page lock a refresh's drop could need."""
        with self.kernel.waiting_on_refresh():
            async with node.commit_lock:
                pass

    # -- nodes by number and name ----------------------------------------------

    def node(self, ino: int) -> Node:
        found = self.layers.inodes.get(ino)
        if found is None:
            raise fail(errno.ENOENT)
        return found

    def folder(self, ino: int) -> Node:
        """The folder ``ino`` (ENOENT if it lost its name, ENOTDIR if it is a file)."""
        found = self.node(ino)
        if found.kind in (Kind.QUERIES, Kind.HISTORY):
            return found  # a folder of the query or history tree (vfs.queries, vfs.history): no name to lose
        if found.kind is not Kind.DIR or not found.attached:
            raise fail(errno.ENOENT if not found.attached else errno.ENOTDIR)
        return found

    def new_child(self, parent_ino: int, name: bytes, *, folder: bool = False) -> tuple[Node, str, Parts]:
        """The folder, the decoded name and the path of a name about to be made in it.

        Refused where nothing may be made (EACCES, EROFS), where the path
        could never be a note's (ENAMETOOLONG, ``check_fits``) and where the
        name is taken (EEXIST); a look-alike of a sibling is the caller's to
        check, since a name cancelling a removal here is not new.
        """
        parent = self.folder(parent_ino)
        text = child_name(name)
        parts = parent.parts + (text,)
        check_fits(parts, folder=folder)
        self.check_writable(parts)
        if self.layers.lookup(parts) is not None:
            raise fail(errno.EEXIST)
        return parent, text, parts

    def existing(self, parent_ino: int, name: bytes) -> tuple[Parts, Node]:
        """The path and node of an existing child (ENOENT otherwise), for changes to it."""
        parts = self.folder(parent_ino).parts + (child_name(name),)
        if is_query_path(parts) or is_history_path(parts):
            self.check_writable(parts)  # the query and history trees are read-only: refused like a read-only root
        found = self.layers.lookup(parts)
        if found is None:
            raise fail(errno.ENOENT)
        return parts, found


def child_name(name: bytes) -> str:
    """A name to create, decoded and validated (EINVAL, ENAMETOOLONG)."""
    try:
        return decode(name)
    except BadName as exc:
        raise fail(exc.errno) from None


def check_fits(parts: Parts, *, folder: bool = False) -> None:
    """ENAMETOOLONG for a path the writer would refuse (``catalog.paths``: depth, bytes).

    Checked where the name is made (create, mkdir, rename), not at the
    close that commits it: by then the tool believes the file exists, and
    a refusal at close loses its data. A ``folder`` must leave room for
    one note of a single byte in it, or nothing could ever be saved there.
    """
    depth = len(parts) + (1 if folder else 0)
    size = sum(len(part.encode("utf-8")) for part in parts) + len(parts) - 1 + (2 if folder else 0)
    if depth > MAX_DEPTH or size > MAX_PATH_BYTES:
        raise fail(errno.ENAMETOOLONG)


def _holds_content(node: Node) -> bool:
    """Whether the kernel may cache pages of ``node`` that hold content (a folder's are its listing,
    whose names go with the view's apply: ``Layers.apply``)."""
    return node.kind not in (Kind.DIR, Kind.QUERIES, Kind.HISTORY)
