"""A real OpenClaw (2026.9.6, from npm) with scopefs owning its memory slot.

``make openclaw`` installs Node 24 and OpenClaw into a cache outside the
clone (``SCOPEFS_OPENCLAW_DIR``); this test fails, never skips, when that
install is missing. One scopefs home, one ``scopefs serve --socket`` (seen
by the plugin through a proxy that records the facts of every open) and
one ``openclaw gateway run`` (isolated HOME, state and config) for the
module. Tools are driven two ways:

* without a model, through the gateway's ``POST /tools/invoke``, whose
  identity facts come from the session key and the
  ``x-openclaw-message-channel`` / ``x-openclaw-account-id`` headers; it
  never sets ``requesterSenderId`` (integrations/openclaw/RESEARCH.md §3
  and §5);
* as real agent turns: OpenClaw's bundled Telegram channel polls a fake Bot
  API (``channels.telegram.apiRoot``) and its model is a scripted
  OpenAI-compatible provider, so a Telegram user's message runs a turn whose
  tool context carries the sender Telegram vouched for (``from.id``) as
  ``requesterSenderId`` (RESEARCH.md §8). The scripted model calls the tool
  the message names and records the result OpenClaw hands back to it.

OpenClaw lowercases session keys, so every sender, account and
conversation id here is lowercase: the plugin passes the key's ids to
scopefs, and the bindings must spell them the same way. The agent ``main``
is not sandboxed (a sandboxed turn needs Docker); ``work`` is, for the
``sandboxed`` fact.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scopefs.api.client import Client
from scopefs.catalog.policy import AudienceKind, Effect, Op
from tests.conftest import SCOPEFS, Cli, db_copy
from tests.mountkit import wait_until
from tests.openclaw_fakes import RecordingApi, ScriptedModel, TelegramBotApi, wait_for
from tests.test_vfs_isolation import policy, publish_shared

pytestmark = pytest.mark.slow

OPENCLAW_DIR = Path(os.environ.get("SCOPEFS_OPENCLAW_DIR", "/var/cache/scopefs/openclaw-2026.9.6"))
OPENCLAW_VERSION = "2026.9.6"
PLUGIN_DIR = (Path(__file__).resolve().parent.parent / "integrations" / "openclaw").resolve()

CHANNEL = "telegram"
ACCOUNT = "oc-bot-acct-4410"
ALICE = "oc-alice-7730115"
BOB = "oc-bob-2290466"
GROUP = "-1005581902"  # a Telegram supergroup's chat id: the Telegram turns post in it too
ALICE_KEY = f"agent:main:{CHANNEL}:{ACCOUNT}:direct:{ALICE}"
BOB_KEY = f"agent:main:{CHANNEL}:{ACCOUNT}:direct:{BOB}"
GROUP_KEY = f"agent:main:{CHANNEL}:group:{GROUP}"
MAIN_KEY = "agent:main:main"

# Telegram users (numeric ids, as Telegram's from.id): Alice and Bob are bound to the same people as
# ALICE and BOB; Carol may talk to the bot (OpenClaw's allowlists) but has no scopefs binding.
TG_ALICE = {"id": 7730115, "is_bot": False, "first_name": "Alice"}
TG_BOB = {"id": 2290466, "is_bot": False, "first_name": "Bob"}
TG_CAROL = {"id": 5550001, "is_bot": False, "first_name": "Carol"}
TG_GROUP = {"id": int(GROUP), "type": "supergroup", "title": "Offsite"}
TG_TOKEN = "7000000001:scopefs-test-token"
MODEL = "scripted-1"

ALICE_FACT = "Alice's private note: allergic to hazelnuts (canary OcA1x)\n"
BOB_FACT = "Bob's private note: allergic to peanuts (canary OcB0y)\n"
CHANNEL_FACT = "Channel note: the team offsite is in Lisbon, allergic menus ordered (canary OcC4z)\n"
SHARED_FACT = "Shared handbook: allergic reactions go to the first-aid desk (canary OcS5w)\n"
CANARIES = {"alice": "OcA1x", "bob": "OcB0y", "channel": "OcC4z", "shared": "OcS5w"}
LONG_NOTE = "".join(f"line {n} of a long note\n" for n in range(1, 131))


@dataclass
class Gateway:
    port: int
    token: str
    env: dict[str, str]
    log: Path
    state: Path
    scopefs: ScopefsServer
    api: RecordingApi
    telegram: TelegramBotApi
    model: ScriptedModel
    people: dict[str, str]  # "alice"/"bob" -> principal id
    _turns: Iterator[int] = field(default_factory=itertools.count)

    def invoke(self, tool: str, args: dict[str, Any], session_key: str | None, *,
               channel: str | None = CHANNEL, account: str | None = ACCOUNT) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"tool": tool, "args": args}
        if session_key is not None:
            body["sessionKey"] = session_key
        headers = {"authorization": f"Bearer {self.token}", "content-type": "application/json"}
        if channel is not None:
            headers["x-openclaw-message-channel"] = channel
        if account is not None:
            headers["x-openclaw-account-id"] = account
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/tools/invoke", json.dumps(body).encode(),
                                         headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def details(self, tool: str, args: dict[str, Any], session_key: str | None, **headers: str | None) -> Any:
        status, answer = self.invoke(tool, args, session_key, **headers)
        assert status == 200 and answer.get("ok"), (status, answer)
        result = answer["result"]
        assert json.loads(result["content"][0]["text"]) == result["details"]  # jsonResult's envelope
        return result["details"]

    def turn(self, chat: dict[str, Any], sender: dict[str, Any], tool: str, args: dict[str, Any], *,
             usage: int | None = None) -> Any:
        """A Telegram message from ``sender`` in ``chat`` whose turn calls ``tool`` once: its result, as
        OpenClaw handed it to the model (the parsed JSON of a jsonResult, or an error's text). ``usage``:
        the prompt tokens the model reports for the turn."""
        turn = next(self._turns)
        script = f"[turn {turn}] CALL {tool} {json.dumps(args)} END" + (f" USAGE {usage}" if usage else "")
        self.telegram.send(chat, sender, script)
        results = wait_for(lambda: self.model.tool_results(turn), timeout=180)
        if not results:
            (self.state.parent / "model-requests.json").write_text(json.dumps(self.model.requests, indent=1))
        assert results, self.log.read_text(errors="replace")[-4000:]
        assert [name for name, _ in results] == [tool], results
        return results[0][1]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(OPENCLAW_DIR / "app/node_modules/.bin/openclaw"), *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)


@dataclass
class ScopefsServer:
    """``scopefs serve --socket`` for the module; restarting it voids every capability it issued."""

    home: Path
    sock: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([SCOPEFS, "serve", "--socket", str(self.sock)],
                                     env={**os.environ, "SCOPEFS_HOME": str(self.home)},
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("ab"))
        proc = self.proc
        wait_until(lambda: proc.poll() is not None or _answers(self.sock), timeout=30)
        assert proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _build_home(home: Path) -> dict[str, str]:
    cli = Cli(home)
    cli("init", check=True)
    cli.j("agent", "add", "main")
    cli.j("agent", "add", "work")
    alice = cli.j("principal", "add", "Alice", "--kind", "human")["principal_id"]
    bob = cli.j("principal", "add", "Bob", "--kind", "human")["principal_id"]
    for who, sender in ((alice, ALICE), (bob, BOB), (alice, str(TG_ALICE["id"])), (bob, str(TG_BOB["id"]))):
        cli.j("bind", who, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", sender)
    conversation = cli.j("conversation", "add", "--agent", "main", "--channel", CHANNEL, "--account", ACCOUNT,
                         "--conversation", GROUP)["conversation_id"]
    for member in (alice, bob):
        cli.j("member", "add", conversation, member, "--expires", "7d")

    def dm(sender: str) -> str:
        return str(cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", sender)["session_id"])

    alice_session, bob_session = dm(ALICE), dm(BOB)
    group_session = cli.j("session", "open", "--agent", "main", "--group", "--conversation", conversation)["session_id"]
    cli.j("write", alice_session, "private/notes/allergy.md", stdin=ALICE_FACT.encode())
    cli.j("write", alice_session, "private/notes/long.md", stdin=LONG_NOTE.encode())
    cli.j("write", bob_session, "private/notes/allergy.md", stdin=BOB_FACT.encode())
    cli.j("write", group_session, "channel/offsite.md", stdin=CHANNEL_FACT.encode())
    guide = publish_shared(home, "agent-shared/handbook.md", SHARED_FACT.encode(), alice_session)
    policy(home, guide, Effect.ALLOW, (Op.RETRIEVE, Op.READ), AudienceKind.SUBJECT_KIND, "ambiguous")
    return {"alice": str(alice), "bob": str(bob)}


def _openclaw_config(state: Path, port: int, token: str, sock: Path, telegram: TelegramBotApi,
                     model: ScriptedModel) -> dict[str, Any]:
    people = [str(u["id"]) for u in (TG_ALICE, TG_BOB, TG_CAROL)]
    return {
        "gateway": {"mode": "local", "port": port, "bind": "loopback", "auth": {"mode": "token", "token": token}},
        "plugins": {"load": {"paths": [str(PLUGIN_DIR)]}, "slots": {"memory": "scopefs"},
                    "entries": {"scopefs": {"enabled": True, "config": {"socket": str(sock)}},
                                "memory-core": {"enabled": False}}},
        "agents": {"ownership": "explicit",
                   "defaults": {"systemAgent": {"agentId": "main"}, "sandbox": {"mode": "off"},
                                "heartbeat": {"every": "0m"}, "model": {"primary": f"scripted/{MODEL}"},
                                # memory-core's flush plan reads this: it would flush at once
                                "compaction": {"memoryFlush": {"forceFlushTranscriptBytes": 1}}},
                   "entries": {"main": {}, "work": {"sandbox": {"mode": "all"}}}},
        "session": {"dmScope": "per-account-channel-peer"},
        "tools": {"toolSearch": False,  # the memory tools as direct tools, not behind tool_search/tool_call
                  "sandbox": {"tools": {"alsoAllow": ["memory_search", "memory_get", "memory_write"]}}},
        "models": {"mode": "merge", "providers": {"scripted": {
            "baseUrl": f"http://127.0.0.1:{model.port}/v1", "apiKey": "scripted-key", "api": "openai-completions",
            "models": [{"id": MODEL, "name": "scripted", "reasoning": False, "input": ["text"],
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                        "contextWindow": 128000, "maxTokens": 4096}]}}},
        "channels": {"telegram": {
            "enabled": True, "apiRoot": telegram.root, "network": {"dangerouslyAllowPrivateNetwork": True},
            "accounts": {ACCOUNT: {"botToken": TG_TOKEN}}, "defaultAccount": ACCOUNT,
            "dmPolicy": "allowlist", "allowFrom": people,
            "groupPolicy": "allowlist", "groupAllowFrom": people, "groups": {GROUP: {"requireMention": False}}}},
        "bindings": [{"agentId": "main", "match": {"channel": CHANNEL, "accountId": ACCOUNT}}],
        "logging": {"file": str(state / "logs" / "openclaw.log")},
    }


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    openclaw = OPENCLAW_DIR / "app/node_modules/.bin/openclaw"
    node_bin = OPENCLAW_DIR / "node/node_modules/.bin"
    installed = OPENCLAW_DIR / "app/node_modules/openclaw/package.json"
    if not (openclaw.exists() and (node_bin / "node").exists() and installed.exists()):
        pytest.fail(f"OpenClaw is not installed in {OPENCLAW_DIR}: run `make openclaw`")
    assert json.loads(installed.read_text())["version"] == OPENCLAW_VERSION

    root = tmp_path_factory.mktemp("openclaw")
    home, state, sock = root / "scopefs-home", root / "state", root / "api.sock"
    people = _build_home(home)
    serve = ScopefsServer(home, sock, root / "serve.log")
    telegram, model = TelegramBotApi(TG_TOKEN), ScriptedModel(MODEL)
    api: RecordingApi | None = None
    gateway_proc: subprocess.Popen[bytes] | None = None
    try:
        serve.start()
        api = RecordingApi(sock, root / "plugin.sock")
        telegram.start()
        model.start()

        port, token = _free_port(), secrets.token_urlsafe(24)
        (state / "logs").mkdir(parents=True)
        (root / "home").mkdir()
        config = state / "openclaw.json"
        config.write_text(json.dumps(_openclaw_config(state, port, token, api.sock, telegram, model), indent=2))
        env = {**os.environ, "HOME": str(root / "home"), "OPENCLAW_STATE_DIR": str(state),
               "OPENCLAW_CONFIG_PATH": str(config), "PATH": f"{node_bin}:{os.environ.get('PATH', '')}",
               "NO_COLOR": "1"}
        log = root / "gateway.log"
        gateway_proc = subprocess.Popen([str(openclaw), "gateway", "run", "--port", str(port)], env=env,
                                        stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
        wait_until(lambda: gateway_proc.poll() is not None or _healthy(port), timeout=120, interval=0.25)
        assert gateway_proc.poll() is None, log.read_text()[-4000:]
        # the Telegram channel is up once it long-polls the fake Bot API
        assert wait_for(lambda: telegram.sent("getUpdates"), timeout=120), log.read_text()[-4000:]
        yield Gateway(port, token, env, log, state, serve, api, telegram, model, people)
    finally:
        if gateway_proc is not None:
            _stop(gateway_proc)
        if api is not None:
            api.stop()
        telegram.stop()
        model.stop()
        serve.stop()


def _answers(sock: Path) -> bool:
    try:
        Client(str(sock)).post("/v1/open", {"agent": "main"})
    except OSError:
        return False
    return True


def _search(gw: Gateway, key: str | None, query: str, **headers: str | None) -> dict[str, Any]:
    return gw.details("memory_search", {"query": query}, key, **headers)  # type: ignore[no-any-return]


def _get(gw: Gateway, key: str | None, path: str, **headers: str | None) -> dict[str, Any]:
    return gw.details("memory_get", {"path": path}, key, **headers)  # type: ignore[no-any-return]


def _canaries(payload: Any) -> set[str]:
    text = json.dumps(payload)
    return {who for who, canary in CANARIES.items() if canary in text}


def test_each_dm_sees_only_its_own_private_notes(gateway: Gateway) -> None:
    for key, who, fact in ((ALICE_KEY, "alice", ALICE_FACT), (BOB_KEY, "bob", BOB_FACT)):
        found = _search(gateway, key, "allergic")
        assert _canaries(found) == {who, "shared"}, found  # private/ and agent-shared/ only
        hit = next(r for r in found["results"] if r["path"] == "private/notes/allergy.md")
        assert set(hit) == {"path", "startLine", "endLine", "score", "snippet", "source", "corpus", "citation"}
        assert (hit["startLine"], hit["endLine"], hit["source"], hit["corpus"]) == (1, 1, "memory", "memory")
        assert hit["citation"] == "private/notes/allergy.md#L1"  # one line: memory-core's short form
        assert hit["snippet"].endswith("\n\nSource: private/notes/allergy.md#L1") and isinstance(hit["score"], float)
        assert found["provider"] == "scopefs" and found["citations"] == "auto"

        read = _get(gateway, key, "private/notes/allergy.md")
        assert read == {"status": "ok", "text": fact.rstrip("\n"), "path": "private/notes/allergy.md", "from": 1,
                        "lines": 1}
        assert _get(gateway, key, "channel/offsite.md") == {"status": "not_found", "text": "",
                                                            "path": "channel/offsite.md"}


def test_the_group_sees_its_channel_and_no_private_notes(gateway: Gateway) -> None:
    found = _search(gateway, GROUP_KEY, "allergic")
    assert _canaries(found) == {"channel", "shared"}, found
    assert {r["path"] for r in found["results"]} == {"channel/offsite.md", "agent-shared/handbook.md"}
    assert all("citation" not in r for r in found["results"])  # memory-core: no citations in groups under auto
    assert _get(gateway, GROUP_KEY, "channel/offsite.md")["text"] == CHANNEL_FACT.rstrip("\n")
    for path in ("private/notes/allergy.md", "private/notes/long.md"):
        assert _get(gateway, GROUP_KEY, path)["status"] == "not_found"


def test_the_main_session_gets_only_the_ambiguous_view(gateway: Gateway) -> None:
    for key, headers in ((MAIN_KEY, {}), (None, {}), (MAIN_KEY, {"channel": None, "account": None})):
        found = _search(gateway, key, "allergic", **headers)
        assert _canaries(found) == {"shared"}, found
        assert [r["path"] for r in found["results"]] == ["agent-shared/handbook.md"]
        assert _get(gateway, key, "agent-shared/handbook.md", **headers)["text"] == SHARED_FACT.rstrip("\n")
        for path in ("private/notes/allergy.md", "channel/offsite.md"):
            assert _get(gateway, key, path, **headers)["status"] == "not_found"


@pytest.mark.parametrize("key, headers", [
    (ALICE_KEY, {"account": "oc-bot-acct-9999"}),  # the account header disagrees with the key
    (ALICE_KEY, {"account": None}),  # no account at all
    (ALICE_KEY, {"channel": "slack"}),  # another channel
    (f"agent:main:{CHANNEL}:oc-bot-acct-9999:direct:{ALICE}", {}),  # a key under another account
    (f"agent:main:{CHANNEL}:direct:{ALICE}", {}),  # per-channel-peer: no account in the key
    (f"agent:main:{CHANNEL}:{ACCOUNT}:direct:oc-mallory-1", {}),  # an unbound sender
    (f"agent:main:{CHANNEL}:group:oc-group-unregistered", {}),  # an unregistered group
], ids=["account-header", "no-account", "channel-header", "key-account", "no-account-in-key", "unbound", "group"])
def test_mismatched_or_forged_facts_fail_closed(gateway: Gateway, key: str, headers: dict[str, str | None]) -> None:
    found = _search(gateway, key, "allergic", **headers)
    assert _canaries(found) <= {"shared"}, found
    assert _get(gateway, key, "private/notes/allergy.md", **headers)["status"] == "not_found"
    status, answer = gateway.invoke("memory_write", {"path": "private/notes/forged.md", "content": "x\n"}, key,
                                    **headers)
    assert status == 403, (status, answer)  # the ambiguous view never writes


def test_writes_land_in_the_callers_own_view(gateway: Gateway) -> None:
    written = gateway.details("memory_write", {"path": "private/notes/flush.md", "content": "flushed (OcF1q)\n"},
                              ALICE_KEY)
    assert written["status"] == "ok" and written["created"] is True
    assert _get(gateway, ALICE_KEY, "private/notes/flush.md")["text"] == "flushed (OcF1q)"
    assert _get(gateway, BOB_KEY, "private/notes/flush.md")["status"] == "not_found"
    status, answer = gateway.invoke("memory_write", {"path": "agent-shared/x.md", "content": "x\n"}, ALICE_KEY)
    assert status == 403 and answer["error"]["type"] == "tool_error", answer


def test_reads_are_bounded_windows_with_next_from(gateway: Gateway) -> None:
    first = _get(gateway, ALICE_KEY, "private/notes/long.md")
    assert (first["from"], first["lines"], first["truncated"], first["nextFrom"]) == (1, 120, True, 121)
    assert first["text"].endswith("line 120 of a long note\n\n[More content available. Use from=121 to continue.]")
    rest = gateway.details("memory_get", {"path": "private/notes/long.md", "from": 121}, ALICE_KEY)
    assert (rest["from"], rest["lines"]) == (121, 10) and "truncated" not in rest and "nextFrom" not in rest
    window = gateway.details("memory_get", {"path": "private/notes/long.md", "from": 5, "lines": 2}, ALICE_KEY)
    assert window["text"].startswith("line 5 of a long note\nline 6 of a long note\n\n[More")
    assert window["nextFrom"] == 7


def test_a_capability_from_an_earlier_scopefs_is_replaced_once(gateway: Gateway) -> None:
    assert _canaries(_search(gateway, ALICE_KEY, "allergic")) == {"alice", "shared"}  # cached capability
    gateway.scopefs.stop()
    status, answer = gateway.invoke("memory_search", {"query": "allergic"}, ALICE_KEY)
    assert status == 200 and answer["result"]["details"]["unavailable"] is True  # memory-core's unavailable shape
    gateway.scopefs.start()  # a new server process: the cached capability is now invalid-context
    assert _canaries(_search(gateway, ALICE_KEY, "allergic")) == {"alice", "shared"}  # reopened, same view
    assert _canaries(_search(gateway, BOB_KEY, "allergic")) == {"bob", "shared"}


@pytest.mark.parametrize("tool, args", [
    ("memory_search", {}),
    ("memory_search", {"query": ""}),
    ("memory_search", {"query": "x", "principal": "alice"}),
    ("memory_search", {"query": "x", "maxResults": 0}),
    ("memory_search", {"query": "x", "corpus": "everything"}),
    ("memory_get", {"path": 5}),
    ("memory_get", {"path": "private/notes/allergy.md", "from": 0}),
    ("memory_write", {"path": "private/notes/x.md"}),
])
def test_bad_arguments_are_tool_input_errors(gateway: Gateway, tool: str, args: dict[str, Any]) -> None:
    status, answer = gateway.invoke(tool, args, ALICE_KEY)
    assert status == 400 and answer["error"]["type"] == "tool_error", (status, answer)


def test_the_memory_cli_is_scopefs_and_sees_only_the_ambiguous_view(gateway: Gateway) -> None:
    status = gateway.cli("memory", "status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout) | {"socket": None} == {"owner": "scopefs", "provider": "scopefs", "socket": None,
                                                           "agent": "main", "reachable": True, "view": "ambiguous"}
    found = gateway.cli("memory", "search", "allergic", "--json")
    assert found.returncode == 0, found.stderr[-2000:]
    results = json.loads(found.stdout)["results"]
    assert [r["path"] for r in results] == ["agent-shared/handbook.md"] and _canaries(results) == {"shared"}


# ---------------------------------------------------------------- real turns: Telegram in, a scripted model


def _dm(user: dict[str, Any]) -> dict[str, Any]:
    return {"id": user["id"], "type": "private", "first_name": user["first_name"]}


def _actor_of(gw: Gateway, name: str) -> list[str | None]:
    """The actor of every revision of the note whose path ends with ``name`` (None: unattributed)."""
    with db_copy(gw.scopefs.home / "agents" / "main" / "catalog.sqlite") as conn:
        rows = conn.execute("SELECT v.actor_id FROM revisions v JOIN resources r USING (resource_id)"
                            " WHERE r.path LIKE ? ORDER BY v.revision_no", (f"%/{name}",)).fetchall()
    return [None if row[0] is None else str(row[0]) for row in rows]


def test_telegram_dms_pass_the_verified_sender_and_see_only_its_notes(gateway: Gateway) -> None:
    for user, who, fact in ((TG_ALICE, "alice", ALICE_FACT), (TG_BOB, "bob", BOB_FACT)):
        found = gateway.turn(_dm(user), user, "memory_search", {"query": "allergic"})
        assert _canaries(found) == {who, "shared"}, found
        hit = next(r for r in found["results"] if r["path"] == "private/notes/allergy.md")
        assert hit["citation"] == "private/notes/allergy.md#L1" and found["provider"] == "scopefs"
        read = gateway.turn(_dm(user), user, "memory_get", {"path": "private/notes/allergy.md"})
        assert read == {"status": "ok", "text": fact.rstrip("\n"), "path": "private/notes/allergy.md", "from": 1,
                        "lines": 1}
        assert gateway.api.opened(agent="main", chat="direct", channel=CHANNEL, account=ACCOUNT,
                                  sender=str(user["id"]))

    # Carol may talk to the bot, but scopefs has no binding for her: the ambiguous view, no writes
    carol = _dm(TG_CAROL)
    found = gateway.turn(carol, TG_CAROL, "memory_search", {"query": "allergic"})
    assert _canaries(found) == {"shared"}, found
    assert gateway.turn(carol, TG_CAROL, "memory_get", {"path": "private/notes/allergy.md"})["status"] == "not_found"
    refused = gateway.turn(carol, TG_CAROL, "memory_write", {"path": "private/notes/carol.md", "content": "x\n"})
    assert "scopefs refused this session" in json.dumps(refused), refused
    assert gateway.api.opened(chat="direct", sender=str(TG_CAROL["id"]))


def test_a_telegram_group_turn_passes_its_sender_as_the_actor(gateway: Gateway) -> None:
    found = gateway.turn(TG_GROUP, TG_ALICE, "memory_search", {"query": "allergic"})
    assert _canaries(found) == {"channel", "shared"}, found  # never the sender's private notes
    assert all("citation" not in r for r in found["results"])
    assert gateway.api.opened(agent="main", chat="group", channel=CHANNEL, account=ACCOUNT, conversation=GROUP,
                              sender=str(TG_ALICE["id"]))

    for user, name in ((TG_ALICE, "from-alice.md"), (TG_BOB, "from-bob.md"), (TG_CAROL, "from-carol.md")):
        written = gateway.turn(TG_GROUP, user, "memory_write", {"path": f"channel/notes/{name}",
                                                                 "content": f"{user['first_name']} was here\n"})
        assert written["status"] == "ok" and written["created"] is True, written
    assert _actor_of(gateway, "from-alice.md") == [gateway.people["alice"]]
    assert _actor_of(gateway, "from-bob.md") == [gateway.people["bob"]]
    assert _actor_of(gateway, "from-carol.md") == [None]  # allowed in the group, unbound: unattributed

    # the group's notes are the group's: Bob reads Alice's, no direct chat sees them
    read = gateway.turn(TG_GROUP, TG_BOB, "memory_get", {"path": "channel/notes/from-alice.md"})
    assert read["text"] == "Alice was here"
    assert _get(gateway, ALICE_KEY, "channel/notes/from-alice.md")["status"] == "not_found"


def test_sandboxed_and_the_session_key_are_sent_when_the_api_declares_them(gateway: Gateway) -> None:
    probe = "oc-sandbox-probe"
    try:
        gateway.api.declare = {"sandboxed", "session_key"}  # the proxy declares them, then takes them off
        for agent, sandboxed in (("work", True), ("main", False)):  # work: sandbox.mode "all"; main: "off"
            key = f"agent:{agent}:{CHANNEL}:{ACCOUNT}:direct:{probe}-1"
            assert _canaries(_search(gateway, key, "allergic")) <= {"shared"}
            assert gateway.api.opened(agent=agent, sender=f"{probe}-1") == [
                {"agent": agent, "chat": "direct", "channel": CHANNEL, "account": ACCOUNT, "sender": f"{probe}-1",
                 "sandboxed": sandboxed, "session_key": key}]
    finally:
        gateway.api.declare = set()
    # what scopefs's API itself declares (on 2026-12-01 neither) is sent, and nothing else
    key = f"agent:work:{CHANNEL}:{ACCOUNT}:direct:{probe}-2"
    assert _search(gateway, key, "allergic")["results"] == []  # the real API took the open
    optional = {"sandboxed": True, "session_key": key}
    declared = {name: value for name, value in optional.items() if name in gateway.api.upstream_open_fields()}
    assert gateway.api.opened(sender=f"{probe}-2") == [
        {"agent": "work", "chat": "direct", "channel": CHANNEL, "account": ACCOUNT, "sender": f"{probe}-2"} | declared]


def test_the_memory_flush_is_declined(gateway: Gateway) -> None:
    """A context nearly full: OpenClaw flushes before it compacts (session maintenance after the turn,
    or the next turn's preflight), if the memory plugin gives it a flush plan. scopefs gives none."""
    carol = _dm(TG_CAROL)
    before = len(gateway.model.requests)
    gateway.turn(carol, TG_CAROL, "memory_search", {"query": "handbook"}, usage=127_000)
    time.sleep(5)  # the session's maintenance (where a flush plan would run first) starts after the turn
    found = gateway.turn(carol, TG_CAROL, "memory_search", {"query": "handbook"})  # compacts first
    assert _canaries(found) == {"shared"}, found
    summaries = [r for r in gateway.model.requests[before:]  # a compaction's: no tools, the transcript
                 if not r["tools"] and "<conversation>" in json.dumps(r["messages"])]
    assert summaries, "no compaction ran: the test did not reach the flush"
    assert "memory flush" not in json.dumps(gateway.model.requests).lower()  # memory-core's: "Pre-compaction ..."
    workspace = gateway.state / "workspace"
    assert workspace.is_dir() and not (workspace / "memory").exists()


def test_nothing_private_reached_the_gateway_log(gateway: Gateway) -> None:
    # last in the module: the logs of every call and turn above
    logs = gateway.log.read_text(errors="replace")
    for path in (gateway.log.parent / "state" / "logs").glob("*"):
        logs += path.read_text(errors="replace")
    assert not any(canary in logs for canary in CANARIES.values())
    assert "allergic" not in logs  # no query logged either
