"""Reading through a mount: only verified bytes of revisions the view still shows.

The mount answers ``open`` with ``ENOSYS`` (``vfs.fs`` says why), so the
kernel never asks before a read: it sends ``READ`` for an inode, with the
caller's context, only for pages it does not hold, and keeps every page it
was given across opens until this mount drops them. So the first ``READ``
of an inode finds the note's active revision and verifies its artifact
(``vfs.content``) before a single byte is answered: a large revision is
hashed whole, on a worker, before its first page goes out, and nothing is
ever stored into the kernel's cache ahead of a verdict. The verified file
stays open as the inode's reader (``Reader``), checked against its stamp on
every ``READ``, until the note has another revision or the reader is
evicted (``KEEP_READERS``); any ``READ`` after that verifies again, so a
page the kernel reclaimed is always answerable.

A ``READ`` also re-checks, every time, that the view still shows the note.
What it does not reach are pages the kernel already holds: those the
mount drops itself (``vfs.follow`` on every change of the view, ``vfs.gate``
on a dismissal).

A failed verification refuses the revision for the rest of the mount
(EIO, never the indexed text or an older revision instead), drops the
kernel's pages and is audited. A verified revision is audited once per
revision and mount, in batches (``expose``).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections import OrderedDict
from pathlib import Path

import trio

from scopefs.catalog.audit import AuditEvent, record_quietly
from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.exposures import Exposed
from scopefs.catalog.policy import Op
from scopefs.catalog.readjournal import ReadJournal
from scopefs.catalog.reasons import Reason
from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.content import Stamp, stamps_now
from scopefs.vfs.drafts import Draft
from scopefs.vfs.errors import fail
from scopefs.vfs.handles import Handle
from scopefs.vfs.history import History
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState
from scopefs.vfs.queries import Queries

log = logging.getLogger("scopefs.vfs")
INLINE_BYTES = 1 << 20  # hash or load larger files on a thread, smaller ones inline
KEEP_READERS = 512  # verified artifacts held open for inodes, least recently read dropped first
RECHECK_S = 1.0  # how often the sweep over the artifacts behind the kernel's cached pages takes its next turn
SWEEP_BATCH = 1000  # artifacts looked at per turn: a view whose 10,000 notes are all cached is swept in 10 s


class Reader:
    """The verified artifact an inode's ``READ``s are answered from: one revision, one descriptor."""

    def __init__(self, node: Node, note: VisibleNote, fd: int, stamp: Stamp, whole: bytes | None = None) -> None:
        self.node = node
        self.note = note
        self.fd = fd
        self.stamp = stamp
        # The bytes the verification hashed, when it read a small file whole: the first READ (a cold
        # tool's only one) is answered from them, not read again. Given away once.
        self.whole = whole

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Reads:
    """Serving verified bytes by inode, and the read audit of one mount."""

    def __init__(self, mount: MountState, queries: Queries, history: History) -> None:
        self._mount = mount
        self._queries = queries
        self._history = history
        self._exposures: list[AuditEvent] = []
        self._exposed_rows: list[Exposed] = []
        self._exposed: set[str] = set()
        self._journal: ReadJournal | None = None  # made at the first read (``catalog.readjournal``)
        self._journal_failing = False  # the last line could not be written (said once, tried again each read)
        self.exposed_count = 0  # revisions exposed since the mount started: whether reads keep coming
        self._readers: OrderedDict[int, Reader] = OrderedDict()  # inode -> its verified reader
        self._verifying: dict[int, trio.Event] = {}  # inode -> set once the verification under way ends
        self._cached: dict[int, Node] = {}  # inodes whose pages the kernel may hold, for ``recheck``
        # the same, by their artifact's name (``recheck_named``); a note and a scratch file frozen to its
        # revision (vim's backup) share one artifact
        self._by_locator: dict[str, dict[int, Node]] = {}
        self._swept = 0  # where the sweep's next turn starts in ``_cached``
        self._stores: set[int] = set()  # the store directories (descriptors) of the cached artifacts

    async def read_inode(self, node: Node, off: int, size: int) -> bytes:
        """A ``READ`` that came without a handle: a note, a scratch file, a draft, a query's results or an
        earlier revision of a note (served like a note, once ``History.check`` let it)."""
        mount = self._mount
        if node.kind is Kind.RESULTS:
            return self._queries.read(self._queries.opened(node), off, size)
        if node.kind in (Kind.DIR, Kind.QUERIES, Kind.HISTORY):
            raise fail(errno.EISDIR)
        if node.kind is Kind.REVISION:  # an earlier revision (``vfs.history``): still one it may show?
            await self._history.check(node)
        elif node.kind is Kind.SCRATCH and node.frozen is not None and node.draft is None:
            await self._history.check_backup(node)  # a backup of an earlier one: the same question
        if node.invalidations_ended < node.discarded_until:
            raise fail(errno.EACCES)  # refused, as the writes discarded were: no zeros where they were
        if node.draft is not None:
            mount.check_copy(node)
            return _unrefused(node.draft).read(off, size)
        reader = await self._reader(node)
        return await self._serve(reader, off, size)

    async def read(self, handle: Handle, off: int, size: int) -> bytes:
        """A ``READ`` through a handle ``create`` gave: the draft being written."""
        self._mount.check_copy(handle.node)
        draft = handle.node.draft
        return _unrefused(draft).read(off, size) if draft is not None else b""

    async def _reader(self, node: Node) -> Reader:
        """``node``'s reader for the revision the view shows now, verified first if it is new."""
        mount = self._mount
        while True:
            note = node.frozen if node.kind in (Kind.SCRATCH, Kind.REVISION) else mount.layers.note_of(node)
            if not mount.serving or (note is None and node.left_view):
                raise fail(errno.EACCES)  # revoked, behind this mount's write, or the note left under a descriptor
            if note is None:
                raise fail(errno.ENOENT)
            if not mount.shows(note.resource_id):
                raise fail(errno.EACCES)
            reader = self._readers.get(node.ino)
            if reader is not None and reader.node is node and (
                    reader.note.revision_id == note.revision_id
                    # Pages of the revision it serves may still be cached until the invalidation
                    # queued for them begins: READs keep to it until then, so no page of the new
                    # one is cached beside old ones no drop is on its way to (``Node.invalidating``).
                    # Not after this mount's own commit of the node: what the kernel caches then is
                    # what was written, the new revision's bytes, and a close that returned must be
                    # read back (``_keeps_to_old``).
                    or self._keeps_to_old(node, reader, note)):
                self._readers.move_to_end(node.ino)
                if node.verified is None:  # its pages were dropped since (a rename elsewhere, a policy
                    self._cached_from(node, reader.note, reader.stamp)  # change): cached again from here
                return reader
            verifying = self._verifying.get(node.ino)
            if verifying is None:
                break
            await verifying.wait()  # readahead sends several READs at once: one verification serves them
        done = self._verifying[node.ino] = trio.Event()
        try:
            fd, stamp, whole = await self._verify(node, note)
        finally:
            del self._verifying[node.ino]
            done.set()
        if node.cached_revision not in (None, note.revision_id) or node.stale_pages:
            # Pages of an older revision may still be cached beside the ones
            # this READ brings in: they go (on the invalidation worker: this
            # READ holds pages that dropping them would wait for).
            mount.kernel.forget_pages(node)
            node.stale_pages = False
        self._cached_from(node, note, stamp)
        self.expose(note)
        reader = Reader(node, note, fd, stamp, whole)
        old = self._readers.pop(node.ino, None)
        if old is not None:
            old.close()
        self._readers[node.ino] = reader
        while len(self._readers) > KEEP_READERS:
            self._readers.popitem(last=False)[1].close()
        return reader

    def _cached_from(self, node: Node, note: VisibleNote, stamp: Stamp) -> None:
        """The kernel caches ``node``'s pages of ``note``, verified as of ``stamp``: the artifact is
        looked at again by the sweep and when inotify names it (``recheck``, ``recheck_named``)."""
        node.cached_revision = note.revision_id
        node.verified = (note, stamp)
        self._cached[node.ino] = node
        self._by_locator.setdefault(note.locator, {})[node.ino] = node
        place = self._mount.artifacts.place(note)
        if place is not None:
            self._stores.add(place[0])

    @staticmethod
    def _keeps_to_old(node: Node, reader: Reader, note: VisibleNote) -> bool:
        """Whether a ``READ`` of ``node`` is still answered from the revision ``reader`` serves, though
        the view shows ``note``: only while the drop of the old revision's pages waits to begin, and
        only when ``note`` came from elsewhere.

        After this mount committed ``note`` from this node's draft
        (``Node.written_revision``; not a rename's, which may take another
        session's revision along), the kernel's pages of the node are what
        the writes left there (FUSE writes through its cache, and truncates
        it): the new revision's bytes. The queued drop still comes, so that
        nothing a tool wrote stays cached unverified. Answering the old revision meanwhile would
        hand a process that closed and opened again the bytes its close
        replaced, cut short where the old revision ended (fsx found it:
        close, open, read).
        """
        return (node.invalidating and reader.note.resource_id == note.resource_id
                and note.revision_id != node.written_revision)

    async def _verify(self, node: Node, note: VisibleNote) -> tuple[int, Stamp, bytes | None]:
        """An open descriptor of ``note``'s artifact whose whole content matched the catalog, and that
        content itself when this hashed a small file from one read (``Artifacts.open``)."""
        artifacts = self._mount.artifacts
        await self._refuse_if_bad(note)
        try:
            if note.size > INLINE_BYTES and artifacts.needs_hash(note):
                fd, stamp, whole = await trio.to_thread.run_sync(
                    functools.partial(artifacts.open, note, keep=False))
            else:
                fd, stamp, whole = artifacts.open(note)
        except IntegrityError:
            await self.integrity_failure(note, node)
            raise fail(errno.EIO) from None
        return fd, stamp, whole

    async def _serve(self, reader: Reader, off: int, size: int) -> bytes:
        mount = self._mount
        note = reader.note
        if not mount.shows(note.resource_id):
            raise fail(errno.EACCES)  # revoked, tombstoned or denied since it was verified
        await self._refuse_if_bad(note)
        whole, reader.whole = reader.whole, None
        if whole is not None and off == 0 and size >= len(whole):
            return whole  # hashed and matched a moment ago (``_reader``): the same bytes, not read again
        try:
            return mount.artifacts.read(reader.fd, reader.stamp, off, size)
        except IntegrityError:
            await self.integrity_failure(note, reader.node)
            raise fail(errno.EIO) from None

    async def recheck(self) -> None:
        """The sweep's next turn: drop the pages of inodes whose artifact changed since it was verified.

        The kernel answers reads from the pages it holds without asking, so
        a tamper (or a replacement) of an artifact on disk would otherwise
        go unnoticed until those pages were reclaimed. A change made through
        the store's directory is reported by inotify and looked at at once
        (``recheck_named``); this sweep is the net for any other (a write
        through a hard link made elsewhere, a watch that could not be set):
        every ``RECHECK_S`` the next ``SWEEP_BATCH`` inodes with cached pages
        have their artifact looked at (one ``stat`` each, on a worker). It
        used to stat every cached inode every second, which for 10,000
        cached notes took a tenth of a CPU and, after the kernel dropped its
        inode cache, a disk read each. Any difference drops the inode's
        reader and pages, and the next READ verifies afresh, refusing a
        tamper (EIO, audited) and accepting a replacement that holds the
        right bytes.
        """
        for ino in [ino for ino, node in self._cached.items() if node.verified is None]:
            del self._cached[ino]
        if len(self._by_locator) > 2 * len(self._cached) + 64:  # names of artifacts no longer cached
            self._by_locator = {}
            for node in self._cached.values():
                if node.verified is not None:
                    self._by_locator.setdefault(node.verified[0].locator, {})[node.ino] = node
        nodes = list(self._cached.values())
        if len(nodes) > SWEEP_BATCH:
            start = self._swept % len(nodes)
            nodes = (nodes[start:] + nodes[:start])[:SWEEP_BATCH]
            self._swept = start + SWEEP_BATCH
        await self._look_again(nodes)

    async def recheck_named(self, locators: set[str] | None) -> None:
        """Look at once at the artifacts inotify named (None: events were lost, so at every one)."""
        if locators is None:
            nodes = list(self._cached.values())
        else:
            nodes = []
            for locator in locators:
                named = self._by_locator.get(locator, {})
                for ino, node in list(named.items()):
                    if node.verified is None or node.verified[0].locator != locator or ino not in self._cached:
                        del named[ino]  # verified again since, or gone: not this artifact's any more
                    else:
                        nodes.append(node)
                if not named:
                    self._by_locator.pop(locator, None)
        await self._look_again(nodes)

    def store_directories(self) -> set[Path]:
        """The store directories of the artifacts ever cached here, as paths inotify can watch (the
        descriptors stay open for the mount's life, so the paths keep naming the same directories)."""
        return {Path(f"/proc/self/fd/{fd}") for fd in self._stores}

    async def _look_again(self, nodes: list[Node]) -> None:
        """``stat`` the artifact of each of ``nodes`` (on a worker); drop what changed since it was verified."""
        mount = self._mount
        checks = [(node, node.verified) for node in nodes if node.verified is not None]
        if not checks:
            return
        places = [mount.artifacts.place(note) for _, (note, _) in checks]
        now = await trio.to_thread.run_sync(stamps_now, places)
        for (node, verified), current in zip(checks, now, strict=True):
            if current != verified[1] and node.verified is verified:
                reader = self._readers.pop(node.ino, None)
                if reader is not None:
                    reader.close()
                mount.kernel.forget_pages(node)

    def drop_readers(self) -> None:
        """Close every reader (the mount is going): the kernel asks nothing more."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

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

        The pages of the node that was read go too when it is not the
        note's own node (a scratch file frozen to the revision: vim's backup).
        """
        mount = self._mount
        audited = mount.bad_revisions.get(note.revision_id)
        if audited is None:
            audited = mount.bad_revisions[note.revision_id] = trio.Event()
        try:  # whatever fails here, the READs waiting on ``audited`` are refused, never left hanging
            own = mount.layers.by_resource.get(note.resource_id)
            for node in (own, opened if opened is not own else None):
                if node is not None:
                    mount.kernel.forget_pages(node)
                    reader = self._readers.pop(node.ino, None)
                    if reader is not None:
                        reader.close()
            event = mount.event(Op.READ, "error", Reason.REVISION_STALE, note)
            await mount.catalog(record_quietly, mount.home.state(), event)
        finally:
            audited.set()

    async def _refuse_if_bad(self, note: VisibleNote) -> None:
        """EIO for a revision that failed verification here, once that failure is audited: the READ
        that found it replies only after its audit row was written (or, while another process holds
        ``state.sqlite``'s lock, held in the mount's audit backlog), and no other READ may reply sooner."""
        audited = self._mount.bad_revisions.get(note.revision_id)
        if audited is not None:
            await audited.wait()
            raise fail(errno.EIO)

    def expose(self, note: VisibleNote) -> None:
        """Record that this session saw a revision: once per mount, in batches.

        One row per revision and mount says what the audit needs (which
        session was shown which immutable revision, and when first); a row
        per read would cost more than the read itself for ``grep -r``.
        """
        if note.revision_id not in self._exposed:
            self._exposed.add(note.revision_id)
            self.exposed_count += 1
            event = self._mount.event(Op.READ, "allow", Reason.ALLOWED, note)
            exposed = Exposed(note.revision_id, note.resource_id)
            self._exposures.append(event)
            self._exposed_rows.append(exposed)
            self._journal_append(event, exposed)

    def _journal_append(self, event: AuditEvent, exposed: Exposed) -> None:
        """On disk before the reply, so a killed mount loses no read's audit. A line that cannot be
        written (a full disk) leaves that read in the batch in memory only, as every read was before
        there was a journal; the mount says so once, until a line is written again."""
        try:
            if self._journal is None:
                self._journal = ReadJournal(self._mount.home)
            self._journal.append(event, exposed)
        except OSError as exc:
            if not self._journal_failing:
                log.warning("the read journal cannot be written (%s): reads are held in memory only until"
                            " it can", type(exc).__name__)
            self._journal_failing = True
        else:
            self._journal_failing = False

    def oldest_exposure_us(self) -> int | None:
        """When the oldest read not yet recorded was made (µs), if any: put back ones included."""
        return self._exposures[0].at if self._exposures else None

    def take_exposures(self) -> tuple[list[AuditEvent], list[Exposed], list[str]]:
        """The exposures not yet recorded, as audit rows and as exposure rows, and the journal files
        holding them; the caller records them (``vfs.follow``) and says so (``recorded``), or gives them
        back (``keep_exposures``)."""
        batch, self._exposures = self._exposures, []
        rows, self._exposed_rows = self._exposed_rows, []
        return batch, rows, self._journal.take() if self._journal is not None else []

    def recorded(self, journal_files: list[str]) -> None:
        """The batch those journal files hold is committed: they go."""
        if self._journal is not None and journal_files:
            try:
                self._journal.done(journal_files)
            except OSError as exc:  # left for ``replay``, which skips what is recorded
                log.warning("a read journal file was not removed (%s)", type(exc).__name__)

    def unrecorded(self, journal_files: list[str]) -> None:
        """The batch those journal files hold was given up: they stay, for the replay after this mount."""
        if self._journal is not None:
            self._journal.given_up(journal_files)

    def close_journal(self) -> None:
        """The mount ends: the journal goes if everything was recorded, else stays for ``replay``."""
        if self._journal is not None:
            journal, self._journal = self._journal, None
            journal.close()

    def keep_exposures(self, batch: list[AuditEvent], rows: list[Exposed]) -> None:
        """Put back what ``take_exposures`` gave and could not be recorded yet, ahead of what came since."""
        self._exposures[:0] = batch
        self._exposed_rows[:0] = rows


def _unrefused(draft: Draft) -> Draft:
    """``draft``; EACCES if a commit of it was refused: what was refused is not read back."""
    if draft.refused:
        raise fail(errno.EACCES)
    return draft
