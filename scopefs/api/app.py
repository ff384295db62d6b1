"""The HTTP face of the API: FastAPI routes over ``service.Service``, one per operation.

FastAPI gives the routes their OpenAPI description from the request
models (``/openapi.json``), which the test suite checks with schemathesis.
The models forbid unknown fields, so a client that names a principal or a
session is refused before anything runs. Everything else is the
service's: a route only moves the object in and the answer out, with the
answer's stable code as the HTTP status (``STATUS``).

Who may call: on the Unix socket the peer's uid was checked when it
connected (``server``); over loopback TCP every request must carry
``Authorization: Bearer <token>``. Requests run on worker threads, as
many at once as the service has homes (``Service.workers``: each request
holds a home, its own catalog connections, while it runs); the others
wait here, on the event loop, not on a thread. A body over
``MAX_BODY_BYTES`` is refused before it is read whole.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scopefs.api.service import MAX_WRITE_CHARS, Service
from scopefs.catalog.excerpt import MAX_LINES

MAX_BODY_BYTES = 4 * MAX_WRITE_CHARS + 4096  # the largest write, every character escaped, and its envelope
BODY_DEADLINE_S = 30.0
STATUS = {"bad-input": 400, "denied": 403, "conflict": 409, "integrity": 409, "failed": 500}
NONCE_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenRequest(_Strict):
    """Verified ingress facts; none at all opens the ambiguous view."""

    agent: str = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")
    chat: Literal["direct", "group"] | None = None
    channel: str | None = Field(default=None, min_length=1, max_length=256)
    account: str | None = Field(default=None, min_length=1, max_length=256)
    sender: str | None = Field(default=None, min_length=1, max_length=256)
    conversation: str | None = Field(default=None, min_length=1, max_length=256)
    ttl_s: int = Field(default=3600, ge=1, le=24 * 3600)
    session_key: str | None = Field(default=None, min_length=1, max_length=512,
                                    description="the gateway's key for this logical session (OpenClaw's"
                                                " sessionKey): reused while its subject holds")
    sandboxed: StrictBool | None = Field(default=None, description="the gateway's own classification of the"
                                                                   " session; recorded, never a grant")


RUN = Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,128}$",
            description="the gateway's run id: receipts of one run add up to its exposure set")


class SearchArgs(_Strict):
    query: str = Field(min_length=1, max_length=1000)
    limit: int = Field(default=10, ge=1, le=100)
    run: str | None = RUN


class ReadArgs(_Strict):
    path: str = Field(min_length=1, max_length=4096)
    from_: int = Field(default=1, ge=1, alias="from")
    lines: int | None = Field(default=None, ge=1, le=MAX_LINES)
    run: str | None = RUN


class WriteArgs(_Strict):
    path: str = Field(min_length=1, max_length=4096)
    content: str = Field(max_length=MAX_WRITE_CHARS)
    origin: Literal["human", "capture"] = Field(
        default="human", description="capture: machine-made from chat (envelope stripped, human block kept)")


class DeriveArgs(_Strict):
    from_: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        alias="from", min_length=1, max_length=64, description="source paths of this session's view")
    to: str = Field(min_length=1, max_length=4096)
    kind: Literal["summary", "compaction", "digest"] = "summary"
    content: str = Field(max_length=MAX_WRITE_CHARS)


class ForgetArgs(_Strict):
    paths: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(min_length=1, max_length=256)
    dry_run: bool = False


class DepositArgs(_Strict):
    handle: str = Field(min_length=1, max_length=64, description="a message handle from `scopefs message add`")
    content: str = Field(max_length=MAX_WRITE_CHARS, description="filed into the message sender's postbox")


class ListArgs(_Strict):
    path: str = Field(default="", max_length=4096)


class CloseArgs(_Strict):
    pass


class MountArgs(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="a folder under the server's --mount-base")
    uid: int = Field(ge=1, le=2**31 - 1, description="the only uid the mount answers, within --mount-uids")


class _Call(_Strict):
    capability: str = Field(min_length=1, max_length=1024)
    nonce: str = Field(pattern=NONCE_PATTERN)
    ts: int = Field(description="microseconds since the epoch when the request was made")


class SearchRequest(_Call):
    args: SearchArgs


class ReadRequest(_Call):
    args: ReadArgs


class WriteRequest(_Call):
    args: WriteArgs


class DepositRequest(_Call):
    args: DepositArgs


class DeriveRequest(_Call):
    args: DeriveArgs


class ForgetRequest(_Call):
    args: ForgetArgs


class ListRequest(_Call):
    args: ListArgs


class CloseRequest(_Call):
    args: CloseArgs = CloseArgs()


class MountRequest(_Call):
    args: MountArgs


class ErrorBody(BaseModel):
    code: Literal["bad-input", "denied", "conflict", "integrity", "failed"]
    message: str
    reason: str | None = None


class Answer(BaseModel):
    ok: bool
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None


def make_app(service: Service, *, token: str | None = None) -> ASGIApp:
    """The ASGI application; ``token`` is required of every request that did not come over the Unix socket."""
    app = FastAPI(title="scopefs gateway API", version="1", docs_url=None, redoc_url=None,
                  responses={code: {"model": Answer} for code in (400, 401, 403, 409, 413, 500)})
    limiter = anyio.CapacityLimiter(service.workers)  # a thread per home: none waits inside for a home

    async def run(body: dict[str, Any]) -> JSONResponse:
        answer = await anyio.to_thread.run_sync(service.handle, body, limiter=limiter)
        status = 200 if answer["ok"] else STATUS.get(answer["error"]["code"], 500)
        return JSONResponse(answer, status_code=status)

    @app.post("/v1/open", response_model=Answer)
    async def open_session(request: OpenRequest) -> JSONResponse:
        return await run({"op": "open", **request.model_dump(exclude_unset=True)})

    for op, model in (("search", SearchRequest), ("read", ReadRequest), ("write", WriteRequest),
                      ("list", ListRequest), ("close", CloseRequest), ("mount", MountRequest),
                      ("deposit", DepositRequest), ("derive", DeriveRequest), ("forget", ForgetRequest)):
        app.post(f"/v1/{op}", response_model=Answer, name=op)(_route(op, model, run))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = sorted({".".join(str(p) for p in error.get("loc", ())[1:]) or "body" for error in exc.errors()})
        message = "invalid request: " + ", ".join(fields)[:300]  # field names only, never a value sent
        return JSONResponse({"ok": False, "error": {"code": "bad-input", "message": message}}, status_code=400)

    return _Guard(app, token)


def _route(op: str, model: type[_Call], run: Callable[[dict[str, Any]], Awaitable[JSONResponse]]
           ) -> Callable[..., Awaitable[JSONResponse]]:
    """The endpoint of one capability-bound operation: its body model is what FastAPI validates and
    describes in the OpenAPI document (set as the annotation, since the model is chosen here)."""
    async def endpoint(request: _Call) -> JSONResponse:
        return await run({"op": op, **request.model_dump(by_alias=True, exclude_unset=True)})

    endpoint.__annotations__ = {"request": model, "return": JSONResponse}
    endpoint.__name__ = f"{op}_operation"
    return endpoint


class _Guard:
    """The bearer token for TCP callers, and the body bound for everyone, before FastAPI sees a byte."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self._app = app
        self._token = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope.get("method") == "GET" and scope.get("path") == "/openapi.json":
            await self._app(scope, _no_body(receive), send)  # the package's own shape: public, no body read
            return
        if not _over_unix_socket(scope) and not self._authorized(scope):
            await _refuse(send, 401, "a bearer token is required here")
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            await _refuse(send, 413, f"the body is over {MAX_BODY_BYTES} bytes")
            return
        body = None
        with anyio.move_on_after(BODY_DEADLINE_S):  # a client that trickles its body is dropped
            body = await _read_body(receive)
        if body is None:
            await _refuse(send, 413, f"the body is over {MAX_BODY_BYTES} bytes")
            return
        await self._app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        if self._token is None:
            return False
        given = dict(scope.get("headers", [])).get(b"authorization", b"")
        return hmac.compare_digest(given, b"Bearer " + self._token)


def _over_unix_socket(scope: Scope) -> bool:
    """uvicorn names a Unix socket's server as (path, None); TCP as (host, port)."""
    server = scope.get("server")
    return isinstance(server, (tuple, list)) and len(server) == 2 and server[1] is None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (None past ``MAX_BODY_BYTES``, or if the client left): small enough to hold."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _no_body(receive: Receive) -> Receive:
    """A ``receive`` for a route that takes no body: an empty one, whatever was sent."""
    async def empty() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    return empty


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then waits for the disconnect."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, status: int, message: str) -> None:
    body = ('{"ok": false, "error": {"code": "bad-input", "message": "' + message + '"}}').encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
