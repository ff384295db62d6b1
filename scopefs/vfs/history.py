"""The hidden history folder: earlier revisions of the view's notes, read-only.

Every note the view shows has a folder of its revisions under ``.history``
at the root of the mount, at the note's own path:

    .history/private/notes/allergy.md/r1.md    revision 1 of private/notes/allergy.md
    .history/private/notes/allergy.md/r2.md    revision 2 (the note's current one, say)

A revision file is named ``r<N>`` with the note's extension
(``vfs.historytree.revision_name``), so tools that go by it treat it like
the note. ``scopefs history SESSION PATH`` lists the same revisions, with
their time, actor and origin.

Why it is built this way:

* One tree under the root, not ``name@rN`` lookups beside each note: any
  name can be a note's (``x.md@r2`` included), so such lookups would shadow
  notes or be shadowed by them, and a shell or ``ls`` could not discover
  them. ``.history`` cannot hide a note: the root holds only the view's
  roots, none named ``.history``, and nothing can be made at the root.
  Inside a root, ``.history`` is an ordinary name (a hidden one, so a
  scratch file unless a note has it: ``vfs.scratch``), and editors' scratch
  files are untouched: the history tree shows committed revisions only.
* ``.history`` is never listed (as ``.search``): ``ls -R``, ``find`` and
  ``grep -r`` over the mount never descend into it and cost what they did.
  Inside it, folders list what they hold, so it can be browsed.
* It shows exactly what ``catalog.history`` allows: only notes the view
  shows now (decided like a read of their current revision, by the view's
  own picture), so a note the view cannot read has no history folder and
  its name gives ``ENOENT`` like any missing name; and of those, only the
  revisions ``catalog.history.shown_revisions`` lets through (committed,
  not forgotten, not held by their lineage, not past their validity, not a
  revoked projection's copy). The folders mirror the view's folders from
  the catalog, not this mount's overlay: a note made here has a history
  once its first revision is committed.
* A revision's bytes are served like a note's (``vfs.reads``): verified
  against the catalog's SHA-256 before the first byte, re-checked on every
  ``READ``, swept for tampering while the kernel holds them, ``EIO`` and an
  audit row on a mismatch, and audited as a read of that revision once per
  mount. Every ``READ`` that reaches the server checks again that the view
  shows the note and that the revision may still be shown (``check``).
* Names and attributes are never cached by the kernel (timeouts of 0,
  ``vfs.historytree``): the facts that decide them change without the note
  changing, so each lookup asks the catalog again (one indexed query for a
  note's revisions). The bytes of a revision never change, so the kernel
  keeps its pages, and they are dropped when they may no longer be shown:
  when the view's picture of the note changes (a new revision, a
  tombstone, a hold, a policy change: the change log, through
  ``MountState.view_followers``), when a lookup finds the note's revisions
  changed, and when a listed revision's validity runs out (``expire``).
  Listings are dropped then too. Since a lookup or a listing is where a
  revision is seen to go, each drops the pages of the revisions it no
  longer finds, and waits for that, before it answers
  (``_without_gone``): the pages go first, then the name.
* Everything here is read-only, refused like a read-only root (``EROFS``;
  in a sandbox the kernel refuses first, from the modes, with ``EACCES``):
  nothing under ``.history`` lies in any root of the view, so
  ``MountState.check_writable`` refuses it.
* A view without evidence has no ``.history`` at all (``ENOENT``); a
  revision file held open stops serving (``EACCES``) once the view goes or
  its revision may no longer be shown.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import pyfuse3
import trio

from scopefs.catalog.clock import now_us
from scopefs.catalog.history import Revision, revisions_shown
from scopefs.catalog.paths import Parts
from scopefs.catalog.visible import VisibleNote, VisibleView
from scopefs.vfs import listings
from scopefs.vfs.attributes import attributes
from scopefs.vfs.errors import fail
from scopefs.vfs.historytree import HISTORY, revision_name, view_parts
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState
from scopefs.vfs.names import BadName, decode
from scopefs.vfs.pages import list_again

log = logging.getLogger("scopefs.vfs")

IDLE_EXPIRY_S = 60.0  # how long ``expire`` sleeps when no listed revision runs out: a net


@dataclass(frozen=True)
class Listed:
    """A note's revisions that may be shown, as the catalog last said."""

    current: str  # the note's revision the view showed when they were read
    revisions: tuple[Revision, ...]
    by_name: Mapping[str, Revision]
    by_id: Mapping[str, Revision]

    @classmethod
    def of(cls, note: VisibleNote, revisions: list[Revision]) -> Listed:
        return cls(note.revision_id, tuple(revisions),
                   {revision_name(r.revision_no, note.parts[-1]): r for r in revisions},
                   {r.revision_id: r for r in revisions})

    def expires(self, now: int) -> int | None:
        """When the first of them runs out, if one does."""
        return min((r.valid_until for r in self.revisions if r.valid_until is not None and r.valid_until > now),
                   default=None)


