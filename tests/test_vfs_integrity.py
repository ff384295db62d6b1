"""A mounted view serves only verified bytes (DESIGN.md §5, invariant 4).

Every open for reading serves bytes only from the active revision whose
SHA-256 matched the catalog at open time. A tampered or missing artifact
gives ``EIO`` on open or read, writes an audit row with decision
``error``, and is never served from any cache: not from the server's
memory of what it verified, not from the kernel's page cache of the file
(the server invalidates the inode when it detects the failure), not to a
process that held the file open since before the tamper.

What the product guarantees, from ``vfs/content.py`` and ``vfs/fs.py``:

* an open re-resolves the artifact and re-hashes it unless it is provably
  the file already verified (same device, inode, size, mtime, ctime); a
  new inode with the right content is re-hashed and accepted;
* every ``read`` request that reaches the server re-checks the artifact's
  stamp, so a held descriptor gets ``EIO`` as soon as its read is not
  answered from pages the kernel cached before the tamper;
* once a revision failed, the mount refuses it from then on and drops the
  kernel's pages of that inode, so a held descriptor fails too;
* no open reaches the server (``vfs.fs``): the first READ of an inode
  verifies the whole revision, a large one on a thread, before any byte of
  it is answered, and READs that arrive meanwhile wait for that one
  verification; nothing is stored into the kernel's cache ahead of it.

The tests tamper with the artifact on disk while the view is mounted,
after the note was read through the mount at least once, or before it was
ever read. The orderings of the verification (concurrent READs share it,
an older revision's pages are dropped) are checked on a ``ScopeFS`` run in
the test's own process, whose kernel notifications are recorded instead of
sent.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import apsw
import pyfuse3
import pytest
import trio
import trio.testing

from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.invariants import inconsistencies
from tests.conftest import ALICE_FACT, Scenario, artifact_path
from tests.mountkit import Mounts, catalog, errno_of, mounts, wait_until  # noqa: F401

NOTE = "notes/allergy.md"
VIRTUAL = f"private/{NOTE}"
BIG = "notes/big.md"
BIG_SIZE = 3 * (1 << 20)  # above vfs.reads.INLINE_BYTES: hashed on a thread
RACY_S = 2.5  # older than vfs.content.RACY_NS: the server may remember its verification


# -- helpers -------------------------------------------------------------------

def _active_revision(home: Path, audience_id: str, path: str) -> str:
    with catalog(home) as conn:
        rows = conn.execute(
            "SELECT v.revision_id FROM resources r JOIN stores s ON s.store_id = r.store_id"
            " JOIN revisions v ON v.resource_id = r.resource_id AND v.state = 'active'"
            " WHERE s.audience_id = ? AND r.path = ? AND r.state = 'live'", (audience_id, path)).fetchall()
    assert len(rows) == 1, rows
    return str(rows[0][0])


def _error_rows(home: Path, session_id: str) -> list[dict[str, Any]]:
    conn = apsw.Connection(str(home / "state.sqlite"))
    try:
        cols = ("audit_id", "event_id", "at", "agent_id", "session_id", "operation", "subject_kind", "actor_id",
                "store_id", "revision_id", "decision", "reason")
        rows = conn.execute(f"SELECT {', '.join(cols)} FROM audit WHERE session_id = ? AND decision = 'error'"
                            " ORDER BY audit_id", (session_id,)).fetchall()
    finally:
        conn.close()
    return [dict(zip(cols, row, strict=True)) for row in rows]


def _assert_error_audited(home: Path, session_id: str, revision_id: str, *, secrets: tuple[bytes, ...]) -> None:
    rows = [r for r in _error_rows(home, session_id) if r["revision_id"] == revision_id]
    assert rows, f"no audit row with decision 'error' for revision {revision_id}: {_error_rows(home, session_id)}"
    for row in rows:
        assert row["operation"] == "read"
        assert row["agent_id"] == "main"
        text = repr(row).encode()
        for secret in secrets:
            assert secret not in text  # ids and reason codes, never content


def _overwrite_in_place(path: Path, data: bytes, *, keep_times: bool = False) -> None:
    """Write ``data`` into the artifact's existing inode (tamper in place)."""
    before = os.stat(path)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep_times:  # an attacker resets mtime; ctime cannot be set back
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _replace_by_new_inode(path: Path, data: bytes, *, keep_times: bool = True) -> None:
    """Swap the artifact for a different file (new inode) holding ``data``."""
    before = os.stat(path)
    tmp = path.with_name(path.name + ".swap")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep_times:
        os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.rename(tmp, path)
    assert os.stat(path).st_ino != before.st_ino


