"""The command line under hostile text, broken streams and large notes.

Text output never carries a raw control character, line separator or bidi
override from a note or a name to the operator's terminal (``--json``
escapes them already); names holding U+2028/U+2029 are refused like other
separators, by the command line and by a mount. A stdout that cannot be
written is one line on stderr and exit 1, a closed pipe a quiet exit 1, a
stdin that cannot be read exit 2 with nothing written. ``read`` streams a
large note in bounded memory, still verifying it whole before the first
byte leaves.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scopefs.catalog.errors import IntegrityError
from scopefs.catalog.home import Home
from scopefs.catalog.reader import stream_note
from scopefs.vfs.names import BadName, decode
from tests.conftest import ALICE_FACT, SCOPEFS, Scenario, artifact_path, snapshot
from tests.mountkit import Mounts, catalog, errno_of, mounts  # noqa: F401

# Everything a note may hold that must not reach a terminal raw: CSI and OSC
# escapes (clear the screen, set the window title), BEL, backspace, carriage
# return, DEL, C1 controls (NEL, 8-bit CSI), line/paragraph separators and
# bidi overrides and isolates.
HOSTILE = ("zebra \x1b[2J\x1b]0;pwned\x07 \x08\r\x7f \x85\x9b31m"
           " stripes\u2028fake line\u2029para \u202eevil\u202c \u2066iso\u2069 end")
ESCAPED = ("zebra \\x1b[2J\\x1b]0;pwned\\x07 \\x08\\r\\x7f \\x85\\x9b31m"
           " stripes\\u2028fake line\\u2029para \\u202eevil\\u202c \\u2066iso\\u2069 end")
RAW_MARKERS = [ch.encode() for ch in "\x1b\x07\x08\r\x7f\x85\x9b\u2028\u2029\u202e\u202c\u2066\u2069"]


def _terminal_safe(out: bytes) -> None:
    """Only printable text and the newlines that end lines."""
    for marker in RAW_MARKERS:
        assert marker not in out, marker
    assert all(b >= 0x20 or b == 0x0A for b in out), out


# -- 6: terminal safety ---------------------------------------------------------

def test_search_text_output_escapes_controls_from_a_group_members_note(scenario: Scenario) -> None:
    cli = scenario.cli
    cli.j("write", scenario.group_session, "channel/zebra.md", stdin=HOSTILE.encode() + b"\n")
    result = cli("search", scenario.group_session, "zebra stripes", "--mode", "words", check=True)
    _terminal_safe(result.out)
    assert ESCAPED in result.text
    assert "channel/zebra.md#L1-L1" in result.text
    # --json is unchanged: the snippet as written, escaped by JSON itself.
    hits = cli.j("search", scenario.group_session, "zebra stripes", "--mode", "words")["results"]
    assert any(HOSTILE in hit["snippet"] for hit in hits)


def test_ls_escapes_a_stored_name_and_json_keeps_it(scenario: Scenario) -> None:
    """A name stored before today's rules (or by any other route) is printed escaped."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/notes/legacy.md", stdin=b"old\n")
    stored = "legacy\u2028\x1b[31mred\u202e.md"
    with catalog(cli.home) as conn:
        conn.execute("UPDATE resources SET path = ? WHERE path = 'notes/legacy.md'", (f"notes/{stored}",))
    result = cli("ls", scenario.alice_session, "private/notes", check=True)
    _terminal_safe(result.out)
    assert result.text.splitlines() == ["allergy.md", "legacy\\u2028\\x1b[31mred\\u202e.md"]
    names = [e["name"] for e in cli.j("ls", scenario.alice_session, "private/notes")["entries"]]
    assert names == ["allergy.md", stored]


@pytest.mark.parametrize("path", ["private/line\u2028sep.md", "private/para\u2029sep.md",
                                  "private/folder\u2028x/note.md"])
def test_cli_refuses_line_and_paragraph_separators_in_names(scenario: Scenario, path: str) -> None:
    before = snapshot(scenario.cli.home)
    result = scenario.cli("write", scenario.alice_session, path, stdin=b"content")
    assert result.code == 2 and result.out == b""
    assert result.err.count("\n") == 1 and result.err.startswith("scopefs: invalid path")
    assert snapshot(scenario.cli.home) == before


