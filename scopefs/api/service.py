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
  a bounded window, ``write``, ``list``, a group's ``deposit``).

Requests may run at once on several threads: each leases a home of its
own for its whole run (``workers``), while the replay window and its
per-capability quota are this object's, one for the process, behind a
lock (``replay``).

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
from scopefs.api.mounting import MountPolicy
from scopefs.api.replay import ReplayGuard
from scopefs.api.workers import WorkerHomes
from scopefs.catalog import exposures, ids
from scopefs.catalog.access import authorize_session
from scopefs.catalog.clock import now_us
from scopefs.catalog.epoch import policy_revision
from scopefs.catalog.errors import BadInput, Conflict, Denied, IntegrityError, ScopefsError
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

_OPEN_FIELDS = frozenset({"op", "agent", "chat", "channel", "account", "sender", "conversation", "ttl_s",
                          "session_key", "sandboxed"})
_CALL_FIELDS = frozenset({"op", "capability", "nonce", "ts", "args"})
_ARGS: dict[str, frozenset[str]] = {
    "search": frozenset({"query", "limit", "run"}),
    "read": frozenset({"path", "from", "lines", "run"}),
    "write": frozenset({"path", "content", "origin"}),
    "list": frozenset({"path"}),
    "close": frozenset(),
    "mount": frozenset({"name", "uid"}),
    "deposit": frozenset({"handle", "content"}),
    "derive": frozenset({"from", "to", "kind", "content"}),
    "forget": frozenset({"paths", "dry_run"}),
}


