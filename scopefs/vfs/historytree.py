"""What the names under the hidden ``.history`` folder mean, and what ``stat`` says of them (see ``vfs.history``).

Pure values and one attribute function, no lookups: ``vfs.attributes``
reads these for every history node, and ``vfs.history`` (which lists with
``vfs.attributes``) builds on them, so neither imports the other.
"""

from __future__ import annotations

import posixpath
import stat

import pyfuse3

from scopefs.catalog.paths import Parts
from scopefs.vfs.inodes import Kind, Node

HISTORY = ".history"
MAX_SUFFIX_BYTES = 16  # a note's extension longer than this is left off its revisions' names


def is_history_path(parts: Parts) -> bool:
    """Whether ``parts`` lies in the history tree (never a note's path: the root holds only view roots)."""
    return parts[:1] == (HISTORY,)


def view_parts(parts: Parts) -> Parts:
    """The path of the view a history node stands for (``.history/private/a.md`` -> ``private/a.md``)."""
    return parts[1:]


def revision_name(revision_no: int, note_name: str) -> str:
    """``r<N>`` and the note's own extension (``r3.md`` for ``allergy.md``): tools that go by the extension
    (an editor's syntax, ``json.load``) treat an earlier revision like the note."""
    suffix = posixpath.splitext(note_name)[1]
    if len(suffix.encode("utf-8")) > MAX_SUFFIX_BYTES:
        suffix = ""
    return f"r{revision_no}{suffix}"


def attributes(node: Node, attr: pyfuse3.EntryAttributes, mtime_ns: int) -> int:
    """Fill in a history node's attributes; returns its time (``mtime_ns`` for folders).

    Read-only, owner-only like everything a sandbox's mount shows. Names
    and attributes are never cached by the kernel (timeouts of 0): whether
    a revision may be shown depends on catalog facts that change without
    the note changing (a forget, a lineage hold, a validity running out),
    so each lookup asks again. The bytes of a revision never change, so
    its pages are kept, and dropped when it may no longer be shown.
    """
    attr.entry_timeout = attr.attr_timeout = 0
    if node.kind is Kind.REVISION:
        assert node.frozen is not None
        attr.st_mode = stat.S_IFREG | 0o400
        attr.st_nlink = 1
        attr.st_size = node.frozen.size
        return node.frozen.mtime_us * 1000
    attr.st_mode = stat.S_IFDIR | 0o500
    attr.st_nlink = 2
    attr.st_size = 0
    return mtime_ns + node.listing_version  # moves when its names change: the kernel lists it again