def _expect_eio_on_open_or_read(path: Path) -> None:
    """A fresh open for reading (and a read if the open succeeded) fails with EIO."""
    with pytest.raises(OSError) as caught, open(path, "rb") as f:
        data = f.read()
        raise AssertionError(f"read through the mount returned {len(data)} bytes after a tamper: {data[:80]!r}")
    assert caught.value.errno == errno.EIO, caught.value


def _cat_fails(path: Path, *secrets: bytes) -> None:
    proc = subprocess.run(["cat", str(path)], check=False, capture_output=True, timeout=20)
    assert proc.returncode != 0, proc.stdout[:80]
    assert b"Input/output error" in proc.stderr, proc.stderr
    for secret in secrets:
        assert secret not in proc.stdout


def _refused_within(path: Path, verified: bytes, timeout: float = 3.0) -> None:
    """Reads of ``path`` fail with EIO within ``timeout`` (``vfs.reads.RECHECK_S``: the kernel
    serves pages it holds without asking); meanwhile they return only the ``verified`` bytes."""
    def refused() -> bool:
        try:
            data = path.read_bytes()
        except OSError as exc:
            assert exc.errno == errno.EIO, exc
            return True
        assert data == verified, "bytes other than the verified revision were served"
        return False

    wait_until(refused, timeout=timeout)


def _assert_refused(scenario: Scenario, note: Path, tampered: bytes, revision: str | None = None) -> None:
    """A tampered note: EIO on open or read, one audited error naming its revision (and no
    content), and ``cat`` shows neither the original nor the tampered bytes."""
    home = scenario.cli.home
    _refused_within(note, ALICE_FACT)
    _expect_eio_on_open_or_read(note)
    revision = revision or _active_revision(home, scenario.alice, NOTE)
    _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"hazelnut", b"pistachio"))
    _cat_fails(note, ALICE_FACT, tampered)


def _pread_errno(fd: int, size: int, offset: int) -> int | bytes:
    """The errno of a failing pread, or the bytes it returned."""
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno or -1


def _held_read_fails(fd: int, offset: int, *never: bytes, size: int = 4096) -> None:
    """The held descriptor's reads fail with EIO (the server dropped the pages).

    Until the server's invalidation lands, the kernel may still answer from
    pages it cached before the tamper: those are the verified bytes. The
    tampered bytes must never come back, and once a read failed, every
    later read fails too.
    """
    seen: list[bytes] = []

    def probe() -> bool:
        got = _pread_errno(fd, size, offset)
        if isinstance(got, bytes):
            seen.append(got)
            return False
        assert got == errno.EIO, os.strerror(got)
        return True

    wait_until(probe, timeout=5.0)
    for data in seen:
        for bad in never:
            assert bad not in data, "a held descriptor was served tampered bytes"
    for off in (0, offset, max(0, offset - 7)):
        assert _pread_errno(fd, size, off) == errno.EIO


def _cli_read_refused(scenario: Scenario, session_id: str, path: str, *secrets: bytes) -> None:
    result = scenario.cli("read", session_id, path, timeout=30)
    assert result.code == 4, (result.code, result.err)
    assert result.out == b""
    for secret in secrets:
        assert secret not in result.out


