"""Serving the API: a Unix socket for local gateways, and loopback HTTP for those that speak only HTTP.

``scopefs serve --socket PATH`` listens on a Unix socket (mode 0660) and
answers only peers whose uid is allowed (``SO_PEERCRED``, checked when
the connection is made, before a byte is read; root and the serving
user by default). ``--http 127.0.0.1:PORT --token-file F`` adds a
loopback TCP listener on which every request needs the token. Both go
to one ASGI application (``app.make_app``) under uvicorn. ``--workers N``
requests run at once, each on a home of its own (``workers``); the
server closes every one of them on its way out.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from scopefs.api.app import make_app
from scopefs.api.mounting import MountPolicy
from scopefs.api.service import Service
from scopefs.api.workers import WorkerHomes, check_workers, default_workers
from scopefs.catalog.errors import BadInput, Conflict
from scopefs.catalog.home import Home
from scopefs.catalog.readjournal import replay
from scopefs.writer.recovery import drain_home, recover_home

log = logging.getLogger("scopefs.api")

_UCRED = struct.Struct("3i")  # pid, uid, gid
MIN_TOKEN_CHARS = 32
MAX_CONNECTIONS = 512  # beyond this uvicorn answers 503 at once: file descriptors stay bounded


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of a Unix socket's peer (None for any other socket)."""
    if sock.family != socket.AF_UNIX:
        return None
    return int(_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))[1])


def _gated_protocol(allowed: frozenset[int]) -> type[H11Protocol]:
    class Gated(H11Protocol):
        """uvicorn's HTTP/1.1 protocol, refusing a Unix peer whose uid is not allowed, at once."""

        refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else None
            if sock is not None and sock.family == socket.AF_UNIX and uid not in allowed:
                self.refused = True  # no log line: a refused peer must not be able to flood the log
                transport.close()
                return
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.refused:  # a refused connection never set up what uvicorn tears down
                super().connection_lost(exc)

    return Gated


def loopback(address: str) -> tuple[str, int]:
    """``127.0.0.1:PORT`` (or ``[::1]:PORT``) parsed; BadInput for anything that is not loopback."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        if not sep or not ipaddress.ip_address(host).is_loopback or not 0 < int(port) < 65536:
            raise ValueError
    except ValueError:
        raise BadInput("--http takes a loopback address and port, e.g. 127.0.0.1:8740") from None
    return host, int(port)


def read_token(path: Path) -> str:
    """The bearer token: a private file of at least ``MIN_TOKEN_CHARS`` characters."""
    try:
        st = path.stat()
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise BadInput("--token-file cannot be read") from None
    if st.st_mode & 0o077:
        raise BadInput("--token-file must not be readable by group or others (chmod 600)")
    if len(token) < MIN_TOKEN_CHARS:
        raise BadInput(f"the token must be at least {MIN_TOKEN_CHARS} characters")
    return token


def _unix_listener(path: Path) -> socket.socket:
    """A socket bound at ``path``; a stale socket there is replaced, a live one (it answers) is not."""
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise BadInput(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: left by a server that is gone
        else:
            raise Conflict(f"{path} is already served")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o660)
    return sock


class _Stopped(Exception):
    """SIGINT or SIGTERM, raised again by uvicorn once it has shut down."""


def _stopped(signum: int, frame: object) -> None:
    raise _Stopped


def serve(home: Home, socket_path: Path, *, allow_uids: Iterable[int] = (), http: str | None = None,
          token_file: Path | None = None, workers: int | None = None,
          mounting: MountPolicy | None = None) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's own handling lets requests in flight finish).

    ``workers``: requests answered at once (``default_workers()`` if None); ``home`` is the first's.
    """
    size = check_workers(default_workers() if workers is None else workers)
    allowed = frozenset({0, os.getuid(), *allow_uids})
    token = read_token(token_file) if token_file is not None else None
    if http is not None and token is None:
        raise BadInput("--http needs --token-file")
    home.api_key()  # made (on first use) now, not by requests racing on several workers to make it
    recover_home(home)  # saves a power loss took are rolled back before any request
    drain_home(home)  # and the audit of saves whose mount died before its batch is delivered
    replay(home)  # and of reads such a mount served (``catalog.readjournal``)
    sockets = [_unix_listener(socket_path)]
    if http is not None:
        host, port = loopback(http)
        tcp = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((host, port))
        sockets.append(tcp)
    options: dict[str, Any] = {"http": _gated_protocol(allowed), "ws": "none", "lifespan": "off",
                               "log_level": "warning", "access_log": False, "server_header": False,
                               "date_header": False, "limit_concurrency": MAX_CONNECTIONS,
                               "timeout_keep_alive": 5}
    homes = WorkerHomes(home, size)
    config = uvicorn.Config(make_app(Service(homes, mounting=mounting), token=token), **options)
    # uvicorn shuts down gracefully on SIGINT and SIGTERM and then raises the signal again with
    # the handlers it found: these end the run here, so the socket is removed on the way out.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(config).run(sockets=sockets)
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sock in sockets:
            sock.close()
        socket_path.unlink(missing_ok=True)
        homes.close()
