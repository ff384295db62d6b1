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
  kernel's pages of that inode, so a held descriptor fails too.

The tests tamper with the artifact on disk while the view is mounted,
after the note was read through the mount at least once.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time
from pathlib import Path

import apsw
import pytest

from tests.conftest import ALICE_FACT, Scenario, artifact_path
from tests.mountkit import Mounts, catalog, mounts, wait_until  # noqa: F401

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
    return [dict(zip(cols, row)) for row in rows]


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

        _expect_eio_on_open_or_read(note)
        _assert_error_audited(home, scenario.alice_session, revision, secrets=(b"hazelnut", b"pistachio"))
        _cat_fails(note, ALICE_FACT, tampered)
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
    _expect_eio_on_open_or_read(note)
    _assert_error_audited(home, scenario.alice_session, _active_revision(home, scenario.alice, NOTE),
                          secrets=(b"hazelnut", b"pistachio"))
    _cat_fails(note, ALICE_FACT, tampered)


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
    _expect_eio_on_open_or_read(note)
    _assert_error_audited(home, scenario.alice_session, _active_revision(home, scenario.alice, NOTE),
                          secrets=(b"hazelnut", b"pistachio"))
    _cat_fails(note, ALICE_FACT, tampered)


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