def _big_content() -> bytes:
    line = b"line of a long note, filler text that is not secret at all ....\n"  # 64 bytes
    data = bytearray(line * (BIG_SIZE // len(line)))
    marker = b"BIG-CANARY-7Q2"
    data[2 * (1 << 20): 2 * (1 << 20) + len(marker)] = marker
    assert len(data) == BIG_SIZE
    return bytes(data)


def _tampered(original: bytes) -> bytes:
    tampered = original.replace(b"hazelnuts", b"pistachio")
    assert len(tampered) == len(original) and tampered != original
    return tampered


# -- tampering in place, after the page cache holds the note ---------------------

@pytest.mark.parametrize("kind", ["same-size", "longer", "shorter"])
def test_tamper_in_place_after_a_cached_read_gives_eio(scenario: Scenario, mounts: Mounts, kind: str) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    artifact = artifact_path(home, scenario.alice, NOTE)
    revision = _active_revision(home, scenario.alice, NOTE)

    # Read it through the mount: the kernel caches its pages and attributes.
    assert note.read_bytes() == ALICE_FACT
    assert subprocess.run(["cat", str(note)], capture_output=True, check=True).stdout == ALICE_FACT
    held = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(held, 4096, 0) == ALICE_FACT
        assert _error_rows(home, scenario.alice_session) == []

        tampered = {"same-size": _tampered(ALICE_FACT),
                    "longer": ALICE_FACT + b"an appended line the catalog never saw\n",
                    "shorter": ALICE_FACT[:20]}[kind]
        _overwrite_in_place(artifact, tampered)

        _assert_refused(scenario, note, tampered, revision)
        # The process that held the note open since before the tamper: its
        # next reads fail, at the offset it read and at another one.
        _held_read_fails(held, 7, tampered, ALICE_FACT)
        for _ in range(3):  # and it stays refused: nothing is served from any cache
            _expect_eio_on_open_or_read(note)
            assert _pread_errno(held, 4096, 0) == errno.EIO
        # With the kernel's clean pages dropped as well, still nothing.
        os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
        assert _pread_errno(held, 4096, 0) == errno.EIO
    finally:
        os.close(held)
    _expect_eio_on_open_or_read(note)
    _cli_read_refused(scenario, scenario.alice_session, VIRTUAL, ALICE_FACT, tampered)


def test_held_descriptor_read_rechecks_the_artifact(scenario: Scenario, mounts: Mounts) -> None:
    """A read that reaches the server re-checks the artifact: no re-open needed.

    The kernel's clean pages of the file are dropped with
    ``posix_fadvise(DONTNEED)`` (the per-file form of ``drop_caches``), so
    the held descriptor's next read, at an offset it never read, is a
    request to the server, which must notice the artifact changed.
    """
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    artifact = artifact_path(home, scenario.alice, NOTE)
    revision = _active_revision(home, scenario.alice, NOTE)
    held = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(held, 8, 0) == ALICE_FACT[:8]
        tampered = _tampered(ALICE_FACT)
        _overwrite_in_place(artifact, tampered, keep_times=True)
        os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
        got = _pread_errno(held, 4096, 13)
        assert got == errno.EIO, f"held descriptor read after a tamper returned {got!r}"
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"hazelnut", b"pistachio"))
        assert _pread_errno(held, 4096, 0) == errno.EIO
        _expect_eio_on_open_or_read(note)
    finally:
        os.close(held)


def test_remembered_verification_does_not_hide_a_tamper(scenario: Scenario, mounts: Mounts) -> None:
    """An artifact verified long after its last change is remembered by its
    stamp; a tamper that restores size and mtime still changes ctime and is
    re-hashed and refused."""
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    artifact = artifact_path(home, scenario.alice, NOTE)
    wait_until(lambda: time.time_ns() - os.stat(artifact).st_ctime_ns > RACY_S * 1e9, timeout=10)
    for _ in range(3):  # verified, remembered, then served on the stamp alone
        assert note.read_bytes() == ALICE_FACT
    tampered = _tampered(ALICE_FACT)
    _overwrite_in_place(artifact, tampered, keep_times=True)
    _assert_refused(scenario, note, tampered)


# -- a missing or replaced artifact ---------------------------------------------

def test_missing_artifact_gives_eio(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    artifact = artifact_path(home, scenario.alice, NOTE)
    revision = _active_revision(home, scenario.alice, NOTE)
    assert note.read_bytes() == ALICE_FACT
    held = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(held, 4096, 0) == ALICE_FACT
        artifact.unlink()
        # The server's descriptor on the unlinked inode still reads the old
        # bytes; they must not be served to the held descriptor either.
        os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
        got = _pread_errno(held, 4096, 3)
        assert got == errno.EIO, f"held descriptor read after the artifact was removed returned {got!r}"
        _expect_eio_on_open_or_read(note)
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"hazelnut",))
        assert _pread_errno(held, 4096, 0) == errno.EIO
    finally:
        os.close(held)
    _cat_fails(note, ALICE_FACT)
    _cli_read_refused(scenario, scenario.alice_session, VIRTUAL, ALICE_FACT)


