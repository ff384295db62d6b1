"""One request of a gateway, from its JSON object to the answer: the API's whole logic.

The transports (a Unix socket, loopback HTTP) only move these objects;
everything a request may do is decided here and below. Two kinds:

* ``open``: verified ingress facts (agent, ``chat`` direct or group,
  channel, account, and the sender of a direct message or the
  conversation of a group, with the group message's sender as the actor)
  become a session and its capability. The kind of chat is said, never
  guessed: a group message that lost its conversation must not open the
  sender's private view. A client never names a principal, a store or a
  session: facts that match no live binding or registered conversation
  open the ambiguous view, never a broader one.
* everything else carries ``capability``, ``nonce`` and ``ts``: the
  capability must open (same home, this server process, not expired),
  the nonce must be new (``replay``), the session's evidence and the
  actor's binding must still hold, and the policy revision must be the
  one the capability was issued under (a refusal there is audited); then
  the operation runs as the command line's does (``search``, ``read`` of
  a bounded window, ``write``, ``list``).

Answers are ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
{"code", "reason"?, "message"}}`` with the exit-code classes of the
command line as stable codes (``bad-input``, ``denied``, ``integrity``,
``failed``). A request never names another scope in an error, and bad
input changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scopefs.api import capabilities
from scopefs.api.capabilities import Grant
from scopefs.api.replay import ReplayGuard
from scopefs.api.revision import policy_revision
from scopefs.catalog import ids
from scopefs.catalog.access import authorize_session
from scopefs.catalog.clock import now_us
from scopefs.catalog.errors import BadInput, Denied, IntegrityError, ScopefsError
from scopefs.catalog.excerpt import Window
from scopefs.catalog.groups import find_conversation
from scopefs.catalog.home import Home
from scopefs.catalog.identity import binding_live, resolve_binding
from scopefs.catalog.listing import list_folder
from scopefs.catalog.policy import Op
from scopefs.catalog.reader import read_window
from scopefs.catalog.reasons import Reason
from scopefs.catalog.search import search
from scopefs.catalog.sessions import DirectMessage, Group, Opening, SharedMain, open_session

log = logging.getLogger("scopefs.api")

CAPABILITY_TTL_S = 3600
MAX_TTL_S = 24 * 3600
MAX_WRITE_CHARS = 1 << 20  # a JSON request holds text; larger notes go through a mount or the CLI

_OPEN_FIELDS = frozenset({"op", "agent", "chat", "channel", "account", "sender", "conversation", "ttl_s"})
_CALL_FIELDS = frozenset({"op", "capability", "nonce", "ts", "args"})
_ARGS: dict[str, frozenset[str]] = {
    "search": frozenset({"query", "limit"}),
    "read": frozenset({"path", "from", "lines"}),
    "write": frozenset({"path", "content"}),
    "list": frozenset({"path"}),
}


class Service:
    """The API of one home, for one server process (its replay window is this process's)."""

    def __init__(self, home: Home, *, clock: Callable[[], int] = now_us) -> None:
        self._home = home
        self._clock = clock
        self._replay = ReplayGuard(clock())
        self._server_id = ids.random_token()  # capabilities of another process (or start) are not ours

    def handle(self, request: object) -> dict[str, Any]:
        """The answer to one request object; never raises for anything a client can send."""
        try:
            return {"ok": True, "result": self._dispatch(request)}
        except ScopefsError as exc:
            return {"ok": False, "error": _error(exc)}
        except Exception as exc:  # noqa: BLE001 - storage trouble or a bug: by type only, never a value
            log.error("an API request failed (%s)", type(exc).__name__)
            return {"ok": False, "error": {"code": "failed", "message": f"the request failed ({type(exc).__name__})"}}

    def _dispatch(self, request: object) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise BadInput("a request is a JSON object")
        op = request.get("op")
        if op == "open":
            _only(request, _OPEN_FIELDS)
            return self._open(request)
        if op not in _ARGS:
            raise BadInput("unknown op (open, search, read, write, list)")
        _only(request, _CALL_FIELDS)
        args = request.get("args", {})
        if not isinstance(args, dict):
            raise BadInput("args must be an object")
        _only(args, _ARGS[op], what="args")
        grant = self._admit(request)
        return _OPERATIONS[op](self._home, grant, args)

    def _open(self, request: dict[str, Any]) -> dict[str, Any]:
        agent = _text(request, "agent")
        ttl = request.get("ttl_s", CAPABILITY_TTL_S)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S:
            raise BadInput(f"ttl_s must be 1 to {MAX_TTL_S} seconds")
        opening, actor, actor_binding = self._opening(agent, request)
        session = open_session(self._home, agent, opening)
        access = authorize_session(self._home, session.session_id, Op.RETRIEVE, actor_id=actor)
        expires = self._clock() + ttl * 1_000_000
        grant = Grant(capabilities.new_grant_id(), self._server_id, session.session_id, agent, actor, actor_binding,
                      policy_revision(access), expires)
        return {"capability": capabilities.issue(self._home, grant), "subject": session.subject.kind.value,
                "roots": list(access.view.roots()), "expires_us": expires}

    def _opening(self, agent: str, request: dict[str, Any]) -> tuple[Opening, str | None, str | None]:
        """The session these facts open, the verified actor (None: unattributed) and its binding."""
        state, key = self._home.state(), self._home.hmac_key()
        chat = request.get("chat")
        if chat is None:
            if any(request.get(f) is not None for f in ("channel", "account", "sender", "conversation")):
                raise BadInput("facts need chat: direct or group")
            return SharedMain(), None, None  # no facts at all: the ambiguous view, never a broader one
        channel, account = _text(request, "channel"), _text(request, "account")
        if chat == "direct":
            if request.get("conversation") is not None:
                raise BadInput("a direct chat has no conversation")
            sender = _text(request, "sender")
            found = resolve_binding(state, key, channel, account, sender)
            return DirectMessage(channel, account, sender), found[1] if found else None, found[0] if found else None
        if chat != "group":
            raise BadInput("chat must be direct or group")
        conversation_id = find_conversation(state, key, agent, channel, account, _text(request, "conversation"))
        if conversation_id is None:
            return SharedMain(), None, None  # an unregistered group is not a subject: ambiguous, fail closed
        found = None
        if request.get("sender") is not None:
            found = resolve_binding(state, key, channel, account, _text(request, "sender"))
        return Group(conversation_id), found[1] if found else None, found[0] if found else None

    def _admit(self, request: dict[str, Any]) -> Grant:
        """The grant of a request that may run now (Denied, audited by the catalog, otherwise)."""
        now = self._clock()
        grant = capabilities.open_grant(self._home, request.get("capability"), now)
        if grant.server_id != self._server_id:
            raise capabilities.invalid()  # another server's, or this one's before a restart
        self._replay.check(grant.grant_id, request.get("nonce"), request.get("ts"), now)
        try:
            access = authorize_session(self._home, grant.session_id, Op.RETRIEVE, actor_id=grant.actor_id)
        except BadInput:
            raise capabilities.invalid() from None  # its session is gone: say nothing of it
        if grant.actor_binding_id is not None and grant.actor_id is not None \
                and not binding_live(self._home.state(), grant.actor_binding_id, grant.actor_id):
            raise access.refuse(Op.RETRIEVE, Reason.IDENTITY_REVOKED)  # the actor was verified through it
        if access.agent_id != grant.agent_id or policy_revision(access) != grant.policy_revision:
            raise access.refuse(Op.RETRIEVE, Reason.PLAN_EXPIRED)
        return grant


def _search(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", 10)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise BadInput("limit must be an integer")
    outcome = search(home, grant.session_id, _text(args, "query"), limit=limit, actor_id=grant.actor_id)
    return outcome.payload()


def _read(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    path = _text(args, "path")
    window = read_window(home, grant.session_id, path, Window(args.get("from", 1), args.get("lines")),
                         actor_id=grant.actor_id)
    return {"path": path, "text": window.text, "from": window.from_line, "lines": window.lines,
            "nextFrom": window.next_from}


def _write(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    from scopefs.writer.transaction import write_note

    content = args.get("content")
    if not isinstance(content, str) or len(content) > MAX_WRITE_CHARS:
        raise BadInput(f"content must be text of at most {MAX_WRITE_CHARS} characters")
    result = write_note(home, grant.session_id, _text(args, "path"), content.encode("utf-8"),
                        actor_id=grant.actor_id)
    return {"resource_id": result.resource_id, "revision_id": result.revision_id, "revision": result.revision_no,
            "sha256": result.sha256, "size": result.size, "created": result.created}


def _list(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    path = args.get("path", "")
    if not isinstance(path, str):
        raise BadInput("path must be text")
    entries = list_folder(home, grant.session_id, path, actor_id=grant.actor_id)
    return {"entries": [{"name": e.name, "folder": e.is_dir, "size": e.size} for e in entries]}


_OPERATIONS: dict[str, Callable[[Home, Grant, dict[str, Any]], dict[str, Any]]] = {
    "search": _search, "read": _read, "write": _write, "list": _list,
}


def _only(fields: dict[str, Any], allowed: frozenset[str], *, what: str = "request") -> None:
    unknown = set(fields) - allowed
    if unknown:
        raise BadInput(f"unknown {what} field(s): {', '.join(sorted(map(str, unknown)))[:200]}")


def _text(fields: dict[str, Any], name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise BadInput(f"{name} must be non-empty text")
    return value


def _error(exc: ScopefsError) -> dict[str, Any]:
    """The stable code of a failure: the command line's exit classes, by name."""
    if isinstance(exc, BadInput):
        code = "bad-input"
    elif isinstance(exc, Denied):
        code = "denied"
    elif isinstance(exc, IntegrityError):
        code = "integrity"
    else:
        code = "failed"
    body: dict[str, Any] = {"code": code, "message": " ".join(str(exc).split())}
    if isinstance(exc, Denied):
        body["reason"] = str(exc.reason)
    return body
