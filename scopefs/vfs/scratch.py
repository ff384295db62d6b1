"""Which names are editor and tool scratch files, never notes.

Editors and tools save through names of their own: vim's swap files, its
``4913`` write probe and ``note.md~`` backups, Emacs's ``.#note.md`` locks
and ``#note.md#`` autosaves, ``sed -i``'s ``sedXXXXXX``, Python's
``tmpXXXXXXXX``, and the ``.note.md.tmpN`` of atomic-write libraries. Such
a file lives only in the mount that made it (DESIGN.md §4): it is never
committed, never shown to another session, and vanishes with the mount.
Only its content can become a note, by renaming it over a note's name.

A name that already names a note is a note, whatever it looks like.
"""

from __future__ import annotations

import re

_PATTERNS = re.compile(
    r"""\A(?:
        \..*                      # hidden: swap files, locks, atomic-write temps, rsync partials
      | .*~                       # backups (vim, emacs, nano)
      | \#.*\#                    # emacs autosave
      | [0-9]+                    # vim's write probe (4913, 5036, ...)
      | sed[A-Za-z0-9]{6}         # sed -i
      | tmp[a-z0-9_]{8}           # Python tempfile
      | .*\.(?:swp|swo|swx|tmp|part|crdownload)
    )\Z""",
    re.VERBOSE | re.DOTALL,
)


def is_scratch(name: str) -> bool:
    return len(name) <= 255 and _PATTERNS.match(name) is not None
