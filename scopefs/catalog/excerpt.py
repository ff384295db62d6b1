"""A bounded window of a note's lines: what a gateway's ``memory_get`` returns.

An agent reads memory through a tool whose answer lands in a model's
context, so one read is bounded (OpenClaw's memory-core: 120 lines and
12,000 characters) and says where the next one starts (``next_from``).
Lines are counted as the search index counts them (``catalog.chunks``:
only ``\\n`` ends a line), so a citation's line numbers name the lines a
read returns. ``Window`` takes the verified bytes chunk by chunk and keeps
only the window, so a window of a large note costs a scan, not the note
in memory; it never reads a file and never decides who may see them.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopefs.catalog.errors import BadInput

MAX_LINES = 120
MAX_CHARS = 12_000
_MAX_WINDOW_BYTES = 4 * MAX_CHARS  # what the window's characters can take in UTF-8


@dataclass(frozen=True)
class Excerpt:
    """Lines ``from_line`` to ``from_line + lines - 1`` (1-based), and where the rest starts, if any."""

    text: str
    from_line: int
    lines: int
    next_from: int | None  # None: the note ends here


class Window:
    """Collects one window of lines from bytes fed in order; ``feed`` says when it has enough."""

    def __init__(self, from_line: int = 1, lines: int | None = None) -> None:
        if not isinstance(from_line, int) or isinstance(from_line, bool) or from_line < 1:
            raise BadInput("from must be a line number, 1 or more")
        if lines is not None and (not isinstance(lines, int) or isinstance(lines, bool) or lines < 1):
            raise BadInput("lines must be 1 or more")
        self.from_line = from_line
        self._wanted = min(lines if lines is not None else MAX_LINES, MAX_LINES)
        self._line = 1  # the line the next byte belongs to
        self._taken: list[bytes] = []  # whole lines of the window, each with its newline
        self._partial = bytearray()  # the window's line being read
        self._size = 0
        self._more = False  # a byte exists after the window's last line

    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes; True once the window is complete (the rest need not be read)."""
        at = 0
        while at < len(chunk):
            if self._line < self.from_line:  # before the window: count lines only
                newline = chunk.find(b"\n", at)
                if newline < 0:
                    return False
                self._line += 1
                at = newline + 1
                continue
            if len(self._taken) >= self._wanted or self._size > _MAX_WINDOW_BYTES:
                self._more = True
                return True
            newline = chunk.find(b"\n", at)
            end = len(chunk) if newline < 0 else newline + 1
            room = _MAX_WINDOW_BYTES + 1 - self._size - len(self._partial)
            self._partial += chunk[at:min(end, at + max(room, 0))]
            at = end
            if newline >= 0:
                self._taken.append(bytes(self._partial))
                self._size += len(self._partial)
                self._partial.clear()
                self._line += 1
        return False

    def result(self) -> Excerpt:
        """The window, cut to ``MAX_CHARS`` on a line boundary (a single longer line is cut in it)."""
        decoded = [_decode(line, cut=False) for line in self._taken]
        if self._partial:  # the last line: without its newline, or cut at the window's byte bound
            decoded.append(_decode(bytes(self._partial), cut=len(self._partial) > _MAX_WINDOW_BYTES))
        taken: list[str] = []
        used = 0
        for line in decoded[:self._wanted]:
            if used + len(line) > MAX_CHARS:
                if not taken:  # one line longer than the whole budget: cut it, go on after it
                    taken.append(line[:MAX_CHARS])
                break
            taken.append(line)
            used += len(line)
        more = self._more or len(decoded) > len(taken)
        if len(taken) == len(decoded) and self._partial:  # the last line had no newline: the note ends
            more = self._more
        return Excerpt("".join(taken), self.from_line, len(taken),
                       self.from_line + len(taken) if more and taken else None)


def _decode(line: bytes, *, cut: bool) -> str:
    """UTF-8 text of ``line``; a line ``cut`` at a byte bound may end inside a character, which goes."""
    for trim in range(4 if cut else 1):
        try:
            return line[:len(line) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise BadInput("the note is not UTF-8 text; read it whole instead")


def excerpt(data: bytes, from_line: int = 1, lines: int | None = None) -> Excerpt:
    """The window of ``data`` starting at line ``from_line``, at most ``lines`` lines (and the bounds).

    A window that starts past the end is empty with ``next_from`` None, so
    a client that pages until ``next_from`` is None always stops.
    """
    window = Window(from_line, lines)
    window.feed(data)
    return window.result()
