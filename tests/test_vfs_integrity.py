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
* a large revision's chunks go to the kernel's page cache while it is
  hashed, before the verdict: only when no other handle is open on the
  inode, while no other open is given a handle on it, and with the pages
  dropped before a failing open answers EIO.

The tests tamper with the artifact on disk while the view is mounted,
after the note was read through the mount at least once, or before it was
ever opened. The orderings of the streamed verification (a second open
waits, pages are dropped before the EIO) are checked on a ``ScopeFS`` run in
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
from collections.abc import Awaitable, Callable, Iterator
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
from scopefs.vfs.mount import inconsistencies
from tests.conftest import ALICE_FACT, Scenario, artifact_path
from tests.mountkit import Mounts, catalog, errno_of, mounts, wait_until  # noqa: F401

NOTE = "notes/allergy.md"
VIRTUAL = f"private/{NOTE}"
BIG = "notes/big.md"
BIG_SIZE = 3 * (1 << 20)  # above vfs.fs.INLINE_BYTES: opened and hashed on a thread
RACY_S = 2.5  # older than vfs.content.RACY_NS: the server may remember its verification


# -- helpers -------------------------------------------------------------------

def _active_revision(home: Path, audience_id: str, path: str) -> str:
    with catalog(home) as conn:
        rows = conn.execute(
            "SELECT v.revision_id FROM resources r JOIN stores s ON s.store_id = r.store_id"
            " JOIN revisions v ON v.resource_id = r.resource_id AND v.state = 'active'"
            " WHERE s.audience_id = ? AND r.path = ? AND r.state = 'live'", (audience_id, path)).fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def _error_rows(home: Path, session_id: str) -> list[dict]:
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


def _assert_refused(scenario: Scenario, note: Path, tampered: bytes, revision: str | None = None) -> None:
    """A tampered note: EIO on open or read, one audited error naming its revision (and no
    content), and ``cat`` shows neither the original nor the tampered bytes."""
    home = scenario.cli.home
    _expect_eio_on_open_or_read(note)
    revision = revision or _active_revision(home, scenario.alice, NOTE)
    _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"hazelnut", b"pistachio"))
    _cat_fails(note, ALICE_FACT, tampered)


def _pread_errno(fd: int, size: int, offset: int) -> int | bytes:
    """The errno of a failing pread, or the bytes it returned."""
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        return exc.errno


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



# -- a large note streamed into the page cache while it is hashed ------------------

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


def test_large_note_cold_read_is_stored_at_open(scenario: Scenario, mounts: Mounts) -> None:
    """A large note's first open, on a fresh mount, leaves the whole verified
    note in the kernel's page cache before a byte was read; the reads then
    return it exactly, through that handle and a fresh one."""
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
        assert _resident_pages(fd, BIG_SIZE) == BIG_SIZE // mmap.PAGESIZE  # stored at open, nothing read yet
        assert os.pread(fd, BIG_SIZE + 1, 0) == content
    finally:
        os.close(fd)
    proc = subprocess.run(["cat", str(note)], capture_output=True, check=True, timeout=30)
    assert proc.stdout == content  # a second read, through a fresh handle
    assert note.read_bytes() == content
    assert _error_rows(home, scenario.alice_session) == []


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
    # revision failed once, and is never served from the pages it streamed.
    _overwrite_in_place(artifact, content)
    _expect_eio_on_open_or_read(note)
    assert (view / VIRTUAL).read_bytes() == ALICE_FACT  # only the bad revision is refused


