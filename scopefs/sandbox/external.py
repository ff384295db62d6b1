"""A session's mount for a sandbox scopefs does not launch: a gateway's own container.

``scopefs mount SESSION DIR --for-uid UID`` serves the view at DIR to
processes running as UID and to nobody else (``vfs.gate.UidGate``): the
gateway binds DIR into its container at ``/memory`` and runs the container
as UID. The mount is made by root with ``allow_other`` (else only root
could use it), and its files are shown owned by UID (and ``--for-gid``),
so the container's tools work as on their own files.

It lasts exactly as long as the session: once the session's evidence is
gone (the session closed, its binding revoked: ``catalog.access``),
the server stops as on SIGTERM: it refuses everyone, drops the view's
pages from the kernel and closes its connection. A bind of the mount in a
container does not follow an unmount on the host (it holds the
filesystem itself); it fails every access with ``ENOTCONN`` from then on,
never showing the directory beneath or a byte more of the view.

What the uid alone cannot tell apart: every process running as UID, on
the host or in any container, is served. Give each mount a uid nothing
else runs as. Root and the sandbox uids that ``scopefs run`` allocates are
refused as targets, and so is the overflow uid ``nobody``, which many
unrelated processes share.

``python -m scopefs.sandbox.external --home H --ready-fd N --uid U --gid G
SESSION MOUNTPOINT`` is the server ``scopefs mount --for-uid`` starts.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from scopefs.catalog.access import current_access
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.human import check_served
from scopefs.sandbox import mounts, uids
from scopefs.vfs.gate import UidGate
from scopefs.vfs.server import run_reporting, serve

MODULE = "scopefs.sandbox.external"
WATCH_S = 0.1  # how often the session's evidence is checked (the mount's own view follows it as often)
OVERFLOW_UID = 65534  # "nobody": shared by unrelated daemons, and what an unmapped uid shows as
MAX_ID = (1 << 32) - 2  # (uid_t)-1 means "no change" to the kernel; it is never a uid

log = logging.getLogger("scopefs.sandbox")


def check_owner(uid: int, gid: int) -> None:
    """BadInput unless ``uid``/``gid`` may be the only ids a mount is served to and shown owned by.

    Root already passes every permission check in a container that runs
    as root: a mount for it would be a mount for everything there. The
    sandbox uids belong to ``scopefs run``'s sandboxes of other sessions.
    """
    for label, value in (("--for-uid", uid), ("--for-gid", gid)):
        if not 0 <= value <= MAX_ID:
            raise BadInput(f"{label} {value} is not an id")
    if uid == 0 or gid == 0:
        raise BadInput("--for-uid and --for-gid must not be 0 (root): run the container as an unprivileged uid")
    if OVERFLOW_UID in (uid, gid):
        raise BadInput("--for-uid and --for-gid must not be 65534 (nobody): many processes share it")
    if uids.in_range(uid):
        raise BadInput(f"--for-uid {uid} is in the range scopefs run allocates to its own sandboxes")


def check_place(mountpoint: str) -> None:
    """BadInput unless only root can change the folders from ``/`` to ``mountpoint`` (resolved).

    The mount is made by root on a path: a folder another user may change
    lets that user swap a link in between the check and the mount, and
    root would mount wherever it points. Every folder on the way, the
    mount point included, must be root's, and none but a sticky one
    (``/tmp``) writable by others: there only an entry's owner, root, may
    rename it.
    """
    path = Path(mountpoint)
    for folder in (*reversed(path.parents), path):
        try:
            st = folder.lstat()
        except OSError:
            raise BadInput(f"mount point {mountpoint} is not a directory") from None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise BadInput(f"mount point {mountpoint}: {folder} is not a directory owned by root")
        if folder != path and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise BadInput(f"mount point {mountpoint}: {folder} may be changed by other users")


async def end_with_session(home_root: Path, session_id: str, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Stop this server (as SIGTERM does) once the session's evidence is gone.

    A positive answer from the catalog ends the mount; a catalog that
    cannot be read does not (the view itself is emptied meanwhile,
    ``vfs.currency``), so a passing fault never unmounts a live session.
    The check has a home of its own: the mount's connections belong to
    its catalog thread.
    """
    home = Home.open(home_root)
    task_status.started()
    try:
        while True:
            await trio.sleep(WATCH_S)
            try:
                _, problem = await trio.to_thread.run_sync(current_access, home, session_id)
            except Exception as exc:  # noqa: BLE001 - never ends the mount; the view fails closed itself
                log.warning("session check failed (%s)", type(exc).__name__)
                continue
            if problem is not None:
                log.warning("the session ended (%s): unmounting", problem.value)
                os.kill(os.getpid(), signal.SIGTERM)  # vfs.server stops on it: refused, pages dropped, unmounted
                return
    finally:
        home.close()


def serve_for(home: Home, session_id: str, mountpoint: str, uid: int, gid: int, *,
              on_ready: Callable[[], None] | None = None, owner_only: bool = False) -> None:
    """Serve ``session_id``'s view at ``mountpoint`` to ``uid`` alone until unmounted or the session ends.

    ``owner_only``: root is refused even the root's attributes (a person's own mount, ``scopefs browse``).
    """
    check_owner(uid, gid)
    check_place(mountpoint)
    check_served(home, session_id, uid)
    serve(home, session_id, mountpoint, on_ready=on_ready, extra_options=frozenset({"allow_other"}),
          gate=UidGate(uid, root_attributes=not owner_only), owner=(uid, gid),
          tasks=[functools.partial(end_with_session, home.root, session_id)])


def start(home: Home, session_id: str, mountpoint: str, uid: int, gid: int, *,
          owner_only: bool = False) -> mounts.MountRecord:
    """``scopefs mount --for-uid`` in the background: checked here first (exit 2), then served."""
    check_owner(uid, gid)
    check_place(mounts.absolute(mountpoint))
    check_served(home, session_id, uid)
    return mounts.start(home, session_id, mountpoint, module=MODULE,
                        options=("--uid", str(uid), "--gid", str(gid), *(("--owner-only",) if owner_only else ())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--home", required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--gid", type=int, required=True)
    parser.add_argument("--owner-only", action="store_true")
    parser.add_argument("session")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    return run_reporting(args.ready_fd, lambda report_ready: serve_for(
        Home.open(Path(args.home)), args.session, args.mountpoint, args.uid, args.gid, on_ready=report_ready,
        owner_only=args.owner_only))


if __name__ == "__main__":
    sys.exit(main())
