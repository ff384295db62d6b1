"""Nodes of one mounted view and the inode numbers the kernel knows them by.

Inode numbers are handed out by this mount, in the order it first shows a
name, starting after the root: they never derive from catalog row ids, so
they reveal nothing about other stores, other sessions or how many notes
exist outside the view. A note's node follows its catalog resource, so the
note keeps its inode through new revisions; scratch files and folders have
nodes of their own, and so do the folders and result files of the hidden
query folder (``vfs.queries``), which share this numbering.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyfuse3
import trio

from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.drafts import Draft

if TYPE_CHECKING:
    from scopefs.vfs.queries import Folder, Results

Parts = tuple[str, ...]


class Kind(enum.Enum):
    DIR = "dir"
    NOTE = "note"
    SCRATCH = "scratch"
    QUERIES = "queries"  # a folder of the hidden query tree (``.search`` and below)
    RESULTS = "results"  # one query's results, computed when its name was looked up


@dataclass(eq=False)
class Node:
    ino: int
    kind: Kind
    parts: Parts
    resource_id: str | None = None  # a note's catalog identity; None until its first commit
    draft: Draft | None = None  # bytes being written (note) or held (scratch)
    frozen: VisibleNote | None = None  # a scratch name holding a note's revision (vim's backup)
    attached: bool = True  # still has a name in this mount
    opens: int = 0
    lookups: int = 0
    cached_revision: str | None = None  # the revision whose pages the kernel may keep
    stale_pages: bool = False  # pages of an older revision may still be in the kernel (drop before a store)
    committed_revision: str | None = None  # the last revision this mount committed for it
    shown: VisibleNote | None = None  # the revision it last showed: sizes stay right for held handles
    commit_lock: trio.Lock = field(default_factory=trio.Lock)
    query: Folder | Results | None = None  # what a QUERIES folder answers, or a RESULTS file holds

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""

    def forget_pages(self) -> None:
        """The kernel may no longer keep this node's pages (an invalidation is on its way).

        Until they are dropped for sure, a store of another revision must
        drop them first: a store never shrinks the kernel's file size, so an
        older, longer revision's tail could otherwise survive it.
        """
        self.stale_pages = self.stale_pages or self.cached_revision is not None
        self.cached_revision = None


class Inodes:
    def __init__(self) -> None:
        self._next = pyfuse3.ROOT_INODE + 1
        self.nodes: dict[int, Node] = {}

    def new(self, kind: Kind, parts: Parts, **fields: object) -> Node:
        if not parts:
            ino = pyfuse3.ROOT_INODE
        else:
            ino, self._next = self._next, self._next + 1
        node = Node(ino, kind, parts, **fields)  # type: ignore[arg-type]
        self.nodes[ino] = node
        return node

    def get(self, ino: int) -> Node | None:
        return self.nodes.get(ino)

    def forget(self, ino: int, count: int) -> None:
        node = self.nodes.get(ino)
        if node is None or ino == pyfuse3.ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - count)
        if node.lookups == 0 and node.opens == 0 and not node.attached:
            if node.draft is not None:
                node.draft.close()
            del self.nodes[ino]
