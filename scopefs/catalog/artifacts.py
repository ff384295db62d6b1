"""Verified access to revision artifacts in the broker-owned artifact area.

A store's directory is opened beneath the agent's ``memory-scopes/v1`` with
openat2 and held; artifacts are opened beneath it the same way and checked
(regular, one link, same device). Content leaves this module only after its
SHA-256 and size matched the catalog's active revision: a missing, swapped
or tampered artifact raises IntegrityError and no byte of it is returned.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re

from scopefs.catalog.errors import IntegrityError, StorageError
from scopefs.catalog.fsafe import (
    UnsafeEntry,
    open_dir,
    open_dir_beneath,
    open_regular,
    read_all,
)
from scopefs.catalog.home import Home
from scopefs.catalog.stores import RevisionRow, StoreRow

_PATH_KEY = re.compile(r"[a-z2-7]{26}")
_LOCATOR = re.compile(r"[a-z2-7]{26}")
HASH_CHUNK = 1 << 20


def check_path_key(path_key: str) -> str:
    if _PATH_KEY.fullmatch(path_key) is None:
        raise StorageError("catalog holds a malformed store path key; refusing to use it")
    return path_key


def check_locator(locator: str) -> str:
    if _LOCATOR.fullmatch(locator) is None:
        raise StorageError("catalog holds a malformed artifact locator; refusing to use it")
    return locator


def open_scopes_dir(home: Home, agent_id: str) -> int:
    """The agent's artifact area; IntegrityError if missing or swapped."""
    try:
        agent_fd = open_dir(home.agent_dir(agent_id))
    except OSError as exc:
        raise IntegrityError("the agent's directory is missing or unsafe") from exc
    try:
        return open_dir_beneath(agent_fd, "memory-scopes/v1")
    except OSError as exc:
        raise IntegrityError("the artifact area is missing or unsafe") from exc
    finally:
        os.close(agent_fd)


def open_store_dir(home: Home, agent_id: str, path_key: str) -> int:
    """The store's directory fd; StorageError if it is missing or unsafe."""
    scopes_fd = open_scopes_dir(home, agent_id)
    try:
        return open_dir_beneath(scopes_fd, check_path_key(path_key))
    except OSError as exc:
        raise IntegrityError("the store's directory is missing or unsafe") from exc
    finally:
        os.close(scopes_fd)


def hash_fd(fd: int) -> tuple[str, int]:
    """SHA-256 hex and size of everything readable from ``fd``'s start."""
    digest = hashlib.sha256()
    size = 0
    offset = 0
    while True:
        chunk = os.pread(fd, HASH_CHUNK, offset)
        if not chunk:
            return digest.hexdigest(), size
        digest.update(chunk)
        size += len(chunk)
        offset += len(chunk)


def open_artifact(store_fd: int, locator: str) -> int:
    """Open an artifact safely; IntegrityError if it is missing or unsafe."""
    return open_artifact_stat(store_fd, locator)[0]


def open_artifact_stat(store_fd: int, locator: str) -> tuple[int, os.stat_result]:
    """``open_artifact`` and the fstat it checked the file with."""
    try:
        return open_regular(store_fd, check_locator(locator))
    except UnsafeEntry as exc:
        raise IntegrityError("artifact is not a plain regular file") from exc
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise IntegrityError("artifact is missing") from exc
        if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
            raise IntegrityError("artifact is not a plain regular file") from exc
        raise StorageError(f"cannot open artifact: {os.strerror(exc.errno or 0)}") from exc


def read_verified_head(home: Home, agent_id: str, store: StoreRow, revision: RevisionRow, keep: int) -> bytes:
    """The first ``keep`` bytes of the revision, once the whole file's size and SHA-256 matched.

    For callers that need only a note's head (a search snippet, the index):
    the file is hashed in chunks, so memory stays bounded by ``keep`` however
    large the note, and nothing is returned unless every byte verified.
    """
    store_fd = open_store_dir(home, agent_id, store.path_key)
    try:
        fd = open_artifact(store_fd, revision.locator)
    finally:
        os.close(store_fd)
    digest = hashlib.sha256()
    head: list[bytes] = []
    kept = size = 0
    try:
        while size <= revision.size:  # one read past the catalog's size notices growth
            chunk = os.pread(fd, HASH_CHUNK, size)
            if not chunk:
                break
            digest.update(chunk)
            if kept < keep:
                head.append(chunk[:keep - kept])
                kept += len(head[-1])
            size += len(chunk)
    finally:
        os.close(fd)
    if size != revision.size or digest.hexdigest() != revision.content_sha256:
        raise IntegrityError("artifact does not match its catalog hash")
    return b"".join(head)


def read_verified(home: Home, agent_id: str, store: StoreRow, revision: RevisionRow) -> bytes:
    """The revision's bytes, only if size and SHA-256 match the catalog."""
    store_fd = open_store_dir(home, agent_id, store.path_key)
    try:
        fd = open_artifact(store_fd, revision.locator)
    finally:
        os.close(store_fd)
    try:
        data = read_all(fd, revision.size)
    finally:
        os.close(fd)
    if len(data) != revision.size or hashlib.sha256(data).hexdigest() != revision.content_sha256:
        raise IntegrityError("artifact does not match its catalog hash")
    return data
