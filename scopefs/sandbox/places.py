"""Where sandbox mounts live on the host, and how their servers are tied to a launcher.

``/run/scopefs`` (0711, root) holds ``uids/`` (0700: one lock file per
allocated uid), ``mounts/`` (0711: one ``<random>/memory`` per sandbox
mount, the ``<random>`` directory 0700 and owned by the session's uid) and
``control/`` (0700: the servers' control sockets). Names are random and
never identities; everything is removed when its server exits, and what a
killed server left is swept by the next launcher.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import stat
from pathlib import Path

from scopefs.catalog.errors import StorageError

RUN_ROOT = Path("/run/scopefs")
PR_SET_PDEATHSIG = 1


def _own_dir(path: Path, mode: int) -> None:
    """Make ``path`` (if missing) and insist it is a real directory owned by root; then set ``mode``."""
    path.mkdir(mode=mode, exist_ok=True)
    st = path.lstat()
    if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode):  # lstat: a symlink is not a directory
        raise StorageError(f"{path} is not a root-owned directory; refusing to use it")
    os.chmod(path, mode)


def run_dir(name: str, mode: int) -> Path:
    """``/run/scopefs/<name>``, owned by root with ``mode`` (created if missing)."""
    _own_dir(RUN_ROOT, 0o711)
    path = RUN_ROOT / name
    _own_dir(path, mode)
    return path


def mounts_dir() -> Path:
    return run_dir("mounts", 0o711)


def control_dir() -> Path:
    return run_dir("control", 0o700)


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``sig`` when the parent dies (called in the child, before exec)."""
    if libc().prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
