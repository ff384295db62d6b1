"""The launcher's end of a sandbox mount's control socket (see ``sandbox.control``).

A Unix seqpacket socket in a root-only directory; the server listens only
to root peers. The launcher says ``admit <pid namespace inode>`` for the
sandbox it is starting and keeps the connection open while the sandbox
runs: the admission ends when the connection closes, so a launcher that
dies cannot leave a namespace admitted. Kept free of trio and pyfuse3 so
that starting a command stays cheap.
"""

from __future__ import annotations

import socket
from typing import Self

MAX_MESSAGE = 64


class Admission:
    """One sandbox's pid namespace admitted to a mount, for as long as this lives."""

    def __init__(self, control: str, namespace: int, timeout: float = 10.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(control)
            self._sock.send(b"admit %d" % namespace)
            if self._sock.recv(MAX_MESSAGE) != b"ok":
                raise ConnectionError("the mount server refused the sandbox")
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
