"""Validity time: ``valid-until`` and ``superseded-by`` in a note's front matter.

A note that says it stops being true at some time must stop being served at
that time, whether or not any cleanup has run since: reads deny it, listings
show it as missing, search drops it. So the time lives in the note itself,
where every copy, backup and migration carries it, and this module reads it
the same way everywhere.

Front matter is YAML-like, but only as much of YAML as these two keys need:

* The note's first line is exactly ``---`` and a later line is exactly
  ``---`` (a trailing CR is allowed on both: CRLF files work). Between them,
  ``key: value`` lines. No byte-order mark, no leading blank line.
* The block, both fences included, is at most 64 lines and 4 KiB (the
  closing fence's line end included). A longer one is not front matter and
  is ignored entirely, so reading costs the same bounded work on any note,
  and a note that merely starts with a Markdown rule reads as plain text.
* Only top-level lines (no indentation) naming ``valid-until`` or
  ``superseded-by`` matter; any other line, even malformed or not UTF-8, is
  ignored. Spaces before the colon are allowed (``valid-until : ...``).
* A value may be quoted with ``'...'`` or ``"..."``; quotes are removed and
  nothing inside is unescaped, so a value holding its own quote character or
  a backslash in double quotes is refused. An unquoted value ends at a
  `` #`` comment.
* A key given twice, an empty value or a malformed one is BadInput (exit 2)
  naming the key, never quoting the note: YAML has no single meaning for
  them, and reading a broken expiry as "none" would keep serving a note its
  author meant to retire.

``valid-until`` is a date ``YYYY-MM-DD``, valid through that whole day in UTC
(until the next midnight UTC), or a datetime ``YYYY-MM-DDTHH:MM[:SS[.f]]``
(``T`` or one space between) with ``Z`` or an offset ``+HH:MM``/``-HH:MM``.
A datetime without a zone is refused: its instant would depend on the
machine reading it. The note is valid while ``now < valid_until_us``.

``superseded-by`` names the note's replacement as a virtual path relative to
the same root as the note (``notes/new.md``), checked with the same rules as
any virtual path. It does not end validity on its own; ``valid-until`` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from scopefs.catalog.durations import parse_duration_us
from scopefs.catalog.errors import BadInput
from scopefs.catalog.paths import split_virtual_path

VALID_UNTIL = "valid-until"
SUPERSEDED_BY = "superseded-by"
MAX_FRONT_MATTER_BYTES = 4096
MAX_FRONT_MATTER_LINES = 64  # both fences included
MAX_INSTANT_CHARS = 40  # the longest instant form is 32 characters

_FENCE = b"---"
_US_PER_DAY = 86_400 * 1_000_000
_EPOCH = datetime(1970, 1, 1)
# Every instant a note may name: 0001-01-01T00:00Z up to the end of 9999-12-31
# (the latter is where a valid-until date of 9999-12-31 stops).
MIN_US = (datetime(1, 1, 1) - _EPOCH) // timedelta(microseconds=1)
MAX_US = (datetime(9999, 12, 31) - _EPOCH) // timedelta(microseconds=1) + _US_PER_DAY

# ASCII digits only, every part a fixed width: nothing here can backtrack.
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_DATETIME = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})"
                       r"(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?(Z|[+-][0-9]{2}:[0-9]{2})")
_INSTANT_FORMS = ("a date YYYY-MM-DD (valid through that day, UTC) or a datetime with Z or an offset"
                  " (e.g. 2025-06-30T18:00:00Z, 2025-06-30T18:00+02:00)")


@dataclass(frozen=True)
class Validity:
    """What a note's front matter says about its own lifetime (None: not said)."""

    valid_until_us: int | None = None
    superseded_by: str | None = None

    def expired(self, now_us: int) -> bool:
        """Past its validity at ``now_us``: the instant itself is already past."""
        return self.valid_until_us is not None and now_us >= self.valid_until_us


def _bad(key: str, why: str) -> BadInput:
    return BadInput(f"front matter {key}: {why}")


