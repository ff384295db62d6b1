"""The control socket a launcher admits its sandbox through (``sandbox.control``, ``sandbox.admission``).

The real server end and launcher end, over a real Unix socket, in this
process: an admission brings a descriptor of the pid namespace it admits,
and the server holds it for exactly as long as the admission lasts. The
gate knows namespaces by number, and the kernel gives a freed namespace's
number to the next one it makes: without the descriptor, a launcher that
died without its ``finally`` could leave its number admitted for another
sandbox's namespace. Whole sandboxes use this in ``test_sandbox_*.py``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import trio
import trio.testing

from scopefs.sandbox.admission import MAX_MESSAGE, Admission
from scopefs.sandbox.control import serve_control
from scopefs.vfs.gate import Gate, pid_namespace


def _descriptors_of(namespace: int) -> int:
    """How many descriptors of this process name the pid namespace ``namespace``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == f"pid:[{namespace}]"
        except OSError:
            pass
    return count


def _said(path: str, message: bytes, fds: list[int]) -> bytes:
    """The server's answer to one message sent with ``fds``, on a connection of its own."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(10)
        sock.connect(path)
        socket.send_fds(sock, [message], fds) if fds else sock.send(message)
        return sock.recv(MAX_MESSAGE)


def test_an_admission_holds_its_namespace_and_nothing_else_admits(tmp_path: Path) -> None:
    namespace = pid_namespace(os.getpid())
    assert namespace is not None
    path = str(tmp_path / "control")
    gate = Gate(os.getuid())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, path, gate)
            before = _descriptors_of(namespace)
            # Refused: no descriptor; one of another kind of namespace; one of another number.
            other = os.open("/proc/self/ns/net", os.O_RDONLY)
            mine = os.open("/proc/self/ns/pid", os.O_RDONLY)
            try:
                for message, fds in ((b"admit %d" % namespace, []), (b"admit %d" % namespace, [other]),
                                     (b"admit %d" % (namespace + 1), [mine]), (b"dismiss", [mine])):
                    assert await trio.to_thread.run_sync(_said, path, message, fds) == b"no", message
                await trio.testing.wait_all_tasks_blocked()
                assert namespace not in gate.admitted
                assert _descriptors_of(namespace) == before + 1  # ours only: the refused ones were closed
                admission = await trio.to_thread.run_sync(Admission, path, namespace, mine)
            finally:
                os.close(other)
                os.close(mine)
            assert namespace in gate.admitted
            assert _descriptors_of(namespace) == before + 1, "the server holds the admitted namespace"
            await trio.to_thread.run_sync(admission.close)
            await trio.testing.wait_all_tasks_blocked()
            assert namespace not in gate.admitted
            assert _descriptors_of(namespace) == before, "let go once the admission ended"
            nursery.cancel_scope.cancel()

    trio.run(main)
