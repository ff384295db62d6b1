"""Ending a mount's connection at once, when its caches can no longer be trusted.

If the kernel refuses to drop a page or a name it holds (an invalidation
that fails for any reason but "not cached" or "already disconnected"), the
view it serves is no longer the one the server decided on. The mount then
fails closed: the connection is aborted through the kernel's FUSE control
filesystem, which fails every access, cached or not, of every process
with ``ENOTCONN`` and lets the kernel forget the pages. An unmount would
not do: a lazy unmount keeps the superblock and its pages alive for every
descriptor still open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess

log = logging.getLogger("scopefs.vfs")

CONTROL = "/sys/fs/fuse/connections"


def connection_of(mountpoint: str) -> str | None:
    """The FUSE connection number of the mount at ``mountpoint`` (its device's minor), from mountinfo."""
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 4 and fields[4] == target and " - fuse" in line:
                    return fields[2].split(":")[1]
    except OSError:
        return None
    return None


def abort(connection: str | None) -> bool:
    """Abort FUSE connection ``connection``; whether the kernel took it (the control filesystem
    is mounted first if it is not, as systemd does at boot)."""
    if connection is None or not connection.isdigit():
        return False
    path = os.path.join(CONTROL, connection, "abort")
    if not os.path.exists(path):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["mount", "-t", "fusectl", "fusectl", CONTROL], check=False, timeout=10,
                           capture_output=True)
    try:
        with open(path, "w", encoding="ascii") as control:
            control.write("1")
    except OSError as exc:
        log.error("the mount's connection could not be aborted (%s)", type(exc).__name__)
        return False
    return True
