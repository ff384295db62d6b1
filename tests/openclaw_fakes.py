"""What tests/test_openclaw.py plays around a real OpenClaw: the two outside services a turn needs, and a
recording proxy in front of scopefs.

* ``TelegramBotApi``: the Telegram Bot API that OpenClaw's bundled Telegram
  channel polls (``channels.telegram.apiRoot``). A test queues a message from
  a Telegram user (``from.id`` is the sender id Telegram vouches for); the
  channel admits it like any other update and runs an agent turn for it.
* ``RecordingApi``: a Unix-socket proxy in front of ``scopefs serve``
  that records every ``POST /v1/open`` body the plugin sends (the facts it
  derived), and can declare optional open facts the API behind it does not
  know yet (it then takes them off before forwarding).
* ``ScriptedModel``: an OpenAI-compatible ``/v1/chat/completions`` endpoint
  (a ``models.providers`` entry with ``api: "openai-completions"``) whose
  answers are scripted by the user's message: ``[turn N] CALL <tool> <json
  args> END`` makes it call that tool once, and it records every tool result
  OpenClaw sends back, exactly as OpenClaw put it into the model's context.
  ``... END USAGE n`` makes it report n prompt tokens for that turn (a
  context nearly full, so the next turn compacts first).

The Telegram and model fakes know nothing of scopefs; they only stand in for
Telegram's servers and for a model provider.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

CALL = re.compile(r"\[turn (?P<turn>\d+)\] CALL (?P<tool>[a-z_]+) (?P<args>\{.*?\}) END(?: USAGE (?P<usage>\d+))?",
                  re.DOTALL)



def send_json(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """One complete JSON answer (both fakes answer this way)."""
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Service:
    """An HTTP server on 127.0.0.1 in a thread; ``handle`` gives (status, JSON, None) or (status, None, SSE events)."""

    def __init__(self) -> None:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:  # quiet
                return

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload, stream = service.handle(method, self.path, raw, dict(self.headers))
                try:
                    self._write(status, payload, stream)
                except (BrokenPipeError, ConnectionResetError):  # the client left (OpenClaw aborts a turn)
                    self.close_connection = True

            def _write(self, status: int, payload: Any, stream: list[str] | None) -> None:
                if stream is not None:
                    self.send_response(status)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("cache-control", "no-cache")
                    self.send_header("connection", "close")
                    self.end_headers()
                    for event in stream:
                        self.wfile.write(f"data: {event}\n\n".encode())
                        self.wfile.flush()
                    self.close_connection = True
                    return
                send_json(self, status, json.dumps(payload).encode())

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self._answer("POST")

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def handle(self, method: str, path: str, raw: bytes, headers: dict[str, str]
               ) -> tuple[int, Any, list[str] | None]:
        raise NotImplementedError


def _form(raw: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """A Bot API call's parameters: JSON, or a urlencoded/multipart form (only JSON is expected)."""
    if not raw:
        return {}
    kind = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    if "json" in kind:
        value = json.loads(raw)
        return value if isinstance(value, dict) else {}
    return dict(parse_qsl(raw.decode()))


