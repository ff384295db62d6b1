"""What the names under the hidden ``.search`` folder mean (see ``vfs.queries``).

Pure values, no inodes: the node table holds these, and the query folder
reads them, so both can import this without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopefs.catalog.paths import Parts

SEARCH = ".search"
_JSON = "json"
_ABOUT = "about"


@dataclass(frozen=True)
class Folder:
    """What the names in one folder of the query tree mean."""

    about: str | None = None  # queries here are narrowed to this verified subject
    as_json: bool = False  # queries here answer in JSON
    principals: bool = False  # names here are principal ids (``.search/about``)

    def child(self, name: str) -> Folder | None:
        """The folder ``name`` opens here, or None if ``name`` is a query."""
        if self.principals:
            return Folder(about=name)
        if not self.as_json and name == _JSON:
            return Folder(about=self.about, as_json=True)
        if self.about is None and not self.as_json and name == _ABOUT:
            return Folder(principals=True)
        return None


@dataclass(frozen=True)
class Results:
    """One query's rendered results and the resources they quote."""

    data: bytes
    quoted: frozenset[str]  # resource ids of the notes quoted that the view showed
    at_ns: int  # when they were computed: the file's times


def is_query_path(parts: Parts) -> bool:
    """Whether ``parts`` lies in the query tree (never a note's path: see ``vfs.queries``)."""
    return parts[:1] == (SEARCH,)
