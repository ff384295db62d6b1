"""The kernel's open files of one mount, and the opens that stream unverified pages.

A handle is what ``open`` and ``create`` answer with: the node, what it
serves (a verified revision, a draft, or a query's results) and the
sandbox that opened it. The table also holds the one thing that makes an
open dangerous to others: a large revision's chunks stored in the
kernel's page cache while it is still being hashed (``PageStream``).

Those chunks are not verified until the hash, the size and the stamp
re-check matched at the end, so nobody may read them before:

* the open that streams is not answered yet, so its caller cannot;
* any other file of the kernel on this inode (an open handle, or a
  mapping, which keeps its handle open) reads the page cache, so a stream
  starts only when the table holds no handle for the node, the node has
  none counted (``opens``) and no draft (a writer's content);
* no handle on the inode is given out while the stream is in flight
  (until the streaming open has its own handle or has failed): every
  ``give`` is preceded, with no await in between, by ``quiesce``, which
  waits for the stream; so a second open that arrives meanwhile is
  answered after the verdict, with ``keep_cache`` only if the revision it
  cached is its own and not refused; and another stream into the same
  inode never starts. ``give`` checks this and refuses (an EIO to the
  caller) rather than hand out a reader of unverified pages;
* if the verification fails in any way after a chunk was stored, the
  pages are dropped (``invalidate_inode``, waited for on a worker) before
  the open answers EIO and before the stream lets anyone else in
  (``vfs.reads``).

A claim is taken with no await between its checks and its registration,
so two opens cannot both take one.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.content import Stamp
from scopefs.vfs.inodes import Node
from scopefs.vfs.pages import PageStream
from scopefs.vfs.querytree import Results

REVOKED = -1  # a handle's pid namespace once its sandbox was dismissed: no namespace has this number


@dataclass(eq=False)
class Handle:
    """One open file: what it reads or writes, and who opened it."""

    node: Node
    writable: bool = False
    note: VisibleNote | None = None  # the verified revision this handle serves, if any
    fd: int = -1  # with ``note``: the verified artifact, checked against ``stamp`` before every read
    stamp: Stamp | None = None
    wrote: bool = False  # a write() came through this handle
    pid_namespace: int | None = None  # on a sandbox's mount: the admitted pid namespace that opened it
    results: Results | None = None  # a query's results, as they were when opened


class HandleTable:
    """File handle numbers to handles, and the streams that keep others out of an inode."""

    def __init__(self) -> None:
        self._handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._streams: dict[int, PageStream] = {}  # inode -> the open streaming unverified pages into it
        self._opened_by: dict[int, set[int]] = {}  # admitted pid namespace -> inodes it opened files on

    def __getitem__(self, fh: int) -> Handle:
        return self._handles[fh]

    def get(self, fh: int) -> Handle | None:
        return self._handles.get(fh)

    def give(self, handle: Handle, stream: PageStream | None = None) -> int:
        """A file handle for ``handle``, never while another open streams into its inode.

        Every caller awaits ``quiesce`` (or owns the stream, ``stream``)
        with no await in between; this check makes a missed one an EIO
        rather than a reader of unverified pages.
        """
        if self._streams.get(handle.node.ino, stream) is not stream:
            raise RuntimeError("a handle was about to be given out while unverified pages are cached")
        fh, self._next_fh = self._next_fh, self._next_fh + 1
        self._handles[fh] = handle
        handle.node.opens += 1
        if handle.pid_namespace is not None:
            self._opened_by.setdefault(handle.pid_namespace, set()).add(handle.node.ino)
        return fh

    def opened_by(self, pid_namespace: int) -> set[int]:
        """The inodes ``pid_namespace`` opened files on, forgotten here (it was dismissed)."""
        return self._opened_by.pop(pid_namespace, set())

    def revoke(self, pid_namespace: int) -> None:
        """Handles opened from ``pid_namespace`` (now dismissed) never work again.

        The kernel reuses a freed namespace's inode number for the next
        namespace it makes, so a later sandbox may be admitted under the
        same number: a handle that kept it would come back to life in a
        descriptor passed out of the old one.
        """
        for handle in self._handles.values():
            if handle.pid_namespace == pid_namespace:
                handle.pid_namespace = REVOKED


    def take(self, fh: int) -> Handle | None:
        """Remove ``fh`` (the kernel released it); the node's ``opens`` is the caller's to settle."""
        return self._handles.pop(fh, None)

    def all(self) -> list[Handle]:
        return list(self._handles.values())

    def on(self, node: Node) -> bool:
        """Whether any handle in the table is on ``node``."""
        return any(handle.node is node for handle in self._handles.values())

    def claim_stream(self, node: Node, size: int) -> PageStream | None:
        """A stream of ``size`` bytes into ``node``'s pages for the open that asks, or None if
        anyone else could read them meanwhile (see the module docstring)."""
        if node.ino in self._streams or node.draft is not None or node.opens > 0 or self.on(node):
            return None
        stream = self._streams[node.ino] = PageStream(node.ino, size)
        return stream

    def release_stream(self, stream: PageStream) -> None:
        """The streaming open answered (with its handle) or failed: let others in."""
        del self._streams[stream.ino]
        stream.settled.set()

    async def quiesce(self, node: Node) -> None:
        """Wait until no open streams unverified pages into ``node``'s inode."""
        while (stream := self._streams.get(node.ino)) is not None:
            await stream.settled.wait()
