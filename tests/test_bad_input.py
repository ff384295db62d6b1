"""Bad input: exit code 2, one line on stderr, nothing written.

Each case runs the real CLI against a populated home and compares the whole
logical state (every table row, every file) before and after. Bad input is
refused before anything is looked up, so not even an audit row appears.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scopefs.catalog.errors import BadInput
from scopefs.catalog.paths import split_virtual_path
from tests.conftest import SCOPEFS, Scenario, snapshot

WELL_FORMED_UNKNOWN_SESSION = "s_" + "a" * 26
WELL_FORMED_UNKNOWN_PRINCIPAL = "p_" + "b" * 26

BAD_PATHS = [
    "../escape.md",
    "private/../../escape.md",
    "private/./x.md",
    "/etc/passwd",
    "/private/notes/x.md",
    "private//x.md",
    "private/notes/",
    "",
    "private/" + "n" * 256,
    "private/" + "/".join(["d" * 200] * 21),  # over 4096 bytes
    "private/a\x01b.md",
    "private/a\x7fb.md",
    "private/line\nbreak.md",
    "private/zero\u200bwidth.md",  # a format character: invisible look-alike
    "private/cafe\u0301.md",  # not NFC: looks like café
    "private/" + "/".join(["d"] * 40),  # deeper than 32
]


def _run_bad(scenario: Scenario, *args: str, stdin: bytes = b"") -> None:
    home = scenario.cli.home
    before = snapshot(home)
    result = scenario.cli(*args, stdin=stdin)
    assert result.code == 2, (args, result.code, result.err)
    assert result.out == b""
    assert result.err.count("\n") == 1 and result.err.startswith("scopefs: "), result.err
    assert snapshot(home) == before


@pytest.mark.parametrize("path", BAD_PATHS, ids=range(len(BAD_PATHS)))
def test_bad_paths_change_nothing(scenario: Scenario, path: str) -> None:
    _run_bad(scenario, "write", scenario.alice_session, path, stdin=b"content")
    _run_bad(scenario, "read", scenario.alice_session, path)
    if path:
        _run_bad(scenario, "ls", scenario.alice_session, path)


def test_non_utf8_path_is_refused(scenario: Scenario) -> None:
    """argv bytes that are not UTF-8 reach Python surrogate-escaped."""
    home = scenario.cli.home
    before = snapshot(home)
    env = {**os.environ, "SCOPEFS_HOME": str(home)}
    for verb in (b"write", b"read"):
        proc = subprocess.run([SCOPEFS.encode(), verb, scenario.alice_session.encode(), b"private/bad\xff\xfe.md"],
                              input=b"x", capture_output=True, env=env)
        assert proc.returncode == 2 and b"UTF-8" in proc.stderr and proc.stdout == b""
    assert snapshot(home) == before


@pytest.mark.parametrize("path", ["a\x00b", "private/x\x00.md", "\x00"])
def test_nul_is_refused_by_the_validator(path: str) -> None:
    """NUL cannot travel through argv; the library and FUSE paths refuse it."""
    with pytest.raises(BadInput):
        split_virtual_path(path)


def test_unknown_agent(scenario: Scenario) -> None:
    _run_bad(scenario, "session", "open", "--agent", "nope", "--shared-main")
    _run_bad(scenario, "session", "open", "--agent", "Not Valid", "--shared-main")
    _run_bad(scenario, "conversation", "add", "--agent", "nope", "--channel", "c", "--account", "a",
             "--conversation", "x")
    _run_bad(scenario, "doctor", "--agent", "nope")
    _run_bad(scenario, "agent", "add", "../evil")
    _run_bad(scenario, "agent", "add", "UPPER")


def test_unknown_session(scenario: Scenario) -> None:
    for session in (WELL_FORMED_UNKNOWN_SESSION, "garbage", "s_../../x", ""):
        _run_bad(scenario, "read", session, "private/notes/allergy.md")
        _run_bad(scenario, "write", session, "private/notes/new.md", stdin=b"x")
        _run_bad(scenario, "ls", session)


def test_unknown_principal(scenario: Scenario) -> None:
    for principal in (WELL_FORMED_UNKNOWN_PRINCIPAL, "Alice", "p_short"):
        _run_bad(scenario, "bind", principal, "--channel", "c", "--account", "a", "--sender", "s")
        _run_bad(scenario, "member", "add", scenario.conversation, principal)
        _run_bad(scenario, "member", "add", principal, scenario.alice)
        _run_bad(scenario, "session", "open", "--agent", scenario.agent, "--service", principal)
        _run_bad(scenario, "read", scenario.group_session, "channel/offsite.md", "--actor", principal)
    _run_bad(scenario, "binding", "revoke", "b_" + "c" * 26)
    _run_bad(scenario, "session", "open", "--agent", scenario.agent, "--group", "--conversation",
             WELL_FORMED_UNKNOWN_PRINCIPAL)


@pytest.mark.parametrize("duration", ["10", "5w", "-1d", "0s", "1.5h", "99999999999d", "3651d", "", "7 d", "d",
                                      "１d"])
def test_malformed_durations(scenario: Scenario, duration: str) -> None:
    _run_bad(scenario, "member", "add", scenario.conversation, scenario.alice, "--expires", duration)


def test_bad_command_lines(scenario: Scenario) -> None:
    _run_bad(scenario, "session", "open", "--agent", scenario.agent)  # no mode
    _run_bad(scenario, "session", "open", "--agent", scenario.agent, "--dm", "--shared-main")
    _run_bad(scenario, "session", "open", "--agent", scenario.agent, "--dm", "--channel", "c")
    _run_bad(scenario, "principal", "add", "X", "--kind", "robot")
    _run_bad(scenario, "principal", "add", "", "--kind", "human")
    _run_bad(scenario, "principal", "add", "bad\x01name", "--kind", "human")
    _run_bad(scenario, "bind", scenario.alice, "--channel", "c", "--account", "a", "--sender", "s" * 300)
    _run_bad(scenario, "frobnicate")
    _run_bad(scenario, "write", scenario.alice_session, "private", stdin=b"x")  # a root, not a note


def test_missing_home(tmp_path: Path) -> None:
    env = {**os.environ, "SCOPEFS_HOME": str(tmp_path / "nowhere")}
    proc = subprocess.run([SCOPEFS, "agent", "add", "main"], capture_output=True, env=env)
    assert proc.returncode == 2 and b"scopefs init" in proc.stderr
    assert not (tmp_path / "nowhere").exists()


def test_json_errors_are_one_object(scenario: Scenario) -> None:
    result = scenario.cli("--json", "read", WELL_FORMED_UNKNOWN_SESSION, "private/x.md")
    assert result.code == 2
    body = result.json()
    assert body["exit_code"] == 2 and "unknown session" in body["error"]


def test_closed_stdin_and_stray_arguments_are_one_line(scenario: Scenario) -> None:
    home = scenario.cli.home
    env = {**os.environ, "SCOPEFS_HOME": str(home)}
    before = snapshot(home)
    proc = subprocess.run(f"{SCOPEFS} write {scenario.alice_session} private/x.md <&-", shell=True,
                          capture_output=True, env=env)
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1 and b"stdin" in proc.stderr
    stray = scenario.cli("read", scenario.alice_session, "private/notes/allergy.md", "raw-sender-4711")
    assert stray.code == 2 and "raw-sender-4711" not in stray.err and stray.err.count("\n") == 1
    assert snapshot(home) == before