class TelegramBotApi(_Service):
    """The Bot API of one bot: long-polled updates in, every call recorded."""

    def __init__(self, token: str, *, bot_id: int = 7000000001, username: str = "scopefs_test_bot") -> None:
        super().__init__()
        self.token = token
        self.bot = {"id": bot_id, "is_bot": True, "first_name": "scopefs test", "username": username,
                    "can_join_groups": True, "can_read_all_group_messages": True, "supports_inline_queries": False}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._updates: list[dict[str, Any]] = []
        self._next_update = 1
        self._next_message = 100
        self._changed = threading.Condition()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def send(self, chat: dict[str, Any], sender: dict[str, Any], text: str) -> int:
        """Queue a text message from ``sender`` in ``chat``; returns its message id."""
        with self._changed:
            self._next_message += 1
            message = {"message_id": self._next_message, "date": int(time.time()), "chat": chat, "from": sender,
                       "text": text}
            self._updates.append({"update_id": self._next_update, "message": message})
            self._next_update += 1
            self._changed.notify_all()
            return self._next_message

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        with self._changed:
            return [params for name, params in self.calls if name == method]

    def handle(self, method: str, path: str, raw: bytes, headers: dict[str, str]
               ) -> tuple[int, Any, list[str] | None]:
        prefix = f"/bot{self.token}/"
        if not path.startswith(prefix):
            return 404, {"ok": False, "error_code": 404, "description": "Not Found"}, None
        name = path[len(prefix):].split("?", 1)[0]
        params = _form(raw, headers)
        with self._changed:
            self.calls.append((name, params))
        if name == "getUpdates":
            return 200, {"ok": True, "result": self._poll(params)}, None
        result: Any = True
        if name == "getMe":
            result = self.bot
        elif name in ("sendMessage", "editMessageText", "sendPhoto", "sendDocument"):
            with self._changed:
                self._next_message += 1
                result = {"message_id": self._next_message, "date": int(time.time()), "from": self.bot,
                          "chat": {"id": params.get("chat_id"), "type": "private"}, "text": params.get("text", "")}
        elif name in ("getMyCommands", "getForumTopicIconStickers"):
            result = []
        elif name == "getChat":
            result = {"id": params.get("chat_id"), "type": "private"}
        elif name == "getChatMember":
            result = {"status": "member", "user": self.bot}
        elif name == "getWebhookInfo":
            result = {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
        return 200, {"ok": True, "result": result}, None

    def _poll(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(params.get("offset") or 0)
        timeout = min(float(params.get("timeout") or 0), 2.0)  # answer long polls quickly: shutdown stays fast
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                ready = [u for u in self._updates if u["update_id"] >= offset]
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return ready
                self._changed.wait(left)


class ScriptedModel(_Service):
    """An OpenAI-compatible chat-completions model that does what the user's message says.

    A user message ``[turn 7] CALL memory_search {"query": "x"} END`` makes it
    call that tool once; when the call's result follows that message it
    answers ``done``. The script is the highest-numbered turn in the user
    messages (OpenClaw may quote earlier messages back as context, and it
    rewrites tool call ids, so neither an id nor the last message says which
    turn this is). A request that offers no tools (a compaction's summary)
    gets a summary; anything else (a title, a recap) gets ``NO_REPLY``.
    """

    MAX_CALLS_PER_TURN = 3  # a script that never sees its result stops calling, instead of looping

    def __init__(self, model: str = "scripted-1") -> None:
        super().__init__()
        self.model = model
        self.requests: list[dict[str, Any]] = []  # each request, with only how many tools it offered
        self._calls: dict[int, int] = {}
        self._lock = threading.Lock()

    def tool_results(self, turn: int) -> list[tuple[str, Any]]:
        """(tool name, parsed result) of each tool result that follows ``turn``'s message."""
        found: dict[str, tuple[str, Any]] = {}
        with self._lock:
            requests = list(self.requests)
        for request in requests:
            messages = request.get("messages", [])
            start = _script_message(messages, turn)
            if start is None:
                continue
            names = {call["id"]: call["function"]["name"] for m in messages[start:] if m.get("role") == "assistant"
                     for call in m.get("tool_calls") or []}
            for m in messages[start:]:
                if m.get("role") == "tool":
                    found.setdefault(m.get("tool_call_id", "?"), (names.get(m.get("tool_call_id"), "?"),
                                                                  _parsed(_text(m.get("content")))))
        return list(found.values())

    def handle(self, method: str, path: str, raw: bytes, headers: dict[str, str]
               ) -> tuple[int, Any, list[str] | None]:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]}, None
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            return 404, {"error": {"message": "not found", "type": "invalid_request_error"}}, None
        request = json.loads(raw or b"{}")
        messages, tools = request.get("messages") or [], len(request.get("tools") or [])
        with self._lock:
            self.requests.append({k: v for k, v in request.items() if k != "tools"} | {"tools": tools})
            message, usage = self._reply(messages, offers_tools=tools > 0)
        if request.get("stream"):
            return 200, None, _stream(self.model, message, usage)
        return 200, _completion(self.model, message, usage), None

    def _reply(self, messages: list[dict[str, Any]], *, offers_tools: bool) -> tuple[dict[str, Any], int]:
        scripts = [script for m in messages if m.get("role") == "user" for script in _scripts(m)]
        if not offers_tools:
            return {"role": "assistant", "content": "Summary: scripted test turns." if scripts else "NO_REPLY"}, 10
        if not scripts:
            return {"role": "assistant", "content": "NO_REPLY"}, 10
        turn, tool, args, usage = max(scripts)
        start = _script_message(messages, turn)
        answered = start is not None and any(m.get("role") == "tool" for m in messages[start:])
        if answered or self._calls.get(turn, 0) >= self.MAX_CALLS_PER_TURN:
            return {"role": "assistant", "content": "done"}, usage
        self._calls[turn] = self._calls.get(turn, 0) + 1
        call = {"id": f"call{turn}x{self._calls[turn]}", "type": "function",
                "function": {"name": tool, "arguments": args}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}, usage


