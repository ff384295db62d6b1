"""Nodes of one mounted view and the inode numbers the kernel knows them by.

Inode numbers are handed out by this mount, in the order it first shows a
name, starting after the root: they never derive from catalog row ids, so
they reveal nothing about other stores, other sessions or how many notes
exist outside the view. A note's node follows its catalog resource, so the
note keeps its inode through new revisions; scratch files and folders have
nodes of their own, and so do the folders and result files of the hidden
query folder (``vfs.queries``), which share this numbering. Numbers are
never reused within a mount, which is why the generation is always 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pyfuse3
import trio

from scopefs.catalog.paths import Parts
from scopefs.catalog.visible import VisibleNote
from scopefs.vfs.content import Stamp
from scopefs.vfs.drafts import Draft
from scopefs.vfs.querytree import Folder, Results


class Kind(enum.Enum):
    DIR = "dir"
    NOTE = "note"
    SCRATCH = "scratch"
    QUERIES = "queries"  # a folder of the hidden query tree (``.search`` and below)
    RESULTS = "results"  # one query's results, computed when its name was looked up
    HISTORY = "history"  # a folder of the hidden history tree (``.history`` and below: ``vfs.history``)
    REVISION = "revision"  # one revision of a note, read-only, under its note's history folder


@dataclass(eq=False)
class Node:
    """One inode: a note, a folder, a scratch file, or a node of the query or history tree.

    The fields change only on the trio thread, and these hold between two
    awaits (``vfs.mount`` says how the code keeps them):

    * ``resource_id`` is set only on a NOTE (never on a scratch file, a
      folder or a query node), and a NOTE without it exists only in this
      mount's overlay: it was created here and is not committed yet. A
      note node that is ``attached`` and has one is the one
      ``Layers.by_resource`` maps that resource to.
    * ``draft`` is set only on a NOTE or a SCRATCH file. A NOTE's draft
      lives while a handle is open: the release of the last one closes it,
      committed by then or discarded if its commit failed, and a clean one
      left by a commit without handles is closed at once
      (``close_clean_draft``). A detached node's is closed whatever it
      holds once nobody has it open (``close_draft_if_detached``).
    * ``frozen`` is set only on a SCRATCH file: the note's revision it
      holds since the note was renamed away to it (vim's backup). A draft
      made for it later starts from that revision and clears it; a draft
      it already had (a writer still held the note open) is what it serves.
      It is also set, always and for good, on a REVISION: the revision it
      shows (``vfs.history``).
    * HISTORY and REVISION nodes, like query nodes, are never ``attached``
      and go when the kernel forgets them.
    * ``query`` is set exactly on QUERIES (a ``Folder``) and RESULTS (a
      ``Results``) nodes, which are never ``attached``: they have no name
      to lose, and go when the kernel forgets them.
    * ``opens`` counts the handles in the handle table on this node;
      ``lookups`` the kernel's references (``forget`` gives them back). A
      node leaves the inode table only when both are 0 and it is detached.
    * ``cached_revision`` is the one revision whose pages the kernel may
      keep for this inode (``keep_cache``); ``stale_pages`` says pages of
      another revision may still be there and must be dropped before any
      store (``forget_pages`` sets it). Neither is ever true of a draft's
      bytes: a node with a draft is opened with ``keep_cache`` off.
    * ``commit_lock`` is held for the whole of one commit of this node; see
      ``vfs.mount`` for the order it is taken in.
    * ``deposit`` is set only on a NOTE made by a create in a group's
      ``postbox/`` (``Commits.create_deposit``): it is never ``attached``
      (no lookup or listing finds it), its handle only writes, and its
      close files the draft into the postbox instead of committing a note.
    """

    ino: int
    kind: Kind
    parts: Parts
    resource_id: str | None = None  # a note's catalog identity; None until its first commit
    draft: Draft | None = None  # bytes being written (note) or held (scratch)
    frozen: VisibleNote | None = None  # a scratch name holding a note's revision (vim's backup)
    attached: bool = True  # still has a name in this mount
    # Detached because the view stopped showing its note (another session removed it, the evidence
    # went), not by this mount's own unlink or rename: writes to it fail rather than vanish.
    left_view: bool = False
    opens: int = 0
    lookups: int = 0
    cached_revision: str | None = None  # the revision whose pages the kernel may keep
    # That revision and the stamp of the artifact it was verified from: checked again every
    # ``vfs.reads.RECHECK_S``, since the kernel serves those pages without asking.
    verified: tuple[VisibleNote, Stamp] | None = None
    # Invalidations of its pages queued (counted on the trio thread) and begun (counted on the worker
    # that sends them, just before it does): one writer each, so no count is lost (``invalidating``).
    invalidations_queued: int = 0
    invalidations_begun: int = 0
    invalidations_ended: int = 0  # those whose drop of the inode's pages and attributes returned
    listing_version: int = 0  # a folder's: how often its names changed (``vfs.attributes``)
    stale_pages: bool = False  # pages of an older revision may still be in the kernel (drop before a store)
    # A draft with writes nobody committed was thrown away (its commit failed): until the drop queued
    # then (this count of ``invalidations_queued``) has ended, the kernel may still size the file as
    # those writes left it, and pad the shorter revision a ``READ`` would answer with zeros (``vfs.reads``).
    discarded_until: int = 0
    # The revision this mount last committed for it, or, after a rename here, the one the view shows at
    # the new name (maybe another session's): a draft loaded before a commit of this mount starts over.
    committed_revision: str | None = None
    # The last revision this mount committed from its draft (a close, an fsync, a truncation, a written
    # file renamed over a note): the kernel's pages of it hold that revision's bytes (``vfs.reads``).
    written_revision: str | None = None
    # Commits of this node that failed (refused, or an error): an fsync that waited for a commit another
    # request had under way reports its failure by this count moving (``ScopeFS.fsync``).
    failed_commits: int = 0
    shown: VisibleNote | None = None  # the revision it last showed: sizes stay right for held handles
    commit_lock: trio.Lock = field(default_factory=trio.Lock)
    query: Folder | Results | None = None  # what a QUERIES folder answers, or a RESULTS file holds
    deposit: str | None = None  # a postbox deposit being written (its message handle): never named, never read
    # On a sandbox's mount: the admitted pid namespace of the last request that read it, or of the
    # last handle given to write it. The kernel's writeback of a shared mapping's dirty pages comes
    # without a caller, and is taken as that namespace's (``Callers.writeback_opener``).
    touched_from: int | None = None

    @property
    def invalidating(self) -> bool:
        """Whether an invalidation of its pages is queued and its worker has not begun to send it.

        Until then, ``READ``s keep to the revision they served (``vfs.reads``):
        its pages may be cached, and that invalidation will drop whatever
        they bring in too. Once it has begun, they get the new revision: if
        a ``READ``'s page was cached before the drop reached it, the drop
        waits for it and takes it. Keeping to the old one until the loop
        learned the invalidation was *sent* was wrong: a ``READ`` the kernel
        sent after dropping the pages was answered from the old revision,
        whose bytes then stayed cached for good, cut to the new size (a CI
        failure: a second mount served them for as long as it was read).
        While the drop sweeps, one read may see both revisions; once it has
        swept them all, only the new one is left. A revision this mount
        committed from the node's own draft (``written_revision``) is
        served at once (``Reads._keeps_to_old``): the kernel's pages hold
        what was written.
        """
        return self.invalidations_queued > self.invalidations_begun

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
        self.verified = None

    def close_clean_draft(self) -> None:
        """A note nobody has open drops a draft that holds nothing uncommitted."""
        if self.kind is Kind.NOTE and self.opens == 0 and self.draft is not None and not self.draft.dirty:
            self.draft.close()
            self.draft = None

    def close_draft_if_detached(self) -> None:
        """A node without a name and without handles has nobody left to read or commit its draft."""
        if not self.attached and self.opens == 0 and self.draft is not None:
            self.draft.close()
            self.draft = None


class Inodes:
    """The nodes the kernel may ask about, by inode number."""

    def __init__(self) -> None:
        self._next = pyfuse3.ROOT_INODE + 1
        self.nodes: dict[int, Node] = {}
        self.results: dict[int, Node] = {}  # the RESULTS nodes among them: few, looked at on every change
        # Nodes that lost their name here (unlinked, renamed over) while the kernel holds them, by the
        # notes whose content they may hold (``held_content``): a process holding one open may be served its
        # cached pages, so they go with the note's when it leaves the view (``MountState._holders``,
        # ``Layers.apply``). ``_unnamed_as``: the keys each is filed under, to let go of it when forgotten.
        self._unnamed: dict[str, dict[int, Node]] = {}
        self._unnamed_as: dict[int, set[str]] = {}

    def new(self, kind: Kind, parts: Parts, *, resource_id: str | None = None, draft: Draft | None = None,
            attached: bool = True) -> Node:
        if not parts:
            ino = pyfuse3.ROOT_INODE
        else:
            ino, self._next = self._next, self._next + 1
        node = Node(ino, kind, parts, resource_id=resource_id, draft=draft, attached=attached)
        self.nodes[ino] = node
        if kind is Kind.RESULTS:
            self.results[ino] = node
        return node

    def get(self, ino: int) -> Node | None:
        return self.nodes.get(ino)

    def lost_name(self, node: Node) -> None:
        """``node`` lost its name (``Layers.detach``): file it under every note whose content it may hold,
        if the kernel still holds it (one it forgot already has no pages, and no FORGET will come)."""
        keys = held_content(node)
        if not keys or self.nodes.get(node.ino) is not node or not (node.lookups or node.opens):
            return
        self._unfile(node.ino)
        for key in keys:
            self._unnamed.setdefault(key, {})[node.ino] = node
        self._unnamed_as[node.ino] = keys

    def unnamed_of(self, resource_id: str) -> list[Node]:
        """The nodes without a name here filed under ``resource_id`` that the kernel holds. Filed when
        they lost their name, and kept there: a backup whose draft closes since no longer says what it
        copied, but the kernel may still cache that content."""
        return [node for node in self._unnamed.get(resource_id, {}).values() if not node.attached]

    def _unfile(self, ino: int) -> None:
        for key in self._unnamed_as.pop(ino, set()):
            filed = self._unnamed[key]
            del filed[ino]
            if not filed:
                del self._unnamed[key]

    def forget(self, ino: int, count: int) -> None:
        node = self.nodes.get(ino)
        if node is None or ino == pyfuse3.ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - count)
        if node.lookups == 0 and node.opens == 0 and not node.attached:
            if node.draft is not None:
                node.draft.close()
            del self.nodes[ino]
            self.results.pop(ino, None)
            self._unfile(ino)


def copied_from(node: Node) -> str | None:
    """The resource whose content ``node`` holds a copy of (a draft loaded from it, a backup frozen to it)."""
    if node.draft is not None:
        return node.draft.source_resource
    return node.frozen.resource_id if node.frozen is not None else None


def held_content(node: Node) -> set[str]:
    """The notes whose content the kernel may cache for ``node``: the one it copies now, the one it was
    frozen to, its own (a backup renamed to a note's name holds both the copy's and the note's)."""
    frozen = node.frozen.resource_id if node.frozen is not None else None
    return {r for r in (copied_from(node), node.resource_id, frozen) if r is not None}
