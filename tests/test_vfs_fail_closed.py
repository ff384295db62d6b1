"""A mount whose catalog cannot be read stops serving (fails closed).

The mount answers from memory. If the catalog changes and the mount can no
longer read it, it cannot know whether the change was a revocation, so it
must empty its view instead of serving the last picture it had. The
server runs here with an apsw VFS whose every read of the agent catalog
fails while a trigger file exists: a disk gone bad under the mount.

The same holds for the kernel's caches: an invalidation the kernel refuses
aborts the connection (``vfs.abort``), shown here on a real mount and, for
the decision itself, on a ``ScopeFS`` in this process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs import kernel as kernel_module
from scopefs.vfs.abort import abort, connection_of, requests_waiting
from scopefs.vfs.fs import ScopeFS
from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import Mounts, errno_of, mounts, server_script, view_servers, wait_until  # noqa: F401

SERVER = """
import os, sys
import apsw
from pathlib import Path
from scopefs.catalog.home import Home
from scopefs.vfs.server import serve

trigger = sys.argv[3]

class Reads(apsw.VFSFile):
    def __init__(self, name, flags):
        self._catalog = str(name.filename() if hasattr(name, "filename") else name).startswith(
            os.path.join(sys.argv[1], "agents"))
        super().__init__("", name, flags)

    def xRead(self, amount, offset):
        if self._catalog and os.path.exists(trigger):
            raise apsw.IOError("injected: the catalog cannot be read")
        return super().xRead(amount, offset)

class FailingReads(apsw.VFS):
    def __init__(self):
        super().__init__("scopefs-failing-reads", "")

    def xOpen(self, name, flags):
        return Reads(name, flags)

vfs = FailingReads()
serve(Home.open(Path(sys.argv[1]), vfs="scopefs-failing-reads"), sys.argv[2], sys.argv[4],
      on_ready=lambda: print("ready", flush=True))
"""



def test_an_unreadable_catalog_empties_the_view(scenario: Scenario, tmp_path: Path) -> None:
    home, trigger, where = scenario.cli.home, tmp_path / "fail-reads", tmp_path / "mnt"
    where.mkdir()
    with server_script(SERVER, where, str(home), scenario.alice_session, str(trigger), str(where)):
        note = where / "private" / "notes" / "allergy.md"
        assert note.read_bytes() == ALICE_FACT
        held = os.open(note, os.O_RDONLY)
        try:
            trigger.touch()
            # A change the mount must read to know what it means (it could be a revocation).
            scenario.cli("write", scenario.alice_session, "private/notes/more.md", stdin=b"x\n", check=True)
            wait_until(lambda: os.listdir(where) == [])
            # The names and pages the kernel held go on the invalidation worker, right after.
            wait_until(lambda: errno_of(note.read_bytes) == errno.ENOENT)
            os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
            wait_until(lambda: errno_of(lambda: os.pread(held, 4096, 0)) in (errno.EACCES, errno.EIO))
            trigger.unlink()  # the catalog is readable again: the view comes back
            wait_until(lambda: sorted(os.listdir(where)) == ["agent-shared", "postbox", "private", "projections"])
            assert note.read_bytes() == ALICE_FACT
        finally:
            os.close(held)


# -- an invalidation the kernel refuses ends the connection --------------------------------


def test_an_aborted_connection_fails_every_access_cached_or_not(scenario: Scenario, mounts: Mounts) -> None:
    """What the mount does when it fails closed (``vfs.abort``): after the abort, no request is
    answered: opening a cached name, looking up any other, reading a page the kernel no longer
    holds. (A listing or a page the kernel still holds stays readable through a descriptor opened
    before: aborting a connection does not drop them; README says so.)"""
    view = mounts.mount(scenario.alice_session)
    note = view / "private" / "notes" / "allergy.md"
    assert note.read_bytes() == ALICE_FACT  # cached: name, attributes, pages
    held = os.open(note, os.O_RDONLY)
    try:
        assert abort(connection_of(str(view)))
        assert errno_of(note.read_bytes) == errno.ENOTCONN
        assert errno_of(lambda: os.stat(view / "private" / "notes" / "other.md")) == errno.ENOTCONN
        assert errno_of(lambda: os.stat(view / ".search" / "allergic")) == errno.ENOTCONN
        os.posix_fadvise(held, 0, 0, os.POSIX_FADV_DONTNEED)
        assert errno_of(lambda: os.pread(held, 4096, 0)) == errno.ENOTCONN
    finally:
        with contextlib.suppress(OSError):
            os.close(held)  # its FLUSH has nobody to answer it: ENOTCONN, and the descriptor is closed


def test_a_refused_invalidation_fails_the_mount_closed(scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel refuses to drop what it holds (any error but "not cached" or "gone"): the mount
    aborts its connection rather than go on serving a view it no longer controls."""
    aborted: list[str | None] = []
    monkeypatch.setattr(pyfuse3, "invalidate_inode", _refuse)
    monkeypatch.setattr(pyfuse3, "invalidate_entry", _refuse)
    def record(connection: str | None) -> bool:
        aborted.append(connection)
        return True

    monkeypatch.setattr(kernel_module, "abort", record)
    monkeypatch.setattr(kernel_module, "connection_of", lambda mountpoint: "77")
    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session))
    fs.mount.kernel.mountpoint = "/nowhere"  # as if mounted there

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await fs.background(nursery)
            fs.mount.kernel.forget_pages(fs.mount.layers.root)
            with trio.fail_after(5):
                while not aborted:  # noqa: ASYNC110 - the worker's record
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        fs.artifacts.close()
        home.close()
    assert aborted == ["77"]


