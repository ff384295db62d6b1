"""The postbox through the command line: deposit-only from a group, reviewed by its owner.

A group files an observation into one participant's quarantine through a
server-issued message handle; it never reads, lists or searches it back,
and every refusal is the same. The owner sees pending items with their
provenance in its own DM view, never in search or ``private/`` until it
approves one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import apsw
import pytest

from scopefs.catalog.home import Home
from scopefs.catalog.human import open_human_session
from tests.conftest import (
    ACCOUNT,
    ALICE_SENDER,
    BOB_SENDER,
    CHANNEL,
    Result,
    Scenario,
    diff_snapshots,
    snapshot,
    sqlite_str,
)
from tests.mountkit import catalog

NOTE = b"Alice said she prefers the window seat (canary P0st)\n"
UNCHANGED_BUT = ("audit",)


def _handle(s: Scenario, sender: str = ALICE_SENDER, session: str | None = None) -> str:
    return str(s.cli.j("message", "add", session or s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                       "--sender", sender)["message_handle"])


def _deposit(s: Scenario, handle: str, data: bytes = NOTE, session: str | None = None) -> Result:
    return s.cli("deposit", session or s.group_session, handle, stdin=data)


@pytest.fixture
def enabled(scenario: Scenario) -> Scenario:
    scenario.cli.j("postbox", "enable", scenario.alice, "--mode", "review")
    return scenario


def _state_rows(s: Scenario, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _refusals(s: Scenario, calls: Iterator[tuple[str, str]]) -> set[tuple[int, str, bytes]]:
    """(exit code, stderr, stdout) of each deposit; each must change nothing but the audit."""
    seen = set()
    for session, handle in calls:
        before = snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)
        result = _deposit(s, handle, session=session)
        assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)) == [], handle
        seen.add((result.code, result.err, result.out))
    return seen


def test_the_postbox_is_off_by_default(scenario: Scenario) -> None:
    s = scenario
    handle = _handle(s)
    assert _refusals(s, iter([(s.group_session, handle)])) == {(3, "scopefs: deposit refused\n", b"")}
    reasons = _state_rows(s, "SELECT reason FROM audit WHERE operation = 'deposit'")
    assert reasons == [("postbox-off",)]


def test_a_deposit_reaches_only_its_owners_review(enabled: Scenario) -> None:
    s = enabled
    result = _deposit(s, _handle(s))
    assert result.code == 0, result.err
    # The group gets nothing back: not a listing, not a read, not a search hit.
    assert s.cli.j("ls", s.group_session, "postbox")["entries"] == []
    assert s.cli.j("search", s.group_session, "window seat")["results"] == []
    # The owner sees it in postbox/, with its provenance; never in private/ or in search.
    listed = s.cli.j("postbox", "list", s.alice_session)
    [pending] = listed["pending"]
    assert (pending["conversation_id"], pending["source_session_id"], pending["state"]) == \
        (s.conversation, s.group_session, "pending")
    assert [n["conversation_id"] for n in listed["notices"]] == [s.conversation]
    folder = s.cli.j("ls", s.alice_session, f"postbox/{s.conversation}")["entries"]
    assert [e["name"].endswith(f"-{pending['item_id']}.md") for e in folder] == [True]
    path = f"postbox/{s.conversation}/{folder[0]['name']}"
    assert s.cli("read", s.alice_session, path, check=True).out == NOTE
    notices = s.cli("read", s.alice_session, "postbox/NOTICES.md", check=True).text
    assert s.conversation in notices and "first deposit" in notices
    assert s.cli.j("search", s.alice_session, "window seat")["results"] == []
    assert [e["name"] for e in s.cli.j("ls", s.alice_session, "private/notes")["entries"]] == ["allergy.md"]
    assert "window" not in s.cli("run", s.alice_session, "--", "sh", "-c", "cat /memory/private/notes/*").text
    for other in (s.bob_session, s.group_session):
        assert s.cli("read", other, path).code == 3
    _unchanged_write(s, path)


def _unchanged_write(s: Scenario, path: str) -> None:
    before = snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)
    assert s.cli("write", s.alice_session, path, stdin=b"edit").code == 3  # owner review is read-only
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)) == []


def test_every_bad_deposit_gets_the_same_refusal(enabled: Scenario) -> None:
    s = enabled
    used = _handle(s)
    assert _deposit(s, used).code == 0
    second_group = s.cli.j("session", "open", "--agent", s.agent, "--group", "--conversation",
                           s.conversation)["session_id"]
    other_conv = s.cli.j("conversation", "add", "--agent", s.agent, "--channel", CHANNEL, "--account", ACCOUNT,
                         "--conversation", "tg-chat-other-4040")["conversation_id"]
    s.cli.j("member", "add", other_conv, s.alice)
    other_group = s.cli.j("session", "open", "--agent", s.agent, "--group", "--conversation",
                          other_conv)["session_id"]
    from_other = _handle(s, session=other_group)
    for_second = _handle(s)
    expired = _handle(s)
    with catalog(s.cli.home) as conn:  # a day has passed, for this one handle (past the schema's guard)
        guard = sqlite_str(conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'message_handles_fixed'"
                                        ).fetchall()[0][0])
        conn.execute("DROP TRIGGER message_handles_fixed")
        conn.execute("UPDATE message_handles SET expires_at = 0 WHERE handle_sha256 = ?",
                     (hashlib.sha256(expired.encode()).hexdigest(),))
        conn.execute(guard)
    bob_handle = _handle(s, BOB_SENDER)  # Bob never enabled his postbox
    left = _handle(s)
    calls = [
        (s.group_session, used),                                 # reused
        (s.group_session, "mh_" + "a" * 32),                     # forged
        (s.group_session, "not-a-handle"),                       # malformed
        (s.group_session, "mh_" + "a" * 5000),                   # oversized
        (second_group, for_second),                              # another session of the same conversation
        (s.group_session, from_other),                           # another conversation
        (s.group_session, expired),                              # expired
        (s.group_session, bob_handle),                           # the sender's postbox is off
        (s.bob_session, _handle(s)),                             # not a group session at all
    ]
    seen = _refusals(s, iter(calls))
    s.cli.j("member", "remove", s.conversation, s.alice)
    seen |= _refusals(s, iter([(s.group_session, left)]))        # the sender left the conversation
    assert seen == {(3, "scopefs: deposit refused\n", b"")}
    reasons = {r[0] for r in _state_rows(s, "SELECT reason FROM audit WHERE operation = 'deposit'"
                                            " AND decision = 'deny'")}
    assert reasons == {"handle-invalid", "postbox-off", "membership-stale"}


def test_over_cap_deposits_are_dropped_and_audited(enabled: Scenario) -> None:
    s = enabled
    from scopefs.catalog.postbox import RATE_CAP

    handles = [_handle(s) for _ in range(RATE_CAP + 1)]
    for handle in handles[:RATE_CAP]:
        assert _deposit(s, handle).code == 0
    assert _refusals(s, iter([(s.group_session, handles[-1])])) == {(3, "scopefs: deposit refused\n", b"")}
    assert _state_rows(s, "SELECT count(*) FROM audit WHERE operation = 'deposit' AND reason = 'rate-limited'") \
        == [(1,)]
    with catalog(s.cli.home) as conn:
        assert conn.execute("SELECT accepted FROM postbox_rates").fetchall() == [(RATE_CAP,)]
    # Another conversation has its own allowance.
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == RATE_CAP


def test_the_first_deposit_from_a_conversation_notifies_once(enabled: Scenario) -> None:
    s = enabled
    for _ in range(3):
        assert _deposit(s, _handle(s)).code == 0
    listed = s.cli.j("postbox", "list", s.alice_session)
    assert len(listed["pending"]) == 3 and len(listed["notices"]) == 1
    text = s.cli("read", s.alice_session, "postbox/NOTICES.md", check=True).text
    assert text.count("first deposit from conversation") == 1


def test_the_owners_listing_shows_conversation_time_and_actor(enabled: Scenario) -> None:
    s = enabled
    result = s.cli("deposit", s.group_session, _handle(s), "--actor", s.bob, stdin=NOTE)
    assert result.code == 0, result.err
    [pending] = s.cli.j("postbox", "list", s.alice_session)["pending"]
    assert pending["actor_id"] == s.bob
    [entry] = s.cli.j("ls", s.alice_session, f"postbox/{s.conversation}")["entries"]
    stamp, rest = entry["name"].split("-by-")
    assert len(stamp) == len("20261202T073000Z") and rest == f"{s.bob}-{pending['item_id']}.md"
    # An actor who is not a member of the group is a refusal like any other.
    assert _deposit(s, _handle(s)).code == 0
    assert s.cli("deposit", s.group_session, _handle(s), "--actor", s.mike1, stdin=NOTE).err == \
        "scopefs: deposit refused\n"


def test_approve_reject_and_purge(enabled: Scenario) -> None:
    s = enabled
    for data in (NOTE, b"second (canary Tw0)\n", b"third (canary Thr3)\n"):
        assert _deposit(s, _handle(s), data).code == 0
    first, second, third = s.cli.j("postbox", "list", s.alice_session)["pending"]
    done = s.cli.j("postbox", "approve", s.alice_session, first["item_id"], "--to", "private/notes/seat.md")
    assert s.cli("read", s.alice_session, "private/notes/seat.md", check=True).out == NOTE
    assert [h["path"] for h in s.cli.j("search", s.alice_session, "window seat")["results"]] == \
        ["private/notes/seat.md"]
    with catalog(s.cli.home) as conn:
        assert conn.execute("SELECT parent_revision_id, relation FROM lineage_edges WHERE child_revision_id = ?",
                            (done["revision_id"],)).fetchall() == [(first["revision_id"], "postbox")]
        assert conn.execute("SELECT trust_origin FROM revisions WHERE revision_id = ?",
                            (done["revision_id"],)).fetchall() == [("postbox",)]
    s.cli.j("postbox", "reject", s.alice_session, second["item_id"])
    assert [p["item_id"] for p in s.cli.j("postbox", "list", s.alice_session)["pending"]] == [third["item_id"]]
    purged = s.cli.j("postbox", "purge", s.alice_session, "--from", s.conversation)
    assert purged["item_ids"] == [third["item_id"]]
    assert s.cli.j("postbox", "list", s.alice_session)["pending"] == []
    assert [e["name"] for e in s.cli.j("ls", s.alice_session, "postbox")["entries"]] == ["NOTICES.md"]
    for item in (first, second):
        assert s.cli("postbox", "reject", s.alice_session, item["item_id"]).code == 2


def test_a_browse_session_cannot_review_the_postbox(enabled: Scenario) -> None:
    """Approve, reject and purge with the person's browse session would be the operator's act recorded as
    the person's own session: refused (exit 2, nothing changed), as every other change through the CLI."""
    s = enabled
    browse = open_human_session(Home(s.cli.home), s.agent, s.alice, 12345).session_id
    for data in (NOTE, b"second (canary Tw0)\n"):
        assert _deposit(s, _handle(s), data).code == 0
    first, second = s.cli.j("postbox", "list", browse)["pending"]  # reading the review is still the person's
    before = snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)
    for call in (("approve", browse, first["item_id"], "--to", "private/notes/op.md"),
                 ("approve", browse, first["item_id"]),
                 ("reject", browse, second["item_id"]),
                 ("purge", browse, "--from", s.conversation)):
        result = s.cli("postbox", *call)
        assert result.code == 2 and "a browse session writes only through its mount" in result.err, (call, result)
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)) == []
    with catalog(s.cli.home) as conn:
        assert conn.execute("SELECT count(*) FROM revisions WHERE session_id = ?", (browse,)).fetchall() == [(0,)]
    # the owner's DM session still reviews them
    s.cli.j("postbox", "approve", s.alice_session, first["item_id"], "--to", "private/notes/op.md")
    s.cli.j("postbox", "reject", s.alice_session, second["item_id"])


