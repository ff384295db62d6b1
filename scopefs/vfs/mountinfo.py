"""The kernel's table of this process's mounts (``/proc/self/mountinfo``), read without asking a mount.

Failing closed needs a mount's FUSE connection (``vfs.abort``), and
stopping one needs its type (``sandbox.mounts``). Both come from this table
rather than from a ``stat`` of the mount point, which the server being
asked may be the one that cannot answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TABLE = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountEntry:
    device: str  # "major:minor"; a FUSE mount's minor is its connection's number
    fstype: str  # "fuse.scopefs", say; empty if the line had none


def last_mount_at(path: str) -> MountEntry | None:
    """The mount on top at ``path`` exactly as given (nothing is resolved): the last the table lists
    there, as the kernel resolves the path. Raises OSError if the table cannot be read."""
    found = None
    with open(TABLE, encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            left, _, right = line.partition(" - ")  # the optional fields end before the separator
            fields = left.split()
            if len(fields) >= 5 and unescaped(fields[4]) == path:
                kind = right.split()
                found = MountEntry(fields[2], kind[0] if kind else "")
    return found


def unescaped(field: str) -> str:
    """A path field as the path it names (the kernel writes space, tab, newline and backslash as three
    octal digits after a backslash)."""
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), field) if "\\" in field else field


_ESCAPE = re.compile(r"\\([0-7]{3})")
