"""The follow loop (``vfs.follow``) sees a commit whose fsync was slow, and an expiry, without its net.

inotify reports a commit's ``write(2)`` before its fsync, and the commit is
visible only after it; a loop that looked only at once and 0.1 s later
missed a commit whose fsync took longer, until ``FOLLOW_S`` (measured:
4.5-4.8 s for fsyncs of 0.3-0.6 s, in an independent review). The real
loop runs here over a real inotify watch of a real WAL database; another
process commits through a SQLite VFS whose sync of the log sleeps. The
mount is reduced to what the loop calls: ``view`` and ``sync``. The net,
``FOLLOW_S``, is put out of reach: whatever the loop sees, it saw by the
way under test, however slow the machine (no timing is asserted).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import apsw
import pytest
import trio

from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs import follow as follow_module
from scopefs.vfs.follow import QUIET_PATIENCE_S, Follow
from scopefs.vfs.mount import MountState
from scopefs.vfs.watch import DirectoryWatch
from tests.conftest import Scenario

SLOW_WRITER = r"""
import sys, time, apsw
path, delay = sys.argv[1], float(sys.argv[2])
slow = [0.0]

class File(apsw.VFSFile):
    def __init__(self, vfs, name, flags):
        self.log = (name.filename() if hasattr(name, "filename") else str(name)).endswith("-wal")
        super().__init__(vfs, name, flags)

    def xSync(self, flags):
        if self.log and slow[0]:
            time.sleep(slow[0])
        return super().xSync(flags)

class Vfs(apsw.VFS):
    def __init__(self):
        super().__init__("slow-sync", "")

    def xOpen(self, name, flags):
        return File("", name, flags)