def _refuse(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EIO, "the kernel refused the invalidation")


def test_the_connection_is_found_without_asking_the_mount(scenario: Scenario, mounts: Mounts,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Failing closed looks the connection up in mountinfo; resolving the mountpoint itself would ask
    its server, which may be the stuck one, or the caller itself. A path the kernel writes escaped
    (a space) is found too."""
    view = mounts.mount(scenario.alice_session, name="with space")
    expected = str(os.minor(os.stat(view).st_dev))
    asked: list[str] = []
    def watching(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            asked.append(os.fspath(path))
            return real(path, *args, **kwargs)
        return call

    for name in ("stat", "lstat"):
        monkeypatch.setattr(os, name, watching(getattr(os, name)))
    assert connection_of(str(view)) == expected
    monkeypatch.undo()
    assert str(view) not in asked


def test_a_stuck_invalidation_fails_the_mount_closed(scenario: Scenario, mounts: Mounts) -> None:
    """A process copies the cached listing of a folder into a mapping of a note of a second mount whose
    server is stopped: the listing's page stays locked until that server answers. A note of the folder
    is then removed, and the drop of the folder's pages waits on that lock, with every invalidation
    queued behind it. The mount must not serve on meanwhile: once its worker dropped nothing for
    ``watchdog.STALL_S`` while the kernel waited on no request of it, it fails closed."""
    large = os.urandom(1 << 16)  # a mapping of a page needs a note of a page at least
    scenario.cli("write", scenario.alice_session, "private/notes/large.md", stdin=large, check=True)
    scenario.cli("write", scenario.alice_session, "private/notes/gone.md", stdin=b"soon gone\n", check=True)
    view, other = mounts.mount(scenario.alice_session), mounts.mount(scenario.alice_session)
    connections = [str(os.minor(os.stat(where).st_dev)) for where in (view, other)]
    notes = view / "private" / "notes"
    assert sorted(os.listdir(notes)) == ["allergy.md", "gone.md", "large.md"]  # the kernel now holds this listing
    target = other / "private" / "notes" / "large.md"
    # Looked up and opened while its server answers (its first open tells the kernel to send no more);
    # its pages are never read before the listing.
    os.close(os.open(target, os.O_RDONLY))
    (stopped,) = view_servers(other)
    listing: subprocess.Popen[str] | None = None
    os.kill(stopped, signal.SIGSTOP)
    try:
        # In a process of its own: a descriptor of the stopped mount in this one would be closed by
        # every fork of it (the CLI's), and each close waits for that server's answer.
        listing = subprocess.Popen([sys.executable, "-c", LISTING, str(notes), str(target)], cwd=REPOSITORY,
                                   stdout=subprocess.PIPE, text=True)
        assert listing.stdout is not None and listing.stdout.readline().strip() == "listing"
        with contextlib.suppress(subprocess.TimeoutExpired):
            listing.wait(timeout=0.5)
        assert listing.returncode is None, "the listing did not wait for the stopped server"
        wait_until(lambda: (requests_waiting(connections[1]) or 0) >= 1)  # its READ waits at the stopped one
        scenario.cli("rm", scenario.alice_session, "private/notes/gone.md", check=True)
        # Only the log is looked at meanwhile: a request of the mount would count as its being busy.
        wait_until(lambda: STUCK in _mount_logs(scenario), timeout=STUCK_BOUND_S)
        assert errno_of(lambda: os.statvfs(view)) == errno.ENOTCONN  # statvfs is never answered from a cache
    except BaseException:
        for connection in connections:
            abort(connection)  # lets the listing and the clean-up end
        raise
    finally:
        os.kill(stopped, signal.SIGCONT)
        if listing is not None:
            try:
                copied, _ = listing.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                listing.kill()
                listing.communicate()
                raise
    assert listing.wait() == 0 and int(copied) > 0  # the stopped server answered: the copy ended
    assert target.read_bytes() == large  # and it serves on


def _mount_logs(scenario: Scenario) -> str:
    return "".join(log.read_text() for log in (scenario.cli.home / "mounts").glob("*.log"))


STUCK = "is stuck: the mount fails closed"  # what the watchdog logs: this abort, not any other
STUCK_BOUND_S = 30.0  # watchdog.STALL_S and the view change's own way to the mount, with room for a loaded machine
LISTING = """
import sys
from pathlib import Path
from tests.mountkit import getdents_into
print("listing", flush=True)
print(getdents_into(Path(sys.argv[1]), Path(sys.argv[2])), flush=True)
"""
REPOSITORY = Path(__file__).resolve().parents[1]
