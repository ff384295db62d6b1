"""Virtual paths: the only names a session may use, validated before lookup.

A virtual path is ``<root>/<relative path>`` inside a session's view, for
example ``private/notes/x.md``. Validation is strict and total: a path that
is not clean is refused with BadInput before anything is looked up, so no
refusal ever depends on what exists.
"""

from __future__ import annotations

import unicodedata

from scopefs.catalog.errors import BadInput

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_DEPTH = 32

Parts = tuple[str, ...]  # a virtual path's components, root first: ("private", "notes", "x.md")

# Unicode categories no name may hold: controls (C0, DEL, C1), format
# characters (zero-width, bidi overrides), surrogates, private use and
# unassigned code points, and the line and paragraph separators U+2028 and
# U+2029 (Zl, Zp): line-based tools split on them, so a name holding one
# would read as two lines of ``ls`` or ``search`` output.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _reject(why: str) -> BadInput:
    return BadInput(f"invalid path: {why}")


def validate_component(name: str) -> str:
    """Check one path component; returns it unchanged when it is clean."""
    if not isinstance(name, str):
        raise _reject("not text")
    try:
        encoded = name.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise _reject("not valid UTF-8") from None
    if not name:
        raise _reject("empty component")
    if len(encoded) > MAX_COMPONENT_BYTES:
        raise _reject(f"a component is longer than {MAX_COMPONENT_BYTES} bytes")
    if name in (".", ".."):
        raise _reject("'.' and '..' are not allowed")
    if "/" in name or "\x00" in name:
        raise _reject("'/' or NUL inside a name")
    if any(unicodedata.category(ch) in _REFUSED_CATEGORIES for ch in name):
        raise _reject("control, format, line-separator or unassigned characters are not allowed")
    if unicodedata.normalize("NFC", name) != name:
        raise _reject("names must be in Unicode NFC form")
    return name


def split_virtual_path(path: str) -> tuple[str, ...]:
    """Components of a relative virtual path, refusing anything unclean.

    Refused: absolute paths, ``.`` and ``..``, empty components (``a//b``),
    NUL, control, format and line/paragraph separator characters, non-UTF-8
    (surrogate-escaped) text, names over 255 bytes, paths over 4096 bytes,
    non-NFC names.
    """
    if not isinstance(path, str):
        raise _reject("not text")
    if "\x00" in path:
        raise _reject("NUL byte")
    try:
        encoded = path.encode("utf-8", errors="strict")
    except UnicodeEncodeError:
        raise _reject("not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise _reject(f"longer than {MAX_PATH_BYTES} bytes")
    if not path:
        raise _reject("empty")
    if path.startswith("/"):
        raise _reject("absolute paths are not allowed; use a path inside the view, e.g. private/notes/x.md")
    return check_parts(tuple(path.split("/")))


def check_parts(parts: Parts) -> Parts:
    """``parts`` unchanged if they are a clean virtual path (the same rules as ``split_virtual_path``).

    For callers that hold components rather than a string (a mount knows
    each name apart): nothing is joined and split again, and a component
    holding ``/`` is refused rather than read as two.
    """
    if not isinstance(parts, tuple) or not parts:
        raise _reject("empty")
    if len(parts) > MAX_DEPTH:
        raise _reject(f"deeper than {MAX_DEPTH} levels")
    for part in parts:
        validate_component(part)
    if sum(len(p.encode("utf-8")) for p in parts) + len(parts) - 1 > MAX_PATH_BYTES:
        raise _reject(f"longer than {MAX_PATH_BYTES} bytes")
    return parts