def test_held_handle_never_reads_a_new_revision_being_verified(scenario: Scenario, mounts: Mounts) -> None:
    """A process holds the note open (its pages cached, ``keep_cache``) while
    another open verifies the note's new revision, tampered on disk: the
    held handle reads the old revision's bytes (or EIO), never a page of
    the new one, during the verification or after it."""
    home = scenario.cli.home
    path = "notes/shared.md"
    old = _filler(SHARED_SIZE, b"the verified revision, every line the same ...\n")
    scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=old)
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / path
    held = os.open(note, os.O_RDONLY)
    reader = _HeldReader(held, old)
    try:
        assert os.pread(held, SHARED_SIZE + 1, 0) == old
        reader.start()
        scenario.cli.j("write", scenario.alice_session, f"private/{path}",
                       stdin=_filler(SHARED_SIZE, b"the new revision as the catalog has it .......\n"))
        revision = _active_revision(home, scenario.alice, path)
        _tamper_same_size(artifact_path(home, scenario.alice, path), _marked(SHARED_SIZE))
        # Opens are answered with the old revision until the mount sees the
        # new one; then one open verifies it, and fails.
        wait_until(lambda: errno_of(lambda: note.read_bytes()) == errno.EIO, timeout=20)
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(MARK,))
        reader.stop()
        assert reader.reads > 0
        assert reader.bad == [], f"the held handle read {len(reader.bad)} chunks that are not the old revision"
        got = _pread_errno(held, 1 << 16, SHARED_SIZE // 2)
        assert got == errno.EIO or got == old[SHARED_SIZE // 2:][:1 << 16]
    finally:
        reader.stop()
        os.close(held)
    _expect_eio_on_open_or_read(note)


class _HeldReader:
    """Reads a held descriptor over and over on a thread, keeping what is not ``expected``."""

    def __init__(self, fd: int, expected: bytes) -> None:
        self.fd = fd
        self.expected = expected
        self.reads = 0
        self.bad: list[tuple[int, bytes]] = []
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
                if isinstance(got, bytes) and got != self.expected[offset:offset + chunk]:
                    self.bad.append((offset, got[:64]))
                if self._stop.is_set():
                    return


# -- the same orderings, on a ScopeFS in this process -------------------------------

class FakeKernel:
    """What a ``ScopeFS`` in this process tells the kernel, in order.

    ``store`` and ``drop`` replace ``pyfuse3.notify_store`` and
    ``pyfuse3.invalidate_inode`` (there is no FUSE session here); ``hold``
    makes the first store wait until ``release``; ``fail_store_at``
    makes that store (0 = the first) fail as the kernel would for an
    inode it forgot.
    """

    def __init__(self, *, hold: bool = False, fail_store_at: int | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.stores = 0
        self.holding = threading.Event()
        self.released = threading.Event()
        self._hold = hold
        self._fail_store_at = fail_store_at
        self._lock = threading.Lock()

    def log(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def store(self, ino: int, offset: int, data: bytes) -> None:
        index, self.stores = self.stores, self.stores + 1
        if index == self._fail_store_at:
            self.log("store-failed", ino, offset)
            raise OSError(errno.ENOENT, "fuse_lowlevel_notify_store returned: No such file or directory")
        self.log("store", ino, offset, len(data))
        if self._hold and index == 0:
            self.holding.set()
            assert self.released.wait(timeout=30)

    def drop(self, ino: int, attr_only: bool = False) -> None:
        self.log("drop", ino)

    def kinds(self) -> list[str]:
        return [event[0] for event in self.events]


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeKernel]]:
    made: list[FakeKernel] = []

    def make(**options: Any) -> FakeKernel:
        fake = FakeKernel(**options)
        monkeypatch.setattr(pyfuse3, "notify_store", fake.store)
        monkeypatch.setattr(pyfuse3, "invalidate_inode", fake.drop)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.released.set()


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
        fs.artifacts.close()
        home.close()


async def _open(fs: ScopeFS, ino: int, answers: list[tuple[str, Any]], label: str) -> None:
    """Open ``ino`` for reading; note the answer (its FileInfo or errno) in ``answers``."""
    try:
        info = await fs.open(ino, os.O_RDONLY, None)
    except pyfuse3.FUSEError as exc:
        answers.append((label, exc.errno))
    else:
        answers.append((label, info))


def _write_big(scenario: Scenario) -> bytes:
    content = _big_content()
    scenario.cli.j("write", scenario.alice_session, f"private/{BIG}", stdin=content)
    return content


def test_streamed_open_keeps_the_cache_only_for_a_complete_verified_stream(scenario: Scenario,
                                                                          kernel: Callable[..., FakeKernel]) -> None:
    content = _write_big(scenario)
    fake = kernel()

    async def test(fs: ScopeFS, ino: int) -> None:
        answers: list[tuple[str, Any]] = []
        await _open(fs, ino, answers, "first")
        info = answers[0][1]
        assert isinstance(info, pyfuse3.FileInfo) and info.keep_cache
        stored = [e for e in fake.events if e[0] == "store"]
        assert [(e[2], e[3]) for e in stored] == [(off, min(1 << 20, BIG_SIZE - off))
                                                  for off in range(0, BIG_SIZE, 1 << 20)]
        assert fake.kinds()[0] == "drop"  # an older revision's pages never outlive it under keep_cache
        assert await fs.read(info.fh, BIG_SIZE - 10, 100) == content[-10:]
        await fs.release(info.fh)

    _run_fs(scenario, test)


def test_second_open_waits_for_the_stream_in_flight(scenario: Scenario, kernel: Callable[..., FakeKernel]) -> None:
    """An open that arrives while another open streams into the same inode
    is answered only after that stream's verdict, and starts no stream."""
    content = _write_big(scenario)
    fake = kernel(hold=True)

    async def test(fs: ScopeFS, ino: int) -> None:
        answers: list[tuple[str, Any]] = []
        hashed: list[bool] = []
        opened = fs.artifacts.open

        def recording_open(*args: Any, **kwargs: Any) -> Any:
            result = opened(*args, **kwargs)
            hashed.append(kwargs.get("sink") is not None)
            return result

        fs.artifacts.open = recording_open  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_open, fs, ino, answers, "streaming")
            await trio.to_thread.run_sync(fake.holding.wait, 30)
            nursery.start_soon(_open, fs, ino, answers, "second")
            try:
                # the second open hashed on its own thread, without a stream (a list that thread appends to)
                while hashed != [False]:  # noqa: ASYNC110
                    await trio.sleep(0.005)
                await trio.testing.wait_all_tasks_blocked()
                assert answers == [], "an open was answered while another one streamed unverified pages"
            finally:
                fake.released.set()
        assert [label for label, _ in answers] == ["streaming", "second"]
        for _, info in answers:
            assert isinstance(info, pyfuse3.FileInfo) and info.keep_cache
            assert await fs.read(info.fh, 0, 64) == content[:64]
        assert sum(1 for kind in fake.kinds() if kind == "store") == BIG_SIZE >> 20  # one stream only

    _run_fs(scenario, test)


def test_failed_stream_drops_the_pages_before_eio(scenario: Scenario, kernel: Callable[..., FakeKernel]) -> None:
    """The pages a failing verification stored are dropped, and waited for,
    before the open answers EIO (and the audit row is written)."""
    home = scenario.cli.home
    content = _write_big(scenario)
    revision = _active_revision(home, scenario.alice, BIG)
    _tamper_same_size(artifact_path(home, scenario.alice, BIG), content[:-1] + b"?")
    fake = kernel()

    async def test(fs: ScopeFS, ino: int) -> None:
        answers: list[tuple[str, Any]] = []
        await _open(fs, ino, answers, "tampered")
        fake.log("answered")
        assert answers == [("tampered", errno.EIO)]
        kinds = fake.kinds()
        last_store = max(i for i, kind in enumerate(kinds) if kind == "store")
        assert last_store == len(kinds) - 3 and kinds[-2:] == ["drop", "answered"], kinds
        assert all(event[1] == ino for event in fake.events if event[0] in ("store", "drop"))

    _run_fs(scenario, test)
    _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"BIG-CANARY",))


