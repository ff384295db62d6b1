"""Real FUSE mounts of scenario sessions, for the vfs tests.

``mounts`` mounts sessions through the installed ``scopefs mount`` and
always unmounts them at teardown (a lazy unmount if the server is gone), so
a failing test never leaves a mount behind for the next one.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import apsw
import pytest

from scopefs.vfs.mountinfo import last_mount_at
from tests.conftest import Cli, Scenario, sqlite_int

T = TypeVar("T")


def wait_until(probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout``.

    A functional bound (the change must arrive), not a speed assertion: the
    mount applies a catalog change as soon as inotify reports the commit,
    an expiry when it is due (``vfs.follow``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s (last value: {value!r})")
        time.sleep(interval)


def errno_of(call: Callable[[], object]) -> int:
    """The errno ``call`` fails with, or 0 if it succeeds."""
    try:
        call()
    except OSError as exc:
        return exc.errno or 0
    return 0


def is_mounted(path: Path) -> bool:
    return last_mount_at(os.path.realpath(path)) is not None


_SERVE = """
import sys
from pathlib import Path
from scopefs.catalog.home import Home
from scopefs.vfs.server import serve
serve(Home.open(Path(sys.argv[1])), sys.argv[2], sys.argv[3], on_ready=lambda: print("ready", flush=True))
"""


@contextlib.contextmanager
def patched_server(home: Path, session_id: str, where: Path, patch: str) -> Iterator[None]:
    """A real mount of ``session_id`` at ``where`` whose server runs ``patch`` (Python source) first: a
    fault, or a moment stretched for one name, on purpose, in front of the real kernel. Unmounted after."""
    with server_script(patch + _SERVE, where, str(home), session_id, str(where)):
        yield


@contextlib.contextmanager
def server_script(source: str, where: Path, *args: str) -> Iterator[None]:
    """Run ``source`` (a mount server that prints "ready" once it answers at ``where``) with ``args``;
    unmount ``where`` and wait for the server after."""
    server = subprocess.Popen([sys.executable, "-c", source, *args],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield
    finally:
        if is_mounted(where):
            subprocess.run(["fusermount3", "-u", str(where)], capture_output=True)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def second_group_session(scenario: Scenario) -> str:
    """Another group session of the scenario's conversation: a second writer of the same channel."""
    return str(scenario.cli.j("session", "open", "--agent", scenario.agent, "--group",
                              "--conversation", scenario.conversation)["session_id"])


def view_servers(where: Path, *, patched: bool = False) -> set[int]:
    """Live ``scopefs.vfs.server`` processes serving ``where`` (``patched``: ``server_script``'s ``python -c``)."""
    wanted = os.path.realpath(where).encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = argv[1:2] == [b"-c"] if patched else b"scopefs.vfs.server" in argv
        if ours and wanted in argv and state not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def getdents_into(folder: Path, target: Path) -> int:
    """``getdents64`` of ``folder`` into a private writable mapping of ``target``'s first page, never read before.

    The kernel copies a cached listing out with its page locked, so the copy's
    page fault (a ``READ`` of ``target``) is answered while that lock is held.
    """
    folder_fd, target_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY), os.open(target, os.O_RDONLY)
    try:
        mapping = mmap.mmap(target_fd, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            window = ctypes.c_char.from_buffer(mapping)
            got = getdents64(folder_fd, ctypes.addressof(window), mmap.PAGESIZE)
            del window
            return got
        finally:
            mapping.close()
    finally:
        os.close(folder_fd)
        os.close(target_fd)


def getdents64(fd: int, address: int, size: int) -> int:
    """The system call itself (Python has none): what a listing from the descriptor's offset returns."""
    number = {"x86_64": 217, "aarch64": 61}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    got = libc.syscall(ctypes.c_long(number), ctypes.c_int(fd), ctypes.c_void_p(address), ctypes.c_size_t(size))
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    return int(got)


@dataclass
class Mounts:
    cli: Cli
    root: Path
    active: list[Path] = field(default_factory=list)

    def mount(self, session_id: str, name: str | None = None) -> Path:
        where = self.root / (name or f"m{len(self.active)}")
        where.mkdir(parents=True, exist_ok=True)
        self.cli("mount", session_id, str(where), check=True)
        self.active.append(where)
        return where

    def umount(self, where: Path) -> None:
        self.cli("umount", str(where), check=True)
        self.active.remove(where)

    def cleanup(self) -> None:
        for where in self.active:
            if is_mounted(where):
                if self.cli("umount", str(where)).code != 0:
                    subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True)
        self.active.clear()


@pytest.fixture
def mounts(scenario: Scenario, tmp_path: Path) -> Iterator[Mounts]:
    kit = Mounts(scenario.cli, tmp_path / "mnt")
    try:
        yield kit
    finally:
        kit.cleanup()


@contextlib.contextmanager
def catalog(home: Path, agent: str = "main") -> Iterator[apsw.Connection]:
    conn = apsw.Connection(str(home / "agents" / agent / "catalog.sqlite"))
    try:
        yield conn
    finally:
        conn.close()


@dataclass(frozen=True)
class NoteHistory:
    resource_id: str
    path: str
    revisions: int  # active or superseded: committed revisions
    active_sha256: str | None


def unsynced_paths(home: Path, agent: str = "main") -> set[str]:
    """Paths of the notes with a revision committed without a disk sync (``writer.unsynced``)."""
    with catalog(home, agent) as conn:
        rows = conn.execute("SELECT r.path FROM unsynced_revisions u JOIN resources r USING (resource_id)").fetchall()
    return {str(row[0]) for row in rows}


def live_notes(home: Path, audience_id: str, agent: str = "main") -> dict[str, NoteHistory]:
    """Live resources of the store whose audience is ``audience_id``, by path."""
    with catalog(home, agent) as conn:
        rows = conn.execute(
            "SELECT r.resource_id, r.path,"
            " (SELECT count(*) FROM revisions v WHERE v.resource_id = r.resource_id"
            "   AND v.state IN ('active', 'superseded')),"
            " (SELECT content_sha256 FROM revisions v WHERE v.resource_id = r.resource_id AND v.state = 'active')"
            " FROM resources r JOIN stores s USING (store_id)"
            " WHERE s.audience_id = ? AND r.state = 'live'", (audience_id,)).fetchall()
    return {str(path): NoteHistory(str(resource_id), str(path), sqlite_int(count), None if sha is None else str(sha))
            for resource_id, path, count, sha in rows}


def all_resource_paths(home: Path, agent: str = "main") -> set[str]:
    """Every path any resource ever had in the catalog (live or tombstoned)."""
    with catalog(home, agent) as conn:
        return {str(row[0]) for row in conn.execute("SELECT path FROM resources")}


def pending_rows(home: Path, agent: str = "main") -> int:
    with catalog(home, agent) as conn:
        return sqlite_int(conn.execute("SELECT (SELECT count(*) FROM revisions WHERE state = 'pending')"
                                   " + (SELECT count(*) FROM write_intents WHERE state = 'pending')").fetchall()[0][0])
