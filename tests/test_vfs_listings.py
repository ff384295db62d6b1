"""Which folders a view change makes the kernel list again (``Layers._listings_changed``).

The kernel keeps a folder's listing and attributes until the mount drops
them (no ``opendir`` reaches it). A folder whose names changed must be
dropped, or ``ls`` would miss a note or show one that went; a folder
whose names stayed must not be, since with ``default_permissions`` the
kernel asks for the attributes of every folder on each path it walks
again (three ``GETATTR`` per file of a ``cp -r`` two levels down, before
this was precise). Real mounts listing through a change are
``test_vfs_live.py``.
"""

from __future__ import annotations

from scopefs.vfs.inodes import Node
from scopefs.vfs.layers import Invalidation, Layers
from scopefs.vfs.tree import Tree
from tests.conftest import Scenario
from tests.inprocesskit import layers_of


def _folder(layers: Layers, path: str) -> Node:
    node = layers.lookup(tuple(path.split("/")) if path else ())
    assert node is not None
    return node


def _relisted(out: list[Invalidation], folders: dict[str, Node]) -> dict[str, str]:
    """Each known folder the change drops: "grew" (attributes only) or "lost" (its pages too)."""
    by_ino = {node.ino: path for path, node in folders.items()}
    return {by_ino[item.ino]: "grew" if item.listing_grew else "lost" for item in out if item.ino in by_ino}


def test_a_note_in_a_folder_that_was_there_drops_that_folder_only(scenario: Scenario) -> None:
    with layers_of(scenario) as (layers, refresh):
        folders = {path: _folder(layers, path) for path in ("", "private", "private/notes")}
        versions = {path: node.listing_version for path, node in folders.items()}
        scenario.cli.j("write", scenario.alice_session, "private/notes/new.md", stdin=b"x\n")
        assert _relisted(refresh(), folders) == {"private/notes": "grew"}
        assert {path: node.listing_version - versions[path] for path, node in folders.items()} == {
            "": 0, "private": 0, "private/notes": 1}


def test_a_note_in_new_folders_drops_the_folder_that_gained_the_first_of_them(scenario: Scenario) -> None:
    with layers_of(scenario) as (layers, refresh):
        folders = {path: _folder(layers, path) for path in ("", "private", "private/notes")}
        scenario.cli.j("write", scenario.alice_session, "private/deep/er/x.md", stdin=b"x\n")
        assert _relisted(refresh(), folders) == {"private": "grew"}
        folders.update({path: _folder(layers, path) for path in ("private/deep", "private/deep/er")})
        scenario.cli.j("write", scenario.alice_session, "private/deep/er/y.md", stdin=b"y\n")
        assert _relisted(refresh(), folders) == {"private/deep/er": "grew"}


def test_a_note_that_goes_drops_its_folder_and_the_one_above_each_folder_that_goes_with_it(
        scenario: Scenario) -> None:
    scenario.cli.j("write", scenario.alice_session, "private/deep/er/x.md", stdin=b"x\n")
    scenario.cli.j("write", scenario.alice_session, "private/deep/kept.md", stdin=b"k\n")
    with layers_of(scenario) as (layers, refresh):
        folders = {path: _folder(layers, path) for path in ("", "private", "private/deep", "private/deep/er")}
        scenario.cli.j("rm", scenario.alice_session, "private/deep/er/x.md")
        out = refresh()
        # er/ went with its only note: its entry is forgotten, and deep/, which held it, is listed again
        assert _relisted(out, folders) == {"private/deep/er": "lost", "private/deep": "lost"}
        assert not layers.tree.is_dir(("private", "deep", "er"))
        scenario.cli.j("rm", scenario.alice_session, "private/deep/kept.md")
        assert _relisted(refresh(), folders) == {"private/deep": "lost", "private": "lost"}


def test_a_note_that_goes_with_its_folder_loses_its_pages_before_any_name_on_its_path(
        scenario: Scenario) -> None:
    """The worker sends in order, and the first entry dropped on a path makes the path unknown at
    once: a reader holding the note open must find its pages gone by then, not served from cache."""
    scenario.cli.j("write", scenario.alice_session, "private/deep/er/x.md", stdin=b"x\n")
    with layers_of(scenario) as (layers, refresh):
        note = layers.lookup(("private", "deep", "er", "x.md"))
        assert note is not None
        folders = {_folder(layers, path).ino for path in ("private/deep", "private/deep/er")}
        scenario.cli.j("rm", scenario.alice_session, "private/deep/er/x.md")
        out = refresh()
        pages = [i for i, item in enumerate(out) if item.ino == note.ino]
        names = [i for i, item in enumerate(out) if item.name is not None and item.ino != note.ino
                 and (item.ino in folders or item.parent_ino in folders)]
        assert pages and names, out  # the note's pages go, and so does the folder that held only it
        assert max(pages) < min(names), out


def test_a_folder_that_becomes_a_note_of_its_name_keeps_the_name_listed() -> None:
    """In one view change ``a/b/c.md`` goes and a note ``a/b`` comes (or the other way round): the
    newcomer is counted in first, and the removal of what went must not take its name with it."""
    tree = Tree([("a",)])
    tree.add(("a", "b", "c.md"))
    assert tree.add(("a", "b")) == []  # a note where a folder still is: nothing new above it
    assert tree.remove(("a", "b", "c.md")) == [("a", "b")]
    assert tree.names(("a",)) == {"b": False} and not tree.is_dir(("a", "b"))

    tree = Tree([("a",)])
    tree.add(("a", "b"))
    assert tree.add(("a", "b", "c.md")) == [("a", "b")]
    assert tree.remove(("a", "b")) == []
    assert tree.names(("a",)) == {"b": True} and tree.names(("a", "b")) == {"c.md": False}
