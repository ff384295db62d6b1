"""SHA-256 of what a descriptor holds, read in chunks, optionally handed on as it is hashed.

The loops that read content to hash it, and nothing else: what a hash is
compared with, and what a mismatch means, is ``catalog.artifacts.verify``'s
business. Every read is a ``pread`` from the start of the file, so the
caller's file offset is never moved and a descriptor may be shared.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

HASH_CHUNK = 1 << 20
FAST_HASH_FROM = 64 << 10  # bytes: from here on, OpenSSL's SHA-256 is worth loading libcrypto for
READ_AHEAD = 2  # chunks waiting between two threads of a streamed hash: a few MiB in all

Sink = Callable[[int, bytes], None]  # (offset, chunk) of a file being hashed, not verified yet


def sha256_for(size_hint: int | None) -> Any:
    """A fresh SHA-256 for about ``size_hint`` bytes (``None``: unknown, maybe large).

    Why two: a mount server sets OpenSSL's hashes aside (``vfs.lean``), so
    that an idle mount does not hold libcrypto, and ``hashlib.sha256`` is
    then Python's own, about 3.6 times slower (300 MB/s here). For a note
    of a few KiB that costs microseconds; for a 256 MiB note it would cost
    most of a second. So content of ``FAST_HASH_FROM`` bytes or more, or of
    unknown size, is hashed by OpenSSL's, imported on first use. In every
    other process both are OpenSSL's. The digests are the same either way.
    """
    if size_hint is not None and size_hint < FAST_HASH_FROM:
        return hashlib.sha256()
    return _openssl_sha256()


def _openssl_sha256() -> Any:
    modules: dict[str, Any] = sys.modules  # an entry may be None: "not importable" (vfs.lean)
    if modules.get("_hashlib", 0) is None:
        modules.pop("_hashlib", None)  # set aside by vfs.lean: this content is worth loading it for
    try:
        import _hashlib
    except ImportError:  # a Python built without OpenSSL: its own is all there is
        return hashlib.sha256()
    return _hashlib.openssl_sha256()


def hash_fd(fd: int) -> tuple[str, int]:
    """SHA-256 hex and size of everything readable from ``fd``'s start."""
    sha, size, _ = hash_head(fd, limit=None, keep=0)
    return sha, size


def hash_head(fd: int, *, limit: int | None, keep: int) -> tuple[str, int, bytes]:
    """SHA-256 hex and size of what ``fd`` holds from its start, and its first ``keep`` bytes.

    With ``limit``, reading stops one byte past it: a file that grew is
    noticed (its size is wrong) without reading what was appended.
    A short read is the end of the file (these are regular files on a
    local disk), so a file that fits one read costs one ``pread``: the
    mount's cold opens of small notes are on this path. Were a read ever
    short for another reason, the size would come out wrong: a refusal,
    never an acceptance.
    Memory stays bounded by ``keep`` and one chunk, whatever the size.
    """
    digest = sha256_for(os.fstat(fd).st_size if limit is None else limit)
    head: list[bytes] = []
    kept = size = 0
    while limit is None or size <= limit:
        want = HASH_CHUNK if limit is None else min(HASH_CHUNK, limit + 1 - size)
        chunk = os.pread(fd, want, size)
        digest.update(chunk)
        if kept < keep:
            head.append(chunk[:keep - kept])
            kept += len(head[-1])
        size += len(chunk)
        if len(chunk) < want:
            break
    return digest.hexdigest(), size, b"".join(head)


def hash_streamed(fd: int, limit: int, sink: Sink) -> tuple[str, int]:
    """SHA-256 hex and size of what ``fd`` holds from its start, each chunk
    also handed to ``sink`` in order; reading stops one byte past ``limit``
    (the size is wrong by then) and ``sink`` never sees a byte past it.

    Three threads, each releasing the GIL for its part: a reader
    (``pread``), this one (the hash) and a storer (``sink``: the mount
    copies the chunk into the kernel's page cache). A store runs while the
    same chunk is hashed. On this 2-core VM, the cold open of a 256 MiB
    note took 0.34 s with one thread or with reader and hasher alone, 0.29 s
    with all three (medians of 12 interleaved rounds; bench/RESULTS.md,
    run E). At most ``READ_AHEAD`` chunks wait in each queue, so a stream
    holds a few MiB whatever the file's size. Both helpers are joined
    before this returns or raises: ``fd`` is the caller's to close, and no
    chunk reaches ``sink`` once this returned.
    """
    chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=READ_AHEAD)
    stores: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=READ_AHEAD)
    stop = threading.Event()
    failures: list[BaseException] = []
    reader = threading.Thread(target=_read_ahead, args=(fd, limit + 1, chunks, stop), daemon=True)
    storer = threading.Thread(target=_hand_on, args=(stores, sink, failures), daemon=True)
    reader.start()
    storer.start()
    try:
        sha, size = _hash_chunks(chunks, stores, limit)
    finally:
        stores.put(None)
        storer.join()
        stop.set()
        while reader.is_alive():  # it may wait to put a chunk nobody will take
            with contextlib.suppress(queue.Empty):
                chunks.get(timeout=0.01)
        reader.join()
    if failures:
        raise failures[0]
    return sha, size


def _hash_chunks(chunks: queue.Queue[bytes | BaseException], stores: queue.Queue[tuple[int, bytes] | None],
                 limit: int) -> tuple[str, int]:
    """Hash the reader's chunks until its empty one, queueing each for the storer first."""
    digest = sha256_for(limit)
    size = 0
    while True:
        chunk = chunks.get()
        if isinstance(chunk, BaseException):
            raise chunk
        if not chunk:
            return digest.hexdigest(), size
        if size < limit:
            stores.put((size, chunk if size + len(chunk) <= limit else chunk[:limit - size]))
        digest.update(chunk)
        size += len(chunk)


def _read_ahead(fd: int, limit: int, chunks: queue.Queue[bytes | BaseException], stop: threading.Event) -> None:
    """Read ``fd`` in order up to ``limit`` bytes into ``chunks``; an empty chunk ends it."""
    offset = 0
    try:
        while not stop.is_set():
            chunk = os.pread(fd, min(HASH_CHUNK, limit - offset), offset) if offset < limit else b""
            chunks.put(chunk)
            if not chunk:
                return
            offset += len(chunk)
    except BaseException as exc:  # noqa: BLE001 - handed to the hasher, which raises it
        chunks.put(exc)


def _hand_on(stores: queue.Queue[tuple[int, bytes] | None], sink: Sink, failures: list[BaseException]) -> None:
    """Give each queued chunk to ``sink`` until the ``None`` that ends the stream.

    After a failure of ``sink`` the rest is taken and dropped, so the
    hasher never waits on a full queue; the failure is raised by it.
    """
    while (item := stores.get()) is not None:
        if not failures:
            try:
                sink(*item)
            except BaseException as exc:  # noqa: BLE001 - raised by hash_streamed
                failures.append(exc)
