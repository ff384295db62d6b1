"""Starting and stopping a session's mount from the command line.

``start`` runs the mount server (``python -m scopefs.vfs.server``) in its own
session and process group, waits until the mount answers, and records the
server in ``$SCOPEFS_HOME/mounts/`` (0700; file names are hashes of the
mount point, never identities). ``stop`` unmounts with ``fusermount3 -u``
and waits for the server to settle and exit.

Checking a mount point and mounting on it is one step (``claim``): a lock
file of the registry (per mount point) is held from the check to the
record, and an ``flock`` on the directory itself keeps other homes out
too, so concurrent mounts on one directory never stack (one wins, the
others are told it is a mount point already). ``stop`` takes the same
registry lock. A mount point inside the home or inside ``/run/scopefs``,
or one that holds either, is refused: a view mounted there would hide
the broker's own files from the broker.

A mount served to one uid (``scopefs mount --for-uid``, ``sandbox.external``)
is stopped by signalling its server instead: a container may hold a bind
of it, which an unmount of the mount point would leave served.

A server that died (SIGKILL, OOM) leaves the kernel's mount behind. Its
callers do not hang: with the FUSE connection gone every access fails at
once with ``ENOTCONN`` ("Transport endpoint is not connected"). ``stop``
removes such a stale mount the same way; ``start`` refuses to mount over
one and says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from scopefs.catalog.errors import BadInput, Conflict, Denied, StorageError
from scopefs.catalog.home import Home
from scopefs.sandbox.places import RUN_ROOT
from scopefs.vfs.mountinfo import last_mount_at

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
FSTYPE = "fuse.scopefs"
SERVER_MODULE = "scopefs.vfs.server"
# Registry record names beside a plain mount's (a hash of its mount point): a kept sandbox mount's (a hash
# of its session id, ``sandbox.sessions``) and a run's own mount's (a random token). ``sandbox.census``
# tells the three apart by these.
KEPT_RECORD_PREFIX = "sandbox-"
RUN_RECORD_PREFIX = "run-"


@dataclass(frozen=True)
class MountRecord:
    mountpoint: str
    session_id: str
    pid: int
    module: str = SERVER_MODULE  # the server's module (records written before it existed name none)


def mounted_fstype(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at ``mountpoint``, if any (last one wins)."""
    entry = last_mount_at(mountpoint)
    return (entry.fstype or None) if entry is not None else None


