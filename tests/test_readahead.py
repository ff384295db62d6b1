"""``vfs.readahead``: a folder listed afresh has its notes' artifacts asked of the disk, and nothing else.

Residency in the page cache is read with ``fincore`` (util-linux); files
are pushed out of it with ``POSIX_FADV_DONTNEED`` after a sync, so each
test starts from pages that are really not in memory and fails if the
read-ahead does not bring them in.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from scopefs.vfs import readahead
from scopefs.vfs.readahead import AHEAD_NOTES, WORKERS, ReadAhead
from tests.conftest import Scenario, artifact_path
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401


def locator(i: int) -> str:
    """A name shaped like an artifact's (26 base32 letters): read-ahead opens nothing else."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "a" * 23 + alphabet[i // 1024 % 32] + alphabet[i // 32 % 32] + alphabet[i % 32]


def resident(path: Path) -> int:
    """Bytes of ``path`` in the page cache now."""
    out = subprocess.run(["fincore", "--raw", "--noheadings", "--bytes", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def all_resident(paths: list[Path], size: int) -> bool:
    """Whether each of ``paths`` has ``size`` bytes in the page cache now (one ``fincore`` for all)."""
    out = subprocess.run(["fincore", "--raw", "--noheadings", "--bytes", "--output", "RES", *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return [int(line) for line in out.split()] == [size] * len(paths)


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert resident(path) == 0


def test_read_ahead_brings_the_named_files_in_and_follows_no_link_and_waits_on_no_fifo(tmp_path: Path) -> None:
    """Only what a READ would open: no link, no FIFO, no hard link, no malformed name (``..``, a NUL)."""
    store = tmp_path / "store"
    store.mkdir()
    names = [locator(i) for i in range(20)]
    for name in names:
        (store / name).write_bytes(os.urandom(8192))
        evict(store / name)
    outside = tmp_path / "outside"
    outside.write_bytes(os.urandom(8192))
    evict(outside)
    linked = tmp_path / "linked"
    linked.write_bytes(os.urandom(8192))
    evict(linked)
    (store / locator(900)).symlink_to(outside)
    os.link(linked, store / locator(901))
    os.mkfifo(store / locator(902))
    bad = ["../outside", "bad\0name", locator(903)]  # the last one is missing
    dir_fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
    ahead = ReadAhead()
    try:
        ahead.want([(dir_fd, n) for n in (locator(902), locator(900), locator(901), *bad, *names)])
        wait_until(lambda: all(resident(store / n) == 8192 for n in names), timeout=10)
        closing = threading.Thread(target=ahead.close)
        closing.start()
        closing.join(timeout=10)
        assert not closing.is_alive(), "a FIFO among the names held the thread"
    finally:
        os.close(dir_fd)
    assert resident(outside) == 0  # neither the symlink nor "../" reached it
    assert resident(linked) == 0  # a hard-linked file is not an artifact


def test_read_ahead_takes_at_most_its_share_of_one_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readahead, "IDLE_S", 0.2)
    names = [locator(i) for i in range(AHEAD_NOTES + 10)]
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 4096)
        evict(tmp_path / name)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    ahead = ReadAhead()
    try:
        ahead.want([(dir_fd, n) for n in names])
        wait_until(lambda: all_resident([tmp_path / n for n in names[:AHEAD_NOTES]], 4096), timeout=30)
        wait_until(lambda: ahead.threads() == 0, timeout=10)  # nothing left to do: the threads went idle
    finally:
        ahead.close()
        os.close(dir_fd)
    assert all_resident([tmp_path / n for n in names[AHEAD_NOTES:]], 0)


def no_thread_left() -> bool:
    return not [t for t in threading.enumerate() if t.name == "scopefs-readahead"]


def test_threads_share_a_listing_and_end_when_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large listing is taken by several threads at once, and none outlives its work by much: an idle
    mount keeps no read-ahead thread (and so none of its memory)."""
    monkeypatch.setattr(readahead, "IDLE_S", 0.2)
    names = [locator(i) for i in range(200)]
    for name in names:
        (tmp_path / name).write_bytes(b"y" * 4096)
        evict(tmp_path / name)
    released = threading.Event()
    ask = readahead._ask

    def held(dir_fd: int, name: str) -> None:
        released.wait(timeout=10)  # every thread holds its first chunk until all have started
        ask(dir_fd, name)

    monkeypatch.setattr(readahead, "_ask", held)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    ahead = ReadAhead()
    try:
        ahead.want([(dir_fd, n) for n in names])
        assert ahead.threads() == WORKERS
        released.set()
        wait_until(lambda: all_resident([tmp_path / n for n in names], 4096), timeout=10)
        wait_until(lambda: ahead.threads() == 0, timeout=10)
        wait_until(no_thread_left, timeout=10)
        evict(tmp_path / names[0])
        ahead.want([(dir_fd, names[0])])  # a later listing starts one again
        assert ahead.threads() == 1
        wait_until(lambda: resident(tmp_path / names[0]) == 4096, timeout=10)
    finally:
        ahead.close()
        os.close(dir_fd)
    assert ahead.threads() == 0 and no_thread_left()
    ahead.want([(dir_fd, names[1])])  # after close: nothing starts, nothing uses the closed descriptor
    assert ahead.threads() == 0


def test_a_listing_queued_while_the_last_thread_goes_idle_is_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread that timed out waiting looks at the queue again, under the lock ``want`` takes, before
    it ends; a listing queued in between is read by it, never left without a thread."""
    monkeypatch.setattr(readahead, "IDLE_S", 0.05)
    asked: list[str] = []
    monkeypatch.setattr(readahead, "_ask", lambda dir_fd, name: asked.append(name))
    ahead = ReadAhead()
    try:
        ahead.want([(0, "first")])
        wait_until(lambda: asked == ["first"], timeout=5)
        with ahead._lock:  # the thread times out meanwhile and waits for this lock to end
            time.sleep(0.3)
            ahead._waiting.put_nowait([(0, "second")])  # what ``want`` does, without starting a thread
            assert len(ahead._threads) == 1  # still counted: ``want`` would start none
        wait_until(lambda: asked == ["first", "second"], timeout=5)
    finally:
        ahead.close()


def test_a_thread_that_cannot_start_fails_no_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read-ahead is best effort: when no thread can be started (a process limit), ``want`` returns
    quietly, keeps no thread it does not have, and a later listing starts one once it can."""
    (tmp_path / locator(0)).write_bytes(b"z" * 4096)
    evict(tmp_path / locator(0))
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    ahead = ReadAhead()
    try:
        with monkeypatch.context() as patched:
            def refuse(self: threading.Thread) -> None:
                raise RuntimeError("can't start new thread")
            patched.setattr(threading.Thread, "start", refuse)
            ahead.want([(dir_fd, locator(0))])
            assert ahead.threads() == 0
        ahead.want([(dir_fd, locator(0))])
        wait_until(lambda: resident(tmp_path / locator(0)) == 4096, timeout=10)
    finally:
        ahead.close()
        os.close(dir_fd)


def test_listing_a_folder_of_a_mount_reads_its_notes_ahead(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    home = scenario.cli.home
    paths = [f"notes/ahead-{i}.md" for i in range(12)]
    for path in paths:
        scenario.cli("write", scenario.alice_session, "private/" + path, stdin=f"{path}\n".encode() * 200,
                     check=True)
    artifacts = [artifact_path(home, scenario.alice, path) for path in paths]
    other = artifact_path(home, scenario.bob, "notes/allergy.md")  # Bob's note: not in Alice's view
    where = mounts.mount(scenario.alice_session, "alice")
    for artifact in [*artifacts, other]:
        evict(artifact)
    assert all(resident(a) == 0 for a in artifacts)
    names = os.listdir(where / "private" / "notes")  # READDIR: nothing is read, the folder is listed
    assert {Path(p).name for p in paths} <= set(names)
    wait_until(lambda: all(resident(a) > 0 for a in artifacts), timeout=10)
    assert resident(other) == 0
    for path in paths:  # and what the READs then serve is still verified content
        assert (where / "private" / path).read_bytes() == f"{path}\n".encode() * 200
