"""Writing through a mount: drafts, and the one revision each close makes of them.

Content goes to an in-memory draft (``vfs.drafts``) and becomes one new
revision, through the writer's staged-rename transaction, when the file
is closed (``flush``) or synced. A save that changed nothing makes no
revision. Scratch files of editors have drafts too, and never leave this
mount.

Durability follows POSIX (DESIGN.md §6): a close commits without any
disk sync (visible to every session at once, safe from the death of any
process, and listed as unsynced so that recovery can roll it back if a
power loss takes it); ``fsync``/``fdatasync`` of the note commits durably,
or makes what earlier closes committed durable (``sync``), and ``fsync``
of a folder does that for every note of the mount's cells. Every half minute and at unmount one ``syncfs``
makes what closes committed here durable, as the kernel would have
written it back by then anyway. The audit rows of unsynced commits wait
in the outbox and are drained in batches; the search rows follow once the
saves pause (``vfs.owed`` keeps what each save leaves to do, and
``vfs.follow`` does it).

Which handle each inode's writes go through, and the settle that commits
writers no close follows (the kernel sends no RELEASE here), are
``vfs.writers``'s. A ``FLUSH`` (every close sends one) commits and lets go
of the inode's writer (``flush_inode``); a handle that only truncated or
created an empty file (the shell's ``> note`` closing its first descriptor
before anything is written, ``touch``) is kept for the writes that follow.

Each commit names the note it means (``catalog_ops.commit`` with the
node's resource id): if another session renamed the note away meanwhile,
the mount catches up with the view once and commits to the note where it
now is, as a file descriptor follows its file across a rename.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable

import pyfuse3
import trio

from scopefs.catalog.errors import Conflict, Denied
from scopefs.catalog.paths import Parts
from scopefs.catalog.postbox import DEPOSIT_MAX_BYTES, handle_of_name, refused
from scopefs.catalog.visible import VisibleNote
from scopefs.vfs import catalog_ops
from scopefs.vfs.drafts import Draft
from scopefs.vfs.errors import errno_for, fail
from scopefs.vfs.handles import Handle
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState, child_name
from scopefs.vfs.owed import Owed
from scopefs.vfs.reads import Reads
from scopefs.vfs.scratch import is_scratch
from scopefs.vfs.writers import Writers, is_refusal
from scopefs.writer.transaction import WriteResult

log = logging.getLogger("scopefs.vfs")


class Commits:
    """Drafts of one mount's notes and scratch files, and the commits that turn them into revisions."""

    def __init__(self, mount: MountState, reads: Reads) -> None:
        self._mount = mount
        self._reads = reads
        self.writers = Writers(mount, self.release)  # which handle writes each inode, and the settle
        # inode -> its note, while commits of its draft are under way or waiting for its lock, and how many
        self._committing: dict[int, tuple[Node, int]] = {}
        self.owed = Owed(mount)  # the syncs, search rows and audit rows the saves made here leave (``vfs.owed``)

    async def ensure_draft(self, node: Node, *, truncate: bool) -> Draft:
        """``node``'s draft, made now from its current content (or from nothing) if it has none."""
        return (await self._draft_of(node, truncate=truncate))[0]

    async def _draft_of(self, node: Node, *, truncate: bool) -> tuple[Draft, bool]:
        """``ensure_draft``, and whether this call made the draft (rather than found one)."""
        mount = self._mount
        existing = node.draft
        if existing is not None:
            if truncate and existing.size:
                existing.truncate(0)
            return existing, False
        while True:
            committed_here = node.committed_revision
            source = self._content_of(node)
            if source is None or truncate:
                data, loaded_from = b"", None
                break
            if not mount.shows(source.resource_id):
                raise fail(errno.EACCES)
            data = await self._reads.load(source)  # a large note loads on a thread: the node may move on
            loaded_from = source.resource_id if data else None
            if node.draft is not None:  # another request made one meanwhile: it may hold that request's
                return node.draft, False  # writes already, so it is the draft
            # Another request's draft of this node committed and let go meanwhile: start from that commit,
            # or the close would put the content loaded back over it. (Another session's save meanwhile is
            # overwritten, as any save through a mount overwrites what it did not read: last writer wins.)
            if node.committed_revision == committed_here:
                break
        node.draft = draft = Draft(data, source_resource=loaded_from)
        node.frozen = None if node.kind is Kind.SCRATCH else node.frozen
        if truncate and source is not None and source.size:
            draft.dirty = True
        return draft, True

    def _content_of(self, node: Node) -> VisibleNote | None:
        """The revision a draft of ``node`` starts from: a backup's own, or the one its note shows."""
        return node.frozen if node.kind is Kind.SCRATCH else self._mount.layers.note_of(node)

    async def writer(self, node: Node, pid_namespace: int | None, *, truncate: bool = False) -> Handle:
        """The handle ``node``'s writes by inode go through: made now (from its content, or empty when
        ``truncate``: an ``O_TRUNC`` open never reads what it throws away) if there is none.

        On a sandbox's mount the handle belongs to the sandbox whose write
        or truncation made it; a dismissal revokes it like any other.
        """
        mount = self._mount
        writers = self.writers
        # A writer kept for a sandbox since dismissed: none of it may be committed, and nothing written
        # now may go with it when it is let go. This write starts a writer of its own, from the note.
        await writers.forsake(node)
        handle = writers.writer_of(node)
        if handle is not None:
            handle.used = time.monotonic()
            return handle
        if node.kind in (Kind.DIR, Kind.QUERIES, Kind.RESULTS):
            raise fail(errno.EISDIR if node.kind is not Kind.RESULTS else errno.EROFS)
        if node.kind is not Kind.SCRATCH:
            mount.check_writable(node.parts)
        draft, made = await self._draft_of(node, truncate=truncate)
        handle = writers.writer_of(node)
        if handle is not None:  # another request's, made while the draft loaded: one writer per node
            handle.used = time.monotonic()
            return handle
        handle = Handle(node, writable=True, pid_namespace=pid_namespace)
        try:
            fh = mount.callers.give(handle)
        except BaseException:
            # Its sandbox was dismissed while the note's draft loaded: the draft was made for nobody.
            # Left, it would be read in place of the note (another session's save shown never), and
            # the next writer would start from it, putting it back over that save (or commit the
            # truncation). A scratch file's draft is its content, frozen no more: it stays.
            if made and node.kind is Kind.NOTE and node.draft is draft and node.opens == 0:
                self._discard(node)
            raise
        writers.register(node, fh)
        return handle

    def _discard(self, node: Node) -> None:
        """Drop ``node``'s draft. If it held uncommitted bytes, the kernel's pages (and its size) of
        them go too, and READs by inode are refused until that drop has ended
        (``Node.discarded_until``): a kernel still sizing the file as written would pad the older
        revision with zeros."""
        draft = node.draft
        if draft is None:
            return
        if draft.dirty:
            self._mount.kernel.forget_pages(node)
            node.discarded_until = node.invalidations_queued  # (queued, or one queued already)
        draft.close()
        node.draft = None

    async def flush_inode(self, node: Node) -> None:
        """A close of a file that was opened without an open: commit its writes, let go of its handle.

        Any descriptor's close of the inode commits what was written
        through any of them: the kernel does not say which one wrote.
        """
        writers = self.writers
        # The settle may be committing this inode's writes, its writer taken out of the registry for
        # the while: this close answers for that commit (the writer kept if it failed: found below).
        lost = await writers.settled(node)
        await writers.forsake(node)  # a dismissed sandbox's refused writes go, uncommitted, not this close's
        handle, fh = writers.writer_of(node), writers.fh_of(node)
        if handle is None or fh is None:
            if lost is not None:
                raise fail(lost)  # the settle's commit failed for good, and its writes went
            return
        try:
            await self.flush(handle)
        except BaseException:
            if not self._mount.suspended:  # (suspended: kept for a close or a settle once it resumes)
                with trio.CancelScope(shield=True):
                    await writers.let_go(node, fh=fh, commit=False)  # refused or failed: none of it stays readable
            raise
        if handle.wrote or node.draft is None or not node.draft.dirty:
            # Its release commits once more what was written during this commit (through the same
            # writer, by another process): if that fails, those writes went, and this close says so.
            released = await writers.let_go(node, fh=fh)
            lost = lost if lost is not None else released
        if lost is not None:
            raise fail(lost)  # the settle's commit (or the release's) failed for good, and its writes went

    async def create(self, parent_ino: int, name: bytes, pid_namespace: int | None) -> tuple[Node, int]:
        """A new note or scratch file, open for writing: its node and file handle."""
        mount = self._mount
        layers = mount.layers
        if layers.depositable(mount.folder(parent_ino).parts + ("x",)):
            return await self.create_deposit(parent_ino, name, pid_namespace)
        parent, text, parts = mount.new_child(parent_ino, name)
        removal = layers.removed.get(parts)
        revived = None
        if removal is not None and not removal.in_flight:
            # Unlinked or renamed away a moment ago: this is a new revision of
            # the same note (an editor's save, mv's copy over it).
            layers.cancel_removal(parts)
            revived = layers.lookup(parts)
            if revived is not None and revived.resource_id != removal.resource_id:
                # Another session moved the unlinked note away and put another
                # one at its name: saving into that one would overwrite a note
                # this tool never opened.
                mount.shown_again(parts)  # that one shows at the name now
                raise fail(errno.EAGAIN)
        if revived is not None:
            node = revived
            node.draft = Draft()
            node.draft.dirty = True
        else:
            mount.check_new_name(parent, text)
            kind = Kind.SCRATCH if is_scratch(text) else Kind.NOTE
            draft = Draft()
            draft.dirty = kind is Kind.NOTE
            node = layers.inodes.new(kind, parts, draft=draft)
            layers.add_local(node)
        node.lookups += 1
        fh = mount.callers.give(Handle(node, writable=True, pid_namespace=pid_namespace))
        self.writers.register(node, fh)
        return node, fh

    async def create_deposit(self, parent_ino: int, name: bytes, pid_namespace: int | None) -> tuple[Node, int]:
        """``postbox/<handle>.md`` in a group: a write-only file its close deposits (``writer.postbox``).

        The handle is checked now, so that a tool learns of a refusal at
        its open rather than at its close; every refusal is the same
        ``EACCES``. The node gets no name: the folder keeps listing empty,
        and looking the file up, reading it or opening it again finds
        nothing, before the close and after it.
        """
        mount = self._mount
        parts = mount.folder(parent_ino).parts + (child_name(name),)
        handle = handle_of_name(parts[-1])
        try:
            if handle is None:
                raise refused()
            await mount.catalog(catalog_ops.check_deposit, mount.home, mount.session_id, handle)
        except Denied:
            raise fail(errno.EACCES) from None
        draft = Draft()
        draft.dirty = True
        node = mount.layers.inodes.new(Kind.NOTE, parts, draft=draft)
        node.deposit, node.attached = handle, False
        try:
            fh = mount.callers.give(Handle(node, writable=True, pid_namespace=pid_namespace))
        except BaseException:
            draft.close()  # its sandbox was dismissed during the check: nobody will write or close it
            raise
        node.lookups += 1
        self.writers.register(node, fh)
        return node, fh

    async def _deposit(self, node: Node, draft: Draft) -> None:
        """A deposit's close: its bytes filed once (an empty one files nothing); EACCES for any refusal."""
        assert node.deposit is not None
        if not draft.dirty or draft.size == 0:
            return
        mount = self._mount
        # Read here, on the trio thread: the catalog thread never touches a draft's descriptor.
        data = draft.read(0, draft.size)
        draft.dirty = False  # writes landing during the filing mark it dirty again (as ``save``)
        try:
            await mount.catalog(catalog_ops.deposit, mount.home, mount.session_id, node.deposit, data)
        except BaseException as exc:
            draft.dirty = True
            if isinstance(exc, Denied):
                raise fail(errno.EACCES) from None
            raise

    def write(self, handle: Handle, off: int, buf: bytes) -> int:
        if not handle.writable or handle.node.draft is None:
            raise fail(errno.EBADF)
        if not self._mount.view.usable or handle.node.left_view:
            raise fail(errno.EACCES)  # the view went (revoked), or the note left it: nothing written could be saved
        if handle.node.deposit is not None and off + len(buf) > DEPOSIT_MAX_BYTES:
            raise fail(errno.EFBIG)  # a deposit is an observation, bounded before it is held
        handle.wrote = True
        handle.used = time.monotonic()
        return handle.node.draft.write(off, buf)

    async def truncate(self, node: Node, size: int, *, by_path: bool) -> None:
        """``truncate(2)``/``ftruncate(2)``: the draft's new size (by path, committed at once)."""
        if node.kind is Kind.DIR:
            raise fail(errno.EISDIR)
        await self.writers.forsake(node)  # a truncation starts from the note, not from what it holds
        draft = await self.ensure_draft(node, truncate=False)
        draft.truncate(size)
        if by_path and node.kind is Kind.NOTE:  # truncate(2) by path: nobody will close it
            try:
                await self.commit(node)
            except BaseException:
                if node.opens == 0 and node.draft is draft:  # nor release it: the failed truncation goes now
                    # (not ``_discard``: the kernel kept no size of it, its SETATTR failed; reads go on)
                    self._mount.kernel.forget_pages(node)
                    draft.close()
                    node.draft = None
                raise
            if node.draft is not draft and draft.dirty:
                raise fail(errno.EAGAIN)  # another truncation's refusal let this draft go uncommitted
            node.close_clean_draft()

    async def commit(self, node: Node, *, durable: bool = False, only_if: Callable[[], bool] | None = None) -> None:
        """Make a note's dirty draft its next revision (one writer transaction), synced to disk
        if ``durable``; not if ``only_if``, asked once this holds the node's commit lock, says no."""
        mount = self._mount
        with mount.kernel.waiting_on_refresh():
            await self._commit_locked(node, durable=durable, only_if=only_if)

    async def _commit_locked(self, node: Node, *, durable: bool, only_if: Callable[[], bool] | None) -> None:
        # Counted before the lock is asked for (its acquire yields once it holds it): a folder's fsync
        # that comes meanwhile finds this commit and waits for it (``committed_under``).
        _, waiting = self._committing.get(node.ino, (node, 0))
        self._committing[node.ino] = (node, waiting + 1)
        try:
            async with node.commit_lock:  # one commit of a node at a time
                try:
                    await self._commit_held(node, durable=durable, only_if=only_if)
                except BaseException:
                    node.failed_commits += 1  # what an fsync that waited for it reports (``ScopeFS.fsync``)
                    raise
        finally:
            _, waiting = self._committing[node.ino]
            if waiting == 1:
                del self._committing[node.ino]
            else:
                self._committing[node.ino] = (node, waiting - 1)

    async def _commit_held(self, node: Node, *, durable: bool, only_if: Callable[[], bool] | None) -> None:
        """The commit itself; the caller holds ``node.commit_lock``. ``only_if`` is asked once nothing
        more can come between it and reading the draft."""
        mount = self._mount
        draft = node.draft
        if draft is not None and node.deposit is not None:
            await self._deposit(node, draft)
            return
        if draft is None or not draft.dirty or node.kind is not Kind.NOTE:
            return
        await mount.resume()  # a commit refreshes anyway, and holds no page lock
        if only_if is not None and not only_if():
            return
        if not mount.view.usable or mount.withheld(node.resource_id):
            # Revoked with bytes not committed (or the note on its way out of the view):
            # the close or fsync that asks must fail, never report success for data that is gone.
            self._refused(node, draft)
            raise fail(errno.EACCES)
        if not node.attached:
            if node.left_view:
                self._refused(node, draft)
                raise fail(errno.EACCES)  # removed by another session, or the view went and came back
            return  # unlinked here while open: its writes go with it, as on any filesystem
        if self.writers.forsaken_draft(draft):  # a dismissed sandbox's refused writes, taken over meanwhile
            self._refused(node, draft)
            raise fail(errno.EACCES)
        try:
            saved = await self.save(node, draft, node.parts, node.resource_id, durable=durable)
        except BaseException:
            mount.kernel.forget_pages(node)  # the kernel holds refused bytes: they must not be read back
            raise
        if saved is None:  # the draft holds exactly the revision the view shows: so do the kernel's pages
            shown = mount.layers.note_of(node)
            node.written_revision = shown.revision_id if shown is not None else node.written_revision
            return
        node.committed_revision = node.written_revision = saved.revision_id  # shown already (``commit_and_sync``)
        self.bind(node, saved.resource_id)

    async def save(self, node: Node, draft: Draft, parts: Parts, expected: str | None, *,
                   durable: bool = False) -> WriteResult | None:
        """``draft`` as the next revision of the note ``expected`` (None: a new note) at ``parts``.

        None, and no revision, when the draft holds exactly the revision the
        view shows of that note at ``parts``: a save that changed nothing (a
        note moved away meanwhile is not at ``parts``: the commit decides).
        The caller holds ``node.commit_lock``; a failure leaves the draft dirty.
        """
        if not self._mount.serving:
            raise fail(errno.EACCES)  # what the view shows of ``expected`` may be what this mount overwrote
        current = self._mount.layers.note_for(expected)
        if current is not None and current.parts == parts and draft.holds(current.size, current.sha256):
            draft.dirty = draft.refused = False
            draft.kept_for = None
            return None
        try:
            self._mount.check_copy(node)
        except pyfuse3.FUSEError:
            self._refused(node, draft)  # a refusal like the catalog's: the settle keeps it for a close
            raise
        cell_agent = self._cell_agent(parts)
        draft.dirty = False  # writes landing during the commit mark it dirty again
        try:
            saved = await self._commit_following(node, draft, parts, expected, durable)
        except BaseException as exc:
            draft.dirty = True
            if is_refusal(exc):
                self._refused(node, draft)
            raise
        draft.refused = False  # what it holds now is committed
        draft.kept_for = None
        self.owed.saved(cell_agent, saved.store_id, durable=durable)
        return saved

    def _refused(self, node: Node, draft: Draft) -> None:
        """A commit of ``draft`` was refused: the bytes refused are not read back, from the kernel's
        cache or from the draft (``Draft.refused``), until what it holds is committed."""
        draft.refused = True
        self._mount.kernel.forget_pages(node)

    def _cell_agent(self, parts: Parts) -> str:
        """The agent id of the cell that holds ``parts``: the session's agent's, or a shared pool's."""
        access = self._mount.view.access
        found = access.view.mount_for(parts)
        return access.in_cell(found[0].cell if found is not None else "").agent_id

    async def committed_under(self, folder: Parts) -> None:
        """Until every note created under ``folder`` that a close may have shown is committed.

        A close may return before its note's commit: a file created or
        truncated and closed unwritten (``touch f``, ``: > f``) is committed
        by the settle once its writer was left alone (``writers.WRITER_IDLE_S``),
        or by its RELEASE where the kernel sends one, which it does not
        wait for either. An fsync of the folder that comes after that close
        must find the note committed, so that it makes it durable, rather
        than answer before the commit, which would then land unsynced. So
        this waits for the commits under way (or waiting for their lock),
        and commits itself every new note under ``folder`` that holds
        nothing yet and still has its writer: an empty file, so nothing of a
        file another process is still writing is shown before its close.
        A note this session may not write there now (its commit refused) is
        not the folder's to sync: its writer's own close or fsync learns
        of the refusal, and this fsync goes on with the others. Any other
        failure, or a mount suspended before or during it, fails the fsync:
        it did not make that name durable. (A file's own fsync waits for
        whatever commit of it is under way: ``ScopeFS.fsync``.)
        """
        mount = self._mount

        async def under_way() -> None:
            for committing, _ in list(self._committing.values()):
                if committing.parts[:len(folder)] == folder:
                    await mount.commit_over(committing)

        await under_way()
        for fh in self.writers.handles():
            handle = mount.handles.get(fh)
            if handle is None:
                continue
            node = handle.node

            def created_empty(node: Node = node, fh: int = fh) -> bool:
                draft = node.draft
                return (self.writers.fh_of(node) == fh and node.parts[:len(folder)] == folder
                        and node.kind is Kind.NOTE and node.resource_id is None and node.deposit is None
                        and draft is not None and draft.dirty and draft.size == 0)

            if not created_empty():
                continue
            mount.check_current()  # EACCES while suspended: a commit now would be refused, its draft dropped
            try:
                await self.commit(node, only_if=created_empty)  # asked again before the draft is read
            except Exception as exc:
                if not is_refusal(exc) or mount.suspended:
                    raise  # this fsync did not make the new name durable: it says so
                log.warning("a new note's commit was refused at its folder's fsync")
        # The settle may have let go of a writer meanwhile (passed over above), its commit not done yet.
        await under_way()

    async def sync(self, node: Node | None) -> None:
        """``fsync``: make what closes committed without a sync durable, for ``node``'s note, or
        (None: a folder's fsync) for every cell of the view."""
        mount = self._mount
        if node is None:
            access = mount.view.access
            for cell in access.cells():
                await mount.catalog(catalog_ops.sync, mount.home, access.in_cell(cell).agent_id, None)
            return
        if mount.suspended:  # the view may lack this note's last commit: synced by its own resource
            if node.kind is Kind.NOTE and node.resource_id is not None:
                await mount.catalog(catalog_ops.sync, mount.home, self._cell_agent(node.parts), node.resource_id)
            return
        if not mount.serving:  # revoked, or on its way out: nothing says what the closes committed is durable
            raise fail(errno.EACCES)
        note = mount.layers.note_of(node) if node.kind is Kind.NOTE else None
        if note is not None:
            await mount.catalog(catalog_ops.sync, mount.home, self._cell_agent(note.parts), note.resource_id)

    async def _commit_following(self, node: Node, draft: Draft, parts: Parts, expected: str | None,
                                durable: bool) -> WriteResult:
        """Commit to the note meant; once more where it is now, if it is ``node``'s and another session moved it.
        The view shows the new revision when this returns: commit and refresh make one catalog trip."""
        mount = self._mount
        try:
            # The draft is opened here, on the trio thread, before the commit waits for the catalog
            # thread: whatever closes the draft meanwhile, the commit reads its content, never an
            # error, nor another file that took the same descriptor number.
            with draft.reader() as source:
                return await mount.commit_and_sync(catalog_ops.commit, mount.home, mount.session_id, parts,
                                                   source, expected, durable=durable)
        except Conflict as conflict:
            if expected is None or node.resource_id != expected:
                raise
            try:
                await mount.sync()  # the view catches up: a moved note's node has its new path
            except Exception:  # noqa: BLE001 - the close reports the conflict, not the failed catch-up
                raise conflict from None
            if not node.attached or node.parts == parts:
                raise
            mount.check_copy(node)  # the view moved on: the draft's source must still be in it
            if node.draft is not draft:
                raise  # let go of meanwhile: nothing is left to commit
            with draft.reader() as source:
                return await mount.commit_and_sync(catalog_ops.commit, mount.home, mount.session_id,
                                                   node.parts, source, node.resource_id, durable=durable)

    def bind(self, node: Node, resource_id: str) -> None:
        """``node`` is now the catalog resource ``resource_id``."""
        layers = self._mount.layers
        if layers.local.get(node.parts) is node:
            layers.drop_local(node.parts)
        other = layers.by_resource.get(resource_id)
        if other is not None and other is not node:
            layers.detach(other)
        node.kind = Kind.NOTE
        node.resource_id = resource_id
        node.frozen = None  # a backup renamed back is its note again
        node.attached = True
        node.left_view = False
        node.forget_pages()
        layers.by_resource[resource_id] = node

    async def flush(self, handle: Handle) -> None:
        """Commit on close, so that a successful close(2) means committed: visible everywhere, and
        kept whatever process dies (durable on disk only once synced).

        Except for a handle that has only truncated or created an empty
        file: the shell's ``> note`` opens, duplicates the descriptor and
        closes the original before anything is written, and committing
        that close would make every redirect two revisions (an empty one,
        then the content). Such a draft is committed by the close that
        follows the writes, or at release if none come.
        """
        mount = self._mount
        if not handle.writable:
            return
        draft = handle.node.draft
        if handle.wrote or (draft is not None and draft.size > 0):
            await self.commit(handle.node)
        elif draft is not None and draft.dirty and handle.node.kind is Kind.NOTE and handle.node.deposit is None:
            # Deferred, but a refusal must still reach this close().
            try:
                await mount.catalog(catalog_ops.check_save, mount.home, mount.session_id, handle.node.parts)
            except BaseException:
                mount.kernel.forget_pages(handle.node)
                raise

    async def release(self, fh: int, *, commit: bool = True, keep: bool = False) -> int | None:
        """Let go of ``fh``: commit what nobody will close again (unless ``commit`` is false: its
        commit just failed), drop what is settled. Returns the errno of a commit that failed and whose
        writes went with the draft (None otherwise).

        ``keep`` (the settle's, which cannot know whether a descriptor is
        still open: the kernel sends no RELEASE for most files): a commit
        that fails keeps the writer and its draft (marked refused, if it was
        refused). Dropped, the draft's bytes would be gone with nobody told
        (the writer's next close answering 0), and its reads would be
        answered from the older revision, which a kernel still sizing the
        file as written pads with zeros (fsx under revocation found it).
        Kept, a refusal's reads are refused, and the next close hears of it.
        """
        mount = self._mount
        layers = mount.layers
        handle = mount.handles.get(fh)
        if handle is None:
            return None
        node = handle.node
        # From here on, writes by inode make a writer of their own. Found through this handle, they
        # would land in the draft this release may close below without committing them (the kernel
        # does not wait for a RELEASE: ``touch f; echo x > f`` can write while it commits).
        self.writers.unregister(node, fh)
        failure: int | None = None
        if commit and handle.writable and node.opens == 1 and node.draft is not None and node.draft.dirty:
            failed = node.failed_commits
            try:
                await self.commit(node)  # an empty file created or truncated and closed unwritten
            except Exception as exc:  # noqa: BLE001 - nobody is left to tell, unless kept for a close
                if (keep and node.draft is not None and node.draft.dirty
                        and node.failed_commits == failed + 1  # no close heard of a failure of it meanwhile
                        and self.writers.keep(handle, fh, exc)):  # nor did another writer come
                    return None
                log.warning("a note was not committed at release (%s)", type(exc).__name__)
                failure = errno.EIO if isinstance(exc, Conflict) else errno_for(exc)  # not EAGAIN: gone
        if mount.handles.take(fh) is None:  # only now: until here the handle counted in ``opens`` was in the
            return None  # table; gone, another release of it (a settle's let-go while this one committed) counted it
        node.opens -= 1
        if node.opens == 0 and node.kind is Kind.NOTE and node.draft is not None and node.commit_lock.locked():
            # Another close is committing the draft (this is the settle letting go of a writer that
            # looked idle while its commit waited for the catalog): the draft goes once it is done.
            await mount.commit_over(node)  # a FLUSH's let-go waits here as on a commit
        lost = None
        if node.opens == 0 and node.kind is Kind.NOTE and node.draft is not None:
            if node.draft.dirty:
                lost = failure  # a draft whose commit failed is discarded (else it was committed by flush)
            self._discard(node)
            if node.resource_id is None and layers.local.get(node.parts) is node:
                layers.drop_local(node.parts)  # a new note whose first commit failed never existed
                layers.detach(node)
                mount.never_was(node)
        node.close_draft_if_detached()
        return lost
