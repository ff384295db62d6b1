"""A descriptor passed out of a sandbox is useless once ``scopefs run`` returned.

The sandboxed command gets a Unix socket as its stdout and sends an open
folder and an open note out with SCM_RIGHTS, after reading the note (so
its pages are in the kernel's cache). Once ``run`` returns, the folder
lists nothing (not even a note written after the run) and the note reads
nothing: its pages were dropped before the launcher heard the admission
end, and the folder's handle remembers the sandbox that opened it. Both
with a mount made for the one command and with a kept one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess

import pytest

from tests.conftest import ALICE_FACT, SCOPEFS, Scenario

pytestmark = pytest.mark.slow

SENDER = """
import os, socket
out = socket.socket(fileno=1)
folder = os.open("/memory/private/notes", os.O_RDONLY | os.O_DIRECTORY)
note = os.open("/memory/private/notes/allergy.md", os.O_RDONLY)
assert os.pread(note, 4096, 0)
assert os.listdir(folder)
socket.send_fds(out, [os.pread(note, 4096, 0)], [folder, note])
"""


def _passed_out(scenario: Scenario) -> tuple[bytes, int, int]:
    """Run the sender in Alice's sandbox; what it said, and the folder and note descriptors it sent."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        done = subprocess.run([SCOPEFS, "run", scenario.alice_session, "--", "python3", "-c", SENDER],
                              stdout=theirs.fileno(), stderr=subprocess.PIPE, timeout=120, check=False,
                              env={**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)})
        assert done.returncode == 0, done.stderr
        said, fds, _, _ = socket.recv_fds(ours, 4096, 2)
    assert len(fds) == 2
    return said, fds[0], fds[1]


def _read(fd: int) -> bytes | int:
    try:
        return os.pread(fd, 4096, 0)
    except OSError as exc:
        return exc.errno or -1


def _list(fd: int) -> list[str] | int:
    try:
        return os.listdir(fd)
    except OSError as exc:
        return exc.errno or -1


@pytest.mark.parametrize("kept", [False, True], ids=["per-run mount", "kept mount"])
def test_descriptors_passed_out_of_a_sandbox_read_and_list_nothing(scenario: Scenario, kept: bool) -> None:
    if kept:
        scenario.cli("session", "up", scenario.alice_session, check=True)
    try:
        said, folder, note = _passed_out(scenario)
        try:
            assert said == ALICE_FACT  # the control: inside the sandbox both worked
            scenario.cli.j("write", scenario.alice_session, "private/notes/after.md", stdin=b"written after\n")
            listed, read = _list(folder), _read(note)
        finally:
            for fd in (folder, note):
                with contextlib.suppress(OSError):  # ENOTCONN once the mount server is gone
                    os.close(fd)
    finally:
        if kept:
            scenario.cli("session", "down", scenario.alice_session, check=True)
    assert isinstance(listed, int), listed  # an errno, never names
    assert isinstance(read, int) or read == b"", read  # an errno (or nothing), never the note's bytes
