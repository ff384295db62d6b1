"""Which handle each inode's writes go through, and the settle of writers nobody closes.

No ``open`` reaches the mount (``vfs.fs``): a file opened for writing
shows up with its first ``WRITE`` or truncation, by inode, and the mount
makes a handle for it then (``Commits.writer``); ``create`` makes one too.
Each inode has at most one such writer. A ``FLUSH`` (every close sends
one) commits and lets go of it; the next write makes a new one. Once
OPEN answered ENOSYS the kernel sends no RELEASE, not even for a file it
created, so writes no close follows (a mapping written back after its
close, a writer that pauses, ``touch``'s empty file) are committed by the
settle once left alone for ``WRITER_IDLE_S``.

Nobody is there to hear whether the settle's commit worked, and the
process may still hold the file open: a commit that fails keeps the
writer (``keep``), refused reads and all, for the next close to hear of,
and is tried again while ``UNCOMMITTED_KEPT_S`` pass without a write; a
close that comes while the settle commits waits for it (``settled``).
Dropped at once, the writes would be gone with the next close answering
0, and reads would be answered from the older revision, which a kernel
still sizing the file as written pads with zeros (fsx under revocation
found it).
"""

from __future__ import annotations

import errno
import math
import time
from collections.abc import Awaitable, Container
from typing import Protocol

import pyfuse3
import trio

from scopefs.catalog.errors import BadInput, Denied
from scopefs.vfs.drafts import Draft
from scopefs.vfs.handles import REVOKED, Handle
from scopefs.vfs.inodes import Node
from scopefs.vfs.mount import MountState

WRITER_IDLE_S = 1.0  # a writer's handle left alone this long without a close that committed it is
# committed and let go
UNCOMMITTED_KEPT_S = 30.0  # a writer whose commit at the settle failed (refused, say) is kept this long
# with no write, for a close to hear of it, and tried again each ``WRITER_IDLE_S`` (``settle``); then
# nobody is left to tell (a mapping written back after its close): one last try, and its writes go


class Release(Protocol):
    """``Commits.release``: let go of a handle (committing what it holds unless ``commit`` is false,
    keeping it registered if ``keep`` and the commit fails); the errno of a failure whose writes went,
    if one did."""

    def __call__(self, fh: int, *, commit: bool = True, keep: bool = False) -> Awaitable[int | None]: ...


