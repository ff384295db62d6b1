"""Renames through a mount, as the tools that save by renaming expect them.

A rename never moves content between roots (``EXDEV``: ``mv`` then copies,
through the write path and its policy checks). Inside a root it is one of:

* a note moved to another name: one writer transaction, the note keeps its
  identity and revisions (``_rename_note``);
* a note renamed to a scratch name, as vim and Emacs do before a save: the
  note is scheduled for removal and its revision stays readable under the
  scratch name until then, so renaming it back undoes it (``_rename_away``);
* a scratch file or a note not committed yet renamed to a note's name: its
  content becomes a revision, of the note it replaces if there is one
  (``_rename_local``; the atomic save of sed -i, Python, editors);
* an empty folder made in this mount; folders that hold notes exist only
  through their notes and are refused with ``EXDEV`` (tools copy them).
"""

from __future__ import annotations

import errno
import time

from scopefs.catalog.paths import Parts
from scopefs.vfs import catalog_ops
from scopefs.vfs.commits import Commits
from scopefs.vfs.errors import fail
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.layers import Removal
from scopefs.vfs.mount import MountState, check_fits, child_name
from scopefs.vfs.scratch import is_scratch

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class Renames:
    """The ``rename`` requests of one mount."""

    def __init__(self, mount: MountState, commits: Commits) -> None:
        self._mount = mount
        self._commits = commits

    async def rename(self, parent_ino_old: int, name_old: bytes, parent_ino_new: int, name_new: bytes,
                     flags: int) -> None:
        mount = self._mount
        layers = mount.layers
        if flags & RENAME_EXCHANGE:
            raise fail(errno.EINVAL)
        src, node = mount.existing(parent_ino_old, name_old)
        # Either name may be a created file whose first commit is under way: moved or saved over
        # meanwhile, the note that commit makes would come back, or be saved over what was moved.
        at_dst = layers.lookup(mount.folder(parent_ino_new).parts + (child_name(name_new),))
        waited = await mount.first_commit_done(node)
        if await mount.first_commit_done(at_dst) or waited:
            src, node = mount.existing(parent_ino_old, name_old)  # and the folders' paths below, as they are now
        old_parent, new_parent = mount.folder(parent_ino_old), mount.folder(parent_ino_new)
        dst_name = child_name(name_new)
        dst = new_parent.parts + (dst_name,)
        check_fits(dst, folder=node.kind is Kind.DIR)
        mount.check_writable(src)
        mount.check_writable(dst)
        src_root, dst_root = layers.mount_for(src), layers.mount_for(dst)  # the view roots they lie under
        if src_root is None or dst_root is None or src_root[0] != dst_root[0]:
            raise fail(errno.EXDEV)
        target = layers.lookup(dst)
        if target is node:
            return
        if target is not None and flags & RENAME_NOREPLACE:
            raise fail(errno.EEXIST)
        if target is None:
            mount.check_new_name(new_parent, dst_name, ignore=src[-1] if new_parent is old_parent else None)
        if node.kind is Kind.DIR or (target is not None and target.kind is Kind.DIR):
            self._rename_dir(node, src, dst, target)
            return
        to_scratch = is_scratch(dst_name) and not (target is not None and target.resource_id is not None)
        if node.resource_id is None:  # scratch, or a note not committed yet
            await self._rename_local(node, src, dst, target, to_scratch)
        elif to_scratch:
            await self._rename_away(node, src, dst, target)
        else:
            await self._rename_note(node, src, dst, target)

    def _rename_dir(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        """Only folders made here and still empty move; others are copied by the tool."""
        layers = self._mount.layers
        if node.kind is not Kind.DIR:
            raise fail(errno.EISDIR)
        if target is not None and target.kind is not Kind.DIR:
            raise fail(errno.ENOTDIR)
        if layers.local.get(src) is not node or layers.names(src) or target is not None:
            raise fail(errno.EXDEV)
        layers.drop_local(src)
        layers.dirs.pop(src, None)
        node.parts = dst
        layers.add_local(node)
        layers.dirs[dst] = node

    def _replace_target(self, target: Node | None, dst: Parts) -> None:
        """The node renamed over loses its name."""
        if target is None:
            return
        layers = self._mount.layers
        if layers.local.get(dst) is target:
            layers.drop_local(dst)
        layers.detach(target)
        target.close_draft_if_detached()

    async def _rename_local(self, node: Node, src: Parts, dst: Parts, target: Node | None,
                            to_scratch: bool) -> None:
        mount = self._mount
        layers = mount.layers
        if to_scratch:
            layers.drop_local(src)
            self._replace_target(target, dst)
            node.parts, node.kind = dst, Kind.SCRATCH
            layers.add_local(node)
            return
        removal = layers.removed.get(dst)
        frozen = node.frozen
        if (target is None and removal is not None and frozen is not None and node.draft is None
                and removal.resource_id == frozen.resource_id and not removal.in_flight
                and layers.shows_at(dst, frozen.resource_id)):
            # A backup renamed back over the note it was taken from: undo. (Not if another session
            # moved that note away and put another at the name: the commit below then refuses.)
            layers.cancel_removal(dst)
            layers.drop_local(src)
            node.parts, node.frozen = dst, None
            self._commits.bind(node, frozen.resource_id)
            return
        await self._commits.writers.forsake(node)  # (not under the lock: a release may wait for it)
        async with node.commit_lock:  # a close of the same file commits it too: one at a time
            if node.resource_id is None and (not node.attached or layers.local.get(src) is not node):
                raise fail(errno.ENOENT)  # let go meanwhile: its first commit was refused, so it never was
            if node.resource_id is None:
                await self._commit_local(node, src, dst, target, removal)
                return
        await self._rename_note(node, src, dst, target)  # a close made it a note while this waited

    async def _commit_local(self, node: Node, src: Parts, dst: Parts, target: Node | None,
                            removal: Removal | None) -> None:
        """The content of a local file becomes the note at ``dst`` (the one it replaces, if any).

        The caller holds ``node.commit_lock``. Content equal to the replaced
        note's makes no revision (a backup renamed back over its note while
        a tool still had it open). A refused commit leaves an unlink of
        ``dst`` made here standing.
        """
        mount = self._mount
        layers = mount.layers
        draft = await self._commits.ensure_draft(node, truncate=False)
        if self._commits.writers.forsaken_draft(draft):  # a dismissed sandbox's refused writes
            raise fail(errno.EACCES)
        replacing = target.resource_id if target is not None else None  # the note saved over, if any
        cancelled = None
        if removal is not None and not removal.in_flight and layers.removed.get(dst) is removal:
            layers.cancel_removal(dst)
            cancelled, replacing = removal, removal.resource_id
        asked = time.monotonic_ns()
        try:
            saved = await self._commits.save(node, draft, dst, replacing)
        except BaseException:
            if cancelled is not None and dst not in layers.removed:
                layers.removed[dst] = cancelled  # the unlink made here stands
            raise
        if saved is None:  # the same bytes as the note it replaces: that note, unchanged
            current = layers.note_for(replacing)
            assert current is not None
            resource_id, revision_id = current.resource_id, current.revision_id
        else:
            resource_id, revision_id = saved.resource_id, saved.revision_id
            node.written_revision = revision_id  # its pages are what was written (``Reads._keeps_to_old``)
        layers.drop_local(src)
        self._replace_target(target, dst)
        node.parts = dst
        node.committed_revision = revision_id
        try:
            await mount.sync(since=asked, after_write=True)  # nothing to read if the save's trip refreshed it
        finally:  # committed: the file renamed is the note, whatever the view (suspended if it cannot be read)
            self._commits.bind(node, resource_id)
            if node.opens == 0:
                node.close_clean_draft()

    async def _rename_away(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        """A note renamed to a scratch name (vim's and Emacs's backup before a save)."""
        mount = self._mount
        layers = mount.layers
        await self._commits.writers.forsake(node)  # a dismissed sandbox's refused writes go, uncommitted
        await self._commits.commit(node)
        if not mount.serving:  # the backup would be frozen to what the view shows: maybe what that commit replaced
            raise fail(errno.EACCES)
        await mount.catalog(catalog_ops.check_remove, mount.home, mount.session_id, src)
        note = layers.note_of(node)
        assert node.resource_id is not None
        layers.schedule_removal(src, node.resource_id)
        mount.settle_wanted.set()
        self._replace_target(target, dst)
        node.kind, node.parts, node.frozen, node.resource_id = Kind.SCRATCH, dst, note, None
        node.attached = True
        layers.add_local(node)

    async def _rename_note(self, node: Node, src: Parts, dst: Parts, target: Node | None) -> None:
        mount = self._mount
        layers = mount.layers
        await self._commits.writers.forsake(node)  # a dismissed sandbox's refused writes go, uncommitted
        await self._commits.commit(node)
        removal = layers.removed.get(dst)
        if removal is not None and removal.in_flight:
            # A note unlinked at ``dst`` about a second ago is being tombstoned right now: ``mv`` does
            # not retry, so wait for it, as ``rmdir`` does, then rename onto what is there by then.
            with mount.kernel.waiting_on_refresh():
                await removal.settled.wait()
            if node.parts != src or layers.lookup(src) is not node:
                raise fail(errno.ENOENT)  # moved or removed meanwhile (its own name is this rename's)
            target = layers.lookup(dst)
            if target is not None and target.kind is Kind.DIR:
                raise fail(errno.EISDIR)  # a folder came at the name meanwhile
            removal = layers.removed.get(dst)
            if removal is not None and removal.in_flight:
                raise fail(errno.EAGAIN)  # another unlink and settle meanwhile: let the tool try again
        if target is not None and target.resource_id is not None:
            replacing: str | None = target.resource_id
        else:  # a local file, or nothing, at the destination: nothing of the catalog's but an unlinked note
            replacing = removal.resource_id if removal is not None else None
        assert node.resource_id is not None
        await mount.catalog(catalog_ops.rename, mount.home, mount.session_id, src, dst, node.resource_id, replacing)
        layers.keep_folders(src[:-1])
        layers.cancel_removal(dst)
        self._replace_target(target, dst)
        note = layers.note_of(node)
        node.committed_revision = note.revision_id if note else None
        node.parts = dst
        await mount.sync(after_write=True)  # if it fails, the view showing the note at ``src`` serves nothing
