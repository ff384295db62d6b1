"""The gateway API's core, in process: capabilities, replay, and each session's own view.

A gateway opens a session from verified ingress facts and gets an opaque
capability; every later request carries it with a fresh nonce and time.
These tests drive ``scopefs.api.service.Service`` with the request
objects a transport would pass (the transports come on top of it): who
sees what, what a forged, expired, replayed or outdated request gets, and
that bad input changes nothing.
"""

from __future__ import annotations

import secrets
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from scopefs.api.service import Service
from scopefs.catalog.excerpt import MAX_CHARS, MAX_LINES, Window, excerpt
from scopefs.catalog.home import Home
from scopefs.catalog.policies import add_entry
from scopefs.catalog.policy import AudienceKind, Effect, Op
from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    BOB_SENDER,
    CHANNEL,
    CHANNEL_FACT,
    GROUP_CONVERSATION,
    Cli,
    Scenario,
    build_scenario,
    snapshot,
)

START_US = 1_900_000_000_000_000  # the service's clock, moved by the tests


class Clock:
    def __init__(self) -> None:
        self.now = START_US

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def api(scenario: Scenario) -> Iterator[tuple[Service, Clock]]:
    home = Home.open(scenario.cli.home)
    clock = Clock()
    try:
        yield Service(home, clock=clock), clock
    finally:
        home.close()


def _ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"] is True, answer
    return answer["result"]  # type: ignore[no-any-return]


def _refused(answer: dict[str, Any], code: str, reason: str | None = None) -> dict[str, Any]:
    assert answer["ok"] is False, answer
    assert answer["error"]["code"] == code, answer
    assert answer["error"].get("reason") == reason, answer
    return answer["error"]  # type: ignore[no-any-return]


def _call(service: Service, clock: Clock, capability: str, op: str, **args: Any) -> dict[str, Any]:
    return service.handle({"op": op, "capability": capability, "nonce": secrets.token_urlsafe(16),
                           "ts": clock.now, "args": args})


def _open(service: Service, **facts: str) -> dict[str, Any]:
    return _ok(service.handle({"op": "open", "agent": "main", **facts}))


def _dm(service: Service, sender: str) -> str:
    return _open(service, chat="direct", channel=CHANNEL, account=ACCOUNT,  # type: ignore[no-any-return]
                 sender=sender)["capability"]


def _group(service: Service, **facts: str) -> dict[str, Any]:
    return _open(service, chat="group", channel=CHANNEL, account=ACCOUNT, conversation=GROUP_CONVERSATION, **facts)


