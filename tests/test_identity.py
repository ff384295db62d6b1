"""Identity: keyed-HMAC bindings, no rebinding, labels are only labels,
revocation ends every session opened through a binding."""

from __future__ import annotations

import hashlib
import hmac as std_hmac
import os
import stat
from typing import Any

import apsw

from tests.conftest import (
    ACCOUNT,
    ALICE_FACT,
    ALICE_SENDER,
    BOB_SENDER,
    CHANNEL,
    MIKE1_SENDER,
    MIKE2_SENDER,
    Scenario,
    snapshot,
    table_dump,
)


def _reference_hmac(key: bytes, *fields: str) -> bytes:
    """An independent implementation of the documented lookup-key encoding."""
    msg = b""
    for part in ("scopefs/binding/v1", *fields):
        data = part.encode()
        msg += len(data).to_bytes(4, "big") + data
    return std_hmac.new(key, msg, hashlib.sha256).digest()


def test_binding_is_stored_as_keyed_hmac_only(scenario: Scenario) -> None:
    home = scenario.cli.home
    key = (home / "hmac.key").read_bytes()
    assert len(key) == 32
    conn = apsw.Connection(str(home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    (lookup,) = conn.execute("SELECT lookup_key FROM identity_bindings WHERE binding_id = ?",
                             (scenario.alice_binding,)).fetchall()[0]
    assert lookup == _reference_hmac(key, CHANNEL, ACCOUNT, ALICE_SENDER)
    for path in home.rglob("*"):
        if path.is_file():
            assert ALICE_SENDER.encode() not in path.read_bytes(), path


def test_key_and_home_are_private(scenario: Scenario) -> None:
    home = scenario.cli.home
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(home / "hmac.key").st_mode) == 0o600


def test_loose_key_permissions_are_refused(scenario: Scenario) -> None:
    os.chmod(scenario.cli.home / "hmac.key", 0o644)
    result = scenario.cli("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                          "--sender", ALICE_SENDER)
    assert result.code == 1 and "hmac.key" in result.err


def test_loose_home_permissions_are_refused(scenario: Scenario) -> None:
    os.chmod(scenario.cli.home, 0o755)
    result = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md")
    assert result.code == 1 and result.out == b""


def test_rebinding_a_live_tuple_is_refused(scenario: Scenario) -> None:
    cli = scenario.cli
    before = snapshot(cli.home)
    result = cli("bind", scenario.bob, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER)
    assert result.code == 2 and "already bound" in result.err
    assert snapshot(cli.home) == before
    # Binding the same principal again is a no-op returning the same binding.
    again = cli.j("bind", scenario.alice, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER)
    assert again == {"binding_id": scenario.alice_binding, "created": False}
    # After a revocation the tuple may be bound afresh.
    cli.j("binding", "revoke", scenario.alice_binding)
    fresh = cli.j("bind", scenario.bob, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER)
    assert fresh["created"] and fresh["binding_id"] != scenario.alice_binding


def test_the_same_tuple_on_another_account_is_another_identity(scenario: Scenario) -> None:
    cli = scenario.cli
    session = cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", "other-acct",
                    "--sender", ALICE_SENDER)
    assert session["subject"] == "ambiguous" and session["subject_reason"] == "unbound"


def test_two_mikes_stay_two_principals(scenario: Scenario) -> None:
    cli = scenario.cli
    assert scenario.mike1 != scenario.mike2
    sessions = []
    for sender, principal in ((MIKE1_SENDER, scenario.mike1), (MIKE2_SENDER, scenario.mike2)):
        opened = cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                       "--sender", sender)
        assert opened["subject"] == "user" and opened["subject_principal_id"] == principal
        sessions.append(opened["session_id"])
    cli.j("write", sessions[0], "private/profile.md", stdin=b"mike one likes jazz\n")
    cli.j("write", sessions[1], "private/profile.md", stdin=b"mike two likes metal\n")
    assert cli("read", sessions[0], "private/profile.md").out == b"mike one likes jazz\n"
    assert cli("read", sessions[1], "private/profile.md").out == b"mike two likes metal\n"
    catalog = table_dump(cli.home / "agents" / "main" / "catalog.sqlite")
    user_stores = [row for row in catalog["stores"] if row[3] == "user"]
    audiences = {row[4] for row in user_stores}
    assert {scenario.mike1, scenario.mike2} <= audiences


