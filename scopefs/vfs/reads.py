"""Reading through a mount: only verified bytes of revisions the view still shows.

``open`` resolves the note's active revision and verifies its artifact
(``vfs.content``); ``read`` serves bytes from that verified file and
re-checks, on every request, that the view still allows the note. The
kernel may keep a revision's pages (``keep_cache``) only while that
revision is the one it cached; any change is invalidated by the follow
loop. Bytes verified at open go to the kernel's page cache before the
open is answered, so a first read needs no READ round trip: a small
revision's in one piece once hashed, a large one's chunk by chunk while it
is hashed on a worker (``PageStream``; ``vfs.handles`` says why nobody can
read those pages before the verdict).

A failed verification refuses the revision for the rest of the mount
(EIO, never the indexed text or an older revision instead), drops the
kernel's pages and is audited. A successful open is audited once per
revision and mount, in batches (``expose``).
"""

from __future__ import annotations

import errno
import functools
import os

import pyfuse3
import trio

from scopefs.catalog.audit import AuditEvent, record_quietly
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.content import Stamp
from scopefs.vfs.handles import Handle
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState, fail
from scopefs.vfs.pages import PageStream, drop_pages
from scopefs.vfs.queries import Queries

INLINE_BYTES = 1 << 20  # hash or load larger files on a thread, smaller ones inline


