"""Names for what a boot ends: the page cache a file lives in, and one run of a process.

A revision committed without a disk sync (DESIGN.md §6, a close through a
mount) is safe for as long as the kernel's page cache that holds its bytes
lives: a SIGKILL of any process leaves it, only a power loss, a crash of
the kernel or an unmount ends it. So the catalog records, with each such
revision, the page cache it was written into, and recovery checks only
the revisions of a page cache that is gone: the boot (``boot_id`` changes
at every boot) or the mount of the home's filesystem (its unique mount id,
never reused within a boot, changes when the filesystem is unmounted and
mounted again, as after the power-loss tests' cut).

A run of a process is named the same way (``run_mark``), so that what a
command left behind when it was killed can be told from what a command
still running holds (the broker's sessions, ``catalog.broker_sessions``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

_STATX = {"x86_64": 332, "aarch64": 291}
_STATX_MNT_ID_UNIQUE = 0x4000  # Linux 6.8
_STATX_MNT_ID = 0x1000  # Linux 5.8; reused after an unmount, still tells a remount from no remount in practice
_MNT_ID_OFFSET = 0x90  # struct statx: stx_mnt_id
_AT_STATX_DONT_SYNC = 0x4000
_ENDED = ("Z", "X", "x")  # /proc/PID/stat states of a process that has exited: zombie, dead

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()[:64]
    except OSError:
        return "no-boot-id"


def _mount_id(path: Path) -> str:
    """The unique id of the mount ``path`` is on ('u…'), the reusable one ('m…'), or '' if neither."""
    number = _STATX.get(platform.machine())
    if number is None:
        return ""
    buf = ctypes.create_string_buffer(256)
    result = _libc.syscall(number, ctypes.c_int(-100), os.fsencode(path), ctypes.c_int(_AT_STATX_DONT_SYNC),
                           ctypes.c_uint(_STATX_MNT_ID_UNIQUE | _STATX_MNT_ID), buf)
    if result != 0:
        return ""
    mask = int.from_bytes(buf.raw[0:4], "little")
    mnt_id = int.from_bytes(buf.raw[_MNT_ID_OFFSET:_MNT_ID_OFFSET + 8], "little")
    if mask & _STATX_MNT_ID_UNIQUE:
        return f"u{mnt_id}"
    return f"m{mnt_id}" if mask & _STATX_MNT_ID else ""


def page_cache_of(path: Path) -> str:
    """A name for the page cache that holds files under ``path`` now: equal while it lives."""
    return f"{_boot_id()}/{_mount_id(path)}"


def run_mark(pid: int | None = None) -> str:
    """A name for one run of a process (this one by default): its boot, pid and start time.

    A pid alone is reused; with the boot and the start time (clock ticks
    after boot, ``/proc/PID/stat``) it names one process for good, so a
    record that a run left can tell whether that run is still going.
    """
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}/{pid}/{_started(pid)}"


def running(mark: str) -> bool:
    """Whether the run ``run_mark`` named is still going (on this machine, in this boot).

    A run that has exited but is not reaped yet (a zombie) is gone: it can
    hold nothing and do nothing more, and its parent may never reap it. (A
    main thread that ended while other threads of its process go on shows
    the same state: that process still runs.)
    """
    boot, _, rest = mark.partition("/")
    pid, _, started = rest.partition("/")
    if boot != _boot_id() or not pid.isdigit() or not started:
        return False
    fields = _stat_fields(int(pid))
    if len(fields) <= 19 or fields[19] != started:
        return False
    return fields[0] not in _ENDED or _other_threads(int(pid))


def _other_threads(pid: int) -> bool:
    """Whether the process still has a thread besides its main one (which has ended)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _started(pid: int) -> str:
    """The process's start time after boot, in clock ticks ('' if there is no such process)."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: the state first, the start time 20th
    ([] if there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()[:4096]
    except OSError:
        return []
    # The command name (field 2) is in parentheses and may hold anything: the fields after it
    # start after its last ')'.
    return stat[stat.rfind(b")") + 2:].decode("ascii", "replace").split()
