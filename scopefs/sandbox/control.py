"""The mount server's end of the launcher's line: which sandboxes may use it.

A Unix seqpacket socket in a root-only directory. Only a root peer is
listened to (``SO_PEERCRED``). The launcher connects, says
``admit <pid namespace inode>`` for the sandbox it is starting, with a
descriptor of that namespace, which the server holds while it is
admitted (the kernel would give a freed namespace's number to the next
sandbox it makes, and the gate knows namespaces by number), and keeps
the connection open while the sandbox runs. Once the sandbox is gone it
says ``dismiss`` and waits for ``ok``: by then the namespace is refused
and the pages of every file it opened are dropped (``vfs.gate``). The
admission also ends when the connection closes, so a launcher that dies
cannot leave a namespace admitted. Messages are tiny and bounded;
anything else is answered ``no``.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import struct

import trio

from scopefs.sandbox.admission import MAX_MESSAGE
from scopefs.vfs.gate import Gate

_UCRED = struct.Struct("3i")  # pid, uid, gid
_FD = array.array("i")
MAX_FDS = 4  # descriptors read with one message (an admission brings one)


async def serve_control(path: str, gate: Gate, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Accept launchers on ``path`` until cancelled; the socket file is removed after.

    Reports itself started (``nursery.start``) only once it listens, so the
    mount is never announced ready while a launcher's connect could still be
    refused.
    """
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    await listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    task_status.started()
    try:
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await listener.accept()
                nursery.start_soon(_converse, conn, gate)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


async def _converse(conn: trio.socket.SocketType, gate: Gate) -> None:
    held: list[tuple[int, int]] = []  # (namespace, a descriptor of it) for each admission of this launcher
    with conn:
        _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != 0:
            return
        try:
            while True:
                message, fds = await _received(conn)
                try:
                    if not message:
                        return
                    verb, _, arg = message.partition(b" ")
                    if (verb == b"admit" and arg.isdigit() and len(arg) <= 20 and len(fds) == 1
                            and _names_namespace(fds[0], int(arg))):
                        gate.admit(int(arg))
                        held.append((int(arg), fds.pop()))
                        await conn.send(b"ok")
                    elif verb == b"dismiss" and not arg and not fds:
                        await _dismiss(gate, held)
                        await conn.send(b"ok")
                    else:
                        await conn.send(b"no")
                finally:
                    for fd in fds:  # any the message brought that no admission holds
                        os.close(fd)
        except OSError:
            return
        finally:
            await _dismiss(gate, held)


async def _received(conn: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """The next message and the descriptors it carried (at most ``MAX_FDS``; a message whose
    descriptors did not fit is refused by carrying none it could be admitted with: all are closed)."""
    message, ancillary, flags, _ = await conn.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * _FD.itemsize),
                                                     socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        return message, []
    return message, list(fds)


def _names_namespace(fd: int, namespace: int) -> bool:
    """Whether ``fd`` is a descriptor of the pid namespace numbered ``namespace``."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == f"pid:[{namespace}]"
    except OSError:
        return False


async def _dismiss(gate: Gate, held: list[tuple[int, int]]) -> None:
    """End every admission ``held`` (at once, before any await), then drop what they opened; only then
    let go of the namespaces' descriptors, so that no number is given to another sandbox meanwhile."""
    taken, held[:] = list(held), []
    try:
        gone = [namespace for namespace, _ in taken if gate.dismiss(namespace)]
        for namespace in gone:
            await gate.dismissed(namespace)
    finally:
        for _, fd in taken:
            os.close(fd)