def _instant_us(text: str, label: str) -> int:
    """Microseconds since the epoch of a date (its end) or a zoned datetime.

    ``label`` names where the text came from (a front matter key, a command
    line option); the text itself is never echoed back.
    """
    if len(text) > MAX_INSTANT_CHARS:
        raise BadInput(f"{label}: expected {_INSTANT_FORMS}")
    try:
        day = _DATE.fullmatch(text)
        if day is not None:
            end = date(int(day[1]), int(day[2]), int(day[3])).toordinal() + 1
            return (end - _EPOCH.toordinal()) * _US_PER_DAY
        moment = _DATETIME.fullmatch(text)
        if moment is None:
            if _DATETIME.fullmatch(text + "Z") is not None:
                raise BadInput(f"{label}: a datetime needs Z or an offset such as +02:00")
            raise BadInput(f"{label}: expected {_INSTANT_FORMS}")
        naive = datetime(int(moment[1]), int(moment[2]), int(moment[3]), int(moment[4]), int(moment[5]),
                         int(moment[6] or 0), int((moment[7] or "0").ljust(6, "0")))
        zone = moment[8]
        offset_us = 0
        if zone != "Z":
            hours, minutes = int(zone[1:3]), int(zone[4:6])
            if hours > 23 or minutes > 59:
                raise BadInput(f"{label}: the offset must be between -23:59 and +23:59")
            offset_us = (hours * 60 + minutes) * 60_000_000 * (-1 if zone[0] == "-" else 1)
    except ValueError:  # a day, month, hour, ... out of range
        raise BadInput(f"{label}: no such date or time; expected {_INSTANT_FORMS}") from None
    us = (naive - _EPOCH) // timedelta(microseconds=1) - offset_us
    if not MIN_US <= us <= MAX_US:
        raise BadInput(f"{label}: out of range (years 0001 to 9999, in UTC)")
    return us


def _front_matter(data: bytes) -> list[bytes] | None:
    """The lines of the front matter block, fences included, each with its
    line end; None when ``data`` has none. Reads at most the first 4 KiB."""
    window = data[:MAX_FRONT_MATTER_BYTES]
    pieces = window.split(b"\n", MAX_FRONT_MATTER_LINES)
    if len(pieces) < 2 or pieces[0].removesuffix(b"\r") != _FENCE:
        return None
    for i in range(1, min(len(pieces), MAX_FRONT_MATTER_LINES)):
        if pieces[i].removesuffix(b"\r") != _FENCE:
            continue
        if i + 1 < len(pieces):  # a newline follows inside the window
            return [piece + b"\n" for piece in pieces[:i + 1]]
        if len(window) == len(data):  # the note ends on the fence
            return [piece + b"\n" for piece in pieces[:i]] + [pieces[i]]
        return None  # the fence line runs past 4 KiB
    return None


def _key_of(line: bytes) -> tuple[str, bytes] | None:
    """(key, raw value) when ``line`` sets one of our keys, else None."""
    for key in (VALID_UNTIL, SUPERSEDED_BY):
        name = key.encode()
        if line.startswith(name):
            rest = line[len(name):].lstrip(b" \t")
            if rest.startswith(b":"):
                return key, rest[1:]
    return None


def _names(line: bytes, key: str) -> bool:
    keyed = _key_of(line)
    return keyed is not None and keyed[0] == key


def _value(key: str, raw: bytes) -> str:
    """The text of a value: decoded, unquoted, stripped of a comment."""
    try:
        text = raw.decode("utf-8").removesuffix("\n").removesuffix("\r").strip(" \t")
    except UnicodeDecodeError:
        raise _bad(key, "the value is not UTF-8") from None
    if text[:1] in ("'", '"'):
        quote = text[0]
        close = text.find(quote, 1)
        if close < 0:
            raise _bad(key, "an opening quote has no closing quote")
        after = text[close + 1:].lstrip(" \t")
        if after and not after.startswith("#"):
            raise _bad(key, "text after the closing quote (a quote inside a value is not supported)")
        text = text[1:close]
        if quote == '"' and "\\" in text:
            raise _bad(key, "escapes in double quotes are not supported")
    else:
        for mark in (" #", "\t#"):
            cut = text.find(mark)
            if cut >= 0:
                text = text[:cut].rstrip(" \t")
        if text.startswith("#"):
            text = ""
    if not text:
        raise _bad(key, "the value is empty")
    return text


