"""Claims: the value a forget rejects, so a forgotten fact cannot come back by another door.

OpenClaw's own tombstones are keyed on the session a fact came from:
forget the conversation and the same sentence, said again elsewhere, is
learned again. A forget here also rejects the *value*: every claim of the
forgotten note, normalised and keyed, is refused on every later write of
the cell (any session, a derivation, a deposit, an import).

A claim is a paragraph (text between blank lines) and, inside a paragraph
of several lines, each line on its own (a list item is a claim of its
own). Normalising: invisible format characters (a soft hyphen, a
zero-width space) dropped, then the look-alike fold of
``catalog.lookalikes`` (NFKC, case, cross-script homoglyphs, combining
marks), Markdown markup and punctuation dropped, whitespace collapsed; so
re-wrapping, re-bulleting, re-casing or re-spelling a sentence with
look-alike letters does not make it new. Claims shorter than
``MIN_WORDS`` words or ``MIN_CHARS`` characters (a heading, "ok", a
date) are not keyed: forgetting them would refuse ordinary writing.
Front-matter fences, the validity keys' lines and the human-notes markers
are not claims; any other line, front matter included, is, and so is
each line without up to three leading labels ("Note: X" is the claim X).

Only a keyed hash (HMAC-SHA256 under the home's key, ``identity.lookup_key``)
is stored: the rejection list holds no text, and without the key it cannot
be tested against guesses offline. Only the first ``MAX_SCAN_BYTES`` of a
note are read for claims: notes are far smaller, and the bound keeps a
giant write from costing a giant scan.
"""

from __future__ import annotations

import json
import re
import unicodedata

import apsw

from scopefs.catalog.identity import lookup_key
from scopefs.catalog.lookalikes import looks_like

MAX_SCAN_BYTES = 1 << 20
MAX_CLAIM_CHARS = 64 << 10  # a longer paragraph is keyed by its first 64 KiB of normalised text
MIN_WORDS = 5  # a forgotten fact is a sentence; "see you tomorrow morning" is not one to ban agent-wide
MIN_CHARS = 24
MAX_LABELS = 3
MAX_LEAD_WORDS = 6  # a write is checked with up to this many leading words dropped ("**Fact:** X", "So, X")
# Characters that show nothing (format and control characters, combining and variation marks) and
# letters made to look blank: dropped, so none of them can split a word of a forgotten claim.
_INVISIBLE = frozenset({"Cf", "Cc", "Mn", "Me", "Co", "Cs"})
_BLANKS = frozenset("\u115f\u1160\u2800\u3164\uffa0")
_LABEL = re.compile(r"[ \t>*_#-]{0,8}[^:\n]{1,40}:[ \t]{1,8}")  # "Note: ", "- Fact: ", "## Alice: "
_MARKUP = re.compile(r"[^\w\s]", re.UNICODE)  # one character at a time: linear
_SPACE = re.compile(r"\s+", re.UNICODE)
_MARKERS = (b"<!-- scopefs:human:start -->", b"<!-- scopefs:human:end -->")
# In the front matter at a note's start, its fences and the validity keys' lines (``catalog.validity``)
# are metadata every note may share; every other line, there or anywhere, may be a claim.
_METADATA = re.compile(rb"[ \t]{0,8}(?:---[ \t\r]{0,8}|(?:valid-until|superseded-by)[ \t]{0,8}:.{0,200})\r?")
FRONT_MATTER_LINES = 64


def normalise(text: str) -> str:
    """The form two spellings of one claim share (module docstring)."""
    visible = "".join(ch for ch in text[: MAX_CLAIM_CHARS * 2]
                      if ch in "\n\t" or (unicodedata.category(ch) not in _INVISIBLE and ch not in _BLANKS))
    return _SPACE.sub(" ", _MARKUP.sub(" ", looks_like(visible))).strip()[:MAX_CLAIM_CHARS]


def _body(data: bytes) -> bytes:
    """``data`` without what is never a claim: the leading front matter's fences and validity keys, and
    the human-block markers."""
    for marker in _MARKERS:
        data = data.replace(marker, b"\n\n")
    lines = data.split(b"\n", FRONT_MATTER_LINES + 1)
    if not lines or lines[0].rstrip(b"\r") != b"---":
        return data
    head = lines[:FRONT_MATTER_LINES + 1]
    end = next((i for i in range(1, len(head)) if head[i].rstrip(b"\r") == b"---"), None)
    if end is None:
        return data
    kept = [line for line in head[1:end] if _METADATA.fullmatch(line) is None]
    return b"\n".join([*kept, *lines[end + 1:]])


def units(data: bytes, *, checking: bool = False) -> list[str]:
    """Every normalised claim of ``data`` long enough to key, each once.

    ``checking`` (a write, not a forget): also each claim with up to
    ``MAX_LEAD_WORDS`` leading words dropped, so a forgotten claim cannot
    come back behind a label or a lead-in the label rule does not know.
    Only the writing side does this: a forget keys what was said, never a
    tail of it that ordinary writing could share.
    """
    text = _body(data[:MAX_SCAN_BYTES]).decode("utf-8", errors="replace")
    found: dict[str, None] = {}
    for paragraph in re.split(r"\n[ \t\r\f\v]*\n", text):
        lines = [line for line in paragraph.split("\n") if line.strip()]
        for piece in ([paragraph] if len(lines) > 1 else []) + lines:
            for variant in _unlabelled(piece):
                claim = normalise(variant)
                for tail in _tails(claim) if checking else [claim]:
                    if len(tail) >= MIN_CHARS and tail.count(" ") + 1 >= MIN_WORDS:
                        found[tail] = None
    return list(found)


def _tails(claim: str) -> list[str]:
    """``claim`` and it without its first 1 to ``MAX_LEAD_WORDS`` words."""
    tails = [claim]
    for _ in range(MAX_LEAD_WORDS):
        cut = tails[-1].find(" ")
        if cut == -1:
            break
        tails.append(tails[-1][cut + 1:])
    return tails


def _unlabelled(piece: str) -> list[str]:
    """``piece``, and ``piece`` without each of up to ``MAX_LABELS`` leading labels ("Note: ", "Fact: "):
    "Note: X" is still the claim X, whichever side of a forget the label was on."""
    variants = [piece]
    for _ in range(MAX_LABELS):
        found = _LABEL.match(variants[-1])
        if found is None:
            break
        variants.append(variants[-1][found.end():])
    return variants


def keys(home_key: bytes, data: bytes, *, checking: bool = False) -> list[str]:
    """The keyed hashes of ``data``'s claims: what a forget stores, or (``checking``) what a write is
    checked against."""
    return [lookup_key(home_key, "forgotten-claim", claim).hex() for claim in units(data, checking=checking)]


def any_forgotten(conn: apsw.Connection, agent_id: str) -> bool:
    """Whether this cell has rejected any claim at all."""
    return bool(conn.execute("SELECT 1 FROM rejected_claims WHERE agent_id = ? LIMIT 1", (agent_id,)).fetchall())


def any_rejected(conn: apsw.Connection, agent_id: str, claim_keys: list[str]) -> bool:
    """Whether any of ``claim_keys`` was forgotten in this cell (one indexed query)."""
    if not claim_keys:
        return False
    return bool(conn.execute(
        "SELECT 1 FROM rejected_claims WHERE agent_id = ? AND claim_key IN (SELECT value FROM json_each(?)) LIMIT 1",
        (agent_id, json.dumps(claim_keys))).fetchall())
