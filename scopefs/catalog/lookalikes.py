"""What text looks like: the fold that makes two spellings of one thing compare equal.

A name that renders like a sibling's (a Cyrillic "а" for a Latin "a") is
refused by the mount (``vfs.names``), and a claim a person forgot must not
come back by the same trick (``catalog.claims``). Both compare the same
fold: Unicode compatibility forms (NFKC), case folding, a small table of
cross-script look-alikes, and combining marks dropped.
"""

from __future__ import annotations

import unicodedata

# Letters from other scripts that render like Latin ones (a small, common
# subset of Unicode's confusables table; enough for the usual spoofs).
_LOOKALIKES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s",
    "ԁ": "d", "ɡ": "g", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ᴠ": "v", "ᴢ": "z",
    "α": "a", "ο": "o", "ρ": "p", "ν": "v", "τ": "t", "ι": "i", "κ": "k", "χ": "x", "υ": "u", "ε": "e",
    "ı": "i", "ℓ": "l", "０": "0", "１": "1", "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-", "−": "-",
    "⁄": "/", "∕": "/", "․": ".", "‧": ".", "。": ".",
    "ɑ": "a", "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ց": "g", "ᴏ": "o", "ᴄ": "c", "ꮪ": "s", "ɩ": "i",
})


def looks_like(text: str) -> str:
    """``text`` folded: compatibility forms, case, look-alike letters and combining marks."""
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_LOOKALIKES)
    return "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))