class Service:
    """The API of one home, for one server process (its replay window is this process's).

    ``homes``: one home (requests then take turns on it) or a ``WorkerHomes`` of them
    (as many requests at once as it has homes). ``handle`` may be
    called from any thread.
    """

    def __init__(self, homes: Home | WorkerHomes, *, clock: Callable[[], int] = now_us,
                 mounting: MountPolicy | None = None) -> None:
        self._mounting = mounting
        self._homes = homes if isinstance(homes, WorkerHomes) else WorkerHomes(homes, 1)
        self._clock = clock
        self._replay = ReplayGuard(clock())
        self._server_id = ids.random_token()  # capabilities of another process (or start) are not ours

    @property
    def workers(self) -> int:
        """How many requests may run at once (one home each)."""
        return self._homes.size

    def handle(self, request: object) -> dict[str, Any]:
        """The answer to one request object; never raises for anything a client can send."""
        try:
            with self._homes.lease() as home:
                return {"ok": True, "result": self._dispatch(home, request)}
        except ScopefsError as exc:
            return {"ok": False, "error": _error(exc)}
        except Exception as exc:  # noqa: BLE001 - storage trouble or a bug: by type only, never a value
            log.error("an API request failed (%s)", type(exc).__name__)
            return {"ok": False, "error": {"code": "failed", "message": f"the request failed ({type(exc).__name__})"}}

    def _dispatch(self, home: Home, request: object) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise BadInput("a request is a JSON object")
        op = request.get("op")
        if op == "open":
            _only(request, _OPEN_FIELDS)
            return self._open(home, request)
        if op not in _ARGS:
            raise BadInput("unknown op (open, search, read, write, list, close, mount, deposit)")
        _only(request, _CALL_FIELDS)
        args = request.get("args", {})
        if not isinstance(args, dict):
            raise BadInput("args must be an object")
        _only(args, _ARGS[op], what="args")
        grant = self._admit(home, request)
        if op == "mount":
            return self._mount(home, grant, args)
        return _OPERATIONS[op](home, grant, args)

    def _mount(self, home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        """Mount the session for a sandbox the gateway runs (``scopefs mount --for-uid``) at a place this
        server's operator allowed (``api.mounting``); it stops when the session ends."""
        from scopefs.sandbox import external, mounts

        if self._mounting is None:
            raise BadInput("this server does not mount sessions (start it with --mount-base and --mount-uids)")
        if any(m.session_id == grant.session_id for m in mounts.live_records(home)):
            raise BadInput("this session is mounted already")
        where, uid = self._mounting.place(args.get("name"), args.get("uid"))
        record = external.start(home, grant.session_id, str(where), uid, uid)
        return {"mountpoint": record.mountpoint, "for_uid": uid, "for_gid": uid}

    def _open(self, home: Home, request: dict[str, Any]) -> dict[str, Any]:
        agent = _text(request, "agent")
        ttl = request.get("ttl_s", CAPABILITY_TTL_S)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S:
            raise BadInput(f"ttl_s must be 1 to {MAX_TTL_S} seconds")
        if request.get("sandboxed") is not None and not isinstance(request.get("sandboxed"), bool):
            raise BadInput("sandboxed must be true or false")
        session_key = request.get("session_key")
        if session_key is not None and not isinstance(session_key, str):
            raise BadInput("session_key must be text")
        opening, actor, actor_binding = self._opening(home, agent, request)
        session = open_session(home, agent, opening, session_key=session_key)
        access = authorize_session(home, session.session_id, Op.RETRIEVE, actor_id=actor)
        expires = self._clock() + ttl * 1_000_000
        grant = Grant(capabilities.new_grant_id(), self._server_id, session.session_id, agent, actor, actor_binding,
                      policy_revision(access), expires)
        return {"capability": capabilities.issue(home, grant), "subject": session.subject.kind.value,
                "roots": list(access.view.roots()), "capture": access.view.capture, "expires_us": expires}

    def _opening(self, home: Home, agent: str, request: dict[str, Any]) -> tuple[Opening, str | None, str | None]:
        """The session these facts open, the verified actor (None: unattributed) and its binding."""
        state, key = home.state(), home.hmac_key()
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

    def _admit(self, home: Home, request: dict[str, Any]) -> Grant:
        """The grant of a request that may run now (Denied, audited by the catalog, otherwise)."""
        now = self._clock()
        grant = capabilities.open_grant(home, request.get("capability"), now)
        if grant.server_id != self._server_id:
            raise capabilities.invalid()  # another server's, or this one's before a restart
        self._replay.check(grant.grant_id, request.get("nonce"), request.get("ts"), now)
        try:
            access = authorize_session(home, grant.session_id, Op.RETRIEVE, actor_id=grant.actor_id)
        except BadInput:
            raise capabilities.invalid() from None  # its session is gone: say nothing of it
        if grant.actor_binding_id is not None and grant.actor_id is not None \
                and not binding_live(home.state(), grant.actor_binding_id, grant.actor_id):
            raise access.refuse(Op.RETRIEVE, Reason.IDENTITY_REVOKED)  # the actor was verified through it
        if access.agent_id != grant.agent_id or policy_revision(access) != grant.policy_revision:
            raise access.refuse(Op.RETRIEVE, Reason.PLAN_EXPIRED)
        return grant


def _search(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", 10)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise BadInput("limit must be an integer")
    _run(args)
    outcome = search(home, grant.session_id, _text(args, "query"), limit=limit, actor_id=grant.actor_id)
    receipt = _receipt(home, grant, args, "search",
                       [exposures.Exposed(hit.revision_id, hit.resource_id) for hit in outcome.hits])
    return {**outcome.payload(), "receipt": receipt}


def _read(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    path = _text(args, "path")
    _run(args)
    window, exposed = read_window(home, grant.session_id, path, Window(args.get("from", 1), args.get("lines")),
                                  actor_id=grant.actor_id)
    receipt = _receipt(home, grant, args, "read", [exposed])  # recorded before the text leaves
    return {"path": path, "text": window.text, "from": window.from_line, "lines": window.lines,
            "nextFrom": window.next_from, "receipt": receipt}


def _run(args: dict[str, Any]) -> None:
    """BadInput for a malformed run id, before anything is read (bad input changes nothing)."""
    if args.get("run") is not None:
        exposures.check_run_id(args["run"])


def _receipt(home: Home, grant: Grant, args: dict[str, Any], operation: str,
             exposed: list[exposures.Exposed]) -> dict[str, Any]:
    return exposures.record(home, session_id=grant.session_id, agent_id=grant.agent_id, run_id=args.get("run"),
                            operation=operation, exposed=exposed, policy_revision=grant.policy_revision).as_dict()


def _content(args: dict[str, Any]) -> bytes:
    content = args.get("content")
    if not isinstance(content, str) or len(content) > MAX_WRITE_CHARS:
        raise BadInput(f"content must be text of at most {MAX_WRITE_CHARS} characters")
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput("content must be valid text") from None


def _write(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    """A note of the session's own words, or (``origin: capture``) a machine capture from chat
    (``writer.capture``: the envelope stripped, a human-notes block kept)."""
    from scopefs.writer.capture import capture
    from scopefs.writer.transaction import write_note

    origin = args.get("origin", "human")
    if origin not in ("human", "capture"):
        raise BadInput("origin must be human or capture")
    write = capture if origin == "capture" else write_note
    result = write(home, grant.session_id, _text(args, "path"), _content(args), actor_id=grant.actor_id)
    return {"resource_id": result.resource_id, "revision_id": result.revision_id, "revision": result.revision_no,
            "sha256": result.sha256, "size": result.size, "created": result.created}


def _deposit(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    """A group's deposit through a message handle (``writer.postbox``): one generic refusal for every failure,
    an oversized deposit included."""
    from scopefs.writer.postbox import deposit

    content = args.get("content")
    handle = args.get("handle")
    if not isinstance(content, str) or not isinstance(handle, str):
        raise BadInput("a deposit is a handle and text content")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput("content must be valid text") from None
    deposit(home, grant.session_id, handle, data, actor_id=grant.actor_id)
    return {"deposited": True}


def _derive(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    """A derivation from notes of this session's view only: a capability names no other session."""
    from scopefs.writer.derive import MAX_SOURCES, derive, parse_source

    sources = args.get("from")
    if not isinstance(sources, list) or not 1 <= len(sources) <= MAX_SOURCES \
            or not all(isinstance(p, str) and p for p in sources):
        raise BadInput(f"from must list 1 to {MAX_SOURCES} paths")
    if any(parse_source(grant.session_id, p)[0] != grant.session_id for p in sources):
        raise BadInput("a source is a path of this session's view")
    kind = args.get("kind", "summary")
    if not isinstance(kind, str):
        raise BadInput("kind must be summary, compaction or digest")
    derived = derive(home, grant.session_id, sources, _text(args, "to"), _content(args), kind=kind,
                     actor_id=grant.actor_id)
    result = derived.result
    return {"resource_id": result.resource_id, "revision_id": result.revision_id, "revision": result.revision_no,
            "sha256": result.sha256, "size": result.size, "kind": derived.kind, "sources": derived.sources}


def _forget(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    from scopefs.writer.forget import MAX_PATHS, forget

    paths = args.get("paths")
    if not isinstance(paths, list) or not 1 <= len(paths) <= MAX_PATHS or not all(isinstance(p, str) for p in paths):
        raise BadInput(f"paths must list 1 to {MAX_PATHS} paths")
    dry_run = args.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadInput("dry_run must be true or false")
    return forget(home, grant.session_id, paths, dry_run=dry_run, actor_id=grant.actor_id).as_dict()


def _list(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    path = args.get("path", "")
    if not isinstance(path, str):
        raise BadInput("path must be text")
    entries = list_folder(home, grant.session_id, path, actor_id=grant.actor_id)
    return {"entries": [{"name": e.name, "folder": e.is_dir, "size": e.size} for e in entries]}


def _close(home: Home, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
    """End the session: every capability of it is refused from now on, and its mounts stop."""
    from scopefs.catalog.sessions import close_session

    return {"closed": close_session(home, grant.session_id)}


_OPERATIONS: dict[str, Callable[[Home, Grant, dict[str, Any]], dict[str, Any]]] = {
    "search": _search, "read": _read, "write": _write, "list": _list, "close": _close, "deposit": _deposit,
    "derive": _derive, "forget": _forget,
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
    elif isinstance(exc, Conflict):
        code = "conflict"  # another writer changed the note first: nothing was changed, retry is safe
    elif isinstance(exc, IntegrityError):
        code = "integrity"
    else:
        code = "failed"
    body: dict[str, Any] = {"code": code, "message": " ".join(str(exc).split())}
    if isinstance(exc, Denied):
        body["reason"] = str(exc.reason)
    return body
