"""Names arriving from the kernel: decoded, validated, compared for look-alikes.

The kernel hands us raw bytes. A name we cannot hold as a note path (not
UTF-8, not NFC, control or format characters, the line and paragraph
separators U+2028 and U+2029, too long: ``catalog.paths.validate_component``
decides, for the mount and the command line alike) can never exist,
so looking it up answers "no such file" like any missing name, and
creating it is refused with a clear errno. A new name that merely looks
like a sibling (``note.md`` and ``nоte.md`` with a Cyrillic o, or a
different case) is refused too: two notes a reader cannot tell apart are
an invitation to edit the wrong one.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Iterable

from scopefs.catalog.errors import BadInput
from scopefs.catalog.lookalikes import looks_like
from scopefs.catalog.paths import MAX_COMPONENT_BYTES, validate_component


class BadName(Exception):
    """A name that can never be a note's, and the errno that refuses creating it."""

    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.errno = code


def decode(name: bytes) -> str:
    """The validated name, or BadName (EINVAL, ENAMETOOLONG)."""
    if len(name) > MAX_COMPONENT_BYTES:
        raise BadName(errno.ENAMETOOLONG)
    try:
        text = name.decode("utf-8")
        return validate_component(text)
    except (UnicodeDecodeError, BadInput):
        raise BadName(errno.EINVAL) from None


@functools.lru_cache(maxsize=1 << 16)
def skeleton(name: str) -> str:
    """What ``name`` looks like (``catalog.lookalikes``), cached: a create compares it with every sibling."""
    return looks_like(name)


def confusable(name: str, siblings: Iterable[str]) -> list[str]:
    """The siblings that look the same as ``name`` but are not it."""
    mark = skeleton(name)
    return [other for other in siblings if other != name and skeleton(other) == mark]
