"""The protected human-notes block: a region no machine write may change.

A note may hold a region between ``<!-- scopefs:human:start -->`` and
``<!-- scopefs:human:end -->``. People (through a mount or an editor) change
it freely; every machine write of the note (derive, regenerate, migrate,
approve) carries the previous revision's region over byte for byte. Where
the markers cannot be trusted the machine write fails (BadInput, exit 2)
rather than guess: a guess that is wrong overwrites what a person wrote, and
that cannot be undone, while a refusal costs one marker fixed by hand. The
idea is OpenClaw memory-wiki's preserveHumanNotesBlock, which likewise asks
for the missing marker to be restored instead of regenerating over it.

Markers are exact byte strings, found with ``bytes.find``: linear in the
note's size, no regular expression, no decoding, so any bytes are safe input.
A marker that was edited into something else (a space dropped, a letter
changed) is not a marker; with its partner intact that reads as "only one
marker", which is refused.

Decisions:

* A note without either marker has no block; a machine write of it is not
  constrained (its new content is kept as given, markers or not).
* A person who deletes both markers removed the block; the next machine write
  has nothing to protect. Damaging only one marker is refused.
* If the previous revision's markers are damaged (a person broke them by
  hand), the machine write fails: the human text may be anywhere around
  them, so no write can know what to keep.
* If the previous revision had no block, new content is taken as it is, even
  with damaged markers: there is nothing to protect. The next machine write
  of that note is then refused until the markers are fixed, by the rule
  above.
"""

from __future__ import annotations

from scopefs.catalog.errors import BadInput

START = b"<!-- scopefs:human:start -->"
END = b"<!-- scopefs:human:end -->"


class HumanBlockDamaged(BadInput):
    """A machine write would overwrite a human-notes block it cannot locate.

    The message names the markers and the kind of damage, never the note's
    content: the reason is safe to print and to audit.
    """

    def __init__(self, detail: str | None = None) -> None:
        message = ("the note's human-notes block is damaged or missing: restore both markers"
                   f" ({START.decode()} ... {END.decode()}) before a machine write")
        super().__init__(f"{message} ({detail})" if detail else message)


def _span(data: bytes, where: str) -> tuple[int, int] | None:
    """Offsets of the region (after START, at END), None without a block.

    ``where`` says which text is damaged (the note as it is, or the content
    being written), so the person fixing it knows which one to open.
    """
    start = data.find(START)
    end = data.find(END)
    if start < 0 and end < 0:
        return None
    if start < 0:
        raise HumanBlockDamaged(f"{where}: the start marker is missing")
    if end < 0:
        raise HumanBlockDamaged(f"{where}: the end marker is missing")
    if data.find(START, start + len(START)) >= 0:
        raise HumanBlockDamaged(f"{where}: the start marker appears more than once")
    if data.find(END, end + len(END)) >= 0:
        raise HumanBlockDamaged(f"{where}: the end marker appears more than once")
    if end < start + len(START):
        raise HumanBlockDamaged(f"{where}: the end marker comes before the start marker")
    return start + len(START), end


def human_region(data: bytes) -> bytes | None:
    """The bytes between the markers, None when the note has no block.

    Raises HumanBlockDamaged when only one marker is present, either marker
    appears twice, or the end marker comes first: each is a block that a
    write cannot place, so it is reported rather than read as "no block".
    """
    span = _span(data, "in the note")
    return None if span is None else data[span[0]:span[1]]


def keep_human_block(previous: bytes | None, new: bytes) -> bytes:
    """``new`` with the previous revision's human region put back, byte for byte.

    ``previous`` is the active revision's content (None for a new note).
    Without a block in ``previous`` there is nothing to protect and ``new``
    is returned unchanged. With one, ``new`` must hold exactly one
    well-formed block, and only the bytes between its markers are replaced:
    a machine writer keeps control of where the block sits, never of what
    it says. A damaged ``previous`` fails the write (see the module's
    decisions).
    """
    if previous is None:
        return new
    kept = _span(previous, "in the note's current revision")
    if kept is None:
        return new
    target = _span(new, "in the content being written")
    if target is None:
        raise HumanBlockDamaged("in the content being written: both markers are missing, and the note has a block")
    return new[:target[0]] + previous[kept[0]:kept[1]] + new[target[1]:]
