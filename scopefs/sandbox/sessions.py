"""A session's sandbox mount: started for one command, or kept up for many.

``scopefs run`` needs a mount that only sandboxes can use (see
``scopefs.sandbox.server``). Starting one costs a mount server and a view build,
so a session that runs many commands keeps one up (``scopefs session up``)
and every ``run`` reuses it: only the sandbox is per command. Without a
kept mount, ``run`` starts one for its command and stops it afterwards;
that server is tied to the launcher (the kernel sends it SIGTERM if the
launcher dies), so nothing outlives a killed launcher.

Kept mounts are recorded in ``$SCOPEFS_HOME/mounts/`` under a hash of the
session id, never the id itself; a run's own mount is recorded there too,
under a random name (``run-…``), for as long as its command runs, so that
``scopefs stats`` counts it (``sandbox.census``). A killed launcher's record
outlives its server; the census does not count it, and the next run removes
it. ``keep`` and ``release`` hold the
session's lock file there (same hash) from the check to the record, so of
concurrent ``session up`` calls exactly one starts a server, and ``session
down`` always finds the one that is up.

A kept mount was authorized when its server started, but the session's
evidence can go later (a revoked binding empties the view, the server
stays). ``for_run`` therefore authorizes the session on every run, kept
mount or not, exactly as a server starting for one command would: a
revoked session is refused (exit 3) and nothing runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from scopefs.catalog import ids
from scopefs.catalog.access import authorize_session
from scopefs.catalog.errors import BadInput, Conflict, StorageError
from scopefs.catalog.home import Home
from scopefs.catalog.human import check_served
from scopefs.catalog.policy import Op
from scopefs.sandbox import mounts, uids
from scopefs.sandbox.launch import Target
from scopefs.sandbox.places import control_dir, mounts_dir

FRESH_S = 60.0
SERVER_MODULE = "scopefs.sandbox.server"


def _record_path(home: Home, session_id: str) -> Path:
    digest = hashlib.sha256(b"sandbox\0" + session_id.encode()).hexdigest()[:32]
    registry = home.root / "mounts"
    registry.mkdir(mode=0o700, exist_ok=True)
    return registry / f"{mounts.KEPT_RECORD_PREFIX}{digest}"


def _lock(home: Home, session_id: str) -> mounts.RegistryLock:
    """The session's lock: held by ``keep`` and ``release`` across check, start or stop, and record."""
    return mounts.registry_lock(home, _record_path(home, session_id).name)


def _target(details: dict[str, object]) -> Target:
    try:
        uid = details["uid"]
        if not isinstance(uid, (int, str)):
            raise TypeError("uid")
        return Target(int(uid), str(details["mountpoint"]), str(details["control"]), bool(details["writable"]))
    except (KeyError, TypeError, ValueError):
        raise StorageError("the sandbox mount server reported nothing usable") from None


def start(home: Home, session_id: str, *, tied: bool) -> tuple[subprocess.Popen[bytes], Target]:
    """Start a sandbox mount server; ``tied`` makes it end with this process.

    A browse (human) session is refused here, the one place a run's mount and
    a kept mount both start: its view goes to its own user through ``scopefs
    browse`` alone, never into a sandbox (writable, and not owner-only).
    """
    check_served(home, session_id, None)
    sweep()
    log = _record_path(home, session_id).with_suffix(".log")
    tie = ["--die-with-parent", str(os.getpid())] if tied else []
    proc, details = mounts.spawn_server(SERVER_MODULE, ["--home", os.path.abspath(home.root), *tie, session_id],
                                        log)
    return proc, _target(details)