def _places(names: list[str], listed: Listed | None) -> list[tuple[str, int]]:
    """A listing's names with the place each one's successor starts from (``vfs.listings``). In a
    note's folder that is the revision's number, which nothing moves: a listing whose rest is read
    afresh (a revision went or came meanwhile, ``_drop``) goes on after the last revision it answered,
    none skipped, none twice."""
    if listed is None:
        return [(name, index) for index, name in enumerate(names, start=1)]
    return sorted(((name, listed.by_name[name].revision_no) for name in names), key=lambda entry: entry[1])


class History:
    """The history tree of one mount: a node per path the kernel knows, no more."""

    def __init__(self, mount: MountState) -> None:
        self._mount = mount
        self._known: dict[Parts, Node] = {}  # history path -> the node the kernel knows it by
        self._paths: dict[int, Parts] = {}  # inode -> its path in _known
        self._lists: dict[str, Listed] = {}  # resource id -> its revisions, as last read
        self._revision_nodes: dict[str, dict[int, Node]] = {}  # resource id -> its REVISION nodes
        self._resource_of: dict[int, str] = {}  # a REVISION node's inode -> its resource id
        # Each listing's names as it began, with their places in order, and, for a note's folder, the
        # revisions they were read with: the rest of a listing read in pieces answers from these, as
        # its start did.
        self._listings: listings.Listings[tuple[list[tuple[str, int]], Listed | None]] = listings.Listings()
        self._expiry: dict[str, int] = {}  # resource id -> when its first listed revision runs out
        # REVISION nodes whose revision went and whose pages were dropped since (``_without_gone``)
        self._dropped_gone: set[int] = set()
        self._woken = trio.Event()  # an earlier expiry was added
        mount.view_followers.append(self.view_moved)
        mount.page_holders.append(self.holding)

    # -- names ---------------------------------------------------------------

    @staticmethod
    def covers(parent: Node, name: bytes) -> bool:
        """Whether looking up ``name`` in ``parent`` is answered here."""
        return parent.kind is Kind.HISTORY or (parent.kind is Kind.DIR and not parent.parts
                                               and name == HISTORY.encode())

    async def lookup(self, parent: Node, name: bytes) -> Node:
        """The folder or revision ``name`` is in ``parent`` now (ENOENT if it is none)."""
        if not self._mount.view.usable:
            raise fail(errno.ENOENT)  # no evidence, no view: no history either
        if parent.kind is not Kind.HISTORY:
            return self._folder((HISTORY,))
        try:
            text = decode(name)
        except BadName:
            raise fail(errno.ENOENT) from None  # a name that cannot exist is simply not there
        note = self._note_at(parent.parts)
        listed = None
        if note is not None:  # a note's folder: the name is one of its revisions, read afresh
            listed = await self._read(note)
            await self._without_gone(note, listed)
        else:
            inner = view_parts(parent.parts + (text,))
            shown = self._mount.view.notes.get(inner) if self._is_folder(parent.parts) else None
            if shown is not None:  # a note's folder: its listing as it is now, for the kernel's listing
                await self._read(shown)
        child = self._child(parent, text, listed)
        if child is None:
            raise fail(errno.ENOENT)
        return child

    def _note_at(self, parts: Parts) -> VisibleNote | None:
        """The note whose history folder ``parts`` is, if the view shows one there."""
        view = self._mount.view
        inner = view_parts(parts)
        return view.notes.get(inner) if inner and view.usable else None

    def _is_folder(self, parts: Parts) -> bool:
        """Whether ``parts`` stands for a folder of the view (``.history`` itself for its root)."""
        return self._mount.view.usable and self._mount.layers.tree.is_dir(view_parts(parts))

    def _child(self, parent: Node, name: str, listed: Listed | None = None) -> Node | None:
        """The node of ``name`` in ``parent`` as the view and the last read revisions say, or None."""
        if not self._mount.view.usable:
            return None
        parts = parent.parts + (name,)
        note = self._note_at(parent.parts)
        if note is not None:
            listed = listed or self._lists.get(note.resource_id)
            revision = listed.by_name.get(name) if listed is not None else None
            if revision is None:  # one that ran out since it was read stays, unreadable (``check``),
                return None  # until a lookup or a listing reads the catalog again (``_without_gone``)
            node = self._revision(parts, note, revision)
            self._dropped_gone.discard(node.ino)  # shown again: if it goes again, its pages go again
            return node
        if not self._is_folder(parent.parts):
            return None  # the folder left the view
        inner = view_parts(parts)
        if inner in self._mount.view.notes or self._mount.layers.tree.is_dir(inner):
            return self._folder(parts)
        return None

    def _folder(self, parts: Parts) -> Node:
        node = self._known.get(parts)
        if node is None or node.kind is not Kind.HISTORY or self._mount.layers.inodes.get(node.ino) is not node:
            node = self._new(parts, Kind.HISTORY)
        return node

    def _revision(self, parts: Parts, note: VisibleNote, revision: Revision) -> Node:
        """The node of one revision of ``note``: the one the kernel knows for this path and revision, if any."""
        node = self._known.get(parts)
        if (node is None or node.kind is not Kind.REVISION or node.frozen is None
                or node.frozen.revision_id != revision.revision_id
                or self._mount.layers.inodes.get(node.ino) is not node):
            node = self._new(parts, Kind.REVISION)
            node.frozen = dataclasses.replace(note, revision_id=revision.revision_id, sha256=revision.sha256,
                                              size=revision.size, locator=revision.locator,
                                              mtime_us=revision.time_us)
            self._revision_nodes.setdefault(note.resource_id, {})[node.ino] = node
            self._resource_of[node.ino] = note.resource_id
        return node

    def _new(self, parts: Parts, kind: Kind) -> Node:
        """A node for ``parts``, never attached: ``Inodes.forget`` drops it once the kernel has forgotten it."""
        node = self._mount.layers.inodes.new(kind, parts, attached=False)
        self._known[parts] = node
        self._paths[node.ino] = parts
        return node

    def forget(self, ino: int) -> None:
        """After the kernel forgot ``ino``: let go of the node if the inode table did."""
        parts = self._paths.get(ino)
        if parts is None or self._mount.layers.inodes.get(ino) is not None:
            return
        del self._paths[ino]
        self._listings.drop(ino)
        node = self._known.get(parts)
        if node is not None and node.ino == ino:
            del self._known[parts]
        self._dropped_gone.discard(ino)
        resource_id = self._resource_of.pop(ino, None)
        if resource_id is not None:
            nodes = self._revision_nodes.get(resource_id, {})
            gone = nodes.pop(ino, None)
            if gone is not None:
                gone.forget_pages()  # the kernel has none left; ``vfs.reads`` stops sweeping its artifact
            if not nodes:
                self._revision_nodes.pop(resource_id, None)

    # -- listings --------------------------------------------------------------

    async def readdir(self, node: Node, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """List a folder of the tree; a listing is taken whole when it starts (``vfs.listings``)."""
        found = self._listings.find(node.ino, start_id)
        if found is None:
            names, listed = await self._names(node)
            taken = (_places(names, listed), listed)  # sorted once, not again for every piece
            number = self._listings.start(node.ino, taken)
        else:
            number, taken = found
        places, listed = taken
        first = bisect.bisect_right(places, listings.place(start_id), key=lambda entry: entry[1])
        for index in range(first, len(places)):
            name, place = places[index]
            child = self._child(node, name, listed)
            if child is None:
                continue
            next_at = listings.offset(number, place)
            if next_at is None or not pyfuse3.readdir_reply(token, name.encode(), attributes(self._mount, child),
                                                            next_at):
                return
            child.lookups += 1

    async def _names(self, node: Node) -> tuple[list[str], Listed | None]:
        """What a listing of ``node`` starting now holds: the names, and the revisions they stand for."""
        if not self._mount.view.usable:
            return [], None
        note = self._note_at(node.parts)
        if note is not None:
            listed = await self._read(note)
            await self._without_gone(note, listed)
            return list(listed.by_name), listed  # oldest first
        if not self._is_folder(node.parts):
            return [], None
        return sorted(self._mount.layers.tree.names(view_parts(node.parts))), None

    # -- reads -------------------------------------------------------------------

    async def check(self, node: Node) -> None:
        """EACCES unless the revision ``node`` shows may still be shown (before every ``READ`` of it)."""
        revision = node.frozen
        assert node.kind is Kind.REVISION and revision is not None
        await self._may_show(revision)
        self._dropped_gone.discard(node.ino)  # its pages may be cached again: if it goes again, they go again

    async def check_backup(self, node: Node) -> None:
        """EACCES unless a scratch file frozen to an earlier revision of a note (Emacs's ``note~``, kept
        after the save that followed) may still show it: as a ``.history`` revision file (``check``),
        not forgotten, held or run out since. Frozen to the revision the view shows, it is the note's
        own content, decided by the view (``Reads``).

        Asked of the catalog at every ``READ``: a forget writes no change-log entry, and no lookup of
        a ``.history`` name comes first to notice it, as one does for a revision file. A ``READ``
        that finds it gone drops the backup's pages (``_read``). Backups are read seldom.
        """
        revision = node.frozen
        assert node.kind is Kind.SCRATCH and revision is not None
        note = self._mount.layers.note_for(revision.resource_id)
        if note is not None and note.revision_id != revision.revision_id:
            await self._may_show(revision, afresh=True)

    async def _may_show(self, revision: VisibleNote, *, afresh: bool = False) -> None:
        """EACCES unless ``revision`` is one of its note's revisions that may be shown now (as last
        read, unless ``afresh``)."""
        note = self._mount.layers.note_for(revision.resource_id)
        if note is None or not self._mount.shows(note.resource_id):
            raise fail(errno.EACCES)  # revoked, or the note left the view, since it was looked up
        listed = self._lists.get(note.resource_id)
        if afresh or listed is None or listed.current != note.revision_id:
            listed = await self._read(note)
        shown = listed.by_id.get(revision.revision_id)
        if shown is None or _expired(shown, now_us()):
            raise fail(errno.EACCES)

    async def _read(self, note: VisibleNote) -> Listed:
        """``note``'s revisions that may be shown, read from the catalog now; what changed is dropped."""
        mount = self._mount
        found = await mount.catalog(revisions_shown, mount.home, note.cell, note.resource_id)
        listed = Listed.of(note, found)
        old = self._lists.get(note.resource_id)
        self._lists[note.resource_id] = listed
        if old is not None and old.revisions != listed.revisions:
            self._drop(note.resource_id, note.parts)  # forgotten, held or run out since: a lookup found it first
            self._lists[note.resource_id] = listed
        until = listed.expires(now_us())
        if until is None:
            self._expiry.pop(note.resource_id, None)
        else:
            if until < min(self._expiry.values(), default=until + 1):
                self._woken.set()
            self._expiry[note.resource_id] = until
        return listed

    async def _without_gone(self, note: VisibleNote, listed: Listed) -> None:
        """Drop the kernel's pages of ``note``'s revisions that ``listed`` lacks, before a lookup or a
        listing answers without them.

        Their names are never cached, so a lookup or a listing is where a
        revision is seen to go (forgotten, held by its lineage, revoked, run
        out); a process that saw it go must not then read its bytes from the
        cache through a descriptor it held (``MountState._withdrawn_then_applied``
        says the same of notes). The queued drops of ``_drop`` come later.
        Called by those two handlers only: neither holds a page of a
        revision, so the drop cannot wait on them; a ``READ`` (``check``)
        refuses a revision that went instead, and waits for nothing.
        """
        gone = [node for node in self._revision_nodes.get(note.resource_id, {}).values()
                if node.frozen is not None and node.frozen.revision_id not in listed.by_id
                and node.ino not in self._dropped_gone]
        if gone:
            await self._mount.kernel.drop_pages_now(gone, in_handler=True)
            # Marked only now, and only while the revisions last read still lack them: a lookup meanwhile
            # drops them too rather than answer before they are gone, and one shown again meanwhile
            # (``_child``, ``check``) may have its pages cached again. Unmarked, a node is dropped again.
            still_gone = self._lists.get(note.resource_id)
            if still_gone is not None:
                self._dropped_gone.update(node.ino for node in gone if node.frozen is not None
                                          and node.frozen.revision_id not in still_gone.by_id)

    # -- following the view --------------------------------------------------------

    def holding(self, resources: set[str]) -> list[Node]:
        """The revision nodes of these notes, whose cached pages hold their content."""
        return [node for r in resources for node in self._revision_nodes.get(r, {}).values()]

    def view_moved(self, old: VisibleView) -> None:
        """The view moved on from ``old`` (``MountState._apply``): drop what may have changed with it.

        Only notes whose entry may differ between the two pictures are
        looked at (every one when the picture was built again): their
        revisions are read again at the next lookup or ``READ``, the
        kernel's pages of those revisions go, and so do the listings of
        their history folders and of every folder above.
        """
        new = self._mount.view
        backups = self._backups()
        if new.base_seq == old.seq and new.usable == old.usable and new.access.view == old.access.view:
            paths: frozenset[Parts] | None = new.delta
            resources = {n.resource_id for p in new.delta for n in (old.notes.get(p), new.notes.get(p))
                         if n is not None}
        else:
            paths, resources = None, {*self._lists, *self._revision_nodes, *backups}
        for resource_id in resources:
            self._drop(resource_id, None, backups)
        if paths is None:
            folders = [node for node in self._known.values() if node.kind is Kind.HISTORY]
        else:
            wanted: set[Parts] = set()
            for parts in paths:
                for depth in range(len(parts), -1, -1):
                    above = (HISTORY, *parts[:depth])
                    if above in wanted:
                        break
                    wanted.add(above)
            folders = [node for parts in wanted if (node := self._known.get(parts)) is not None
                       and node.kind is Kind.HISTORY]
        self._drop_listings(folders)

    def _backups(self) -> dict[str, list[Node]]:
        """The scratch files frozen to a revision (``check_backup``), by the note they copy."""
        found: dict[str, list[Node]] = {}
        for node in self._mount.layers.local.values():
            if node.kind is Kind.SCRATCH and node.frozen is not None:
                found.setdefault(node.frozen.resource_id, []).append(node)
        return found

    def _drop(self, resource_id: str, parts: Parts | None, backups: dict[str, list[Node]] | None = None) -> None:
        """Forget what was read of a note's revisions and drop the kernel's pages of them, and of the
        scratch files frozen to one (``backups``, found now if not given; and, given the note's
        ``parts``, the listing of its history folder)."""
        self._lists.pop(resource_id, None)
        self._expiry.pop(resource_id, None)
        for node in self._revision_nodes.get(resource_id, {}).values():
            self._mount.kernel.forget_pages(node)
        for node in (backups if backups is not None else self._backups()).get(resource_id, ()):
            self._mount.kernel.forget_pages(node)
        if parts is not None:
            folder = self._known.get((HISTORY, *parts))
            if folder is not None and folder.kind is Kind.HISTORY:
                self._drop_listings([folder])

    def _drop_listings(self, folders: list[Node]) -> None:
        """The kernel lists these again: their times move and their attributes go now, their cached
        listings on the worker (``MountState._apply`` says why)."""
        for folder in folders:
            folder.listing_version += 1
            # A note's revisions are read again by the rest of a listing begun (its places, revision
            # numbers, keep it where it was); a folder's names are not: that rest goes on from the names
            # it began with (places by index), each looked up in the view now, so none that stays is skipped.
            self._listings.drop(folder.ino, lambda taken: taken[1] is not None)
            list_again(folder.ino)
            self._mount.kernel.forget_pages(folder)

    async def expire(self) -> None:
        """Forever: when a listed revision's validity runs out, its pages and its name go at once.

        The view wakes for the validity of the revisions it shows
        (``catalog.visible``); earlier revisions are this tree's own, so it
        keeps their times and wakes for them itself.
        """
        while True:
            soonest = min(self._expiry.values(), default=None)
            wait = IDLE_EXPIRY_S if soonest is None else max(0.0, (soonest - now_us()) / 1e6) + 0.001
            with trio.move_on_after(wait):
                await self._woken.wait()
            self._woken = trio.Event()
            try:
                now = now_us()
                for resource_id in [r for r, at in self._expiry.items() if at <= now]:
                    self._drop(resource_id, self._mount.view.by_resource.get(resource_id))
            except Exception as exc:  # noqa: BLE001 - a background failure must not end the mount
                log.warning("history expiry failed (%s)", type(exc).__name__)


def _expired(revision: Revision, now: int) -> bool:
    return revision.valid_until is not None and now >= revision.valid_until