class Writers:
    """The writer of each inode, by file handle, and what the settle does with those left alone."""

    def __init__(self, mount: MountState, release: Release) -> None:
        self._mount = mount
        self._release = release
        self._by_inode: dict[int, int] = {}  # inode -> the file handle its writes go through
        self._replaced: list[int] = []  # handles of inodes that got a new one (a name created again)
        # inode -> the settle's let-go of its writer under way (a commit, the writer kept if it fails)
        self._settling: dict[int, _Settling] = {}
        self.writing = _CloseWanted(self._by_inode, self._settling)

    def register(self, node: Node, fh: int) -> None:
        """``fh`` writes ``node`` from now on. A writer it replaces (the name was created again while
        the old one was open) is released by the next settle, its writes committed."""
        old = self._by_inode.get(node.ino)
        if old is not None:
            self._replaced.append(old)
        self._by_inode[node.ino] = fh
        self._mount.settle_wanted.set()

    @property
    def pending(self) -> bool:
        """Whether a writer's handle waits to be committed (``settle``)."""
        return bool(self._by_inode or self._replaced)

    def fh_of(self, node: Node) -> int | None:
        """The file handle of ``node``'s writer, if it has one (``writer_of`` gives the handle)."""
        return self._by_inode.get(node.ino)

    def handles(self) -> list[int]:
        """Every writer's file handle, as a list: what a caller does with them may change the registry."""
        return list(self._by_inode.values())

    def writer_of(self, node: Node) -> Handle | None:
        """The handle writes by inode made on ``node``, if it still has one."""
        fh = self._by_inode.get(node.ino)
        handle = self._mount.handles.get(fh) if fh is not None else None
        return handle if handle is not None and handle.node is node else None

    def unregister(self, node: Node, fh: int) -> None:
        """``fh`` is no longer ``node``'s writer (if it was): writes by inode make a new one."""
        if self._by_inode.get(node.ino) == fh:
            del self._by_inode[node.ino]

    def keep(self, handle: Handle, fh: int, exc: Exception) -> bool:
        """After the settle's commit of ``handle`` failed with ``exc``: ``fh`` is the writer again,
        unless another writer came meanwhile (False). Input no try can take (too large, a bad name)
        is not tried again; a refusal only once the view has moved; anything else (storage, a
        conflict) each ``WRITER_IDLE_S``."""
        node = handle.node
        if handle.pid_namespace == REVOKED:
            return False  # its sandbox is gone: no close is left to hear of it, nor a try to make for it
        if self._by_inode.setdefault(node.ino, fh) != fh:
            return False
        now = time.monotonic()
        if node.draft is not None:
            node.draft.kept_for = handle
        handle.kept_since = now if handle.kept_since is None else handle.kept_since
        handle.retry_at = math.inf if isinstance(exc, BadInput) else now + WRITER_IDLE_S
        handle.retry_seq = self._mount.view.seq if is_refusal(exc) else None
        return True

    @staticmethod
    def forsaken(handle: Handle) -> bool:
        """Whether ``handle`` is a writer kept after a failed commit (``keep``) for a sandbox since
        dismissed: what it wrote after that failure must not outlive the sandbox, so it is let go
        uncommitted, by the settle, an unmount's settle, or any close or fsync of its inode."""
        return handle.kept_since is not None and handle.pid_namespace == REVOKED

    @staticmethod
    def forsaken_draft(draft: Draft) -> bool:
        """Whether ``draft`` holds what a forsaken writer wrote after its failed commit: whoever holds
        it now (a write that took it over while that writer was let go), it is never committed."""
        kept_for = draft.kept_for
        return isinstance(kept_for, Handle) and Writers.forsaken(kept_for)

    async def forsake(self, node: Node) -> None:
        """Let go of ``node``'s writer, uncommitted, if it is forsaken (before a write or a truncation
        starts from the note)."""
        handle = self.writer_of(node)
        if handle is not None and self.forsaken(handle):
            await self.let_go(node, fh=self.fh_of(node), commit=False)

    async def settled(self, node: Node) -> int | None:
        """Until no settle of ``node``'s writer is under way, or the inode has a writer again (kept
        after a failure, or a new one: the close commits that one); the errno of the settle's commit
        if it failed for good (its writes gone), for a close that came meanwhile to answer with."""
        lost: int | None = None
        while self.writer_of(node) is None and (settling := self._settling.get(node.ino)) is not None:
            with self._mount.kernel.waiting_on_refresh():  # that commit waits on a refresh
                await settling.done.wait()
            lost = settling.lost
        return lost

    async def settle(self, *, everything: bool = False) -> None:
        """Commit and let go of writers' handles nobody closed (``WRITER_IDLE_S``), or all of them."""
        mount = self._mount
        now = time.monotonic()
        idle = now - WRITER_IDLE_S
        replaced, self._replaced = self._replaced, []
        for fh in replaced:
            await self._release(fh)
        for ino, fh in list(self._by_inode.items()):
            handle = mount.handles.get(fh)
            if handle is None:
                if self._by_inode.get(ino) == fh:
                    del self._by_inode[ino]  # the kernel released it (a mount's first files may get RELEASE)
            elif self.forsaken(handle):  # first: an unmount dismisses every sandbox before its settle
                await self._settle_one(handle.node, fh, keep=False, commit=False)
            elif everything:
                await self.let_go(handle.node, fh=fh)
            elif mount.suspended:
                continue  # its commit would be refused, its bytes dropped with nobody to tell: the
                # process's own close is refused instead, or commits once resumed
            elif handle.node.deposit is not None and (handle.wrote or _size(handle.node)):
                continue  # a deposit's close always comes, with its handle: filed then, whole
            elif handle.kept_since is None:
                if handle.used < idle:
                    await self._settle_one(handle.node, fh, keep=True)
            elif max(handle.kept_since, handle.used) < now - UNCOMMITTED_KEPT_S:
                # No close came: one last try (none for input no try can take), and the writes go.
                await self._settle_one(handle.node, fh, keep=False, commit=handle.retry_at != math.inf)
            elif handle.retry_at <= now and handle.used < idle and handle.retry_seq != mount.view.seq:
                # What failed may have passed (a refusal: only once the view moved, as a grant would)
                await self._settle_one(handle.node, fh, keep=True)

    async def _settle_one(self, node: Node, fh: int, *, keep: bool, commit: bool = True) -> None:
        """The settle's let-go of ``fh``, the writer of ``node``: a close meanwhile waits for it."""
        settling = self._settling[node.ino] = _Settling()
        try:
            settling.lost = await self.let_go(node, fh=fh, keep=keep, commit=commit)
        finally:
            if self._settling.get(node.ino) is settling:
                del self._settling[node.ino]
            settling.done.set()

    async def let_go(self, node: Node, *, fh: int | None = None, commit: bool = True,
                     keep: bool = False) -> int | None:
        """Release ``node``'s writer (only if it is still ``fh``, when given); what the release returns.
        Interrupted (an unmount cancels the settle) while the handle is still open, it is the writer
        again, for the unmount's own settle to commit."""
        current = self._by_inode.get(node.ino)
        if current is None or (fh is not None and current != fh):
            return None
        del self._by_inode[node.ino]
        try:
            return await self._release(current, commit=commit, keep=keep)
        except BaseException:
            if self._mount.handles.get(current) is not None:
                self._by_inode.setdefault(node.ino, current)
            raise


class _Settling:
    """The settle's let-go of one writer: set ``done`` once over; ``lost``, the errno of a commit that
    failed for good (its writes gone), for a close that waited to answer with."""

    __slots__ = ("done", "lost")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.lost: int | None = None


class _CloseWanted(Container[int]):
    """The inodes whose close has work to do: a writer is registered, or the settle is letting one go
    (``Writers.settled``). A FLUSH of any other inode is answered by pyfuse3 in C
    (``Operations.flush_wanted``), which keeps a read-only close near native."""

    __slots__ = ("_writers", "_settling")

    def __init__(self, writers: Container[int], settling: Container[int]) -> None:
        self._writers = writers
        self._settling = settling

    def __contains__(self, ino: object) -> bool:
        return ino in self._writers or ino in self._settling


def _size(node: Node) -> int:
    return node.draft.size if node.draft is not None else 0


def is_refusal(exc: BaseException) -> bool:
    """Whether a commit failed because the session may not write there now (the catalog's refusal, or
    the mount's EACCES), rather than because it could not be done."""
    return isinstance(exc, Denied) or (isinstance(exc, pyfuse3.FUSEError) and exc.errno == errno.EACCES)
