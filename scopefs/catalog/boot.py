"""Which page cache a file lives in: the boot and the mount of its filesystem.

A revision committed without a disk sync (DESIGN.md §6, a close through a
mount) is safe for as long as the kernel's page cache that holds its bytes
lives: a SIGKILL of any process leaves it, only a power loss, a crash of
the kernel or an unmount ends it. So the catalog records, with each such
revision, the page cache it was written into, and recovery checks only
the revisions of a page cache that is gone: the boot (``boot_id`` changes
at every boot) or the mount of the home's filesystem (its unique mount id,
never reused within a boot, changes when the filesystem is unmounted and
mounted again, as after the power-loss tests' cut).
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
