"""The catalog and writer calls a mount makes, each run on the catalog thread.

Thin adapters: they take virtual paths built from the mount's own names and
call the same functions the command line uses, so a mount can do nothing
the writer would refuse to the command line.
"""

from __future__ import annotations

import errno

from scopefs.catalog.access import authorize_session
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.stores import find_resource, find_store
from scopefs.vfs.drafts import Draft
from scopefs.writer.rename import CrossRoot, rename_note
from scopefs.writer.tombstone import delete_note, existing_target
from scopefs.writer.transaction import WriteResult, check_write, write_note


def commit(home: Home, session_id: str, path: str, draft: Draft) -> WriteResult:
    with draft.reader() as source:
        return write_note(home, session_id, path, source)


def check_save(home: Home, session_id: str, path: str) -> None:
    """Raise (audited) if saving the note at ``path`` would be refused."""
    check_write(home, session_id, path)


def check_remove(home: Home, session_id: str, path: str) -> None:
    """Raise (audited) if the note at ``path`` may not be removed."""
    access = authorize_session(home, session_id, Op.DELETE)
    existing_target(access, split_virtual_path(path), Op.DELETE)


def remove(home: Home, session_id: str, path: str, resource_id: str) -> None:
    """Tombstone the note at ``path``, if it is still the resource removed."""
    access = authorize_session(home, session_id, Op.DELETE)
    found = access.view.mount_for(split_virtual_path(path))
    if found is None:
        return
    mount, inner = found
    store = find_store(home.catalog(access.agent_id), access.agent_id, mount.scope_kind, mount.audience_id)
    if store is None:
        return
    resource = find_resource(home.catalog(access.agent_id), access.agent_id, store.store_id, "/".join(inner))
    if resource is None or resource.resource_id != resource_id:
        return  # renamed or replaced meanwhile: not ours to remove
    delete_note(home, session_id, path)


def rename(home: Home, session_id: str, source: str, destination: str) -> None:
    try:
        rename_note(home, session_id, source, destination, replace=True)
    except CrossRoot:
        raise OSError(errno.EXDEV, "cross-root rename") from None
