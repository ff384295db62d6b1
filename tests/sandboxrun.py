"""What sandboxed runs leave on the host, for the sandbox tests.

``leftovers`` lists everything a ``scopefs run`` may create outside the
state directory: places under ``/run/scopefs/mounts``, control sockets,
held sandbox uids, scopefs mounts, sandbox mount servers and processes
running as a sandbox uid. A test compares it before and after, so that a run that leaks any of
them fails.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scopefs.sandbox import uids
from scopefs.sandbox.places import RUN_ROOT

MOUNTS = RUN_ROOT / "mounts"
UIDS = RUN_ROOT / "uids"
CONTROL = RUN_ROOT / "control"


@contextlib.contextmanager
def stdout_into(path: Path) -> Iterator[None]:
    """This process's descriptor 1 writes to ``path`` for the block: ``launch.run`` hands the
    sandbox the launcher's own stdout, and a test wants to read what the command printed."""
    with open(path, "wb") as sink:
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def sandbox_processes() -> set[tuple[int, int]]:
    """(pid, uid) of every process running as a sandbox uid."""
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if uids.UID_BASE <= uid < uids.UID_BASE + uids.UID_SPAN:
                found.add((int(entry.name), uid))
    return found


def server_processes() -> set[int]:
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if b"scopefs.sandbox.server" in Path(entry.path, "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def scopefs_mounts() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
        return {line.split()[4] for line in info if " - fuse.scopefs " in line
                and line.split()[4].startswith(str(RUN_ROOT))}


def leftovers() -> dict[str, set[Any]]:
    places = {p.name for p in MOUNTS.iterdir()} if MOUNTS.is_dir() else set()
    held = {int(p.name) for p in UIDS.iterdir() if p.name.isdigit() and uids.held(int(p.name))} \
        if UIDS.is_dir() else set()
    sockets = {p.name for p in CONTROL.iterdir()} if CONTROL.is_dir() else set()
    return {"places": places, "uids": held, "mounts": scopefs_mounts(), "servers": server_processes(),
            "processes": sandbox_processes(), "control": sockets}


def settle(before: dict[str, set[Any]], *, timeout: float = 15.0) -> dict[str, set[Any]]:
    """What is left beyond ``before``, once the host had ``timeout`` to clean up."""
    deadline = time.monotonic() + timeout
    while True:
        now = leftovers()
        extra = {key: now[key] - before[key] for key in now if now[key] - before[key]}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)
