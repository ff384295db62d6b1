"""Starting and stopping a session's mount from the command line.

``start`` runs the mount server (``python -m scopefs.vfs.server``) in its own
session and process group, waits until the mount answers, and records the
server in ``$SCOPEFS_HOME/mounts/`` (0700; file names are hashes of the
mount point, never identities). ``stop`` unmounts with ``fusermount3 -u``
and waits for the server to settle and exit.

A server that died (SIGKILL, OOM) leaves the kernel's mount behind. Its
callers do not hang: with the FUSE connection gone every access fails at
once with ``ENOTCONN`` ("Transport endpoint is not connected"). ``stop``
removes such a stale mount the same way; ``start`` refuses to mount over
one and says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scopefs.catalog.errors import BadInput, Denied, StorageError
from scopefs.catalog.home import Home

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
FSTYPE = "fuse.scopefs"


@dataclass(frozen=True)
class MountRecord:
    mountpoint: str
    session_id: str
    pid: int


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted_fstype(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at ``mountpoint``, if any (last one wins)."""
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) >= 5 and _unescape(fields[4]) == mountpoint:
                found = right.split()[0] if right else None
    return found


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


def check_mountpoint(mountpoint: str) -> None:
    """BadInput unless ``mountpoint`` is an empty directory nothing is mounted on."""
    fstype = mounted_fstype(mountpoint)
    if fstype is not None:
        if fstype == FSTYPE and _is_stale(mountpoint):
            raise BadInput(f"{mountpoint} holds a stale scopefs mount (its server died); "
                           f"run 'scopefs umount {mountpoint}' first")
        raise BadInput(f"{mountpoint} is already a mount point")
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
    """
    read_end, write_end = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--ready-fd", str(write_end), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd, pass_fds=(write_end,),
            start_new_session=True, close_fds=True,
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


def start(home: Home, session_id: str, mountpoint: str) -> MountRecord:
    """Mount in the background; returns once the mount answers."""
    mountpoint = absolute(mountpoint)
    check_mountpoint(mountpoint)
    record_path = _record_path(home, mountpoint)
    proc, _ = spawn_server("scopefs.vfs.server", ["--home", str(home.root), session_id, mountpoint],
                           Path(str(record_path) + ".log"))
    record = MountRecord(mountpoint, session_id, proc.pid)
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


def _load_record(path: Path) -> MountRecord | None:
    try:
        return MountRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def server_alive(pid: int, module: str = "scopefs.vfs.server") -> bool:
    """Whether ``pid`` is still a mount server of ``module`` (not a zombie, not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return module.encode() in cmdline


def await_exit(pid: int, module: str = "scopefs.vfs.server", timeout: float = STOP_TIMEOUT_S) -> None:
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
    record = _load_record(record_path)
    fstype = mounted_fstype(mountpoint)
    if fstype is None:
        record_path.unlink(missing_ok=True)
        raise BadInput(f"{mountpoint} is not mounted")
    if fstype != FSTYPE:
        raise BadInput(f"{mountpoint} is not a scopefs mount")
    done = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if "busy" in done.stderr.lower():
            raise StorageError(f"{mountpoint} is busy (a process is using it); close it and try again")
        raise StorageError(f"cannot unmount {mountpoint}: {done.stderr.strip()[:200]}")
    if record is not None:
        await_exit(record.pid)
    record_path.unlink(missing_ok=True)
    return record