def _scripts(message: dict[str, Any]) -> list[tuple[int, str, str, int]]:
    """The (turn, tool, JSON args, prompt tokens) scripts a user message holds; a quoted (escaped) copy is none."""
    found = []
    for script in CALL.finditer(_text(message.get("content"))):
        try:
            json.loads(script["args"])
        except ValueError:
            continue
        found.append((int(script["turn"]), script["tool"], script["args"], int(script["usage"] or 10)))
    return found


def _script_message(messages: list[dict[str, Any]], turn: int) -> int | None:
    """The index of the first user message scripting ``turn``."""
    return next((i for i, m in enumerate(messages)
                 if m.get("role") == "user" and any(s[0] == turn for s in _scripts(m))), None)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}


def _completion(model: str, message: dict[str, Any], usage: int) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": _usage(usage)}


def _stream(model: str, message: dict[str, Any], usage: int) -> list[str]:
    base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    events: list[dict[str, Any]] = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    if message.get("tool_calls"):
        for i, call in enumerate(message["tool_calls"]):
            delta = {"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": call["function"]["arguments"]}}]}
            events.append({**base, "choices": [{"index": 0, "delta": delta}]})
        finish = "tool_calls"
    else:
        events.append({**base, "choices": [{"index": 0, "delta": {"content": message.get("content") or ""}}]})
        finish = "stop"
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    events.append({**base, "choices": [], "usage": _usage(usage)})
    return [json.dumps(e) for e in events] + ["[DONE]"]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self._path)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class RecordingApi:
    """``scopefs serve --socket`` seen through a recording proxy on another socket.

    ``opens`` holds every ``/v1/open`` body as the plugin sent it. ``declare``
    names optional open facts to add to the API's OpenAPI document; a body's
    declared fact the upstream does not itself declare is recorded and taken
    off before forwarding. When the upstream does not answer, the connection
    is closed with no answer, as a dead server's would be.
    """

    def __init__(self, upstream: Path, sock: Path) -> None:
        self.upstream = str(upstream)
        self.sock = sock
        self.opens: list[dict[str, Any]] = []
        self.declare: set[str] = set()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                return

            def address_string(self) -> str:
                return "unix"

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    status, data = proxy.forward(self.command, self.path, body)
                except OSError:
                    self.close_connection = True
                    return
                send_json(self, status, data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._forward()

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self._forward()

        self._server = _UnixServer(str(sock), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="RecordingApi", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def opened(self, **facts: Any) -> list[dict[str, Any]]:
        """The recorded open bodies that carry all of ``facts``."""
        with self._lock:
            return [o for o in self.opens if all(o.get(k) == v for k, v in facts.items())]

    def forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if method == "POST" and path == "/v1/open":
            request = json.loads(body)
            with self._lock:
                self.opens.append(dict(request))
            unknown = self.declare - self.upstream_open_fields()
            body = json.dumps({k: v for k, v in request.items() if k not in unknown}).encode()
        status, data = self._send(method, path, body)
        if method == "GET" and path == "/openapi.json" and status == 200 and self.declare:
            document = json.loads(data)
            properties = document["components"]["schemas"]["OpenRequest"]["properties"]
            for name in self.declare:
                properties.setdefault(name, {"title": name})
            data = json.dumps(document).encode()
        return status, data

    def upstream_open_fields(self) -> set[str]:
        """The fields the API behind the proxy declares for an open."""
        status, data = self._send("GET", "/openapi.json", b"")
        return set(json.loads(data)["components"]["schemas"]["OpenRequest"]["properties"]) if status == 200 else set()

    def _send(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        connection = _UnixConnection(self.upstream)
        try:
            headers = {"content-type": "application/json"} if method == "POST" else {}
            connection.request(method, path, body=body if method == "POST" else None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
