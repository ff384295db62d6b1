"""The hidden query folder: searching a view with plain file operations.

A sandboxed process has its mount and nothing else, so searching has to be
a file operation. Reading ``.search/<query>`` at the root of a mount runs
the session's scoped search (``catalog.search.search``, what
``scopefs search SESSION QUERY`` runs) and returns its results:

    .search/<query>                          text, as ``scopefs search`` prints it
    .search/json/<query>                     the object ``scopefs --json search`` prints
    .search/about/<PRINCIPAL>/<query>        only notes about that verified subject (``--about``)
    .search/about/<PRINCIPAL>/json/<query>   the same, as JSON

Why it is built this way:

* ``.search`` is never listed: the root lists only the view's roots and
  every query folder lists nothing. So ``ls -R``, ``find`` and ``grep -r``
  never start a search and cost what they did; only naming a query does.
  It cannot hide a note: the root holds only mount roots, none of which is
  named ``.search``.
* A query's results are computed when its name is looked up, held by its
  inode, and taken by each open as they are then (one ``cat`` reads one
  search, whatever other lookups do meanwhile). The kernel may cache none
  of it (entry and attribute timeouts of 0, its pages dropped at each lookup), so every
  ``cat`` is a new search against the catalog as it is then, and ``stat``
  reports the exact size. A query keeps its inode while the kernel knows
  it: a new inode per lookup would make the kernel look every cached name
  up twice (once to revalidate it, once more when the number changed), and
  so search twice per ``cat``. The node goes when the kernel forgets it.
* The search is the command line's own, for this mount's session: the same
  authorization, prefilter, evaluator, hash checks and audit, run on the
  mount's catalog thread. Results name virtual paths of this view
  (``private/notes/x.md``; inside a sandbox ``/memory/private/notes/x.md``).
* Everything here is read-only, refused like a read-only root (``EROFS``;
  in a sandbox the kernel refuses first, from the modes, with ``EACCES``).
* Results follow the resources they quote, never the paths the view
  happened to show: a hit the view does not show yet (a note committed
  through another mount a moment ago) makes the mount catch up first, and
  a hit it still does not show is left out. A results file held open
  stops serving (``EACCES``) once the view goes (a revoked binding) or a
  note it quotes leaves the view (tombstoned, denied), as a held note
  does; a view without evidence has no ``.search`` at all (``ENOENT``).
* Query text, principal ids, paths and snippets are never logged: they are
  the caller's words and the view's content.

Names that are also folders (``json`` and ``about`` directly in
``.search``, ``json`` in an ``about`` folder) shadow the one-word queries
they spell; ``json `` (with a space) or ``JSON`` searches for the word.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import stat
import time
from collections.abc import Awaitable, Callable

import pyfuse3

from scopefs.catalog.errors import BadInput, Denied, ScopefsError
from scopefs.catalog.paths import Parts
from scopefs.catalog.search import Outcome
from scopefs.catalog.visible import VisibleNote, VisibleView
from scopefs.vfs.errors import errno_for
from scopefs.vfs.inodes import Inodes, Kind, Node
from scopefs.vfs.querytree import SEARCH, Folder, Results

log = logging.getLogger("scopefs.vfs")

# (query, about=principal id or None) -> the outcome, run on the catalog thread.
Search = Callable[..., Awaitable[Outcome]]


def render_text(outcome: Outcome) -> bytes:
    """What ``scopefs search`` prints."""
    return ("\n".join(outcome.lines()) + "\n").encode("utf-8")


def render_json(outcome: Outcome) -> bytes:
    """Exactly what ``scopefs --json search`` prints, so a tool can parse either."""
    return (json.dumps(outcome.payload(), sort_keys=True) + "\n").encode("utf-8")


def attributes(node: Node, attr: pyfuse3.EntryAttributes, mtime_ns: int) -> int:
    """Fill in a query node's attributes; returns its time (``mtime_ns`` for folders).

    Read-only, like a read-only root (and so owner-only, as everywhere in a
    sandbox's mount), and never cached: each lookup must search again.
    """
    attr.entry_timeout = attr.attr_timeout = 0
    if node.kind is Kind.RESULTS:
        assert isinstance(node.query, Results)
        attr.st_mode = stat.S_IFREG | 0o400
        attr.st_nlink = 1
        attr.st_size = len(node.query.data)
        return node.query.at_ns
    attr.st_mode = stat.S_IFDIR | 0o500
    attr.st_nlink = 2
    attr.st_size = 0
    return mtime_ns


def _search_errno(exc: Exception) -> int:
    """Bad queries are EINVAL, refusals as elsewhere in the mount, anything else EIO."""
    if isinstance(exc, BadInput):
        return errno.EINVAL
    if isinstance(exc, Denied):
        return errno_for(exc)
    if not isinstance(exc, (ScopefsError, OSError)):
        log.error("unexpected %s in a search", type(exc).__name__)  # the type only: never the query
    return errno.EIO


class Queries:
    """The query tree of one mount: a node per path the kernel knows, no more."""

    def __init__(self, inodes: Inodes, search: Search, view: Callable[[], VisibleView],
                 sync: Callable[[], Awaitable[None]], shows: Callable[[str], bool],
                 suspended: Callable[[], bool]) -> None:
        self._inodes = inodes
        self._search = search
        self._view = view
        self._shows = shows  # ``MountState.shows``: the view, but for notes on their way out of it
        self._suspended = suspended  # ``MountState.suspended``: the view lacks a write of the mount's
        self._sync = sync
        self._known: dict[Parts, Node] = {}
        self._paths: dict[int, Parts] = {}  # inode -> its path in _known
        # Called with each note a results file quotes (``Reads.expose``: a snippet is content, so it is
        # an exposure); set once the mount's reads exist.
        self.expose: Callable[[VisibleNote], None] = lambda _note: None

    @staticmethod
    def covers(parent: Node, name: bytes) -> bool:
        """Whether looking up ``name`` in ``parent`` is answered here."""
        return parent.kind is Kind.QUERIES or (parent.kind is Kind.DIR and not parent.parts
                                               and name == SEARCH.encode())

    async def lookup(self, parent: Node, name: bytes) -> Node:
        """The folder or the freshly computed results that ``name`` is in ``parent``."""
        if not self._view().usable:
            raise pyfuse3.FUSEError(errno.ENOENT)  # no evidence, no view: nothing at all to search
        if parent.kind is not Kind.QUERIES:
            return self._node((SEARCH,), Kind.QUERIES, Folder())
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        folder = parent.query
        assert isinstance(folder, Folder)
        parts = parent.parts + (text,)
        child = folder.child(text)
        if child is not None:
            return self._node(parts, Kind.QUERIES, child)
        try:
            outcome = await self._search(text, about=folder.about)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an errno, logged by type at most
            raise pyfuse3.FUSEError(_search_errno(exc)) from None
        outcome = await self._shown(outcome)
        view = self._view()
        for hit in outcome.hits:
            shown_at = view.by_resource.get(hit.resource_id)
            if shown_at is not None:  # ``_shown`` kept only these; nothing ran in between
                self.expose(view.notes[shown_at])
        data = render_json(outcome) if folder.as_json else render_text(outcome)
        quoted = frozenset(hit.resource_id for hit in outcome.hits)
        return self._node(parts, Kind.RESULTS, Results(data, quoted, time.time_ns()))

    async def _shown(self, outcome: Outcome) -> Outcome:
        """``outcome`` without hits this view does not show (after catching up once, if it lags)."""
        if not self._view().usable:
            raise pyfuse3.FUSEError(errno.ENOENT)  # revoked while searching: as if it came first
        if any(hit.resource_id not in self._view().by_resource for hit in outcome.hits):
            try:
                await self._sync()  # a note committed through another mount since this one's last sync
            except Exception:  # noqa: BLE001 - the hits it cannot confirm are left out below
                pass
        view = self._view()
        if not view.usable:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self._suspended():
            raise pyfuse3.FUSEError(errno.EACCES)  # the hits the view lacks may be this mount's own writes
        hits = tuple(hit for hit in outcome.hits if self._shows(hit.resource_id))
        return outcome if len(hits) == len(outcome.hits) else dataclasses.replace(outcome, hits=hits)

    def _node(self, parts: Parts, kind: Kind, query: Folder | Results) -> Node:
        """The node of ``parts``, now holding ``query``: the one the kernel knows, if it knows one.

        Not attached to any name, so ``Inodes.forget`` drops it once the
        kernel has forgotten it (and no handle holds it).
        """
        node = self._known.get(parts)
        if node is None or node.kind is not kind or self._inodes.get(node.ino) is not node:
            node = self._inodes.new(kind, parts, attached=False)
            self._known[parts] = node
            self._paths[node.ino] = parts
        node.query = query
        return node

    def forget(self, ino: int) -> None:
        """After the kernel forgot ``ino``: let go of the node if the inode table did."""
        parts = self._paths.get(ino)
        if parts is None or self._inodes.get(ino) is not None:
            return
        del self._paths[ino]
        node = self._known.get(parts)
        if node is not None and node.ino == ino:
            del self._known[parts]

    def check(self, results: Results) -> Results:
        """``results``, if they may still be served (EACCES otherwise)."""
        if not self._view().usable or not all(map(self._shows, results.quoted)):
            raise pyfuse3.FUSEError(errno.EACCES)  # revoked, tombstoned or denied since the search
        return results

    def opened(self, node: Node) -> Results:
        """What an open of a results file serves: its results as they are now, if still allowed."""
        assert node.kind is Kind.RESULTS and isinstance(node.query, Results)
        return self.check(node.query)

    def read(self, results: Results, off: int, size: int) -> bytes:
        return self.check(results).data[off:off + size]
