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
import unicodedata
from collections.abc import Iterable

from scopefs.catalog.errors import BadInput
from scopefs.catalog.paths import MAX_COMPONENT_BYTES, validate_component

# Letters from other scripts that render like Latin ones (a small, common
# subset of Unicode's confusables table; enough for the usual spoofs).
_LOOKALIKES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s",
    "ԁ": "d", "ɡ": "g", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ᴠ": "v", "ᴢ": "z",
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "τ": "t", "ι": "i", "κ": "k", "χ": "x", "υ": "u", "ε": "e",
    "ı": "i", "ℓ": "l", "０": "0", "１": "1", "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-", "−": "-",
    "⁄": "/", "∕": "/", "․": ".", "‧": ".", "。": ".",
})


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
    """What ``name`` looks like: compatibility-folded, case-folded, homoglyphs mapped."""
    folded = unicodedata.normalize("NFKC", name).casefold().translate(_LOOKALIKES)
    return "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))


def confusable(name: str, siblings: Iterable[str]) -> list[str]:
    """The siblings that look the same as ``name`` but are not it."""
    mark = skeleton(name)
    return [other for other in siblings if other != name and skeleton(other) == mark]
