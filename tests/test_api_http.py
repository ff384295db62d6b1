"""The gateway API as a gateway meets it: ``scopefs serve`` on a Unix socket and loopback HTTP.

A real server process per test (uvicorn), reached with the package's own
client over the socket and with ``http.client`` over TCP: who may
connect (the peer's uid, the bearer token), what each session sees, and
that bad requests get a stable code and leave the server answering. The
OpenAPI description the server publishes is checked by schemathesis
against the application itself (in process, on a copy of the scenario).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Err, Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance

from scopefs.api.app import MAX_BODY_BYTES, make_app
from scopefs.api.client import ApiError, Client
from scopefs.api.service import Service
from scopefs.catalog.home import Home
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_SENDER,
    CHANNEL,
    GROUP_CONVERSATION,
    SCOPEFS,
    Scenario,
    snapshot,
)
from tests.mountkit import wait_until

OTHER_UID = 1_544_100_077  # nobody's: only the test's setpriv runs as it


@dataclass
class Server:
    socket: Path
    port: int
    token: str
    proc: subprocess.Popen[bytes]

    @property
    def client(self) -> Client:
        return Client(str(self.socket))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(scenario: Scenario, tmp_path: Path, *extra: str, socket_dir: Path | None = None) -> Server:
    token = secrets.token_urlsafe(32)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    where, port = (socket_dir or tmp_path) / "api.sock", _free_port()
    proc = subprocess.Popen([SCOPEFS, "serve", "--socket", str(where), "--http", f"127.0.0.1:{port}",
                             "--token-file", str(token_file), *extra],
                            env={**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}, stderr=subprocess.PIPE)
    server = Server(where, port, token, proc)
    wait_until(lambda: proc.poll() is not None or _answers(server))
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
    return server


def _answers(server: Server) -> bool:
    try:
        server.client.post("/v1/open", {"agent": "main"})
    except OSError:
        return False
    return True


@pytest.fixture
def server(scenario: Scenario, tmp_path: Path) -> Iterator[Server]:
    running = _start(scenario, tmp_path)
    try:
        yield running
    finally:
        running.proc.send_signal(signal.SIGTERM)
        running.proc.wait(timeout=30)
    assert not running.socket.exists()  # removed on the way out


def _tcp(server: Server, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/v1/open", body, {"content-type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_each_gateway_session_sees_only_its_own_view(scenario: Scenario, server: Server) -> None:
    client = server.client
    alice = client.open("main", chat="direct", channel=CHANNEL, account=ACCOUNT, sender=ALICE_SENDER)["capability"]
    bob = client.open("main", chat="direct", channel=CHANNEL, account=ACCOUNT, sender=BOB_SENDER)["capability"]
    group = client.open("main", chat="group", channel=CHANNEL, account=ACCOUNT, conversation=GROUP_CONVERSATION)
    assert client.read(alice, "private/notes/allergy.md")["text"] == ALICE_FACT.decode()
    assert "A1c3" not in client.read(bob, "private/notes/allergy.md")["text"]
    hits = client.search(alice, "allergic")["results"]
    assert [h["path"] for h in hits] == ["private/notes/allergy.md"] and "A1c3" in hits[0]["snippet"]
    with pytest.raises(ApiError) as refused:
        client.read(group["capability"], "private/notes/allergy.md")
    assert (refused.value.status, refused.value.code, refused.value.reason) == (403, "denied", "outside-view")
    client.write(alice, "private/notes/new.md", "via the API\n")
    assert scenario.cli("read", scenario.alice_session, "private/notes/new.md").out == b"via the API\n"


def test_only_allowed_peer_uids_are_answered_on_the_socket(scenario: Scenario, tmp_path: Path) -> None:
    probe = ("import sys; from scopefs.api.client import Client\n"
             "try:\n    print(Client(sys.argv[1]).open('main')['subject'])\n"
             "except Exception as exc:\n    print(type(exc).__name__)\n")
    results = {}
    for name, extra in (("refused", ()), ("allowed", ("--allow-uid", str(OTHER_UID)))):
        (tmp_path / name).mkdir()
        reachable = Path(tempfile.mkdtemp(prefix="scopefs-api-"))  # pytest's own folders are root's alone
        reachable.chmod(0o711)
        server = _start(scenario, tmp_path / name, *extra, socket_dir=reachable)
        try:
            server.socket.chmod(0o666)  # the modes would refuse first: here the uid check must
            done = subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                                   str(Path(SCOPEFS).with_name("python")), "-c", probe, str(server.socket)],
                                  capture_output=True, text=True, timeout=60, check=False)
            results[name] = done.stdout.strip()
        finally:
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=30)
            shutil.rmtree(reachable, ignore_errors=True)
    assert results["allowed"] == "ambiguous"  # the control: the same call, with the uid allowed
    assert results["refused"] in ("RemoteDisconnected", "ConnectionResetError", "BrokenPipeError"), results


def test_loopback_http_needs_the_token(server: Server) -> None:
    body = json.dumps({"agent": "main"}).encode()
    assert _tcp(server, body, {})[0] == 401
    assert _tcp(server, body, {"authorization": "Bearer " + "x" * 43})[0] == 401
    status, answer = _tcp(server, body, {"authorization": f"Bearer {server.token}"})
    assert status == 200 and answer["result"]["subject"] == "ambiguous"


def test_the_description_is_public_and_a_trickled_body_is_bounded(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/openapi.json")
        response = conn.getresponse()
        assert response.status == 200 and "/v1/open" in json.loads(response.read())["paths"]
        # Chunked, no length declared: refused once it grows past the bound, not read whole.
        conn.putrequest("POST", "/v1/open")
        conn.putheader("authorization", f"Bearer {server.token}")
        conn.putheader("transfer-encoding", "chunked")
        conn.endheaders()
        piece = b" " * (1 << 20)
        try:
            for _ in range(MAX_BODY_BYTES // len(piece) + 2):
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass  # the server may close as soon as it refused
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    assert server.client.open("main")["subject"] == "ambiguous"  # still answering


def test_bad_requests_get_a_stable_code_and_change_nothing(scenario: Scenario, server: Server) -> None:
    client = server.client
    capability = client.open("main", chat="direct", channel=CHANNEL, account=ACCOUNT, sender=ALICE_SENDER)["capability"]
    before = snapshot(scenario.cli.home)
    auth = {"authorization": f"Bearer {server.token}"}
    assert _tcp(server, b"{not json", auth)[1]["error"]["code"] == "bad-input"
    assert _tcp(server, b"[]", auth)[1]["error"]["code"] == "bad-input"
    assert _tcp(server, json.dumps({"agent": "main", "principal": scenario.alice}).encode(), auth)[0] == 400
    assert _tcp(server, b" " * (MAX_BODY_BYTES + 1), auth)[0] == 413
    for body in ({"capability": capability, "nonce": "x", "ts": 1, "args": {"path": "a"}},
                 {"capability": "scap1_forged", "nonce": secrets.token_urlsafe(16), "ts": time.time_ns() // 1000,
                  "args": {"path": "private/notes/allergy.md"}}):
        status, answer = client.post("/v1/read", body)
        assert status in (400, 403) and answer["ok"] is False, answer
    assert snapshot(scenario.cli.home) == before
    assert client.read(capability, "private/notes/allergy.md")["text"] == ALICE_FACT.decode()  # still answering
    nonce = secrets.token_urlsafe(16)
    replay = {"capability": capability, "nonce": nonce, "ts": time.time_ns() // 1000,
              "args": {"path": "private/notes/allergy.md"}}
    assert client.post("/v1/read", replay)[0] == 200
    status, answer = client.post("/v1/read", replay)
    assert (status, answer["error"]["reason"]) == (403, "invalid-context")


# -- the published description, checked against the application ------------------------------------

SCHEMA_TOKEN = "t" * 40

T = TypeVar("T")
E = TypeVar("E", bound=Exception)


def ok(result: Ok[T] | Err[E]) -> T:
    """The value of a schemathesis ``Result`` (a union: only ``Ok`` has ``ok()``)."""
    assert isinstance(result, Ok), result.err()
    return result.ok()


def test_the_api_keeps_to_its_openapi_description(scenario: Scenario) -> None:
    """Generated requests for every route, valid and not: never a server error, always the answers
    the description promises (status codes, shapes, content types)."""
    home = Home.open(scenario.cli.home)
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", make_app(Service(home), token=SCHEMA_TOKEN))
        operations = [ok(result) for result in schema.get_all_operations()]
        assert sorted(op.path for op in operations) == ["/v1/close", "/v1/deposit", "/v1/derive", "/v1/forget",
                                                        "/v1/list", "/v1/mount", "/v1/open", "/v1/read", "/v1/search",
                                                        "/v1/write"]
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def check(case: Any) -> None:
                # A request the description allows may still be bad input: a path that is not NFC,
                # a sender with control characters... (``catalog.paths``, ``catalog.identity``);
                # JSON Schema cannot say all of it, so a 400 there is not a failure. Everything
                # else is checked, including that requests the description forbids are refused.
                case.call_and_validate(headers={"authorization": f"Bearer {SCHEMA_TOKEN}"},
                                       excluded_checks=[positive_data_acceptance])

            check()
    finally:
        home.close()