def test_failed_store_stops_the_stream_and_the_cache(scenario: Scenario, kernel: Callable[..., FakeKernel]) -> None:
    """A store the kernel refuses ends the stream: the open is still served,
    but without ``keep_cache``, and its reads go to the server."""
    content = _write_big(scenario)
    fake = kernel(fail_store_at=1)

    async def test(fs: ScopeFS, ino: int) -> None:
        answers: list[tuple[str, Any]] = []
        await _open(fs, ino, answers, "open")
        info = answers[0][1]
        assert isinstance(info, pyfuse3.FileInfo) and not info.keep_cache
        assert fake.kinds() == ["drop", "store", "store-failed"]
        assert await fs.read(info.fh, 3 << 19, 4096) == content[3 << 19:(3 << 19) + 4096]

    _run_fs(scenario, test)


def test_no_stream_while_a_handle_is_open(scenario: Scenario, kernel: Callable[..., FakeKernel]) -> None:
    """With a handle open on the inode, a verification stores nothing: the
    held handle would read the pages before the verdict."""
    content = _write_big(scenario)
    fake = kernel()

    async def test(fs: ScopeFS, ino: int) -> None:
        answers: list[tuple[str, Any]] = []
        await _open(fs, ino, answers, "held")
        stored = fake.stores
        assert stored == BIG_SIZE >> 20
        assert fs.artifacts.needs_hash(fs.handles[answers[0][1].fh].note)  # racy-new: hashed again
        await _open(fs, ino, answers, "while held")
        info = answers[1][1]
        assert isinstance(info, pyfuse3.FileInfo)
        assert fake.stores == stored, "a verification stored pages while another handle was open"
        assert info.keep_cache  # the pages cached are the held handle's, of this same verified revision
        assert await fs.read(info.fh, 0, 64) == content[:64]

    _run_fs(scenario, test)


def test_a_new_smaller_revision_drops_the_old_pages_before_its_own_are_stored(
        scenario: Scenario, kernel: Callable[..., FakeKernel]) -> None:
    """A store never shrinks the kernel's idea of the file: an older, longer
    revision's tail pages could outlive it under ``keep_cache``. So when an
    open stores a revision other than the one the kernel holds, the old
    pages are dropped (and waited for) first."""
    path = "notes/shrinks.md"
    scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"x" * 100_000)
    fake = kernel()

    async def test(fs: ScopeFS, ino: int) -> None:
        first = await fs.open(ino, os.O_RDONLY, None)
        await fs.release(first.fh)
        assert fake.kinds() == ["store"]
        scenario.cli.j("write", scenario.alice_session, f"private/{path}", stdin=b"short\n")
        await fs.sync()
        second = await fs.open(ino, os.O_RDONLY, None)
        await fs.release(second.fh)
        assert second.keep_cache
        assert fake.kinds()[1:] == ["drop", "store"], fake.events
        assert fake.events[-1] == ("store", ino, 0, len(b"short\n"))

    _run_fs(scenario, test, path)
