"""The mount server's end of the launcher's line: which sandboxes may use it.

A Unix seqpacket socket in a root-only directory. Only a root peer is
listened to (``SO_PEERCRED``). The launcher connects, says
``admit <pid namespace inode>`` for the sandbox it is starting, and keeps
the connection open while the sandbox runs. Once the sandbox is gone it
says ``dismiss`` and waits for ``ok``: by then the namespace is refused
and the pages of every file it opened are dropped (``vfs.gate``). The
admission also ends when the connection closes, so a launcher that dies
cannot leave a namespace admitted. Messages are tiny and bounded;
anything else is answered ``no``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct

import trio

from scopefs.sandbox.admission import MAX_MESSAGE
from scopefs.vfs.gate import Gate

_UCRED = struct.Struct("3i")  # pid, uid, gid


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
    held: list[int] = []
    with conn:
        _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != 0:
            return
        try:
            while True:
                message = await conn.recv(MAX_MESSAGE)
                if not message:
                    return
                verb, _, arg = message.partition(b" ")
                if verb == b"admit" and arg.isdigit() and len(arg) <= 20:
                    gate.admit(int(arg))
                    held.append(int(arg))
                    await conn.send(b"ok")
                elif verb == b"dismiss" and not arg:
                    await _dismiss(gate, held)
                    await conn.send(b"ok")
                else:
                    await conn.send(b"no")
        except OSError:
            return
        finally:
            await _dismiss(gate, held)


async def _dismiss(gate: Gate, held: list[int]) -> None:
    """End every admission ``held`` (at once, before any await), then drop what they opened."""
    gone = [namespace for namespace in held if gate.dismiss(namespace)]
    held.clear()
    for namespace in gone:
        await gate.dismissed(namespace)
