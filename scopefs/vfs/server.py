"""Running one session's filesystem: mount, serve, and let go cleanly.

``serve`` mounts the view at a directory and answers requests until the
kernel unmounts it (``scopefs umount``) or the process is told to stop
(SIGTERM, SIGINT, SIGHUP: it then unmounts itself). Either way, removals
still in their grace period are committed and the read-audit batch is
written before the process exits. A SIGKILL skips that; everything a
``close`` or ``fsync`` already reported is committed regardless.

``python -m scopefs.vfs.server`` is how ``scopefs mount`` starts it in the
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol, TextIO

# isort: split
import scopefs.vfs.lean  # noqa: F401 - first: it defers ssl and sets OpenSSL hashes aside before trio imports them

# isort: split
import pyfuse3
import trio

from scopefs.catalog.access import authorize_session
from scopefs.catalog.errors import ScopefsError
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Op
from scopefs.catalog.readjournal import replay
from scopefs.catalog.visible import build
from scopefs.vfs.abort import connection_of, ensure_control, requests_waiting
from scopefs.vfs.fs import POLL_NS, ScopeFS
from scopefs.vfs.gate import Gate
from scopefs.vfs.latency import ENVIRONMENT, CpuLatency, bound_from
from scopefs.vfs.lean import give_back
from scopefs.vfs.watchdog import HARD_STALL_S, let_go
from scopefs.writer.recovery import drain_home, recover_home

log = logging.getLogger("scopefs.vfs")
LET_GO_S = 2.0  # how long the server waits at exit for an abandoned drop's worker, freed by the abort
MOUNT_OPTIONS = frozenset({"fsname=scopefs", "subtype=scopefs", "default_permissions", "nosuid", "nodev",
                           "noexec"})


async def _stop_on_signal(fs: ScopeFS) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            fs.terminated = True
            # The connection closes next, and pages cached by then would stay
            # readable through any descriptor still open (one passed out of a
            # sandbox, say): the kernel drops them first.
            await fs.close_view()
            pyfuse3.terminate()
            return


def _probe(mountpoint: str) -> None:
    try:
        os.stat(mountpoint)
    except PermissionError:
        pass  # a gated mount refuses this process: still an answer from our own loop


async def _announce(mountpoint: str, on_ready: Callable[[], None]) -> None:
    await trio.to_thread.run_sync(_probe, mountpoint)  # answered by our own loop: the mount is live
    on_ready()
    give_back()


async def _run(fs: ScopeFS, mountpoint: str, on_ready: Callable[[], None] | None,
               tasks: Sequence[Callable[..., Awaitable[None]]], latency: CpuLatency) -> None:
    async with trio.open_nursery() as nursery:
        await fs.background(nursery)
        nursery.start_soon(_stop_on_signal, fs)
        nursery.start_soon(latency.hold_while_busy)
        for task in tasks:
            await nursery.start(task)  # each is ready (listening, say) before the mount is announced
        if on_ready is not None:
            nursery.start_soon(_announce, mountpoint, on_ready)
        await pyfuse3.main(poll_ns=POLL_NS, on_wait=latency.touch)
        fs.mount.kernel.answering = False
        nursery.cancel_scope.cancel()
    await fs.shutdown()


def serve(home: Home, session_id: str, mountpoint: str, *, on_ready: Callable[[], None] | None = None,
          extra_options: frozenset[str] = frozenset(), gate: Gate | None = None,
          owner: tuple[int, int] | None = None, tasks: Sequence[Callable[..., Awaitable[None]]] = ()) -> None:
    """Mount ``session_id``'s view at ``mountpoint`` and serve it until unmounted.

    A sandbox's mount passes a ``gate`` (only admitted sandboxes of the
    session uid get answers), the ``owner`` its inodes show, and ``tasks``
    that run beside the filesystem for as long as it is mounted (the
    launcher's control socket); each is started with ``nursery.start`` and
    must report ``task_status.started()`` once it serves.
    """
    setting = os.environ.get(ENVIRONMENT)
    bound_us = bound_from(setting)  # a bad value refuses the mount, before anything happens
    authorize_session(home, session_id, Op.RETRIEVE)  # a revoked or unknown session is refused (audited)
    recover_home(home)  # saves a power loss took are rolled back before anything is served
    drain_home(home)  # and the audit of saves whose mount died before its batch is delivered
    replay(home)  # and of reads such a mount served (``catalog.readjournal``)
    latency = CpuLatency(bound_us, explicit=bool(setting))  # before the mount: it never fails one
    fs = ScopeFS(home, session_id, build(home, session_id), gate=gate, owner=owner)
    pyfuse3.init(fs, mountpoint, set(MOUNT_OPTIONS | extra_options))
    fs.mount.kernel.mountpoint = mountpoint
    fs.mount.kernel.connection = connection_of(mountpoint)
    ensure_control()
    if requests_waiting(fs.mount.kernel.connection) is None:
        log.warning("the kernel's count of this mount's requests cannot be read: a stuck drop from its "
                    "caches is told from a busy mount only after %d s", HARD_STALL_S)
    try:
        trio.run(_run, fs, mountpoint, on_ready, tasks, latency)
    finally:
        latency.close()
        # A worker abandoned in libfuse would use a closed session once let go; the abort usually lets it go.
        if not fs.mount.kernel.abandoned or let_go(LET_GO_S):
            pyfuse3.close(unmount=fs.terminated)
        else:
            log.error("a drop from the kernel's caches is still stuck: the aborted mount stays until unmounted")


class ReportReady(Protocol):
    """Says the server is ready, with optional details for whoever started it."""

    def __call__(self, details: dict[str, object] | None = None) -> None: ...


def _report(ready: TextIO, code: int, message: str, reason: str | None) -> None:
    if not ready.closed:
        ready.write("error " + json.dumps({"code": code, "message": message, "reason": reason}) + "\n")
        ready.close()


def run_reporting(ready_fd: int, body: Callable[[ReportReady], None]) -> int:
    """Run ``body`` and report on ``ready_fd``: ``ready [json]`` once it says so,
    else ``error {json}`` with the exit code and a one-line reason.

    ``body`` receives the function that reports readiness (with optional
    details for the starter); its return ends the server with status 0.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s scopefs-mount[%(process)d] %(message)s")
    ready = os.fdopen(ready_fd, "w", buffering=1)

    def report_ready(details: dict[str, object] | None = None) -> None:
        ready.write("ready" + (" " + json.dumps(details) if details else "") + "\n")
        ready.close()

    try:
        body(report_ready)
    except ScopefsError as exc:
        _report(ready, exc.exit_code, str(exc), getattr(exc, "reason", None))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - reported as one line, by type
        _report(ready, 1, f"the mount server failed: {type(exc).__name__}: {exc}", None)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scopefs.vfs.server")
    parser.add_argument("--home", required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("session")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    return run_reporting(args.ready_fd, lambda report_ready: serve(
        Home.open(Path(args.home)), args.session, args.mountpoint, on_ready=report_ready))


if __name__ == "__main__":
    sys.exit(main())
