"""What ``stat`` and ``statfs`` say about a mount: only what the view itself holds.

Modes follow the root a name is under (0700/0600 where the view places
writes, 0500/0400 where it does not), so the kernel refuses writes to a
read-only root before asking. Sizes and times come from the revision shown
or the draft being written; folders carry the mount's start time, since
they exist only through their notes and a time of their own would say
when a note below changed (a folder's moves by a nanosecond each time its
names change, so that the kernel lists it again). ``statfs`` is constant: free space or a file
count would reveal writes to other scopes.
"""

from __future__ import annotations

import stat

import pyfuse3

from scopefs.vfs import historytree, queries
from scopefs.vfs.absences import ABSENT_KEPT_S, NO_INODE
from scopefs.vfs.inodes import Kind, Node
from scopefs.vfs.mount import MountState

CACHE_TIMEOUT_S = 30.0  # entries and attributes; every change is invalidated precisely
STATFS_BLOCKS = 1 << 28
STATFS_FILES = 1 << 24


def attributes(mount: MountState, node: Node) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = node.ino
    attr.generation = 0  # inode numbers are never reused within a mount (vfs.inodes)
    attr.entry_timeout = attr.attr_timeout = CACHE_TIMEOUT_S
    attr.st_uid, attr.st_gid = mount.uid, mount.gid
    attr.st_blksize = 4096
    mtime = mount.started_ns
    layers = mount.layers
    if node.kind in (Kind.QUERIES, Kind.RESULTS):
        mtime = queries.attributes(node, attr, mtime)
    elif node.kind in (Kind.HISTORY, Kind.REVISION):
        mtime = historytree.attributes(node, attr, mtime)
    elif node.kind is Kind.DIR:
        writable = layers.takes_new(node.parts + ("x",))
        attr.st_mode = stat.S_IFDIR | (0o700 if writable else 0o500)
        attr.st_nlink = 2
        attr.st_size = 0
        # The kernel keeps a listing while the folder's mtime stays the same (no opendir asks):
        # each change of its names seen here moves it by a nanosecond, which says that it
        # changed, as the names do, and nothing of when.
        mtime += node.listing_version
    elif node.deposit is not None:  # being written into a postbox: write-only, and nothing of it is cached
        attr.st_mode = stat.S_IFREG | 0o200
        attr.entry_timeout = attr.attr_timeout = 0
        attr.st_nlink = 0
        attr.st_size = node.draft.size if node.draft is not None else 0
    else:
        writable = node.kind is Kind.SCRATCH or layers.writable(node.parts)
        attr.st_mode = stat.S_IFREG | (0o600 if writable else 0o400)
        attr.st_nlink = 1 if node.attached else 0
        note = node.frozen if node.kind is Kind.SCRATCH else (layers.note_of(node) or node.shown)
        if node.draft is not None:
            attr.st_size = node.draft.size
            mtime = node.draft.mtime_ns
        elif note is not None:
            attr.st_size = note.size
            mtime = note.mtime_us * 1000
        else:
            attr.st_size = 0
    attr.st_blocks = (attr.st_size + 511) // 512
    attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
    return attr


def absent() -> pyfuse3.EntryAttributes:
    """The answer to a lookup of a name the view lacks, which the kernel keeps for ``ABSENT_KEPT_S``
    unless the view comes to show it (``vfs.absences``)."""
    attr = pyfuse3.EntryAttributes()
    attr.st_ino = NO_INODE
    attr.entry_timeout = ABSENT_KEPT_S
    return attr


def statfs() -> pyfuse3.StatvfsData:
    data = pyfuse3.StatvfsData()
    data.f_bsize = data.f_frsize = 4096
    data.f_blocks = data.f_bfree = data.f_bavail = STATFS_BLOCKS
    data.f_files = data.f_ffree = data.f_favail = STATFS_FILES
    data.f_namemax = 255
    return data
