"""Text from notes made safe for a terminal and for line-based tools.

Names, paths and snippets printed for people (the command line's text
output, the mount's ``.search`` text files) carry what other people wrote:
a group member's note could hold escape sequences for the operator's
terminal, or a line separator that splits one result into two lines. So
every such line goes through ``printable``. JSON needs no such care:
``json.dumps`` escapes them already.
"""

from __future__ import annotations

import unicodedata

# Categories escaped in text output: controls (C0, DEL, C1), lone surrogates
# (undecodable argv or file names), line and paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
# Format characters that reorder what a terminal shows (bidi embeddings,
# overrides, isolates and marks). Other format characters (a zero-width
# joiner inside an emoji, say) are harmless and stay as they are.
_BIDI = frozenset({"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))})
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    if ch in _BIDI or unicodedata.category(ch) in _ESCAPED_CATEGORIES:
        code = ord(ch)
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
    return ch


def printable(text: str) -> str:
    """``text`` safe for a terminal and for line-based tools: the characters
    above written as escapes (``\\x1b``, ``\\u2028``, ``\\t``), all else as is.

    A name that passed ``catalog.paths`` validation never changes here (it
    holds none of these), so ``ls`` output stays a faithful list of names;
    a backslash is not doubled for the same reason.
    """
    if text.isprintable():  # the common case: nothing to escape (every escaped character is unprintable)
        return text
    return "".join(map(_escape, text))
