"""The vendored pyfuse3 patch (``vendor/pyfuse3``), on a real mount of ``tests/fork_fs.py``.

Each test reads what the kernel sent from the server's request log: the
patch is only worth having if the kernel really stops sending OPEN and
RELEASE once OPEN answered ENOSYS, and the requests it still sends carry
the inode the server needs to answer them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest

SERVER = Path(__file__).with_name("fork_fs.py")


class Mounted:
    def __init__(self, root: Path, log: Path) -> None:
        self.root = root
        self._log = log

    def requests(self, opcode: str | None = None) -> list[list[str]]:
        lines = [line.split() for line in self._log.read_text().splitlines()]
        return [line for line in lines if opcode is None or line[0] == opcode]


@pytest.fixture
def mounted(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Mounted]:
    root, log = tmp_path / "mnt", tmp_path / "requests.log"
    root.mkdir()
    log.touch()
    poll_ns = getattr(request, "param", 100_000)
    proc = subprocess.Popen([sys.executable, str(SERVER), str(root), str(log), str(poll_ns)])
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(root):
            assert proc.poll() is None, "the server exited before mounting"
            assert time.monotonic() < deadline, "no mount within 10 s"
            time.sleep(0.02)
        yield Mounted(root, log)
    finally:
        subprocess.run(["fusermount3", "-u", str(root)], check=False)
        proc.wait(timeout=10)


def test_the_patched_build_is_installed() -> None:
    assert pyfuse3.Operations.inode_requests is False  # opt-in: stock behaviour unless a file system asks
    assert pyfuse3.Operations.enable_atomic_o_trunc is True
    assert pyfuse3.Operations.flush_wanted is None
    assert pyfuse3.__version__ == "3.5.0+inode.6"


def test_importing_the_patched_build_leaves_importlib_metadata_unloaded() -> None:
    # upstream looks its version up at import, which loads email, zipfile and csv (4.7 MiB per server)
    code = "import sys, pyfuse3; assert 'importlib.metadata' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_reads_come_by_inode_once_open_answered_enosys(mounted: Mounted) -> None:
    a = mounted.root / "a.txt"
    for _ in range(3):
        assert a.read_bytes() == b"alpha\n" * 1000
    opens = mounted.requests("open")
    assert len(opens) == 1  # the first open learned ENOSYS; the kernel never asked again
    reads = mounted.requests("read")
    assert reads and all(fh == "0" and ino == "2" for _, fh, ino, _pid in reads)
    assert all(pid != "None" and int(pid) > 0 for *_, pid in reads)  # the caller's context came along
    # The kernel kept the pages across opens: the later reads sent nothing.
    assert len(reads) == len({tuple(r) for r in reads}) or len(reads) <= 2
    assert len(mounted.requests("release")) <= 1  # at most the one of the open that got ENOSYS


def test_listings_come_by_inode_and_are_kept(mounted: Mounted) -> None:
    for _ in range(3):
        assert sorted(os.listdir(mounted.root / "d")) == ["b.txt"]
    assert len(mounted.requests("opendir")) == 1
    listings = mounted.requests("readdir")
    assert listings and all(fh == "0" and ino == "3" for _, fh, ino, _start in listings)
    assert len([r for r in listings if r[3] == "0"]) == 1  # listed once: the kernel cached the listing


def test_o_trunc_arrives_as_a_truncation_before_the_write(mounted: Mounted) -> None:
    b = mounted.root / "d" / "b.txt"
    b.read_bytes()  # the open that learns ENOSYS
    with open(b, "wb") as out:  # O_TRUNC: no open will come to carry it
        out.write(b"new\n")
    assert b.read_bytes() == b"new\n"
    lines = mounted.requests()
    truncation = next(i for i, line in enumerate(lines) if line[0] == "setattr")
    write = next(i for i, line in enumerate(lines) if line[0] == "write")
    # by inode, to size 0, and without a file handle: the kernel drops it for an O_TRUNC open, so the
    # server cannot tell this truncation from truncate(2) by path
    assert lines[truncation][1:4] == ["None", "4", "0"]
    assert truncation < write
    assert lines[write][1:3] == ["0", "4"]
    flushes = [line for line in lines if line[0] == "flush"]
    assert flushes and all(line[2] == "4" for line in flushes[-1:])  # the close says which inode


def test_fsync_comes_by_inode(mounted: Mounted) -> None:
    a = mounted.root / "a.txt"
    a.read_bytes()
    fd = os.open(a, os.O_WRONLY)
    try:
        os.write(fd, b"ALPHA")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert ["fsync", "0", "2"] in mounted.requests("fsync")
    assert a.read_bytes().startswith(b"ALPHA\nalpha")


LONG_POLL_S = 5


@pytest.mark.parametrize("mounted", [LONG_POLL_S * 1_000_000_000], indirect=True)
def test_a_handler_that_awaits_is_not_held_by_the_poll(mounted: Mounted) -> None:
    # The loop polls for the next request with the event loop held (in C), so while a handler is
    # under way (here fsync, which waits for a worker thread) another task must not poll: the thread's
    # result could not reach the handler until the poll ran out. With a budget of 5 s, each fsync
    # below would take 5 s; it must come back long before.
    a = mounted.root / "a.txt"
    a.read_bytes()
    fd = os.open(a, os.O_WRONLY)
    try:
        for _ in range(3):
            began = time.monotonic()
            os.fsync(fd)
            assert time.monotonic() - began < LONG_POLL_S / 2, "the handler waited for the poll to run out"
    finally:
        os.close(fd)
    assert len(mounted.requests("fsync")) == 3


def test_closes_of_unwanted_inodes_are_answered_without_python(mounted: Mounted) -> None:
    a, b = mounted.root / "a.txt", mounted.root / "d" / "b.txt"
    for _ in range(3):
        assert b.read_bytes() == b"beta\n"
    # Hundreds of closes in a row, most answered in C while the loop polls, then requests that
    # need Python again: every one gets its answer, in order.
    for round_ in range(5):
        for _ in range(200):
            fd = os.open(a, os.O_RDONLY)
            os.close(fd)
        assert a.read_bytes() == b"alpha\n" * 1000
        assert sorted(os.listdir(mounted.root / "d")) == ["b.txt"]
        with open(b, "ab") as out:
            out.write(b"%d" % round_)
    assert b.read_bytes() == b"beta\n01234"
    flushes = mounted.requests("flush")
    assert flushes and all(line[2] == "4" for line in flushes)  # only d/b.txt's closes reached flush()
    assert len(flushes) >= 3 + 5


def test_the_loop_says_when_it_goes_back_to_waiting(mounted: Mounted) -> None:
    a = mounted.root / "a.txt"
    assert a.read_bytes() == b"alpha\n" * 1000
    waits = mounted.requests("wait")
    calls, received = len(waits), int(waits[-1][1])
    for _ in range(1_000):
        os.close(os.open(a, os.O_RDONLY))
    assert a.read_bytes() == b"alpha\n" * 1000  # nothing needs Python here: the loop says so on its next wait
    os.listdir(mounted.root / "d")  # a request for Python: the call before it counts every close
    # Every one of those closes was answered in C, none reached Python, and yet the file system
    # heard at least once per 65 of them that requests keep coming, and how many came.
    assert not mounted.requests("flush")
    waits = mounted.requests("wait")
    assert len(waits) - calls >= 1_000 // 65
    assert int(waits[-1][1]) - received >= 1_000
    counts = [int(line[1]) for line in waits]
    assert counts == sorted(counts)