def test_missing_artifact_never_read_before_gives_eio(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    artifact_path(home, scenario.alice, NOTE).unlink()
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    _expect_eio_on_open_or_read(note)
    _assert_error_audited(home, scenario.alice_session, _active_revision(home, scenario.alice, NOTE),
                          secrets=(b"hazelnut",))


def test_replaced_artifact_is_rehashed(scenario: Scenario, mounts: Mounts) -> None:
    """A different file (new inode) at the artifact's name is hashed again:
    accepted if its content matches the catalog, refused if not, even when
    it copies the original's size and mtime."""
    home = scenario.cli.home
    view = mounts.mount(scenario.alice_session)
    note = view / VIRTUAL
    artifact = artifact_path(home, scenario.alice, NOTE)
    wait_until(lambda: time.time_ns() - os.stat(artifact).st_ctime_ns > RACY_S * 1e9, timeout=10)
    for _ in range(2):
        assert note.read_bytes() == ALICE_FACT  # verified and remembered by its stamp

    _replace_by_new_inode(artifact, ALICE_FACT)
    for _ in range(2):
        assert note.read_bytes() == ALICE_FACT  # same content, new inode: re-hashed, served
    assert _error_rows(home, scenario.alice_session) == []

    tampered = _tampered(ALICE_FACT)
    _replace_by_new_inode(artifact, tampered)
    _assert_refused(scenario, note, tampered)


# -- a large note, hashed on a thread --------------------------------------------

def test_large_note_tampered_gives_eio(scenario: Scenario, mounts: Mounts) -> None:
    home = scenario.cli.home
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    artifact = artifact_path(home, scenario.alice, BIG)
    revision = _active_revision(home, scenario.alice, BIG)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / BIG
    assert os.stat(note).st_size == BIG_SIZE
    assert hashlib.sha256(note.read_bytes()).digest() == hashlib.sha256(content).digest()

    held = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(held, 4096, 0) == content[:4096]
        middle = 2 * (1 << 20)
        tampered = bytearray(content)
        tampered[middle: middle + 14] = b"TAMPERED-BYTES"
        fd = os.open(artifact, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(tampered[middle: middle + 14]), middle)
            os.fsync(fd)
        finally:
            os.close(fd)

        _refused_within(note, content)
        _expect_eio_on_open_or_read(note)
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"BIG-CANARY", b"TAMPERED"))
        _held_read_fails(held, middle, b"TAMPERED-BYTES", size=1 << 16)
        assert _pread_errno(held, 1 << 16, BIG_SIZE - (1 << 16)) == errno.EIO
    finally:
        os.close(held)
    proc = subprocess.run(["cat", str(note)], check=False, capture_output=True, timeout=30)
    assert proc.returncode != 0 and proc.stdout == b""

    # A second mount of the same session knows nothing of the first one's
    # verdict: it hashes the artifact itself (on a thread) and refuses it.
    other = mounts.mount(scenario.alice_session)
    _expect_eio_on_open_or_read(other / "private" / BIG)
    assert (other / VIRTUAL).read_bytes() == ALICE_FACT  # only the bad revision is refused


def test_large_note_held_descriptor_uncached_range_is_rechecked(scenario: Scenario, mounts: Mounts) -> None:
    """A held descriptor reading a range the kernel never cached goes to the
    server, which re-checks the artifact's stamp before every read."""
    home = scenario.cli.home
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    artifact = artifact_path(home, scenario.alice, BIG)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / BIG
    held = os.open(note, os.O_RDONLY)
    try:
        assert os.pread(held, 4096, 0) == content[:4096]
        middle = 2 * (1 << 20)
        fd = os.open(artifact, os.O_WRONLY)
        try:
            os.pwrite(fd, b"TAMPERED-BYTES", middle)
        finally:
            os.close(fd)
        os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
        got = _pread_errno(held, 1 << 16, middle - 100)
        assert got == errno.EIO, f"held descriptor returned {type(got).__name__} after a tamper"
        _assert_error_audited(home, scenario.alice_session, _active_revision(home, scenario.alice, BIG),
                              secrets=(b"BIG-CANARY", b"TAMPERED"))
    finally:
        os.close(held)
    _expect_eio_on_open_or_read(note)



# -- a large note, verified whole before its first byte is served ---------------

SHARED_SIZE = 32 << 20  # long enough to hash that a reader of the same inode runs meanwhile
MARK = b"UNVERIFIED-PAGE!"


