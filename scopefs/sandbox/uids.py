"""Unprivileged host uids for sandboxes, one per running session mount.

bubblewrap started by root runs its sandbox as host uid 0 whatever
``--uid`` says, so every sandboxed session gets a host uid of its own that
nothing else on the machine uses. An allocation is an exclusive ``flock``
on ``/run/scopefs/uids/<uid>``: it lasts exactly as long as the process
holding the lock (the session's mount server), so a crash never leaks one.
A uid is also skipped while any process still runs as it, or when the
system's user database or subordinate-id ranges name it.

The range sits far above login users and the usual ``/etc/subuid`` ranges.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

from scopefs.catalog.errors import StorageError
from scopefs.catalog.fsafe import lock_held
from scopefs.sandbox.places import RUN_ROOT, run_dir

UID_BASE = 0x5C0F_0000  # 1,544,486,912
UID_SPAN = 1 << 16
ATTEMPTS = 64


@dataclass
class Allocation:
    """A uid held by this process until ``release`` or exit."""

    uid: int
    lock_fd: int

    def release(self) -> None:
        """Kill what still runs as the uid, then free it."""
        if self.lock_fd >= 0:
            kill_processes(self.uid)
            with contextlib.suppress(OSError):
                (RUN_ROOT / "uids" / str(self.uid)).unlink()
            os.close(self.lock_fd)
            self.lock_fd = -1


def _in_use(uid: int) -> bool:
    """Whether a process runs as ``uid`` or the system names it (passwd, subuid)."""
    return bool(processes_of(uid)) or _named_by_system(uid)


def _named_by_system(uid: int) -> bool:
    try:
        import pwd
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    for table in ("/etc/subuid", "/etc/subgid"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[:10_000]:
                fields = line.split(":")
                if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                    start, count = int(fields[1]), int(fields[2])
                    if start <= uid < start + count:
                        return True
    return False


def _still_linked(fd: int, path: Path) -> bool:
    """Whether the locked file is still the one at ``path`` (a releaser may have unlinked it)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def allocate() -> Allocation:
    """A uid no other sandbox holds and nothing else uses."""
    locks = run_dir("uids", 0o700)
    for _ in range(ATTEMPTS):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        fd = os.open(locks / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _still_linked(fd, locks / str(uid)) or _in_use(uid):
            os.close(fd)
            continue
        return Allocation(uid, fd)
    raise StorageError("no free sandbox uid (all tried were in use)")


def held(uid: int) -> bool:
    """Whether a live process holds ``uid`` (its lock cannot be taken right now)."""
    return lock_held(RUN_ROOT / "uids" / str(uid))


def sweep() -> None:
    """Remove the lock files of uids nobody holds (left by servers that were killed).

    Each file is unlinked only while this process holds its lock, so an
    allocator racing with the sweep either finds the file gone from its
    path (``_still_linked``) and tries another uid, or holds the lock first
    and keeps the file.
    """
    locks = RUN_ROOT / "uids"
    if not locks.is_dir():
        return
    for path in locks.iterdir():
        if not path.name.isdigit():
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _still_linked(fd, path):
                path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)


def _process_owners() -> dict[int, int]:
    """pid -> uid of every process now (the owner of its /proc entry)."""
    owners = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    owners[int(entry.name)] = entry.stat(follow_symlinks=False).st_uid
    return owners


def processes_of(uid: int) -> list[int]:
    """Pids of the processes running as ``uid`` now."""
    return [pid for pid, owner in _process_owners().items() if owner == uid]


def kill_orphans() -> None:
    """Kill processes that run as a sandbox uid nobody holds (their launcher and server are gone)."""
    for uid in set(_process_owners().values()):
        if in_range(uid) and not held(uid):
            kill_processes(uid)


def kill_processes(uid: int) -> None:
    """SIGKILL every process running as ``uid``: the holder of a sandbox uid does this as it lets go.

    A launcher killed in bwrap's first milliseconds can leave bwrap's child
    waiting forever for a parent that is gone (its own parent-death signal
    is not set yet). Whoever holds the uid is its owner and ends it. Each
    process is held by a pidfd and checked to be still ``uid`` before the
    signal, so a pid reused meanwhile is never hit.
    """
    for pid in processes_of(uid):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def in_range(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + UID_SPAN