vfs = Vfs()
conn = apsw.Connection(path, vfs="slow-sync")
conn.execute("PRAGMA journal_mode=WAL").fetchall()
conn.execute("PRAGMA synchronous=FULL")
slow[0] = delay
conn.execute("INSERT INTO t VALUES (1)")
print(time.monotonic(), flush=True)
conn.close()
"""


NET_OUT_OF_REACH_S = 3600.0  # FOLLOW_S in these tests: the net never fires within one
SEEN_BOUND_S = 30.0  # how long a test waits for what the loop must see (a functional bound, not a timing)


@pytest.fixture
def no_net(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow_module, "FOLLOW_S", NET_OUT_OF_REACH_S)


class _Access:
    def __init__(self) -> None:
        self.evidence_until: int | None = None


class _View:
    def __init__(self) -> None:
        self.valid_until: int | None = None
        self.access = _Access()


class _Mount:
    """What ``Follow._follow`` asks of a mount: its view's expiries, whether it is suspended or failing, and ``sync``
    (here: is the row there?)."""

    def __init__(self, database: Path) -> None:
        self.view = _View()
        self.suspended = self.failing = False  # no write of its own the view lacks, no refresh failing
        self.refresh_failed = trio.Event()
        self.seen_at: float | None = None
        self._fresh = 0
        self._reader = apsw.Connection(str(database))

    async def sync(self, since: int | None = None) -> None:
        if since is not None and self._fresh > since:
            return
        began = time.monotonic_ns()
        if self._reader.execute("SELECT count(*) FROM t").fetchall()[0][0] and self.seen_at is None:
            self.seen_at = time.monotonic()
        self._fresh = began


def _follow_alone(mount: object, watched: Path) -> Follow:
    """The loop alone, watching ``watched``: no reads, removals or commits to follow here."""
    follow = Follow.__new__(Follow)
    follow._mount = mount  # type: ignore[assignment]
    follow._watch = DirectoryWatch.open()
    assert follow._watch is not None, "inotify is part of every machine this runs on"
    follow._directories = lambda: {watched}  # type: ignore[method-assign]
    return follow


async def _until_seen(mount: _Mount | _Expiring | _Suspended | _FailedInARequest) -> None:
    with trio.move_on_after(SEEN_BOUND_S):
        while mount.seen_at is None:  # noqa: ASYNC110 - set by the loop under test, which signals nothing
            await trio.sleep(0.01)


def _seen_by_the_loop_alone(mount: _Mount | _Expiring | _Suspended | _FailedInARequest, folder: Path,
                            meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
    """The loop alone, watching ``folder``, until ``mount`` notes what it must see; ``meanwhile`` runs
    beside it (nothing else writes into the folder)."""
    async def main() -> None:
        follow = _follow_alone(mount, folder)
        assert follow._watch is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow._watch.run)
            nursery.start_soon(follow._follow)
            if meanwhile is not None:
                await meanwhile()
            await _until_seen(mount)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert mount.seen_at is not None


def test_a_commit_whose_fsync_is_slow_is_seen_without_the_net(tmp_path: Path, no_net: None) -> None:
    database = tmp_path / "state.sqlite"
    setup = apsw.Connection(str(database))
    setup.execute("PRAGMA journal_mode=WAL").fetchall()
    setup.execute("CREATE TABLE t (x)")
    setup.close()
    mount = _Mount(database)
    fsync_s = 0.4

    async def slow_write() -> None:
        await trio.sleep(0.3)
        await trio.run_process([sys.executable, "-c", SLOW_WRITER, str(database), str(fsync_s)])

    # seen by the look a second after the report: the net is out of reach
    _seen_by_the_loop_alone(mount, tmp_path, slow_write)


@pytest.mark.parametrize("until", ["evidence_until", "valid_until"])
def test_an_expiry_wakes_the_loop_when_nothing_else_does(tmp_path: Path, no_net: None, until: str) -> None:
    """Nothing is written when a role membership or a view's validity runs out: no inotify event wakes
    the loop, and it must wake at the expiry itself (``test_vfs_live`` shows the expiry on a mount)."""
    expiry = now_us() + 500_000
    mount = _Expiring(expiry)
    if until == "evidence_until":
        mount.view.access.evidence_until = expiry
    else:
        mount.view.valid_until = expiry

    _seen_by_the_loop_alone(mount, tmp_path)  # a folder nothing writes into


class _Expiring:
    """A mount whose view expires at ``expiry``: ``sync`` notes the first look after it."""

    def __init__(self, expiry: int) -> None:
        self.view = _View()
        self.suspended = self.failing = False
        self.refresh_failed = trio.Event()
        self.seen_at: float | None = None
        self._expiry = expiry

    async def sync(self, since: int | None = None) -> None:
        if self.seen_at is None and now_us() >= self._expiry:
            self.seen_at = time.monotonic()


def test_the_watch_waits_for_an_idle_catalog_thread_but_is_never_starved(scenario: Scenario,
                                                                         tmp_path: Path) -> None:
    """The watch reads its reports once the mount's catalog thread is idle (its own commits make most
    of them), and after ``QUIET_PATIENCE_S`` however busy that thread stays: a catalog thread that
    never idles (calls queued back to back) still lets a change elsewhere through."""
    home = Home.open(scenario.cli.home)
    mount = MountState(home, scenario.alice_session, build(home, scenario.alice_session))
    watched = tmp_path / "watched"
    watched.mkdir()

    async def main() -> tuple[float | None, float | None]:
        watch = DirectoryWatch.open()
        assert watch is not None
        watch.watch("g", {watched}, 0x100)  # IN_CREATE
        read_at: list[float] = []

        async def busy() -> None:
            while True:
                await mount.catalog(time.sleep, 0.05)

        async def quiet() -> None:
            await mount.catalog_quiet(QUIET_PATIENCE_S)
            read_at.append(time.monotonic())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run, quiet)
            await trio.sleep(0.1)
            # Idle: a report is read at once.
            (watched / "idle").write_bytes(b"")
            with trio.move_on_after(2):
                await watch.changed("g")
            idle_seen = time.monotonic()
            for _ in range(2):  # one call runs, one waits: the thread is never idle from here on
                nursery.start_soon(busy)
            await trio.sleep(0.2)
            # The watch, waiting on its descriptor, reads this one at once, then waits for quiet.
            (watched / "first").write_bytes(b"")
            with trio.fail_after(10):
                assert await watch.changed("g") == {"first"}
            await trio.sleep(0.1)
            started = time.monotonic()
            (watched / "busy").write_bytes(b"")
            busy_seen = None
            with trio.move_on_after(5):
                assert await watch.changed("g") == {"busy"}
                busy_seen = time.monotonic()
            nursery.cancel_scope.cancel()
        return (idle_seen if read_at else None), (busy_seen - started if busy_seen is not None else None)

    try:
        idle_seen, busy_delay = trio.run(main)
    finally:
        mount.artifacts.close()
        home.close()
    assert idle_seen is not None
    assert busy_delay is not None, "the watch was starved by a catalog thread that never idled"


class _Suspended:
    """A mount whose view lacks a write of its own (``MountState.suspended``): its refreshes fail
    ``failures`` times, then one succeeds, which resumes it (``seen_at``)."""

    def __init__(self, failures: int) -> None:
        self.view = _View()
        self.suspended, self.failing = True, True
        self.refresh_failed = trio.Event()
        self.seen_at: float | None = None
        self._failures = failures

    async def sync(self, since: int | None = None) -> None:
        if self._failures:
            self._failures -= 1
            raise OSError("injected: the catalog cannot be read yet")
        if self.seen_at is None:
            self.seen_at = time.monotonic()
            self.suspended = self.failing = False


def test_a_suspended_mount_looks_again_soon_though_nothing_wakes_it(tmp_path: Path, no_net: None) -> None:
    """A mount suspended by a refresh that failed after its own write serves nothing until one
    succeeds: the loop looks every ``POLL_S`` meanwhile, though no report comes and the net
    (``FOLLOW_S``) is out of reach, and it resumes once the catalog reads."""
    mount = _Suspended(failures=3)

    _seen_by_the_loop_alone(mount, tmp_path)  # a folder nothing writes into


class _FailedInARequest:
    """A mount whose refreshes read until a request's own refresh fails (``fail_in_a_request``), as
    ``MountState._refreshed`` records it; the follower's next refresh after that resumes it (``seen_at``)."""

    def __init__(self) -> None:
        self.view = _View()
        self.suspended = self.failing = False
        self.refresh_failed = trio.Event()
        self.seen_at: float | None = None

    def fail_in_a_request(self) -> None:
        self.suspended = self.failing = True  # after a write of its own: nothing is served meanwhile
        self.refresh_failed.set()

    async def sync(self, since: int | None = None) -> None:
        if self.failing and self.seen_at is None:
            self.seen_at = time.monotonic()
            self.suspended = self.failing = False


def test_a_refresh_failing_in_a_request_wakes_the_loop(tmp_path: Path, no_net: None) -> None:
    """A refresh that a request asked for fails while the loop sleeps with nothing to report and the net
    (``FOLLOW_S``) out of reach: the loop must look again itself, or the mount stays suspended,
    serving nothing, however soon the catalog reads again. (It slept until the net did.)"""
    mount = _FailedInARequest()

    async def fail_later() -> None:
        await trio.sleep(0.3)  # the loop is asleep by now, on a folder nothing writes into
        mount.fail_in_a_request()

    _seen_by_the_loop_alone(mount, tmp_path, fail_later)
    assert not mount.suspended
