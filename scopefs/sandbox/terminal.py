"""Terminal signals for a sandbox that runs in a session of its own.

The sandbox gets a new session (``--new-session``: nothing inside can push
keystrokes into the caller's terminal with TIOCSTI), so the terminal's
signals (Ctrl-C, Ctrl-\\, a window resize) go to the launcher's process
group, never to the sandboxed program. When the launcher's stdin or stdout
is a terminal, it passes them on to every process of the sandbox's pid
namespace except bubblewrap's init (whose death would end the sandbox):
Ctrl-C interrupts the program, a resize makes vim and nano redraw. bwrap
itself runs in its own process group, so the terminal never signals it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from scopefs.vfs.gate import pid_namespace

FORWARDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGWINCH)


def members(namespace: int, init_pid: int) -> list[int]:
    """Host pids of the processes in pid namespace ``namespace``, but its init."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != init_pid and pid_namespace(int(name)) == namespace:
            found.append(int(name))
    return found


def _signal_if_member(pid: int, namespace: int, signum: int) -> None:
    """Signal ``pid`` only if, held by a pidfd, it still is in ``namespace`` (a pid may be reused)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if pid_namespace(pid) == namespace:
            signal.pidfd_send_signal(pidfd, signum)
    except OSError:
        pass
    finally:
        os.close(pidfd)


@contextlib.contextmanager
def forwarding(namespace: int, init_pid: int) -> Iterator[None]:
    """Forward the terminal's signals into the sandbox while it runs (only with a terminal)."""
    if not (os.isatty(0) or os.isatty(1)):
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        for pid in members(namespace, init_pid):
            _signal_if_member(pid, namespace, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