def _subject_row(scenario: Scenario, session_id: str) -> tuple[Any, ...]:
    conn = apsw.Connection(str(scenario.cli.home / "agents" / "main" / "catalog.sqlite"),
                           flags=apsw.SQLITE_OPEN_READONLY)
    return conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchall()[0]


def test_revoked_binding_denies_every_operation_without_rewriting_the_subject(scenario: Scenario) -> None:
    cli = scenario.cli
    subject_before = _subject_row(scenario, scenario.alice_session)
    assert cli("read", scenario.alice_session, "private/notes/allergy.md").out == ALICE_FACT
    cli.j("binding", "revoke", scenario.alice_binding)
    for args, stdin in ((("read", scenario.alice_session, "private/notes/allergy.md"), None),
                        (("write", scenario.alice_session, "private/notes/new.md"), b"x"),
                        (("ls", scenario.alice_session), None),
                        (("ls", scenario.alice_session, "private"), None)):
        result = cli("--json", *args, stdin=stdin)
        assert result.code == 3, args
        assert result.json()["reason"] == "identity-revoked"
        assert b"hazelnut" not in result.out
    assert _subject_row(scenario, scenario.alice_session) == subject_before
    # A new DM from the same sender is now unbound: ambiguous, no private root.
    reopened = cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", ALICE_SENDER)
    assert reopened["subject"] == "ambiguous"
    assert cli("read", reopened["session_id"], "private/notes/allergy.md").code == 3
    # Bob is unaffected.
    assert cli("read", scenario.bob_session, "private/notes/allergy.md").code == 0
    audit = table_dump(cli.home / "state.sqlite")["audit"]
    assert any(row[4] == scenario.alice_session and row[11] == "identity-revoked" for row in audit)


def test_revoking_twice_reports_already_revoked(scenario: Scenario) -> None:
    cli = scenario.cli
    assert cli.j("binding", "revoke", scenario.bob_binding)["revoked"] is True
    assert cli.j("binding", "revoke", scenario.bob_binding)["revoked"] is False


def test_only_humans_are_bound(scenario: Scenario) -> None:
    cli = scenario.cli
    service = cli.j("principal", "add", "cron", "--kind", "service")["principal_id"]
    result = cli("bind", service, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", "svc")
    assert result.code == 2


def test_bindings_cannot_be_edited_or_deleted_in_the_database(scenario: Scenario) -> None:
    conn = apsw.Connection(str(scenario.cli.home / "state.sqlite"))
    for sql in ("UPDATE identity_bindings SET principal_id = principal_id",
                "UPDATE identity_bindings SET lookup_key = x'00'",
                "DELETE FROM identity_bindings"):
        try:
            conn.execute(sql)
        except apsw.ConstraintError:
            continue
        raise AssertionError(f"database accepted: {sql}")


def test_bob_sender_resolves_to_bob(scenario: Scenario) -> None:
    opened = scenario.cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                            "--sender", BOB_SENDER)
    assert opened["subject_principal_id"] == scenario.bob


def test_canonically_equivalent_ids_are_different_identities(scenario: Scenario) -> None:
    """NFC and NFD spellings of one handle are two provider ids: never merged."""
    cli = scenario.cli
    nfc, nfd = "caf\u00e9@example.org", "cafe\u0301@example.org"
    cli.j("bind", scenario.alice, "--channel", "mail", "--account", "acct", "--sender", nfc)
    other = cli.j("session", "open", "--agent", "main", "--dm", "--channel", "mail", "--account", "acct",
                  "--sender", nfd)
    assert other["subject"] == "ambiguous"
    mine = cli.j("session", "open", "--agent", "main", "--dm", "--channel", "mail", "--account", "acct",
                 "--sender", nfc)
    assert mine["subject_principal_id"] == scenario.alice
    first = cli.j("conversation", "add", "--agent", "main", "--channel", "c", "--account", "a",
                  "--conversation", "team-\u00e9")
    second = cli.j("conversation", "add", "--agent", "main", "--channel", "c", "--account", "a",
                   "--conversation", "team-e\u0301")
    assert first["conversation_id"] != second["conversation_id"]
