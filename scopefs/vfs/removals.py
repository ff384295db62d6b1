"""Removing notes through a mount: hidden at once, tombstoned after a grace period.

``unlink`` hides a note in this mount immediately and schedules its
tombstone (``Layers.schedule_removal``): an editor's unlink-then-create,
or ``mv``'s copy over a note, cancels it within the grace period and
becomes one new revision of the same note instead of a delete and a
stranger. ``settle`` commits the removals that are due, each naming the
note it means, so a note renamed onto the path meanwhile is spared.
"""

from __future__ import annotations

import errno
import logging

import trio

from scopefs.catalog.paths import Parts
from scopefs.vfs import catalog_ops
from scopefs.vfs.errors import fail
from scopefs.vfs.inodes import Kind
from scopefs.vfs.mount import MountState

log = logging.getLogger("scopefs.vfs")


class Removals:
    """The ``unlink`` requests of one mount and the tombstones they become."""

    def __init__(self, mount: MountState) -> None:
        self._mount = mount

    async def unlink(self, parent_ino: int, name: bytes) -> None:
        mount = self._mount
        layers = mount.layers
        parts, node = mount.existing(parent_ino, name)
        if node.kind is Kind.DIR:
            raise fail(errno.EISDIR)
        mount.check_writable(parts)
        if await mount.first_commit_done(node):  # removed only here, the note it makes would show again
            parts, node = mount.existing(parent_ino, name)
            if node.kind is Kind.DIR:
                raise fail(errno.EISDIR)
            mount.check_writable(parts)  # EACCES while suspended (the commit's refresh failed)
        if layers.local.get(parts) is node:  # scratch, or a note never committed
            layers.drop_local(parts)
            layers.detach(node)
            node.close_draft_if_detached()
            return
        assert node.resource_id is not None
        await mount.catalog(catalog_ops.check_remove, mount.home, mount.session_id, parts)
        layers.schedule_removal(parts, node.resource_id)
        mount.settle_wanted.set()

    @property
    def pending(self) -> bool:
        """Whether a removal waits for its grace period to end (``settle``)."""
        return bool(self._mount.layers.removed)

    async def settle(self, *, prefix: Parts | None = None, everything: bool = False) -> None:
        """Tombstone notes removed here whose grace period is over (all of them, or all under ``prefix``).

        A removal is forgotten here only once the view without its note is
        applied: each tombstone and the view after it are one trip to the
        catalog (``commit_and_sync``). Forgotten any sooner, the note would
        show again until the next sync (the view still holding it, nothing
        hiding it any more), and an ``rm -r`` would find its folder not
        empty. With ``prefix`` (``rmdir``), the removals under it that
        another settle has in flight are waited for too, so that the folder
        goes only once its notes did.
        """
        mount = self._mount
        layers = mount.layers
        due = layers.due_removals(everything=everything or prefix is not None)
        if prefix is not None:
            due = [(p, r) for p, r in due if p[:len(prefix)] == prefix]
        for parts, removal in due:
            if removal.in_flight:
                if prefix is not None:
                    with mount.kernel.waiting_on_refresh():  # behind another settle's commit and refresh
                        await removal.settled.wait()
                continue
            if layers.removed.get(parts) is not removal:
                continue
            removal.in_flight = True
            keep = False
            try:
                if await mount.commit_and_sync(catalog_ops.remove, mount.home, mount.session_id, parts,
                                               removal.resource_id):
                    # Tombstoned, but the refresh after it failed: hidden until a view without it is applied.
                    keep = layers.shows_at(parts, removal.resource_id)
            except trio.Cancelled:
                removal.in_flight, keep = False, True  # it never ran (the mount is going): the unmount's settle
                raise
            except Exception as exc:  # noqa: BLE001 - logged by type; the note stays
                log.warning("a removal was not committed (%s); the note stays", type(exc).__name__)
            finally:
                if layers.removed.get(parts) is removal:
                    if not keep:
                        del layers.removed[parts]
                        if layers.lookup(parts) is not None:
                            mount.shown_again(parts)  # refused, or another note is at the name by now
                    elif removal.in_flight:
                        layers.tombstoned.add(parts)
                removal.settled.set()
