"""Lazy creation of stores under opaque, random directory names.

A store exists on disk only once something is written to it. Its directory
name is a fresh CSPRNG token created with an exclusive mkdir (a collision
retries with a new token), so no path ever carries a user, channel or role
id. The directory is made and fsynced before the catalog row, so a crash
leaves at worst an empty directory that doctor reports and removes.
"""

from __future__ import annotations

import contextlib
import os

from scopefs.catalog import ids
from scopefs.catalog.access import Access
from scopefs.catalog.artifacts import open_scopes_dir
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import StorageError, storage_error
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Mount
from scopefs.catalog.stores import StoreRow, find_store
from scopefs.writer.steps import Step, checkpoint

_AUTHORITY = {
    "user": "principal",
    "channel": "conversation",
    "role": "role",
    "agent-shared": "agent-admin",
    "agent": "service",
    "projection": "audience",
    "quarantine": "principal",
}
MKDIR_ATTEMPTS = 8


def ensure_store(access: Access, mount: Mount) -> StoreRow:
    """The store behind ``mount``, created on first use."""
    return ensure_store_for(access.home, access.agent_id, mount.scope_kind, mount.audience_id)


def ensure_store_for(home: Home, agent_id: str, scope_kind: str, audience_id: str) -> StoreRow:
    """The store of ``scope_kind`` for ``audience_id`` in ``agent_id``'s cell, created on first use.

    For the broker's own writes into a store no session writes by
    placement (a publisher's copy, a projection) and for grants that need
    the store's policy to exist before anything is in it.
    """
    catalog = home.catalog(agent_id)
    existing = find_store(catalog, agent_id, scope_kind, audience_id)
    if existing is not None:
        return existing
    if scope_kind not in _AUTHORITY:
        raise StorageError("this root has no store of its own")
    scopes_fd = open_scopes_dir(home, agent_id)
    try:
        for _ in range(MKDIR_ATTEMPTS):
            path_key = ids.random_token()
            try:
                os.mkdir(path_key, 0o700, dir_fd=scopes_fd)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise storage_error("cannot create the store directory", exc) from exc
        else:
            raise StorageError("could not allocate a store directory")
        try:
            os.fsync(scopes_fd)
        except OSError as exc:  # never retried: the directory goes, the write fails
            with contextlib.suppress(OSError):
                os.rmdir(path_key, dir_fd=scopes_fd)
            raise storage_error("cannot create the store directory", exc) from exc
        checkpoint(Step.STORE_DIR_MADE)
        store_id, root_id = ids.new_id("store"), ids.new_id("storage_root")
        with immediate(catalog):
            raced = find_store(catalog, agent_id, scope_kind, audience_id)
            if raced is None:
                now = now_us()
                catalog.execute(
                    "INSERT INTO storage_roots (storage_root_id, agent_id, backend_kind, path_key, authority_kind,"
                    " authority_owner, created_at) VALUES (?, ?, 'fs', ?, ?, ?, ?)",
                    (root_id, agent_id, path_key, _AUTHORITY[scope_kind], audience_id or None, now),
                )
                catalog.execute(
                    "INSERT INTO stores (store_id, agent_id, storage_root_id, scope_kind, audience_id, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (store_id, agent_id, root_id, scope_kind, audience_id, now),
                )
        if raced is not None:  # another writer created it first; ours is empty
            os.rmdir(path_key, dir_fd=scopes_fd)
            return raced
        checkpoint(Step.STORE_ROW)
        return StoreRow(store_id, scope_kind, audience_id, path_key)
    finally:
        os.close(scopes_fd)