def read_validity(data: bytes) -> Validity:
    """What the note's front matter says, or an empty Validity without one.

    Bounded on any input: at most the first 4 KiB are looked at. Raises
    BadInput only, naming the key at fault.
    """
    lines = _front_matter(data)
    if lines is None:
        return Validity()
    found: dict[str, str] = {}
    for line in lines[1:-1]:
        keyed = _key_of(line)
        if keyed is None:
            continue
        key, raw = keyed
        if key in found:
            raise _bad(key, "given more than once")
        found[key] = _value(key, raw)
    until = found.get(VALID_UNTIL)
    successor = found.get(SUPERSEDED_BY)
    if successor is not None:
        try:
            split_virtual_path(successor)
        except BadInput as exc:
            raise _bad(SUPERSEDED_BY, f"{exc} (a path under the note's own root, e.g. notes/new.md)") from None
    return Validity(None if until is None else _instant_us(until, f"front matter {VALID_UNTIL}"), successor)


def format_until(until_us: int) -> str:
    """The front matter text for ``until_us``, read back to the same instant.

    An instant at midnight UTC is written as the date before it, the form
    ``--valid-until 2025-06-30`` reads in: a person sees the date they gave.
    """
    if not MIN_US <= until_us <= MAX_US:
        raise BadInput(f"{VALID_UNTIL}: out of range (years 0001 to 9999, in UTC)")
    if until_us % _US_PER_DAY == 0 and until_us > MIN_US:
        return (_EPOCH + timedelta(microseconds=until_us - _US_PER_DAY)).date().isoformat()
    moment = _EPOCH + timedelta(microseconds=until_us)
    text = moment.strftime("%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}"
    return f"{moment.date().isoformat()}T{text}Z"


def with_valid_until(data: bytes, until_us: int) -> bytes:
    """``data`` with its front matter's ``valid-until`` set to ``until_us``.

    Replaces the key's line, or adds one before the closing fence, or puts a
    new front matter block at the start of a note that has none (an oversized
    block is not front matter, so it stays as it is, below the new one).
    Every other byte is kept. A ``valid-until`` given twice is refused as on
    reading: which one to replace would be a guess.
    """
    value = VALID_UNTIL.encode() + b": " + format_until(until_us).encode()
    lines = _front_matter(data)
    if lines is None:
        return b"---\n" + value + b"\n---\n" + data
    block = sum(map(len, lines))
    at = [i for i in range(1, len(lines) - 1) if _names(lines[i], VALID_UNTIL)]
    if len(at) > 1:
        raise _bad(VALID_UNTIL, "given more than once")
    if at:
        lines[at[0]] = value + (b"\r\n" if lines[at[0]].endswith(b"\r\n") else b"\n")
    else:
        lines.insert(len(lines) - 1, value + (b"\r\n" if lines[0].endswith(b"\r\n") else b"\n"))
    result = b"".join(lines) + data[block:]
    if _front_matter(result) is None:  # the key's line pushed the block past its bounds
        raise _bad(VALID_UNTIL, f"no room: front matter is at most {MAX_FRONT_MATTER_LINES} lines"
                                f" and {MAX_FRONT_MATTER_BYTES} bytes")
    return result


def parse_until(text: str, now_us: int) -> int:
    """The instant ``scopefs write --valid-until TEXT`` means, in microseconds.

    A date or zoned datetime as in front matter, or a duration (``30d``,
    ``12h``) counted from ``now_us``. An instant already past is accepted:
    retiring a note at once is a legitimate use.
    """
    if not isinstance(text, str):
        raise BadInput("--valid-until: not text")
    if text[-1:] in ("s", "m", "h", "d") and text[:-1].isascii() and text[:-1].isdigit():
        return now_us + parse_duration_us(text)
    return _instant_us(text, "--valid-until")