class Reads:
    """Opening notes for reading, serving their verified bytes, and the read audit of one mount."""

    def __init__(self, mount: MountState, queries: Queries) -> None:
        self._mount = mount
        self._queries = queries
        self._exposures: list[AuditEvent] = []
        self._exposed: set[str] = set()

    async def open(self, node: Node, pid_namespace: int | None) -> pyfuse3.FileInfo:
        """A read-only open of a note, a scratch file or a query's results."""
        mount = self._mount
        if node.kind is Kind.RESULTS:
            handle = Handle(node, pid_namespace=pid_namespace, results=self._queries.opened(node))
            return pyfuse3.FileInfo(fh=mount.give(handle), direct_io=True,
                                    keep_cache=False)  # the kernel keeps nothing: each cat searches anew
        if node.draft is not None:
            mount.check_copy(node)
            await mount.handles.quiesce(node)
            return pyfuse3.FileInfo(fh=mount.give(Handle(node, pid_namespace=pid_namespace)),
                                    keep_cache=False)
        note = node.frozen if node.kind is Kind.SCRATCH else mount.layers.note_of(node)
        if note is None or not mount.view.usable:
            raise fail(errno.ENOENT)
        if not mount.shows(note.resource_id):
            raise fail(errno.EACCES)
        stream = None
        if note.size > INLINE_BYTES and mount.artifacts.needs_hash(note):
            stream = mount.handles.claim_stream(node, note.size)
        try:
            return await self._open_verified(node, note, stream, pid_namespace)
        finally:
            if stream is not None:
                mount.handles.release_stream(stream)

    async def _open_verified(self, node: Node, note: VisibleNote, stream: PageStream | None,
                             pid_namespace: int | None) -> pyfuse3.FileInfo:
        mount = self._mount
        fd, stamp, verified = await self._open_artifact(node, note, stream)
        try:
            if stream is None:
                if verified and (node.stale_pages or node.cached_revision not in (None, note.revision_id)):
                    # An older revision's pages may outlive it past the new end of
                    # file (a store never shrinks the kernel's size): drop them first.
                    await trio.to_thread.run_sync(drop_pages, node.ino)
                    node.stale_pages = False
                await mount.handles.quiesce(node)  # another open's stream settles first: see vfs.handles
            mount.check_opener(pid_namespace)  # dismissed while this open awaited: store nothing, give nothing
            keep = self._keep_cache(node, note, verified, stream)
            node.cached_revision = note.revision_id
            self.expose(note)
            handle = Handle(node, note=note, fd=fd, stamp=stamp, pid_namespace=pid_namespace)
            fh = mount.give(handle, stream)
        except BaseException:
            os.close(fd)
            if stream is not None and stream.touched:  # pages stored for an open that gives no handle
                node.forget_pages()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(drop_pages, node.ino)
            raise
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep)

    async def _open_artifact(self, node: Node, note: VisibleNote,
                             stream: PageStream | None) -> tuple[int, Stamp, bytes | None]:
        artifacts = self._mount.artifacts
        if note.revision_id in self._mount.bad_revisions:
            raise fail(errno.EIO)
        try:
            if stream is not None:
                return await self._verify_streaming(node, note, stream)
            if note.size > INLINE_BYTES and artifacts.needs_hash(note):
                return await trio.to_thread.run_sync(functools.partial(artifacts.open, note, keep=False))
            return artifacts.open(note)
        except IntegrityError:
            await self.integrity_failure(note, node)
            raise fail(errno.EIO) from None

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
            return await trio.to_thread.run_sync(functools.partial(self._mount.artifacts.open, note, keep=False,
                                                                   sink=stream))
        except BaseException:
            if stream.touched:
                node.forget_pages()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(drop_pages, node.ino)
            raise

    @staticmethod
    def _keep_cache(node: Node, note: VisibleNote, verified: bytes | None, stream: PageStream | None) -> bool:
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

    async def read(self, handle: Handle, off: int, size: int) -> bytes:
        mount = self._mount
        if handle.results is not None:
            return self._queries.read(handle.results, off, size)
        if handle.note is None:
            mount.check_copy(handle.node)
            draft = handle.node.draft
            return draft.read(off, size) if draft is not None else b""
        note = handle.note
        if not mount.shows(note.resource_id):
            raise fail(errno.EACCES)  # revoked, tombstoned or denied since the open
        if note.revision_id in mount.bad_revisions:
            raise fail(errno.EIO)
        assert handle.stamp is not None
        try:
            return mount.artifacts.read(handle.fd, handle.stamp, off, size)
        except IntegrityError:
            await self.integrity_failure(note, handle.node)
            raise fail(errno.EIO) from None

    async def load(self, note: VisibleNote) -> bytes:
        """A whole revision, verified (a draft starting from a note's content)."""
        artifacts = self._mount.artifacts
        try:
            if note.size > INLINE_BYTES:
                return await trio.to_thread.run_sync(functools.partial(artifacts.read_all, note, keep=False))
            return artifacts.read_all(note)
        except IntegrityError:
            await self.integrity_failure(note)
            raise fail(errno.EIO) from None

    async def integrity_failure(self, note: VisibleNote, opened: Node | None = None) -> None:
        """Refuse the revision from now on, drop the kernel's pages, audit.

        The pages of the node that was opened go too when it is not the
        note's own node (a scratch file frozen to the revision: vim's backup).
        """
        mount = self._mount
        mount.bad_revisions.add(note.revision_id)
        own = mount.layers.by_resource.get(note.resource_id)
        for node in (own, opened if opened is not own else None):
            if node is not None:
                mount.forget_pages(node)
        event = mount.event(Op.READ, "error", Reason.REVISION_STALE, note)
        await mount.catalog(record_quietly, mount.home.state(), event)

    def expose(self, note: VisibleNote) -> None:
        """Record that this session saw a revision: once per mount, in batches.

        One row per revision and mount says what the audit needs (which
        session was shown which immutable revision, and when first); a row
        per open would cost more than the read itself for ``grep -r``.
        """
        if note.revision_id not in self._exposed:
            self._exposed.add(note.revision_id)
            self._exposures.append(self._mount.event(Op.READ, "allow", Reason.ALLOWED, note))

    def take_exposures(self) -> list[AuditEvent]:
        """The exposures not yet recorded; the caller records them (``vfs.follow``)."""
        batch, self._exposures = self._exposures, []
        return batch
