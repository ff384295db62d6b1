"""How many mounts of a home are up now, counted without trusting the registry.

The registry (``$SCOPEFS_HOME/mounts/``) keeps a record per mount started
by ``scopefs mount`` and per kept sandbox mount (``scopefs session up``).
A record outlives a server that was killed, so a record alone proves
nothing: a mount counts only if its server process still runs (the pid
names that server's module, so a reused pid does not count), the kernel
shows a scopefs FUSE filesystem at its mount point, and (for plain
mounts) the mount answers ``statvfs`` within a short deadline instead of
``ENOTCONN`` (a stopped server that never answers is not up, and never
hangs the count). The mount a ``scopefs run`` starts for its command
alone is recorded while that command runs (``run-…``) and counted as a
``run``. Only counts leave this module: no session id, mount point or pid.
"""

from __future__ import annotations

import errno
import json
import os
import threading

from scopefs.catalog.home import Home
from scopefs.sandbox import mounts

SANDBOX_MODULE = "scopefs.sandbox.server"


ANSWER_DEADLINE_S = 2.0  # a live server answers statvfs in milliseconds


def _answers(mountpoint: str, deadline: float = ANSWER_DEADLINE_S) -> bool:
    """Whether the FUSE connection is alive: a dead server answers ``ENOTCONN``. A mount served to
    another uid may refuse us (``EACCES``), which still proves its server answers.

    A stopped or wedged server never answers and ``statvfs`` waits in the kernel for good, so it runs in a
    daemon thread and a server silent past ``deadline`` counts as not answering (the thread stays blocked
    until the server resumes or the mount goes, and never keeps the process from exiting)."""
    result: list[bool] = []

    def probe() -> None:
        try:
            os.statvfs(mountpoint)  # answered by the server itself, never from a cache
        except OSError as exc:
            result.append(exc.errno != errno.ENOTCONN)
        else:
            result.append(True)

    thread = threading.Thread(target=probe, name="scopefs-census-statvfs", daemon=True)
    thread.start()
    thread.join(deadline)
    return bool(result) and result[0]


def mounts_up(home: Home) -> dict[str, int]:
    """{"mount": n, "sandbox": m, "run": r}: live plain mounts, kept sandbox mounts, and the mounts
    ``scopefs run`` started for one command each, of this home."""
    counts = {"mount": 0, "sandbox": 0, "run": 0}
    registry = home.root / "mounts"
    try:
        names = sorted(os.listdir(registry))
    except FileNotFoundError:
        return counts
    for name in names:
        if "." in name:  # a ".log", ".lock" or unfinished ".tmp"
            continue
        try:
            record = json.loads((registry / name).read_text())
            pid, mountpoint = int(record["pid"]), str(record["mountpoint"])
            sandboxed = name.startswith((mounts.KEPT_RECORD_PREFIX, mounts.RUN_RECORD_PREFIX))
            module = str(record.get("module") or (SANDBOX_MODULE if sandboxed else mounts.SERVER_MODULE))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not mounts.server_alive(pid, module) or mounts.mounted_fstype(mountpoint) != mounts.FSTYPE:
            continue
        if sandboxed:  # served to the sandbox uid only: its gate answers, not a statvfs from here
            counts["run" if name.startswith(mounts.RUN_RECORD_PREFIX) else "sandbox"] += 1
        elif _answers(mountpoint):
            counts["mount"] += 1
    return counts