def _resident_pages(fd: int, size: int) -> int:
    """How many pages of the file behind ``fd`` the kernel's page cache holds (``mincore``).

    Mapping the file reads nothing; ``mincore`` reports the page cache of the
    FUSE inode (the tests run as root, so it reports more than mapped pages).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr is not None and addr != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
    try:
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        return sum(b & 1 for b in vec.raw)
    finally:
        libc.munmap(addr, size)


def _filler(size: int, line: bytes) -> bytes:
    data = (line * (size // len(line) + 1))[:size]
    assert len(data) == size
    return data


def _marked(size: int) -> bytes:
    """Bytes with ``MARK`` on every page: any page of them read anywhere is recognised."""
    page = MARK + b"." * (mmap.PAGESIZE - len(MARK) - 1) + b"\n"
    return _filler(size, page)


def _tamper_same_size(artifact: Path, data: bytes) -> None:
    assert os.stat(artifact).st_size == len(data)
    _overwrite_in_place(artifact, data, keep_times=True)


def test_large_note_cold_read_is_verified_then_kept(scenario: Scenario, mounts: Mounts) -> None:
    """A large note's first read, on a fresh mount and cold on disk, returns
    it exactly; the kernel then holds every page of it, and later opens
    read the same bytes."""
    home = scenario.cli.home
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    os.posix_fadvise(fd := os.open(artifact_path(home, scenario.alice, BIG), os.O_RDONLY), 0, 0,
                     os.POSIX_FADV_DONTNEED)  # cold on disk as well, as far as this file goes
    os.close(fd)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / BIG
    fd = os.open(note, os.O_RDONLY)
    try:
        assert _resident_pages(fd, BIG_SIZE) == 0  # nothing is stored ahead of a read
        assert os.pread(fd, BIG_SIZE + 1, 0) == content
        assert _resident_pages(fd, BIG_SIZE) == BIG_SIZE // mmap.PAGESIZE
    finally:
        os.close(fd)
    proc = subprocess.run(["cat", str(note)], capture_output=True, check=True, timeout=30)
    assert proc.stdout == content  # a second read, through a fresh descriptor
    assert note.read_bytes() == content
    assert _error_rows(home, scenario.alice_session) == []


def test_no_reader_sees_a_byte_of_a_tampered_large_note(scenario: Scenario, mounts: Mounts) -> None:
    """Two descriptors read a large tampered note at once, from its first
    byte, while it is verified for the first time: neither ever gets a byte
    of it (no page of it is cached before the verdict), both get EIO."""
    home = scenario.cli.home
    content = _filler(SHARED_SIZE, b"the revision the catalog knows, line after line ...\n")
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    _tamper_same_size(artifact_path(home, scenario.alice, BIG), _marked(SHARED_SIZE))
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / BIG
    results: list[int | bytes] = []
    start = threading.Barrier(2)

    def read_all() -> None:
        fd = os.open(note, os.O_RDONLY)
        try:
            start.wait(timeout=10)
            for offset in range(0, SHARED_SIZE, 1 << 16):
                got = _pread_errno(fd, 1 << 16, offset)
                results.append(got)
                if isinstance(got, int):
                    return
        finally:
            os.close(fd)

    threads = [threading.Thread(target=read_all) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [r for r in results if isinstance(r, bytes)] == [], "a reader was served bytes of a tampered note"
    assert results == [errno.EIO, errno.EIO]
    fd = os.open(note, os.O_RDONLY)
    try:
        assert _resident_pages(fd, SHARED_SIZE) == 0  # and the kernel holds none of them
    finally:
        os.close(fd)
    _assert_error_audited(home, scenario.alice_session, _active_revision(home, scenario.alice, BIG),
                          secrets=(MARK,))


def test_large_note_tampered_before_its_first_open_is_never_served(scenario: Scenario, mounts: Mounts) -> None:
    """Tampered before the mount ever opened it (same size, mtime restored):
    the streamed verification fails, the open answers EIO with an audit
    row, and no later open of the revision is served from any cache."""
    home = scenario.cli.home
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    artifact = artifact_path(home, scenario.alice, BIG)
    revision = _active_revision(home, scenario.alice, BIG)
    tampered = _marked(BIG_SIZE)
    _tamper_same_size(artifact, tampered)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / BIG

    _expect_eio_on_open_or_read(note)
    _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"BIG-CANARY", MARK))
    for _ in range(3):
        _expect_eio_on_open_or_read(note)
    _cat_fails(note, MARK, content[:4096])
    # The artifact put back as it was is still refused by this mount: the
    # revision failed once, and is never served again.
    _overwrite_in_place(artifact, content)
    _expect_eio_on_open_or_read(note)
    assert (view / VIRTUAL).read_bytes() == ALICE_FACT  # only the bad revision is refused


def test_held_handle_never_reads_a_new_revision_being_verified(scenario: Scenario, mounts: Mounts) -> None:
    """A process holds the note open (its pages cached) while the note gets a
    new revision, tampered on disk soon after: every page the held
    descriptor reads is a page of the old revision or of the new one as the
    catalog has it (the mount may verify it before the tamper lands), or
    EIO, never a byte of the tampered file, during the verification or
    after it."""
    home = scenario.cli.home
    path = "notes/shared.md"
    old = _filler(SHARED_SIZE, b"the verified revision, every line the same ...\n")
    new = _filler(SHARED_SIZE, b"the new revision as the catalog has it .......\n")
    scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=old)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / path
    held = os.open(note, os.O_RDONLY)
    reader = _HeldReader(held, old, also=(new,))
    try:
        assert os.pread(held, SHARED_SIZE + 1, 0) == old
        reader.start()
        scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=new)
        revision = _active_revision(home, scenario.alice, path)
        _tamper_same_size(artifact_path(home, scenario.alice, path), _marked(SHARED_SIZE))
        # Reads are answered with the old revision until the mount sees the new
        # one; then the first READ verifies it and fails (or, if it came before
        # the tamper, the recheck of the artifact drops its pages and the next
        # one fails).
        wait_until(lambda: errno_of(lambda: note.read_bytes()) == errno.EIO, timeout=20)
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(MARK,))
        reader.stop()
        assert reader.reads > 0
        assert reader.bad == [], f"the held handle read {len(reader.bad)} unverified chunks: {reader.bad[:3]}"
        got = _pread_errno(held, 1 << 16, SHARED_SIZE // 2)
        assert got in (errno.EIO, old[SHARED_SIZE // 2:][:1 << 16], new[SHARED_SIZE // 2:][:1 << 16])
    finally:
        reader.stop()
        os.close(held)
    _expect_eio_on_open_or_read(note)


class _HeldReader:
    """Reads a held descriptor over and over on a thread, keeping every page that is not, at its
    offset, a page of ``expected`` or of one of the ``also`` revisions."""

    def __init__(self, fd: int, expected: bytes, also: tuple[bytes, ...] = ()) -> None:
        self.fd = fd
        self.expected = expected
        self.allowed = (expected, *also)
        self.reads = 0
        self.bad: list[tuple[int, int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        chunk = 1 << 18
        while not self._stop.is_set():
            for offset in range(0, len(self.expected), chunk):
                got = _pread_errno(self.fd, chunk, offset)
                self.reads += 1
                if not isinstance(got, bytes):
                    continue
                if not got:
                    self.bad.append((offset, 0, b""))  # an end of file before the end: a size not verified
                for start in range(0, len(got), mmap.PAGESIZE):  # a read cut short by an error is a prefix
                    page = got[start:start + mmap.PAGESIZE]
                    at = offset + start
                    if not any(page == allowed[at:at + len(page)] for allowed in self.allowed):
                        self.bad.append((at, len(page), page[:32]))
                        break
                if self._stop.is_set():
                    return


# -- the same orderings, on a ScopeFS in this process -------------------------------

class FakeKernel:
    """What a ``ScopeFS`` in this process tells the kernel, in order.

    ``drop`` replaces ``pyfuse3.invalidate_inode`` (there is no FUSE session
    here) and records it.
    """

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def drop(self, ino: int, attr_only: bool = False) -> None:
        with self._lock:
            self.events.append(("drop", ino))


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setattr(pyfuse3, "invalidate_inode", fake.drop)
    monkeypatch.setattr(pyfuse3, "invalidate_entry", lambda *args, **kwargs: None)
    return fake


def _run_fs(scenario: Scenario, test: Callable[[ScopeFS, int], Awaitable[None]], path: str = BIG) -> None:
    """Run ``test(fs, inode of private/<path>)`` on a ScopeFS of Alice's session in this process."""
    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session))

    async def main() -> None:
        ino = pyfuse3.ROOT_INODE
        for name in ("private", *path.split("/")):
            ino = (await fs.lookup(ino, name.encode())).st_ino
        await test(fs, ino)
        assert inconsistencies(fs.mount) == []  # the node table agrees with the handles and layers

    try:
        trio.run(main)
    finally:
        fs.reads.drop_readers()
        fs.artifacts.close()
        home.close()


