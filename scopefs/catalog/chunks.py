"""Cutting a note into line-addressed chunks, and snippets back out of it.

A search result cites ``path#Lstart-Lend`` and shows a snippet, and both
must come from the verified revision, never from the index: the index keeps
only each chunk's line range, and ``snippet`` cuts the same lines out of the
bytes whose hash was just checked. Chunks follow lines so that a citation
names whole lines an editor can jump to.

Everything here is bounded, because notes are untrusted input: only the
first ``MAX_INDEXED_BYTES`` of a note are indexed, a chunk holds at most
``CHUNK_CHARS`` characters, and a line longer than that is cut.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_INDEXED_BYTES = 1 << 20  # 1 MiB: what of one note search can find; the rest is readable, not searchable
CHUNK_CHARS = 1200  # about a screenful; small enough that a snippet is the chunk
MAX_CHUNKS = MAX_INDEXED_BYTES // 64 + 1  # a note of empty lines cannot make unbounded rows
SNIPPET_CHARS = 700


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    start_line: int  # 1-based, inclusive
    end_line: int
    body: str


def note_text(data: bytes) -> str:
    """The indexable text of a note: its first MAX_INDEXED_BYTES, decoded leniently."""
    return data[:MAX_INDEXED_BYTES].decode("utf-8", errors="replace")


def cut(text: str) -> list[Chunk]:
    """Consecutive chunks of whole lines (a long line is cut to CHUNK_CHARS); blank-only chunks are skipped."""
    chunks: list[Chunk] = []
    lines: list[str] = []
    start = size = 0

    def close(end: int) -> None:
        while lines and not lines[-1].strip():  # a citation ends at the chunk's last line of text
            lines.pop()
            end -= 1
        body = "\n".join(lines).strip()
        if body and len(chunks) < MAX_CHUNKS:
            chunks.append(Chunk(len(chunks), start, end, body))

    for number, line in enumerate(text.split("\n"), start=1):
        line = line[:CHUNK_CHARS]
        if lines and size + len(line) > CHUNK_CHARS:
            close(number - 1)
            lines, size = [], 0
        if not lines:
            if not line.strip():
                continue  # a chunk starts at a line of text
            start = number
        lines.append(line)
        size += len(line) + 1
    if lines:
        close(start + len(lines) - 1)
    return chunks


def snippet(data: bytes, start_line: int, end_line: int) -> str:
    """Lines ``start_line``..``end_line`` of verified ``data``, cut to SNIPPET_CHARS."""
    lines = note_text(data).split("\n")[start_line - 1:end_line]
    text = "\n".join(line[:CHUNK_CHARS] for line in lines).strip()
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS - 1] + "…"
