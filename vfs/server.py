"""Running one session's filesystem: mount, serve, and let go cleanly.

``serve`` mounts the view at a directory and answers requests until the
kernel unmounts it (``scopefs umount``) or the process is told to stop
(SIGTERM, SIGINT, SIGHUP: it then unmounts itself). Either way, removals
still in their grace period are committed and the read-audit batch is
written before the process exits. A SIGKILL skips that; everything a
``close`` or ``fsync`` already reported is committed regardless.

``python -m vfs.server`` is how ``scopefs mount`` starts it in the
background: readiness (or the one-line reason it failed) is reported on
the file descriptor given with ``--ready-fd``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TextIO

import pyfuse3
import trio

from catalog.access import authorize_session
from catalog.errors import ScopefsError
from catalog.home import Home
from catalog.policy import Op
from catalog.visible import build
from vfs.fs import ScopeFS

MOUNT_OPTIONS = frozenset({"fsname=scopefs", "subtype=scopefs", "default_permissions", "nosuid", "nodev",
                           "noexec"})


async def _stop_on_signal(fs: ScopeFS) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            fs.terminated = True
            pyfuse3.terminate()
            return


async def _announce(mountpoint: str, on_ready: Callable[[], None]) -> None:
    await trio.to_thread.run_sync(os.stat, mountpoint)  # answered by our own loop: the mount is live
    on_ready()


async def _run(fs: ScopeFS, mountpoint: str, on_ready: Callable[[], None] | None) -> None:
    async with trio.open_nursery() as nursery:
        await fs.background(nursery)
        nursery.start_soon(_stop_on_signal, fs)
        if on_ready is not None:
            nursery.start_soon(_announce, mountpoint, on_ready)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()
    await fs.shutdown()


def serve(home: Home, session_id: str, mountpoint: str, *, on_ready: Callable[[], None] | None = None,
          extra_options: frozenset[str] = frozenset()) -> None:
    """Mount ``session_id``'s view at ``mountpoint`` and serve it until unmounted."""
    authorize_session(home, session_id, Op.RETRIEVE)  # a revoked or unknown session is refused (audited)
    fs = ScopeFS(home, session_id, build(home, session_id))
    pyfuse3.init(fs, mountpoint, set(MOUNT_OPTIONS | extra_options))
    try:
        trio.run(_run, fs, mountpoint, on_ready)
    finally:
        pyfuse3.close(unmount=fs.terminated)


def _report(ready: TextIO, code: int, message: str, reason: str | None) -> None:
    if not ready.closed:
        ready.write("error " + json.dumps({"code": code, "message": message, "reason": reason}) + "\n")
        ready.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vfs.server")
    parser.add_argument("--home", required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("session")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s scopefs-mount[%(process)d] %(message)s")
    ready = os.fdopen(args.ready_fd, "w", buffering=1)

    def report_ready() -> None:
        ready.write("ready\n")
        ready.close()

    try:
        serve(Home.open(Path(args.home)), args.session, args.mountpoint, on_ready=report_ready)
    except ScopefsError as exc:
        _report(ready, exc.exit_code, str(exc), getattr(exc, "reason", None))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - reported as one line, by type
        _report(ready, 1, f"the mount server failed: {type(exc).__name__}: {exc}", None)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
