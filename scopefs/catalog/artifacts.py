"""Verified access to revision artifacts in the broker-owned artifact area.

A store's directory is opened beneath the agent's ``memory-scopes/v1`` with
openat2 and held; artifacts are opened beneath it the same way and checked
(regular, one link, same device). Content leaves this module only after its
SHA-256 and size matched the catalog's active revision (``verify``): a
missing, swapped or tampered artifact raises IntegrityError and no byte of
it is returned. ``MAX_NOTE_BYTES`` bounds every note, wherever it is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from scopefs.catalog.digests import HASH_CHUNK, Sink, hash_head, hash_streamed
from scopefs.catalog.errors import IntegrityError, StorageError, TooLarge
from scopefs.catalog.fsafe import UnsafeEntry, open_dir, open_dir_beneath, open_regular
from scopefs.catalog.home import Home
from scopefs.catalog.stores import RevisionRow, StoreRow

_PATH_KEY = re.compile(r"[a-z2-7]{26}")
_LOCATOR = re.compile(r"[a-z2-7]{26}")
MAX_NOTE_BYTES = 1 << 30  # 1 GiB: far above any note; bounds what a caller can make us stage or hold


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


def mismatch() -> IntegrityError:
    """The one error for content that is not what the catalog recorded.

    It names no size, hash or path: the caller knows which revision it asked
    for, and nothing about the file's actual content leaves this module.
    """
    return IntegrityError("artifact does not match its catalog hash")


def verify(fd: int, size: int, sha256: str, *, keep: int = 0, sink: Sink | None = None) -> bytes:
    """Check that ``fd`` holds exactly ``size`` bytes hashing to ``sha256``; its first ``keep`` bytes.

    Every verified read of content goes through here: the command line's
    reader, search snippets and the index, the mount, and doctor. Reading
    stops one byte past ``size``, so growth is noticed without reading what
    was appended; memory stays bounded by twice ``keep`` (the pieces and
    their join) plus one chunk. With
    ``sink``, each chunk is also handed on as it is hashed (never a byte past
    ``size``), on a thread of its own: those chunks are *not* verified until
    this returns, and the caller must keep them from every reader until then.
    Raises ``mismatch()`` and returns nothing unless every byte matched.
    """
    if sink is not None:
        if keep:
            raise ValueError("verify keeps no bytes while it streams them")
        actual_sha, actual_size = hash_streamed(fd, size, sink)
        head = b""
    else:
        actual_sha, actual_size, head = hash_head(fd, limit=size, keep=keep)
    if actual_size != size or actual_sha != sha256:
        raise mismatch()
    return head


def check_size(size: int) -> None:
    """Refuse content over ``MAX_NOTE_BYTES`` (``TooLarge``; EFBIG through a mount)."""
    if size > MAX_NOTE_BYTES:
        raise TooLarge(f"note is larger than {MAX_NOTE_BYTES} bytes")


def read_verified(home: Home, agent_id: str, store: StoreRow, revision: RevisionRow,
                  keep: int | None = None) -> bytes:
    """The revision's bytes (its first ``keep`` bytes, if given), once the whole file verified.

    A caller that needs only a note's head (a search snippet, the index)
    passes ``keep``: the file is still hashed whole, in chunks, but memory
    stays bounded by ``keep`` however large the note.
    """
    store_fd = open_store_dir(home, agent_id, store.path_key)
    try:
        fd = open_artifact(store_fd, revision.locator)
    finally:
        os.close(store_fd)
    try:
        return verify(fd, revision.size, revision.content_sha256, keep=revision.size if keep is None else keep)
    finally:
        os.close(fd)


Stamp = tuple[int, int, int, int, int]  # device, inode, size, mtime and ctime (ns) of an open artifact


def _stamp(st: os.stat_result) -> Stamp:
    """What any write, truncate, chmod or replacement of the file changes (ctime cannot be set back)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass(frozen=True)
class VerifiedArtifact:
    """An open artifact whose whole content matched the catalog, and its stamp when it did."""

    fd: int
    size: int
    stamp: Stamp


@contextlib.contextmanager
def opened_verified(home: Home, agent_id: str, store: StoreRow, revision: RevisionRow) -> Iterator[VerifiedArtifact]:
    """The revision's artifact, open and hashed whole before the caller sees a byte of it.

    For content too large to hold (``read_verified`` holds it all): the hash
    reads the file in bounded chunks and keeps nothing, and
    ``copy_verified`` then serves the bytes from this same descriptor, as a
    mount does after its open. A file that changed while it was hashed is
    refused here. The descriptor is closed when the block ends.
    """
    store_fd = open_store_dir(home, agent_id, store.path_key)
    try:
        fd, st = open_artifact_stat(store_fd, revision.locator)
    finally:
        os.close(store_fd)
    try:
        stamp = _stamp(st)
        if st.st_size != revision.size:
            raise mismatch()  # known without reading a byte
        verify(fd, revision.size, revision.content_sha256)
        if _stamp(os.fstat(fd)) != stamp:
            raise mismatch()  # changed while it was hashed
        yield VerifiedArtifact(fd, revision.size, stamp)
    finally:
        os.close(fd)


class StopCopy(Exception):
    """Raised by a ``copy_verified`` writer that has all it wants: the copy ends, quietly."""


def copy_verified(artifact: VerifiedArtifact, write: Callable[[bytes], object]) -> None:
    """Hand a verified artifact's bytes to ``write`` in chunks of ``HASH_CHUNK``.

    Each chunk is read again from the verified descriptor, and the file's
    stamp is compared after the read (a rewrite during it is caught too)
    and before the chunk is handed on, so no byte written into the file
    after it verified is ever passed on: a change raises ``mismatch()``
    and what ``write`` received by then is a verified prefix. Memory stays
    at one chunk whatever the size. A writer that has all it wants raises
    ``StopCopy``, which ends the copy without an error.
    """
    offset = 0
    while offset < artifact.size:
        chunk = os.pread(artifact.fd, min(HASH_CHUNK, artifact.size - offset), offset)
        if not chunk or _stamp(os.fstat(artifact.fd)) != artifact.stamp:
            raise mismatch()  # shrank or changed after it verified
        try:
            write(chunk)
        except StopCopy:
            return
        offset += len(chunk)
