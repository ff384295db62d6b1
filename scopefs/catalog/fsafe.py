"""Symlink-safe file primitives for the artifact area.

Artifacts are only ever opened beneath a held directory descriptor with
``openat2`` and RESOLVE_BENEATH | NO_SYMLINKS | NO_MAGICLINKS | NO_XDEV, then
checked with ``fstat``: a regular file, one link, on the store's device. A
planted symlink, hard link, FIFO, device or directory is refused before a
byte is read. Python 3.11 has no ``openat2`` wrapper; the raw syscall via
ctypes works on every kernel we support (5.6+), and its absence fails closed.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import stat

from scopefs.catalog.errors import StorageError

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
STRICT_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV

RENAME_NOREPLACE = 1

_SYSCALLS = {
    "x86_64": {"openat2": 437, "renameat2": 316},
    "aarch64": {"openat2": 437, "renameat2": 276},
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _syscall_number(name: str) -> int:
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        raise StorageError(f"unsupported architecture for {name}: {platform.machine()}")
    return table[name]


class UnsafeEntry(OSError):
    """An entry exists but is not a plain, single-link regular file (or dir)."""


def openat2(dirfd: int, name: str, flags: int, mode: int = 0, resolve: int = STRICT_RESOLVE) -> int:
    """``openat2(2)``; raises OSError with the kernel's errno."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(_syscall_number("openat2"), ctypes.c_int(dirfd), os.fsencode(name), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise StorageError("this kernel has no openat2; refusing to open artifacts without it")
        raise OSError(err, os.strerror(err), name)
    return int(fd)


def renameat2_noreplace(olddirfd: int, old: str, newdirfd: int, new: str) -> None:
    """Rename that fails with EEXIST instead of replacing the target."""
    res = _libc.syscall(_syscall_number("renameat2"), ctypes.c_int(olddirfd), os.fsencode(old),
                        ctypes.c_int(newdirfd), os.fsencode(new), ctypes.c_uint(RENAME_NOREPLACE))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), new)


def open_dir_beneath(dirfd: int, relpath: str) -> int:
    """A directory below ``dirfd``, refusing symlinks and mount crossings."""
    fd = openat2(dirfd, relpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    return fd


def open_dir(path: str | os.PathLike[str]) -> int:
    """A broker-owned directory by path (the home itself is trusted)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_regular(dirfd: int, name: str) -> tuple[int, os.stat_result]:
    """Open a single-link regular file directly below ``dirfd`` for reading.

    O_NONBLOCK keeps a planted FIFO from blocking the open; the fstat checks
    then refuse it along with devices, directories, sockets and hard links.
    """
    if not name or "/" in name or name in (".", ".."):
        raise UnsafeEntry(errno.EINVAL, "artifact names are single components", name)
    fd = openat2(dirfd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        dir_st = os.fstat(dirfd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeEntry(errno.EINVAL, "not a regular file", name)
        if st.st_nlink != 1:
            raise UnsafeEntry(errno.EMLINK, "artifact has more than one link", name)
        if st.st_dev != dir_st.st_dev:
            raise UnsafeEntry(errno.EXDEV, "artifact is on another device", name)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable; StorageError if the disk says no.

    The one place a directory is synced by path (new names in the home, the
    agent cell, a database's -wal). A failure is final, never retried.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"cannot sync a directory of the scopefs home: {os.strerror(exc.errno or 0)}") from exc


def lock_held(name: str | os.PathLike[str], *, dir_fd: int | None = None) -> bool:
    """Whether a live process holds an exclusive ``flock`` on the file (a missing file holds none).

    Owners of staging files and sandbox uids keep such a lock for their
    lifetime; the kernel drops it when they die, so this tells a live owner
    from a crashed one without any pid bookkeeping.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False