def test_each_capability_sees_only_its_own_view(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, clock = api
    alice, bob = _dm(service, ALICE_SENDER), _dm(service, BOB_SENDER)
    group = _group(service, sender=ALICE_SENDER)
    assert group["subject"] == "conversation" and "channel" in group["roots"] and "private" not in group["roots"]
    note = "private/notes/allergy.md"
    assert _ok(_call(service, clock, alice, "read", path=note))["text"] == ALICE_FACT.decode()
    assert _ok(_call(service, clock, bob, "read", path=note))["text"] == BOB_FACT.decode()
    assert _ok(_call(service, clock, group["capability"], "read", path="channel/offsite.md"))["text"] \
        == CHANNEL_FACT.decode()
    _refused(_call(service, clock, group["capability"], "read", path=note), "denied", "outside-view")
    found = _ok(_call(service, clock, alice, "search", query="allergic"))["results"]
    assert [(h["path"], "A1c3" in h["snippet"]) for h in found] == [(note, True)]  # never Bob's
    assert "B0b7" not in str(_ok(_call(service, clock, alice, "list", path="private/notes")))
    written = _ok(_call(service, clock, bob, "write", path="private/notes/new.md", content="Bob's new fact\n"))
    assert written["created"] is True
    _refused(_call(service, clock, alice, "read", path="private/notes/new.md"), "denied", "outside-view")


def test_no_verifiable_identity_opens_the_ambiguous_view(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, _ = api
    for facts in ({}, {"chat": "direct", "channel": CHANNEL, "account": ACCOUNT, "sender": "tg-sender-nobody-1"},
                  {"chat": "group", "channel": CHANNEL, "account": ACCOUNT, "conversation": "tg-chat-unregistered-1"}):
        opened = _open(service, **facts)
        assert opened["subject"] == "ambiguous" and opened["roots"] == ["agent-shared"], facts
    # A group message whose conversation got lost is not a direct message: it is refused, not guessed.
    _refused(service.handle({"op": "open", "agent": "main", "chat": "group", "channel": CHANNEL, "account": ACCOUNT,
                             "sender": ALICE_SENDER}), "bad-input")
    _refused(service.handle({"op": "open", "agent": "main", "channel": CHANNEL, "account": ACCOUNT,
                             "sender": ALICE_SENDER}), "bad-input")


def test_a_client_cannot_name_a_principal_a_session_or_a_store(scenario: Scenario,
                                                                api: tuple[Service, Clock]) -> None:
    """Nor a path outside the view; and none of these bad requests changes anything."""
    service, clock = api
    alice = _dm(service, ALICE_SENDER)
    before = snapshot(scenario.cli.home)
    for extra in ({"principal": scenario.alice}, {"session_id": scenario.alice_session}, {"store": "x"}):
        _refused(service.handle({"op": "open", "agent": "main", **extra}), "bad-input")
    for args in ({"path": "private/notes/allergy.md", "actor": scenario.bob}, {"path": "/etc/passwd"},
                 {"path": "private/../private/notes/allergy.md"}):
        answer = service.handle({"op": "read", "capability": alice, "nonce": secrets.token_urlsafe(16),
                                 "ts": clock.now, "args": args})
        _refused(answer, "bad-input")
    malformed: object
    for malformed in (None, [], "read", {"op": "read"}, {"op": "drop-tables"},
                      {"op": "read", "capability": alice, "nonce": "short", "ts": clock.now, "args": {}},
                      {"op": "read", "capability": alice, "nonce": secrets.token_urlsafe(16), "ts": "now",
                       "args": {"path": "x"}},
                      {"op": "write", "capability": alice, "nonce": secrets.token_urlsafe(16), "ts": clock.now,
                       "args": {"path": "private/x.md", "content": b"bytes are not text"}}):
        assert service.handle(malformed)["ok"] is False, malformed
    assert snapshot(scenario.cli.home) == before


def test_forged_expired_and_foreign_capabilities_are_refused(scenario: Scenario, api: tuple[Service, Clock],
                                                             tmp_path: Any) -> None:
    service, clock = api
    alice = _dm(service, ALICE_SENDER)
    flipped = alice[:-3] + ("A" if alice[-3] != "A" else "B") + alice[-2:]
    for forged in (flipped, alice[:-5], "scap1_" + "A" * 60, "x" * 5000, 42):
        _refused(_call(service, clock, forged, "read", path="private/notes/allergy.md"),  # type: ignore[arg-type]
                 "denied", "invalid-context")
    cli = Cli(tmp_path / "other-home")
    cli("init", check=True)
    build_scenario(cli)
    with_other_key = Service(Home.open(cli.home), clock=clock)
    _refused(_call(with_other_key, clock, alice, "read", path="private/notes/allergy.md"), "denied",
             "invalid-context")
    clock.now += 3601 * 1_000_000  # past the default hour
    _refused(_call(service, clock, alice, "read", path="private/notes/allergy.md"), "denied", "plan-expired")


def test_a_replayed_or_stale_request_is_refused(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, clock = api
    alice = _dm(service, ALICE_SENDER)
    request = {"op": "read", "capability": alice, "nonce": secrets.token_urlsafe(16), "ts": clock.now,
               "args": {"path": "private/notes/allergy.md"}}
    _ok(service.handle(dict(request)))
    _refused(service.handle(dict(request)), "denied", "invalid-context")  # the same nonce again
    clock.now += 10 * 60 * 1_000_000
    stale = {**request, "nonce": secrets.token_urlsafe(16), "ts": clock.now - 10 * 60 * 1_000_000}
    _refused(service.handle(stale), "denied", "invalid-context")
    from_the_future = {**request, "nonce": secrets.token_urlsafe(16), "ts": clock.now + 60 * 1_000_000}
    _refused(service.handle(from_the_future), "denied", "invalid-context")
    # Within the window, but made before this server started: a restart never reopens the window.
    restarted_clock = Clock()
    restarted_clock.now = START_US + 30 * 1_000_000
    restarted = Service(Home.open(scenario.cli.home), clock=restarted_clock)
    own = _dm(restarted, ALICE_SENDER)
    early = {**request, "capability": own, "nonce": secrets.token_urlsafe(16), "ts": START_US + 29 * 1_000_000}
    _refused(restarted.handle(early), "denied", "invalid-context")
    _ok(restarted.handle({**early, "nonce": secrets.token_urlsafe(16), "ts": restarted_clock.now}))  # the control
    # Another server process of the same home: the first one's capabilities are not its own.
    _refused(restarted.handle({**request, "nonce": secrets.token_urlsafe(16), "ts": restarted_clock.now}),
             "denied", "invalid-context")
    # A wall clock stepped back does not revive a nonce already forgotten.
    sent_at = clock.now
    sent = {**request, "nonce": secrets.token_urlsafe(16), "ts": sent_at}
    _ok(service.handle(dict(sent)))
    clock.now += 3 * 60 * 1_000_000  # past the window: the guard forgets the nonce at its next call
    _ok(service.handle({**request, "nonce": secrets.token_urlsafe(16), "ts": clock.now}))
    clock.now = sent_at  # the clock steps back to when it was sent
    _refused(service.handle(dict(sent)), "denied", "invalid-context")


def test_a_capability_outlives_no_change_of_policy_or_evidence(scenario: Scenario,
                                                               api: tuple[Service, Clock]) -> None:
    service, clock = api
    alice, group = _dm(service, ALICE_SENDER), _group(service)["capability"]
    _ok(_call(service, clock, group, "list", path="channel"))
    home = Home.open(scenario.cli.home)
    try:
        add_entry(home.catalog("main"), "main", target_kind="store", target_id=_store_of(home, "channel"),
                  effect=Effect.DENY, capability=Op.DEPOSIT, audience_kind=AudienceKind.SUBJECT_KIND,
                  audience_id="ambiguous")
    finally:
        home.close()
    _refused(_call(service, clock, group, "list", path="channel"), "denied", "plan-expired")
    reopened = _group(service)["capability"]
    _ok(_call(service, clock, reopened, "list", path="channel"))  # the control: a fresh capability works
    scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
    _refused(_call(service, clock, alice, "read", path="private/notes/allergy.md"), "denied", "identity-revoked")


def test_a_group_actor_ends_with_the_binding_that_verified_them(scenario: Scenario,
                                                                  api: tuple[Service, Clock]) -> None:
    service, clock = api
    group = _group(service, sender=ALICE_SENDER)["capability"]
    unattributed = _group(service)["capability"]
    _ok(_call(service, clock, group, "list", path="channel"))
    scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
    _refused(_call(service, clock, group, "list", path="channel"), "denied", "identity-revoked")
    _ok(_call(service, clock, unattributed, "list", path="channel"))  # the control: the group itself is fine


def test_a_policy_entry_reaching_its_expiry_is_a_new_revision(scenario: Scenario,
                                                              api: tuple[Service, Clock]) -> None:
    service, clock = api
    home = Home.open(scenario.cli.home)
    try:
        add_entry(home.catalog("main"), "main", target_kind="store", target_id=_store_of(home, "channel"),
                  effect=Effect.DENY, capability=Op.DEPOSIT, audience_kind=AudienceKind.SUBJECT_KIND,
                  audience_id="ambiguous", expires_at=(expires_us := time.time_ns() // 1000 + 5_000_000))
    finally:
        home.close()
    group = _group(service)["capability"]  # opened, and listed once, before the entry expires, loaded or not
    _ok(_call(service, clock, group, "list", path="channel"))
    time.sleep(max(0.0, expires_us / 1e6 - time.time()) + 0.2)  # the entry expires: what decides the view
    # changed, though no row did
    _refused(_call(service, clock, group, "list", path="channel"), "denied", "plan-expired")


def _store_of(home: Home, scope_kind: str) -> str:
    row = home.catalog("main").execute("SELECT store_id FROM stores WHERE scope_kind = ?", (scope_kind,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


# -- bounded reads (memory_get) ---------------------------------------------------------------

def test_a_read_is_a_bounded_window_with_the_next_start(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    service, clock = api
    alice = _dm(service, ALICE_SENDER)
    body = "".join(f"line {i}\n" for i in range(1, 301))
    _ok(_call(service, clock, alice, "write", path="private/long.md", content=body))
    first = _ok(_call(service, clock, alice, "read", path="private/long.md"))
    assert (first["from"], first["lines"], first["nextFrom"]) == (1, MAX_LINES, MAX_LINES + 1)
    window = _ok(_call(service, clock, alice, "read", path="private/long.md", **{"from": 290, "lines": 5}))
    assert window["text"] == "".join(f"line {i}\n" for i in range(290, 295)) and window["nextFrom"] == 295
    last = _ok(_call(service, clock, alice, "read", path="private/long.md", **{"from": 295}))
    assert last["lines"] == 6 and last["nextFrom"] is None


def test_excerpt_bounds_characters_and_cuts_only_a_line_longer_than_the_budget() -> None:
    wide = ("x" * 5000 + "\n") * 4
    window = excerpt(wide.encode())
    assert (window.lines, window.next_from) == (2, 3) and len(window.text) <= MAX_CHARS
    huge = excerpt(("y" * (MAX_CHARS + 10) + "\nafter\n").encode())
    assert (len(huge.text), huge.next_from) == (MAX_CHARS, 2)
    assert excerpt(b"one\n", 5).next_from is None and excerpt(b"one\n", 5).text == ""


def test_a_window_of_a_large_note_costs_a_scan_not_the_note(scenario: Scenario, api: tuple[Service, Clock]) -> None:
    from scopefs.writer.transaction import write_note

    service, clock = api
    alice = _dm(service, ALICE_SENDER)
    home = Home.open(scenario.cli.home)
    try:
        write_note(home, scenario.alice_session, "private/big.md", b"".join(b"line %d\n" % i for i in range(4_000_000)))
    finally:
        home.close()
    tracemalloc.start()
    try:
        window = _ok(_call(service, clock, alice, "read", path="private/big.md", **{"from": 3_999_998}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert window["text"] == "line 3999997\nline 3999998\nline 3999999\n" and window["nextFrom"] is None
    assert peak < 16 << 20, peak  # the note is about 50 MiB


@hypothesis.given(st.lists(st.sampled_from(["", "a", "é", "\u2028", "x" * 700, "y" * 13_000]), max_size=200),
                  st.booleans(), st.integers(1, 210), st.one_of(st.none(), st.integers(1, 130)),
                  st.integers(1, 9000))
@hypothesis.settings(max_examples=200, deadline=None)
def test_a_window_fed_in_any_chunks_is_the_reference_window(lines: list[str], newline_at_end: bool, start: int,
                                                            count: int | None, chunk: int) -> None:
    """Only \\n ends a line (as the index counts them); the budget cuts on line boundaries."""
    text = "\n".join(lines) + ("\n" if newline_at_end and lines else "")
    data = text.encode()
    window = Window(start, count)
    for at in range(0, len(data), chunk):
        if window.feed(data[at:at + chunk]):
            break
    got = window.result()
    parts = text.split("\n")
    whole = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    taken: list[str] = []
    used = 0
    for line in whole[start - 1:start - 1 + min(count or MAX_LINES, MAX_LINES)]:
        if used + len(line) > MAX_CHARS:
            if not taken:
                taken.append(line[:MAX_CHARS])
            break
        taken.append(line)
        used += len(line)
    more = start - 1 + len(taken) < len(whole)
    assert (got.text, got.lines, got.next_from) == ("".join(taken), len(taken), start + len(taken) if more and taken
                                                    else None)