@pytest.mark.parametrize("call", [
    ["postbox", "list", "{group}"],
    ["postbox", "approve", "{bob}", "{item}"],               # another owner's item is unknown
    ["postbox", "approve", "{alice}", "pb_aaaaaaaaaaaaaaaaaaaaaaaaaa"],
    ["postbox", "approve", "{alice}", "{item}", "--to", "channel/x.md"],
    ["postbox", "approve", "{alice}", "{item}", "--to", "../x.md"],
    ["postbox", "purge", "{alice}", "--from", "nope"],
    ["postbox", "enable", "{conversation}"],
    ["postbox", "enable", "{alice_id}", "--mode", "labeled"],
    ["message", "add", "{alice}", "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER],
    ["message", "add", "{group}", "--channel", CHANNEL, "--account", ACCOUNT, "--sender", "unbound-sender-1"],
], ids=lambda c: " ".join(c[:2]) + ":" + c[2])
def test_bad_postbox_input_changes_nothing(enabled: Scenario, call: list[str]) -> None:
    s = enabled
    assert _deposit(s, _handle(s)).code == 0
    item = s.cli.j("postbox", "list", s.alice_session)["pending"][0]["item_id"]
    names = {"group": s.group_session, "alice": s.alice_session, "bob": s.bob_session, "item": item,
             "conversation": s.conversation, "alice_id": s.alice}
    before = snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)
    result = s.cli(*[part.format(**names) for part in call])
    assert result.code == 2, (result.code, result.err)
    assert diff_snapshots(before, snapshot(s.cli.home, skip_tables=UNCHANGED_BUT)) == []