def test_reads_that_arrive_during_a_verification_share_it(scenario: Scenario, kernel: FakeKernel) -> None:
    """Readahead sends several READs of one inode at once: the first verifies
    the revision (on a thread), the others wait for that verdict, and none
    is answered before it."""
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)

    async def test(fs: ScopeFS, ino: int) -> None:
        hashed: list[int] = []
        answered: list[tuple[int, bytes]] = []
        opened = fs.artifacts.open
        release = threading.Event()

        def slow_open(*args: Any, **kwargs: Any) -> Any:
            hashed.append(1)
            assert release.wait(timeout=30)
            return opened(*args, **kwargs)

        fs.artifacts.open = slow_open  # type: ignore[method-assign]

        async def read(offset: int) -> None:
            answered.append((offset, await fs.read(0, offset, 4096, ino, None)))

        async with trio.open_nursery() as nursery:
            for offset in (0, 1 << 20, 2 << 20):
                nursery.start_soon(read, offset)
            try:
                while not hashed:  # noqa: ASYNC110 - the verifying thread appends when it starts
                    await trio.sleep(0.005)
                await trio.testing.wait_all_tasks_blocked()
                assert answered == [] and hashed == [1]  # one verification under way, nobody answered
            finally:
                release.set()
        assert sorted(answered) == [(o, content[o:o + 4096]) for o in (0, 1 << 20, 2 << 20)]
        assert hashed == [1]

    _run_fs(scenario, test)


