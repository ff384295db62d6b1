"""A gateway's session key maps to one session; a changed subject rebinds it and refuses the old session.

OpenClaw names a logical session with a ``sessionKey`` that outlives one
window. Re-opening with the same key and the same facts must not pile up
session rows; a key that comes back with facts for another subject must
never carry the old session's view over (the seed: "a stale context fails
with session-rebound; it never follows a changed mapping").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_FACT,
    BOB_SENDER,
    CHANNEL,
    Cli,
    Scenario,
    db_copy,
    sqlite_int,
)
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

KEY = "agent:main:telegram:direct:session-key-canary-K3y9"


def _open(cli: Cli, sender: str, key: str = KEY) -> dict[str, Any]:
    return cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                 "--sender", sender, "--key", key)


def _sessions(home: Path) -> int:
    with db_copy(home / "agents" / "main" / "catalog.sqlite") as conn:
        return sqlite_int(conn.execute("SELECT count(*) FROM sessions").fetchall()[0][0])


def test_the_same_key_and_facts_reuse_one_session(scenario: Scenario) -> None:
    cli = scenario.cli
    before = _sessions(cli.home)
    first = _open(cli, ALICE_SENDER)
    again = _open(cli, ALICE_SENDER)
    assert first["session_id"] == again["session_id"]
    assert _sessions(cli.home) == before + 1
    other = _open(cli, ALICE_SENDER, key=KEY + "-other")
    assert other["session_id"] != first["session_id"]
    assert cli("read", first["session_id"], "private/notes/allergy.md", check=True).out == ALICE_FACT


def test_a_key_that_comes_back_for_another_subject_is_rebound(scenario: Scenario, mounts: Mounts) -> None:
    cli = scenario.cli
    alice = _open(cli, ALICE_SENDER)["session_id"]
    view = mounts.mount(alice)
    assert (view / "private" / "notes" / "allergy.md").read_bytes() == ALICE_FACT
    bob = _open(cli, BOB_SENDER)["session_id"]
    assert bob != alice
    assert cli("read", bob, "private/notes/allergy.md", check=True).out == BOB_FACT
    refused = cli("--json", "read", alice, "private/notes/allergy.md")
    assert refused.code == 3 and refused.json()["reason"] == "session-rebound"
    wait_until(lambda: os.listdir(view) == [])  # the old session's live mount empties
    # Back to Alice under the same key: a third session, never the first one revived.
    third = _open(cli, ALICE_SENDER)["session_id"]
    assert third not in (alice, bob)
    assert cli("--json", "read", bob, "private/notes/allergy.md").json()["reason"] == "session-rebound"


def test_a_closed_session_is_not_reused(scenario: Scenario) -> None:
    cli = scenario.cli
    first = _open(cli, ALICE_SENDER)["session_id"]
    cli.j("session", "close", first)
    assert _open(cli, ALICE_SENDER)["session_id"] != first


def test_the_key_is_stored_only_as_a_keyed_hash(scenario: Scenario) -> None:
    cli = scenario.cli
    _open(cli, ALICE_SENDER)
    needle = b"session-key-canary-K3y9"
    for path in cli.home.rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), path
    long = cli("session", "open", "--agent", "main", "--shared-main", "--key", "k" * 600)
    assert long.code == 2 and "session key" in long.err
