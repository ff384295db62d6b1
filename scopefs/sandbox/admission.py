"""The launcher's end of a sandbox mount's control socket (see ``sandbox.control``).

A Unix seqpacket socket in a root-only directory; the server listens only
to root peers. The launcher says ``admit <pid namespace inode>`` for the
sandbox it is starting, with a descriptor of that namespace, and keeps the
connection open while the sandbox runs, and says ``dismiss`` once it is
gone; the admission also ends when the connection closes, so a launcher
that dies cannot leave a namespace admitted. The server holds the
namespace's descriptor while it is admitted: the kernel gives a freed
namespace's number to the next one it makes, and a number the server
admits must not name another sandbox's namespace meanwhile. Kept free of
trio and pyfuse3 so that starting a command stays cheap.
"""

from __future__ import annotations

import logging
import socket
from typing import Self

MAX_MESSAGE = 64
DISMISS_TIMEOUT_S = 60.0  # dropping the pages of many files can take a while; a dead server answers at once

log = logging.getLogger("scopefs.sandbox")


class Admission:
    """One sandbox's pid namespace admitted to a mount, for as long as this lives."""

    def __init__(self, control: str, namespace: int, held: int, timeout: float = 10.0) -> None:
        """``held``: a descriptor of the namespace (``/proc/PID/ns/pid``), sent for the server to hold."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(control)
            socket.send_fds(self._sock, [b"admit %d" % namespace], [held])
            if self._sock.recv(MAX_MESSAGE) != b"ok":
                raise ConnectionError("the mount server refused the sandbox")
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        """End the admission and wait until the mount dropped the pages the sandbox opened.

        Called once the sandbox is gone. A server that does not answer (it
        died, or it is stopping) ends the admission anyway: the connection
        closes.
        """
        answer = b""
        try:
            self._sock.settimeout(DISMISS_TIMEOUT_S)
            self._sock.send(b"dismiss")
            answer = self._sock.recv(MAX_MESSAGE)
        except OSError:
            pass
        finally:
            self._sock.close()
        if answer != b"ok":  # the namespace is refused all the same (the connection closed); say what is unsure
            log.warning("the mount did not confirm that the sandbox's pages were dropped")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