def stop_server(pid: int, mountpoint: str | None = None) -> None:
    """SIGTERM a sandbox mount server and wait; SIGKILL and lazy-unmount if it will not go."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    mounts.await_exit(pid, SERVER_MODULE)
    if mountpoint is not None:
        _clear(Path(mountpoint).parent)


def _clear(place: Path) -> None:
    """Detach whatever a dead server left at ``place/memory``; remove the directories and its socket."""
    mountpoint = place / "memory"
    if mounts.mounted_fstype(str(mountpoint)) is not None:
        subprocess.run(["umount", "--lazy", str(mountpoint)], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        mountpoint.rmdir()
    with contextlib.suppress(OSError):
        place.rmdir()
    with contextlib.suppress(OSError):
        (control_dir() / f"{place.name}.sock").unlink()


def sweep() -> None:
    """Remove places under /run/scopefs/mounts whose server is gone (its uid lock is free),
    their control sockets, and the lock files of uids nobody holds."""
    root = mounts_dir()
    with os.scandir(root) as entries:
        places = [Path(entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)]
    for place in places:
        try:
            st = place.lstat()
        except OSError:
            continue
        if st.st_uid == 0 and time.time() - st.st_mtime < FRESH_S:
            continue  # a server is still making it (it is chowned to the session uid next)
        if not uids.held(st.st_uid):
            _clear(place)
    _sweep_control(root)
    uids.kill_orphans()
    uids.sweep()


def _sweep_control(places_root: Path) -> None:
    """Remove control sockets whose place is gone (their server was killed)."""
    with os.scandir(control_dir()) as entries:
        sockets = [Path(entry.path) for entry in entries if entry.name.endswith(".sock")]
    for path in sockets:
        with contextlib.suppress(OSError):
            if not (places_root / path.stem).exists():  # a server makes its place before its socket
                path.unlink()


def kept(home: Home, session_id: str) -> tuple[int, Target] | None:
    """The session's kept mount, if its server is still serving."""
    path = _record_path(home, session_id)
    try:
        record = json.loads(path.read_text())
        pid, target = int(record["pid"]), _target(record)
    except (OSError, ValueError, KeyError, TypeError, StorageError):
        return None
    if not mounts.server_alive(pid, SERVER_MODULE) or mounts.mounted_fstype(target.mountpoint) != mounts.FSTYPE:
        return None
    return pid, target


@contextlib.contextmanager
def recorded_run(home: Home, pid: int, target: Target) -> Iterator[None]:
    """Record a run's own mount server (``pid``, serving ``target``) in the registry while the block runs.

    The record names no session (a random name, the server's pid and mount point); it only lets the
    census count the mount, so it never stands in the command's way: a registry that cannot be
    written (a full or read-only disk) leaves the run unrecorded. Records of runs whose server is
    gone (a SIGKILLed launcher) go first."""
    registry = home.root / "mounts"
    path = registry / f"{mounts.RUN_RECORD_PREFIX}{ids.random_token()}"
    try:
        registry.mkdir(mode=0o700, exist_ok=True)
        _sweep_runs(registry)
        mounts.write_record(path, {"pid": pid, "module": SERVER_MODULE, **target.__dict__})
    except OSError:
        with contextlib.suppress(OSError):
            path.with_suffix(".tmp").unlink(missing_ok=True)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _sweep_runs(registry: Path) -> None:
    """Remove the run records whose server no longer runs, and the half-written ones of long ago."""
    for path in registry.glob(f"{mounts.RUN_RECORD_PREFIX}*"):
        with contextlib.suppress(OSError):
            if path.suffix == ".tmp":  # a record on its way in, or one whose writer died writing it
                if time.time() - path.stat().st_mtime > FRESH_S:
                    path.unlink(missing_ok=True)
                continue
            try:
                pid = int(json.loads(path.read_text())["pid"])
            except (ValueError, KeyError, TypeError):
                continue  # unreadable: not ours to judge
            if not mounts.server_alive(pid, SERVER_MODULE):
                path.unlink(missing_ok=True)


def for_run(home: Home, session_id: str) -> Target | None:
    """Authorize the session for a run (Denied, audited, if its evidence is gone); then its kept
    mount, if one is up (None: the run starts a mount of its own, which authorizes the same way)."""
    authorize_session(home, session_id, Op.RETRIEVE)
    found = kept(home, session_id)
    return None if found is None else found[1]


def keep(home: Home, session_id: str) -> tuple[int, Target]:
    """Start a kept mount for the session (Conflict, exit 1, if one is already up or came up while we waited)."""
    with _lock(home, session_id):
        if kept(home, session_id) is not None:
            raise Conflict("this session's sandbox mount is already up")
        proc, target = start(home, session_id, tied=False)
        mounts.write_record(_record_path(home, session_id), {"pid": proc.pid, **target.__dict__})
    return proc.pid, target


def release(home: Home, session_id: str) -> None:
    """Stop the session's kept mount (BadInput if none is up)."""
    with _lock(home, session_id):
        path = _record_path(home, session_id)
        found = kept(home, session_id)
        path.unlink(missing_ok=True)
        if found is None:
            raise BadInput("this session has no sandbox mount up")
        stop_server(found[0], found[1].mountpoint)
