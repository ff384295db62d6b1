"""Run marks: a record left by a run can tell a live run from one that ended (``catalog.boot``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from scopefs.catalog.boot import run_mark, running


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2:].split()[0].decode()


def test_a_live_run_is_running_and_a_reused_mark_is_not() -> None:
    assert running(run_mark())
    boot, pid, started = run_mark().split("/")
    assert not running(f"{boot}/{pid}/{int(started) + 1}")  # the same pid, another start: another run
    assert not running(f"another-boot/{pid}/{started}")
    assert not running("garbage")


def test_a_run_that_exited_unreaped_is_not_running() -> None:
    """A zombie keeps its pid and start time until its parent reaps it, but holds nothing any more."""
    before = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored SIGCHLD would reap it at once
    try:
        _exits_unreaped()
    finally:
        signal.signal(signal.SIGCHLD, before)


def _exits_unreaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        mark = run_mark(child.pid)
        assert running(mark)
        assert child.stdin is not None
        child.stdin.close()  # it exits; nothing reaps it yet
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert run_mark(child.pid) == mark  # still the same pid and start time
        assert not running(mark)
    finally:
        child.wait()
    assert not running(mark)  # reaped: the pid is gone (or another process's, with another start)