def test_a_new_revision_drops_the_pages_of_the_old_one(scenario: Scenario, kernel: FakeKernel) -> None:
    """A store never shrinks the kernel's idea of the file, and READs come by
    inode across opens: when the note has a new revision, the inode's pages
    of the old one are dropped (on the invalidation worker) and READs serve
    the new one."""
    path = "notes/shrinks.md"
    scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"x" * 100_000)

    async def test(fs: ScopeFS, ino: int) -> None:
        async with trio.open_nursery() as nursery:
            await fs.background(nursery)
            assert await fs.read(0, 0, 10, ino, None) == b"x" * 10
            scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"short\n")
            sent = len(kernel.events)
            with trio.CancelScope(shield=True):
                await fs.sync()
                # Until the worker begins to drop the old pages, READs keep to the old revision:
                # no page of the new one is cached beside old ones the drop has not reached.
                if ("drop", ino) not in kernel.events[sent:]:
                    assert await fs.read(0, 4096, 10, ino, None) == b"x" * 10
            with trio.fail_after(5):
                while ("drop", ino) not in kernel.events[sent:]:  # noqa: ASYNC110 - the worker's record
                    await trio.sleep(0.01)
                await trio.testing.wait_all_tasks_blocked()
            assert await fs.read(0, 0, 4096, ino, None) == b"short\n"
            nursery.cancel_scope.cancel()

    _run_fs(scenario, test, path)


def test_a_read_that_comes_while_the_old_pages_are_dropped_serves_the_new_revision(
        scenario: Scenario, kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``READ`` that comes once the worker has begun to drop the old pages (here: while it is inside
    that call) gets the new revision. The kernel may have dropped the page already, and what the READ
    brings in stays: READs that kept to the old revision until the loop learned the call had returned
    left a second mount serving a note's old bytes, cut to the new size, for good."""
    path = "notes/races.md"
    scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"x" * 100)
    dropping, dropped = threading.Event(), threading.Event()
    watched: list[int] = []

    def drop(ino: int, attr_only: bool = False) -> None:
        kernel.drop(ino, attr_only)
        if ino in watched and not dropping.is_set():
            dropping.set()
            dropped.wait(10)  # the kernel's sweep, under way

    monkeypatch.setattr(pyfuse3, "invalidate_inode", drop)

    async def test(fs: ScopeFS, ino: int) -> None:
        watched.append(ino)
        async with trio.open_nursery() as nursery:
            await fs.background(nursery)
            assert await fs.read(0, 0, 10, ino, None) == b"x" * 10
            scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"short\n")
            await fs.sync()
            assert await trio.to_thread.run_sync(dropping.wait, 10), "the old pages were never dropped"
            try:
                assert await fs.read(0, 0, 4096, ino, None) == b"short\n"
            finally:
                dropped.set()
            nursery.cancel_scope.cancel()

    _run_fs(scenario, test, path)
