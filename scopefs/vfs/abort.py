"""Ending a mount's connection at once, when its caches can no longer be trusted.

If the kernel refuses to drop a page or a name it holds (an invalidation
that fails for any reason but "not cached" or "already disconnected"), the
view it serves is no longer the one the server decided on. The mount then
fails closed: the connection is aborted through the kernel's FUSE control
filesystem, which fails every access, cached or not, of every process
with ``ENOTCONN`` and lets the kernel forget the pages. An unmount would
not do: a lazy unmount keeps the superblock and its pages alive for every
descriptor still open. The same filesystem tells how many requests of the
connection the kernel is waiting on (``vfs.watchdog``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess

from scopefs.vfs.mountinfo import last_mount_at

log = logging.getLogger("scopefs.vfs")

CONTROL = "/sys/fs/fuse/connections"


def connection_of(mountpoint: str) -> str | None:
    """The FUSE connection number of the mount at ``mountpoint`` (its device's minor), from mountinfo;
    the last one mounted there, as the kernel resolves the path. Callers pass a resolved path (the
    CLI does).

    Only the folder above is resolved: resolving the mountpoint itself
    would ask the mount for its root's attributes, and the server that
    fails closed may be the one that would have to answer.
    """
    path = mountpoint.rstrip("/") or "/"
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    above, name = os.path.split(path)
    try:
        entry = last_mount_at(os.path.join(os.path.realpath(above), name))
    except OSError:
        return None
    if entry is None or not (entry.fstype == "fuse" or entry.fstype.startswith("fuse.")):
        return None
    return entry.device.partition(":")[2] or None


def abort(connection: str | None) -> bool:
    """Abort FUSE connection ``connection``; whether the kernel took it."""
    path = _control_file(connection, "abort")
    if path is None:
        return False
    if not os.path.exists(path):
        ensure_control()
    try:
        with open(path, "w", encoding="ascii") as control:
            control.write("1")
    except OSError as exc:
        log.error("the mount's connection could not be aborted (%s)", type(exc).__name__)
        return False
    return True


def requests_waiting(connection: str | None) -> int | None:
    """How many requests of FUSE connection ``connection`` the kernel has queued or awaits an answer
    to (background ones too, not the ones it sends whatever happens); None if that cannot be read.
    Asks nothing of the mount itself, and mounts nothing (``ensure_control``, at the mount's start)."""
    path = _control_file(connection, "waiting")
    if path is None:
        return None
    try:
        with open(path, "rb") as control:
            return int(control.read(32))
    except (OSError, ValueError):
        return None


def ensure_control() -> None:
    """Mount the kernel's FUSE control filesystem if it is not (as systemd does at boot): failing closed
    and telling a stuck drop from a busy mount need it, and mounting it then would block the loop."""
    try:
        if os.listdir(CONTROL):
            return  # mounted: it lists every connection
    except OSError:
        return  # no such folder: nothing to mount it on
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["mount", "-t", "fusectl", "fusectl", CONTROL], check=False, timeout=10,
                       capture_output=True)


def _control_file(connection: str | None, name: str) -> str | None:
    if connection is None or not connection.isdigit():
        return None
    return os.path.join(CONTROL, connection, name)