def _registry(home: Home) -> Path:
    path = home.root / "mounts"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _record_path(home: Home, mountpoint: str) -> Path:
    return _registry(home) / hashlib.sha256(mountpoint.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def absolute(mountpoint: str) -> str:
    # realpath, not resolve(): it must not fail on a stale mount (ENOTCONN).
    return os.path.realpath(os.path.abspath(mountpoint))


def _is_stale(mountpoint: str) -> bool:
    try:
        os.statvfs(mountpoint)  # never answered from the kernel's attribute cache
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


class RegistryLock:
    """An exclusive ``flock`` on a lock file of the home's registry, held until ``release``.

    It makes a check and what the check allows (starting a server and
    recording it, or stopping one and removing its record) one step for
    every scopefs process of the home: the waiting process then sees what
    the first one did. The holder removes the file before it lets go, so
    the registry keeps no lock files; a waiter that then gets the lock of
    a removed file sees that it is no longer the file at that name and
    tries again. Names are hashes, never identities.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1
        while self._fd < 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            if _is_at(fd, path):
                self._fd = fd
            else:
                os.close(fd)  # its holder removed it: lock the file now at that name

    def release(self) -> None:
        """Remove the lock file and let the next process in (idempotent)."""
        if self._fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RegistryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file that ``path`` names now."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def registry_lock(home: Home, name: str) -> RegistryLock:
    """Lock ``$SCOPEFS_HOME/mounts/<name>.lock`` (``name`` is a hash)."""
    return RegistryLock(_registry(home) / f"{name}.lock")


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def check_outside_broker(home: Home, mountpoint: str) -> None:
    """BadInput if ``mountpoint`` is in the home or /run/scopefs, or holds either (both sides resolved).

    A view mounted inside the home hides the folder it covers from the
    broker (every write through staging fails); one over a folder that
    holds the home or /run/scopefs hides the catalog, or the sandbox
    places, control sockets and uid locks, from every scopefs process.
    """
    for label, folder in (("the scopefs home", home.root), ("/run/scopefs", RUN_ROOT)):
        broker = os.path.realpath(folder)
        if mountpoint == broker:
            raise BadInput(f"mount point {mountpoint} is {label}; choose a directory outside it")
        if _inside(mountpoint, broker):
            raise BadInput(f"mount point {mountpoint} is inside {label}; choose a directory outside it")
        if _inside(broker, mountpoint):
            raise BadInput(f"mount point {mountpoint} holds {label}; choose a directory outside it")


def check_mountpoint(mountpoint: str) -> None:
    """BadInput unless ``mountpoint`` is an empty directory; Conflict if something is mounted on it
    (exit 1, as when a concurrent writer won: whoever mounted there first keeps it)."""
    fstype = mounted_fstype(mountpoint)
    if fstype is not None:
        if fstype == FSTYPE and _is_stale(mountpoint):
            raise BadInput(f"{mountpoint} holds a stale scopefs mount (its server died); "
                           f"run 'scopefs umount {mountpoint}' first")
        raise Conflict(f"{mountpoint} is already a mount point")
    if not os.path.isdir(mountpoint):
        raise BadInput(f"mount point {mountpoint} is not a directory")
    with os.scandir(mountpoint) as entries:
        if any(True for _ in entries):
            raise BadInput(f"mount point {mountpoint} is not empty")


def _raise_reported(line: str) -> None:
    """Re-raise the error the server reported as ``error {json}``."""
    try:
        report = json.loads(line.removeprefix("error "))
        code, reason, message = int(report["code"]), str(report.get("reason") or ""), str(report["message"])
    except (ValueError, KeyError, TypeError):
        raise StorageError("the mount server failed to start") from None
    if code == 3:
        raise Denied(reason or "outside-view", message)
    raise (BadInput if code == 2 else StorageError)(message)


def spawn_server(module: str, args: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    """Start a mount server (``python -m module``) and wait for its readiness line.

    The server gets its own session, a ``--ready-fd`` and a log file; the
    readiness details it reports (``ready {json}``) are returned. A
    failure to start comes back as the error the server reported.

    It runs in ``/`` with ``-P``: ``python -m`` would otherwise put the
    caller's working directory first on the server's import path, so a
    ``scopefs`` folder there (one a tool left in ``/tmp``, or anyone's in
    a shared folder) would be what the server runs, with the home's keys;
    and a server started in a folder would keep it busy (an unmount of the
    disk it is on would fail) for as long as it serves. ``args`` name files
    by absolute paths for the same reason. ``PYTHONPATH`` still applies.
    """
    read_end, write_end = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", module, "--ready-fd", str(write_end), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd, pass_fds=(write_end,),
            start_new_session=True, close_fds=True, cwd="/",
        )
    finally:
        os.close(write_end)
        os.close(log_fd)
    try:
        line = _read_line(read_end, START_TIMEOUT_S)
    finally:
        os.close(read_end)
    if line != "ready" and not line.startswith("ready "):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        if line.startswith("error "):
            _raise_reported(line)
        raise StorageError("the mount server did not start in time" if line == "" else line)
    try:
        details = json.loads(line[len("ready "):]) if line != "ready" else {}
    except ValueError:
        details = {}
    return proc, details if isinstance(details, dict) else {}


def _hold_directory(mountpoint: str) -> int:
    """An exclusive ``flock`` on the mount point's own directory: it keeps out a mount by another home
    (whose registry lock is another file) until this one has mounted or given up."""
    try:
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        check_mountpoint(mountpoint)  # it changed under us: say what it is now
        raise BadInput(f"mount point {mountpoint} cannot be opened") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def claim(home: Home, mountpoint: str) -> Iterator[Callable[[], None]]:
    """Hold ``mountpoint`` (absolute and resolved) for one mount; yields the function that lets go.

    Refuses, with BadInput, a mount point in or around the broker's
    folders, one something is mounted on (ours or not), a non-directory
    and a non-empty one. The check is made again once the locks are held,
    so of concurrent mounts on one directory only the first mounts; the
    caller lets go once its mount answers (or at the end of the block).
    """
    check_outside_broker(home, mountpoint)
    lock = registry_lock(home, _record_path(home, mountpoint).name)
    fd = -1

    def let_go() -> None:
        nonlocal fd
        if fd >= 0:
            os.close(fd)
            fd = -1
        lock.release()

    try:
        check_mountpoint(mountpoint)  # from mountinfo first: never open a directory something is mounted on
        fd = _hold_directory(mountpoint)
        check_mountpoint(mountpoint)  # another home may have mounted here while we waited
        yield let_go
    finally:
        let_go()


def start(home: Home, session_id: str, mountpoint: str, *, module: str = SERVER_MODULE,
          options: tuple[str, ...] = ()) -> MountRecord:
    """Mount in the background; returns once the mount answers.

    ``module`` serves it (``python -m module --home H [options] SESSION
    MOUNTPOINT``): the plain view by default, ``scopefs.sandbox.external``
    for a mount served to one uid.
    """
    mountpoint = absolute(mountpoint)
    record_path = _record_path(home, mountpoint)
    with claim(home, mountpoint):
        proc, _ = spawn_server(module, ["--home", os.path.abspath(home.root), *options, session_id, mountpoint],
                               Path(str(record_path) + ".log"))
        record = MountRecord(mountpoint, session_id, proc.pid, module)
        write_record(record_path, record.__dict__)
    return record


def write_record(path: Path, record: dict[str, object]) -> None:
    """Replace a registry record atomically (0600)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "replace")[:1000]


