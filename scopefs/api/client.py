"""A small client of the gateway API over its Unix socket, for Python gateways and the tests.

It makes each request's nonce and time itself, so a caller holds only
the capability ``open`` returned. Standard library only: one HTTP/1.1
connection per request over ``AF_UNIX``.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import time
from typing import Any


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class ApiError(Exception):
    """A refusal or failure, with the API's stable code (and reason, for a denial)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "the request failed"))
        self.status = status
        self.code = error.get("code")
        self.reason = error.get("reason")


class Client:
    """Calls on one server's socket."""

    def __init__(self, socket_path: str, *, timeout: float = 30.0) -> None:
        self._path = socket_path
        self._timeout = timeout

    def post(self, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The raw exchange: HTTP status and the answer object."""
        conn = _UnixConnection(self._path, self._timeout)
        try:
            conn.request("POST", route, json.dumps(body), {"content-type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def _result(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        status, answer = self.post(route, body)
        if not answer.get("ok"):
            raise ApiError(status, answer.get("error") or {})
        return answer["result"]  # type: ignore[no-any-return]

    def open(self, agent: str, **facts: str) -> dict[str, Any]:
        """A session for verified ingress facts: ``capability``, ``subject``, ``roots``, ``expires_us``."""
        return self._result("/v1/open", {"agent": agent, **facts})

    def call(self, op: str, capability: str, **args: Any) -> dict[str, Any]:
        body = {"capability": capability, "nonce": secrets.token_urlsafe(24), "ts": time.time_ns() // 1000,
                "args": args}
        return self._result(f"/v1/{op}", body)

    def search(self, capability: str, query: str, limit: int = 10) -> dict[str, Any]:
        return self.call("search", capability, query=query, limit=limit)

    def read(self, capability: str, path: str, start: int = 1, lines: int | None = None) -> dict[str, Any]:
        args: dict[str, Any] = {"path": path, "from": start}
        if lines is not None:
            args["lines"] = lines
        return self.call("read", capability, **args)

    def write(self, capability: str, path: str, content: str) -> dict[str, Any]:
        return self.call("write", capability, path=path, content=content)

    def deposit(self, capability: str, handle: str, content: str) -> dict[str, Any]:
        return self.call("deposit", capability, handle=handle, content=content)

    def derive(self, capability: str, sources: list[str], to: str, content: str,
               kind: str = "summary") -> dict[str, Any]:
        return self.call("derive", capability, **{"from": sources, "to": to, "kind": kind, "content": content})

    def forget(self, capability: str, paths: list[str], dry_run: bool = False) -> dict[str, Any]:
        return self.call("forget", capability, paths=paths, dry_run=dry_run)

    def list(self, capability: str, path: str = "") -> dict[str, Any]:
        return self.call("list", capability, path=path)