def test_a_gateway_deposits_through_the_api_with_the_same_refusal(enabled: Scenario) -> None:
    """The API's ``deposit`` is the CLI's: a group capability files through a handle; nothing else can."""
    import secrets

    from scopefs.api.service import Service
    from scopefs.catalog.clock import now_us
    from scopefs.catalog.home import Home
    from tests.conftest import GROUP_CONVERSATION

    s = enabled
    home = Home.open(s.cli.home)
    try:
        service = Service(home)

        def call(capability: str, op: str, **args: object) -> dict[str, Any]:
            return service.handle({"op": op, "capability": capability, "nonce": secrets.token_urlsafe(16),
                                   "ts": now_us(), "args": args})

        def open_(**facts: str) -> str:
            answer = service.handle({"op": "open", "agent": "main", "channel": CHANNEL, "account": ACCOUNT, **facts})
            assert answer["ok"], answer
            return str(answer["result"]["capability"])

        group = open_(chat="group", conversation=GROUP_CONVERSATION, sender=ALICE_SENDER)
        session = home.state().execute("SELECT session_id FROM session_index ORDER BY rowid DESC LIMIT 1").fetchall()
        assert session
        handle = s.cli.j("message", "add", sqlite_str(session[0][0]), "--channel", CHANNEL, "--account", ACCOUNT,
                         "--sender", ALICE_SENDER)["message_handle"]
        answer = call(group, "deposit", handle=handle, content="filed by the gateway (canary Ap1)\n")
        assert answer == {"ok": True, "result": {"deposited": True}}, answer
        refusals = [call(group, "deposit", handle=handle, content="again\n"),
                    call(group, "deposit", handle="mh_" + "b" * 32, content="forged\n"),
                    call(open_(chat="direct", sender=ALICE_SENDER), "deposit", handle=_handle(s), content="x\n")]
        assert {(r["ok"], r["error"]["code"], r["error"]["message"]) for r in refusals} == \
            {(False, "denied", "deposit refused")}
        bad = call(group, "deposit", handle=_handle(s), content=7)
        assert bad["ok"] is False and bad["error"]["code"] == "bad-input"
    finally:
        home.close()
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == 1