@pytest.mark.parametrize("name", ["line\u2028sep.md", "para\u2029sep.md"])
def test_kernel_names_with_separators_are_invalid(name: str) -> None:
    with pytest.raises(BadName) as caught:
        decode(name.encode())
    assert caught.value.errno == errno.EINVAL


def _create_new(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def test_mount_refuses_separator_names_with_einval(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    where = mounts.mount(scenario.alice_session)
    notes = where / "private/notes"
    for name in ("line\u2028sep.md", "para\u2029sep.md"):
        target = notes / name
        seen = {
            "create": errno_of(functools.partial(_create_new, target)),
            "mkdir": errno_of(functools.partial(os.mkdir, target)),
            "rename-to": errno_of(functools.partial(os.rename, notes / "allergy.md", target)),
            "stat": errno_of(functools.partial(os.stat, target)),
        }
        assert seen == {"create": errno.EINVAL, "mkdir": errno.EINVAL, "rename-to": errno.EINVAL,
                        "stat": errno.ENOENT}, name
    assert sorted(os.listdir(notes)) == ["allergy.md"]


# -- 7: broken streams ------------------------------------------------------------

def _run(scenario: Scenario, *args: str, stdin: int | None = None, stdout: int | None = None) -> tuple[int, str]:
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    proc = subprocess.run([SCOPEFS, *args], stdin=stdin if stdin is not None else subprocess.DEVNULL,
                          stdout=stdout, stderr=subprocess.PIPE, env=env, timeout=60)
    return proc.returncode, proc.stderr.decode("utf-8", errors="replace")


def _commands(scenario: Scenario) -> list[list[str]]:
    session = scenario.alice_session
    return [["init"], ["ls", session, "private"], ["read", session, "private/notes/allergy.md"],
            ["search", session, "hazelnuts", "--mode", "words"], ["--help"], ["agent", "add", "--help"]]


def test_unwritable_stdout_is_one_line_and_exit_1(scenario: Scenario) -> None:
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        for command in _commands(scenario):
            for args in (command, ["--json", *command]):
                code, err = _run(scenario, *args, stdout=full)
                assert code == 1, (args, code, err)
                assert err == "scopefs: cannot write the output: No space left on device\n", (args, err)
        # A refusal whose JSON cannot be printed still says why on stderr, with its own code.
        code, err = _run(scenario, "--json", "read", scenario.alice_session, "channel/offsite.md", stdout=full)
        assert code == 3 and err.count("\n") == 1 and err.startswith("scopefs: "), (code, err)
    finally:
        os.close(full)


def test_a_foreground_mount_nobody_hears_of_is_taken_down(scenario: Scenario, tmp_path: Path) -> None:
    """``mount --foreground > /dev/full``: its readiness line cannot be printed, so it unmounts
    (cleanly, as on a signal) and reports that, once; no mount is left behind."""
    where = tmp_path / "m"
    where.mkdir()
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        code, err = _run(scenario, "mount", scenario.alice_session, str(where), "--foreground", stdout=full)
    finally:
        os.close(full)
    assert (code, err) == (1, "scopefs: cannot write the output: No space left on device\n")
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        assert not any(line.split()[4] == str(where) for line in info)


def test_closed_pipe_is_a_quiet_exit_1(scenario: Scenario) -> None:
    for command in _commands(scenario):
        for args in (command, ["--json", *command]):
            read_end, write_end = os.pipe()
            os.close(read_end)  # the reader left before the first byte: every write is EPIPE
            try:
                code, err = _run(scenario, *args, stdout=write_end)
            finally:
                os.close(write_end)
            assert (code, err) == (1, ""), args


def test_stdin_that_cannot_be_read_is_bad_input(scenario: Scenario, tmp_path: Path) -> None:
    """Stdin open for writing only: its first read fails (EBADF), nothing is written."""
    before = snapshot(scenario.cli.home)
    write_only = os.open(tmp_path / "sink", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        code, err = _run(scenario, "write", scenario.alice_session, "private/notes/new.md", stdin=write_only)
    finally:
        os.close(write_only)
    assert code == 2, (code, err)
    assert err == "scopefs: cannot read the note from stdin: Bad file descriptor\n"
    assert snapshot(scenario.cli.home) == before


def test_stdin_directory_is_refused_by_the_interpreter_and_changes_nothing(scenario: Scenario,
                                                                          tmp_path: Path) -> None:
    """The documented limit (README): Python refuses to start, before any scopefs code runs."""
    before = snapshot(scenario.cli.home)
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        code, err = _run(scenario, "write", scenario.alice_session, "private/notes/new.md", stdin=directory)
    finally:
        os.close(directory)
    assert code == 1 and "is a directory" in err
    assert snapshot(scenario.cli.home) == before


# -- 8a: large notes ----------------------------------------------------------------

BIG = 200 << 20
PEAK_LIMIT_KIB = 120 << 10

# Runs the CLI as its only child, hashes what it prints, reports its peak RSS.
_MEASURE = """
import hashlib, json, resource, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
digest, size = hashlib.sha256(), 0
while chunk := proc.stdout.read(1 << 20):
    digest.update(chunk)
    size += len(chunk)
code = proc.wait()
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"code": code, "size": size, "sha256": digest.hexdigest(), "peak_kib": peak}))
"""


def _big_note(path: Path) -> str:
    """A 200 MiB file of distinct 1 MiB blocks; its SHA-256."""
    block = os.urandom(1 << 20)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for i in range(BIG >> 20):
            piece = i.to_bytes(8, "big") + block[8:]
            digest.update(piece)
            out.write(piece)
    return digest.hexdigest()


def test_reading_a_200_mib_note_stays_in_bounded_memory(scenario: Scenario, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    sha = _big_note(source)
    with source.open("rb") as stdin:
        code, err = _run(scenario, "write", scenario.alice_session, "private/big.bin", stdin=stdin.fileno())
    assert code == 0, err
    source.unlink()
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    measured = subprocess.run([sys.executable, "-c", _MEASURE, SCOPEFS, "read", scenario.alice_session,
                               "private/big.bin"], capture_output=True, env=env, timeout=120, check=True)
    report = json.loads(measured.stdout)
    assert (report["code"], report["size"], report["sha256"]) == (0, BIG, sha), measured.stderr
    assert report["peak_kib"] < PEAK_LIMIT_KIB, report


def _multi_chunk_note(scenario: Scenario) -> tuple[bytes, Path]:
    data = b"".join(bytes([65 + i]) * (1 << 20) for i in range(3)) + b"tail\n"  # a bit over 3 chunks
    scenario.cli.j("write", scenario.alice_session, "private/notes/long.md", stdin=data)
    return data, artifact_path(scenario.cli.home, scenario.alice, "notes/long.md")


def test_a_mismatch_in_the_last_chunk_prints_nothing(scenario: Scenario) -> None:
    """Streaming hashes the whole file before the first byte leaves."""
    data, artifact = _multi_chunk_note(scenario)
    assert scenario.cli("read", scenario.alice_session, "private/notes/long.md", check=True).out == data
    tampered = bytearray(data)
    tampered[-2] ^= 0x20
    artifact.write_bytes(bytes(tampered))
    result = scenario.cli("read", scenario.alice_session, "private/notes/long.md")
    assert (result.code, result.out) == (4, b"")
    assert result.err == "scopefs: artifact does not match its catalog hash\n"
    assert scenario.cli("read", scenario.alice_session, "private/notes/allergy.md", check=True).out == ALICE_FACT


def test_a_change_after_verification_stops_the_copy(scenario: Scenario) -> None:
    """Bytes written into the artifact after it verified are never handed on."""
    data, artifact = _multi_chunk_note(scenario)
    received: list[bytes] = []

    def write(chunk: bytes) -> None:
        received.append(chunk)
        if len(received) == 1:  # after verification, before the second chunk is read
            with artifact.open("r+b") as f:
                f.seek(len(data) - 2)
                f.write(b"X")
    with pytest.raises(IntegrityError):
        stream_note(Home.open(scenario.cli.home), scenario.alice_session, "private/notes/long.md", write)
    assert received == [data[:1 << 20]]