def live_records(home: Home) -> list[MountRecord]:
    """The registry's records whose server still runs (a record left by a server that ended is skipped)."""
    found = []
    for path in sorted(_registry(home).iterdir()):
        if path.suffix:  # a ".log" or an unfinished ".tmp"
            continue
        record = _load_record(path)
        if record is not None and server_alive(record.pid, record.module):
            found.append(record)
    return found


def _load_record(path: Path) -> MountRecord | None:
    try:
        return MountRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def server_alive(pid: int, module: str = SERVER_MODULE) -> bool:
    """Whether ``pid`` is still a mount server of ``module`` (not a zombie, not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return module.encode() in cmdline


def await_exit(pid: int, module: str = SERVER_MODULE, timeout: float = STOP_TIMEOUT_S) -> None:
    """Wait for a mount server to finish its shutdown; SIGKILL it if it will not."""
    deadline = time.monotonic() + timeout
    while server_alive(pid, module) and time.monotonic() < deadline:
        time.sleep(0.01)
    if server_alive(pid, module):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop(home: Home, mountpoint: str) -> MountRecord | None:
    """Unmount and wait for the server to exit; also clears a stale mount."""
    mountpoint = absolute(mountpoint)
    record_path = _record_path(home, mountpoint)
    with registry_lock(home, record_path.name):
        return _stop_locked(mountpoint, record_path)


def _stop_locked(mountpoint: str, record_path: Path) -> MountRecord | None:
    """``stop`` with the mount point's registry lock held (so no mount starts or record changes meanwhile)."""
    record = _load_record(record_path)
    fstype = mounted_fstype(mountpoint)
    if fstype is None:
        record_path.unlink(missing_ok=True)
        raise BadInput(f"{mountpoint} is not mounted")
    if fstype != FSTYPE:
        raise BadInput(f"{mountpoint} is not a scopefs mount")
    if record is not None and record.module != SERVER_MODULE and server_alive(record.pid, record.module):
        _stop_by_signal(record)
        if mounted_fstype(mountpoint) is None:
            record_path.unlink(missing_ok=True)
            return record
    done = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if "busy" in done.stderr.lower():
            raise StorageError(f"{mountpoint} is busy (a process is using it); close it and try again")
        raise StorageError(f"cannot unmount {mountpoint}: {done.stderr.strip()[:200]}")
    if record is not None:
        await_exit(record.pid, record.module)
    record_path.unlink(missing_ok=True)
    return record


def _stop_by_signal(record: MountRecord) -> None:
    """Stop a server whose mount may be bound elsewhere (a container's ``/memory``), and wait.

    Unmounting the mount point would not end such a server: a bind holds
    the filesystem, and the server would go on serving it. On SIGTERM the
    server refuses everyone, drops the view's pages and closes its
    connection, so every bind of it fails with ``ENOTCONN`` from then on.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    await_exit(record.pid, record.module)
