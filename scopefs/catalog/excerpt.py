"""A bounded window of a note's lines: what a gateway's ``memory_get`` returns.

An agent reads memory through a tool whose answer lands in a model's
context, so one read is bounded (OpenClaw's memory-core: 120 lines and
12,000 characters) and says where the next one starts (``next_from``).
This is a pure function of bytes that were already verified: it never
reads a file and never decides who may see them.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopefs.catalog.errors import BadInput

MAX_LINES = 120
MAX_CHARS = 12_000


@dataclass(frozen=True)
class Excerpt:
    """Lines ``from_line`` to ``from_line + lines - 1`` (1-based), and where the rest starts, if any."""

    text: str
    from_line: int
    lines: int
    next_from: int | None  # None: the note ends here


def excerpt(data: bytes, from_line: int = 1, lines: int | None = None) -> Excerpt:
    """The window of ``data`` starting at line ``from_line``, at most ``lines`` lines (and the bounds).

    Whole lines only, except a single line longer than ``MAX_CHARS``,
    which is cut (the next read starts at the line after it). A window
    that starts past the end is empty with ``next_from`` None, so a
    client that pages until ``next_from`` is None always stops.
    """
    if not isinstance(from_line, int) or isinstance(from_line, bool) or from_line < 1:
        raise BadInput("from must be a line number, 1 or more")
    if lines is not None and (not isinstance(lines, int) or isinstance(lines, bool) or lines < 1):
        raise BadInput("lines must be 1 or more")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("the note is not UTF-8 text; read it whole instead") from None
    all_lines = text.splitlines(keepends=True)
    wanted = min(lines if lines is not None else MAX_LINES, MAX_LINES)
    start = from_line - 1
    taken: list[str] = []
    used = 0
    for line in all_lines[start:start + wanted]:
        if used + len(line) > MAX_CHARS:
            if not taken:  # one line longer than the whole budget: cut it, go on after it
                taken.append(line[:MAX_CHARS])
            break
        taken.append(line)
        used += len(line)
    end = start + len(taken)
    return Excerpt("".join(taken), from_line, len(taken), end + 1 if end < len(all_lines) else None)
