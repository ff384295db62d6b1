"""Provider ids read from stdin (``--sender-stdin``, ``--conversation-stdin``) instead of the command line.

Every local user reads a running command's argv in ``/proc/PID/cmdline``, so
the ``-stdin`` twins keep a sender's or a conversation's id out of it. They
must mean exactly what the argv form means (the same binding, subject,
conversation), refuse what is not one id on one line without quoting it,
and the id must really never reach the process table.
"""

from __future__ import annotations

import json
import os
import select
import subprocess

import apsw
import pytest

from tests.conftest import ACCOUNT, ALICE_SENDER, CHANNEL, SCOPEFS, Scenario, sqlite_int


def _bindings(scenario: Scenario) -> int:
    conn = apsw.Connection(str(scenario.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return sqlite_int(conn.execute("SELECT count(*) FROM identity_bindings").fetchall()[0][0])
    finally:
        conn.close()


def test_bind_from_stdin_is_the_same_binding(scenario: Scenario) -> None:
    cli = scenario.cli
    again = cli.j("bind", scenario.alice, "--channel", CHANNEL, "--account", ACCOUNT, "--sender-stdin",
                  stdin=ALICE_SENDER.encode() + b"\n")
    assert again == {"binding_id": scenario.alice_binding, "created": False}
    crlf = cli.j("bind", scenario.alice, "--channel", CHANNEL, "--account", ACCOUNT, "--sender-stdin",
                 stdin=ALICE_SENDER.encode() + b"\r\n")
    assert crlf["binding_id"] == scenario.alice_binding


def test_a_dm_opened_from_stdin_has_the_same_subject(scenario: Scenario) -> None:
    opened = scenario.cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                            "--sender-stdin", stdin=ALICE_SENDER.encode())  # no line end at all
    assert opened["subject"] == "user" and opened["subject_principal_id"] == scenario.alice


def test_a_conversation_from_stdin_is_the_same_conversation(scenario: Scenario) -> None:
    cli = scenario.cli
    where = ("--agent", "main", "--channel", "c", "--account", "a")
    first = cli.j("conversation", "add", *where, "--conversation", "team-room-4411")
    second = cli.j("conversation", "add", *where, "--conversation-stdin", stdin=b"team-room-4411\n")
    assert second == {"conversation_id": first["conversation_id"], "created": False}


def test_a_message_handle_from_stdin(scenario: Scenario) -> None:
    made = scenario.cli.j("message", "add", scenario.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                          "--sender-stdin", stdin=ALICE_SENDER.encode() + b"\n")
    assert made["message_handle"]


@pytest.mark.parametrize(("stdin", "said"), [
    (b"", "must not be empty"),
    (b"\n", "must not be empty"),
    (b"lone-cr\rinside", "must be one line"),
    (b"x" * 257 + b"\n", "longer than 256 bytes"),
    (b"y" * 5000, "longer than 256 bytes"),
    (b"not-utf8-\xff\xfe", "not valid UTF-8"),
    (b"tab\there", "control characters"),
])
def test_what_is_not_one_id_on_one_line_is_refused_unquoted(scenario: Scenario, stdin: bytes, said: str) -> None:
    done = scenario.cli("bind", scenario.bob, "--channel", CHANNEL, "--account", "other-account", "--sender-stdin",
                        stdin=stdin)
    assert done.code == 2 and said in done.err, done.err
    for part in stdin.split():
        if len(part) > 3:
            assert part.decode("utf-8", errors="replace") not in done.err
    assert _bindings(scenario) == 4  # the scenario's own (Alice, Bob, two Mikes): nothing was bound


def test_both_forms_at_once_or_stdin_outside_a_dm_are_refused(scenario: Scenario) -> None:
    cli = scenario.cli
    both = cli("bind", scenario.bob, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", "s-1",
               "--sender-stdin", stdin=b"s-2\n")
    assert both.code == 2 and "not allowed with" in both.err and "s-1" not in both.err
    neither = cli("bind", scenario.bob, "--channel", CHANNEL, "--account", ACCOUNT)
    assert neither.code == 2
    group = cli("session", "open", "--agent", "main", "--group", "--conversation", scenario.conversation,
                "--sender-stdin", stdin=b"s-3\n")
    assert group.code == 2 and "belong to --dm" in group.err


def test_only_the_first_line_is_read_so_a_caller_may_keep_the_pipe_open(scenario: Scenario) -> None:
    """An adapter that writes the id and keeps its end of the pipe open gets its answer (a read to the end
    of stdin would wait for good); what follows the first line is not read."""
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    proc = subprocess.Popen([SCOPEFS, "--json", "bind", scenario.bob, "--channel", CHANNEL, "--account",
                             "pipe-account", "--sender-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"tg-sender-kept-pipe-60177\nnot read\n")
        proc.stdin.flush()  # and not closed
        chunks = []
        while True:  # until the command closes its stdout, with our end of its stdin still open
            assert select.select([proc.stdout], [], [], 60)[0], "the command waited for the end of stdin"
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
        out = b"".join(chunks)
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else b""
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(out)["created"] is True
    opened = scenario.cli.j("session", "open", "--agent", "main", "--dm", "--channel", CHANNEL, "--account",
                            "pipe-account", "--sender", "tg-sender-kept-pipe-60177")
    assert opened["subject_principal_id"] == scenario.bob


def test_stdin_ids_are_refused_beside_a_child_session(scenario: Scenario) -> None:
    done = scenario.cli("session", "open", "--agent", "main", "--child-of", scenario.alice_session, "--cap",
                        "private/**", "--sender-stdin", stdin=b"s-4\n")
    assert done.code == 2 and "--child-of takes only" in done.err
