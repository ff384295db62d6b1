"""A session's mount made for sandboxes: its own uid, its own place, a gate.

``python -m scopefs.sandbox.server --home H --ready-fd N SESSION`` allocates a
host uid for the session, makes ``/run/scopefs/mounts/<random>/memory``
(the directory 0700 and, once the mount is live, owned by that uid, so no
other unprivileged uid can even reach the mount), mounts the view there with ``allow_other`` and
inodes owned by the uid, and serves the launcher's control socket. Its
readiness line carries ``uid``, ``mountpoint``, ``control`` and
``writable`` (whether any root of the view accepts writes).

Everything it made is removed when it exits, whatever ended it: an
unmount, a signal, or (with ``--die-with-parent``) the death of the
launcher that started it for one command. The uid allocation is a lock
held by this process, so even a SIGKILL frees it; the directories it
leaves then are swept by the next launcher (``sweep``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from pathlib import Path

from scopefs.catalog import ids
from scopefs.catalog.access import current_access
from scopefs.catalog.home import Home
from scopefs.catalog.human import check_served
from scopefs.catalog.policy import Op
from scopefs.sandbox import uids
from scopefs.sandbox.control import serve_control
from scopefs.sandbox.places import control_dir, die_with_parent, mounts_dir
from scopefs.vfs.gate import Gate
from scopefs.vfs.server import ReportReady, run_reporting, serve


def any_writable(home: Home, session_id: str) -> bool:
    access, problem = current_access(home, session_id)
    return problem is None and any(Op.APPEND in mount.placement for mount in access.view.mounts)


def _make_place() -> tuple[Path, Path]:
    """``<random>/memory``, both root's until the mount is live (then the place goes to the uid:
    nobody with that uid can swap the mount point for a link before root mounts on it)."""
    place = mounts_dir() / ids.random_token()
    place.mkdir(mode=0o700)
    mountpoint = place / "memory"
    mountpoint.mkdir(mode=0o700)
    return place, mountpoint


def _remove_place(place: Path) -> None:
    with contextlib.suppress(OSError):
        (place / "memory").rmdir()
    with contextlib.suppress(OSError):
        place.rmdir()


def serve_sandbox(home: Home, session_id: str, report_ready: ReportReady) -> None:
    check_served(home, session_id, None)  # a person's browse view never goes to a sandbox uid (as ``start``)
    allocation = uids.allocate()
    place: Path | None = None
    control = None
    try:
        place, mountpoint = _make_place()
        control = str(control_dir() / f"{place.name}.sock")
        gate = Gate(allocation.uid)
        details: dict[str, object] = {"uid": allocation.uid, "mountpoint": str(mountpoint), "control": control,
                                      "writable": any_writable(home, session_id), "pid": os.getpid()}

        def ready() -> None:
            assert place is not None
            os.chown(place, allocation.uid, allocation.uid)  # now bwrap, as the uid, can reach the mount
            report_ready(details)

        serve(home, session_id, str(mountpoint), on_ready=ready, extra_options=frozenset({"allow_other"}),
              gate=gate, owner=(allocation.uid, allocation.uid),
              tasks=[functools.partial(serve_control, control, gate)])
    finally:
        if control is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(control)
        if place is not None:
            _remove_place(place)
        allocation.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scopefs.sandbox.server")
    parser.add_argument("--home", required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--die-with-parent", type=int, metavar="PID",
                        help="end (SIGTERM) when the launcher PID dies; exit at once if it already has")
    parser.add_argument("session")
    args = parser.parse_args(argv)
    if args.die_with_parent is not None:
        die_with_parent()  # first the tie, then the check: no moment in which a death goes unseen
        if os.getppid() != args.die_with_parent:
            return 1
    return run_reporting(args.ready_fd, lambda report_ready: serve_sandbox(
        Home.open(Path(args.home)), args.session, report_ready))


if __name__ == "__main__":
    sys.exit(main())