def test_an_expired_deposit_leaves_the_review(enabled: Scenario) -> None:
    """A deposit waits a month for its owner; then the next review settles it out of the quarantine."""
    import time

    s = enabled
    assert _deposit(s, _handle(s)).code == 0
    [pending] = s.cli.j("postbox", "list", s.alice_session)["pending"]
    path = f"postbox/{s.conversation}"
    assert len(s.cli.j("ls", s.alice_session, path)["entries"]) == 1
    with catalog(s.cli.home) as conn:  # the item's month has passed (past the schema's guard)
        guard = sqlite_str(conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'postbox_items_fixed'"
                                        ).fetchall()[0][0])
        conn.execute("DROP TRIGGER postbox_items_fixed")
        conn.execute("UPDATE postbox_items SET expires_at = ? WHERE item_id = ?",
                     (int(time.time() * 1_000_000) - 1, pending["item_id"]))
        conn.execute(guard)
    assert s.cli("postbox", "approve", s.alice_session, pending["item_id"]).code == 2  # expired: not approvable
    assert s.cli.j("postbox", "list", s.alice_session)["pending"] == []
    assert s.cli("ls", s.alice_session, path).code == 3  # settled out of the quarantine
    assert s.cli("read", s.alice_session, "postbox/NOTICES.md").code == 0  # the notice stays


def test_an_oversized_deposit_is_the_same_refusal_and_spends_nothing(enabled: Scenario) -> None:
    from scopefs.catalog.postbox import DEPOSIT_MAX_BYTES

    s = enabled
    handle = _handle(s)
    result = _deposit(s, handle, b"x" * (DEPOSIT_MAX_BYTES + 1))
    assert (result.code, result.err) == (3, "scopefs: deposit refused\n")
    assert _deposit(s, handle, b"x" * DEPOSIT_MAX_BYTES).code == 0  # the handle was not spent by the refusal
