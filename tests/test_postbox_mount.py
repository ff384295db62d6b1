"""The postbox through live mounts and the sandbox: deposit-only for a group, review-only for its owner.

A group files ``postbox/<handle>.md`` with unmodified tools (``cp``, a
shell redirect); the folder keeps listing empty, and the file cannot be
looked up, read or opened again, before its close or after. Every bad
deposit is the same ``EACCES``. The owner's mounted ``postbox/`` shows the
pending item (read-only) and its notice; approving moves it out.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from scopefs.vfs.writers import WRITER_IDLE_S
from tests.conftest import ACCOUNT, ALICE_SENDER, BOB_SENDER, CHANNEL, Scenario
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401 - fixture
from tests.test_vfs_live import BOUND_S

NOTE = b"Alice would like a vegetarian option (canary M0nt)\n"


def _handle(s: Scenario, sender: str = ALICE_SENDER) -> str:
    return str(s.cli.j("message", "add", s.group_session, "--channel", CHANNEL, "--account", ACCOUNT,
                       "--sender", sender)["message_handle"])


def _errno(call: Callable[[], object]) -> int:
    try:
        call()
    except OSError as exc:
        return exc.errno or 0
    return 0


def _write(path: Path, data: bytes) -> int:
    """errno of writing ``data`` to a new file at ``path`` and closing it (0: done)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return exc.errno or 0
    try:
        os.write(fd, data)
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            return exc.errno or 0  # noqa: B012 - the close is where a deposit is filed
    return 0


@pytest.fixture
def enabled(scenario: Scenario) -> Scenario:
    scenario.cli.j("postbox", "enable", scenario.alice)
    return scenario


def test_a_group_deposits_with_cp_and_never_sees_it_again(enabled: Scenario, mounts: Mounts,
                                                            tmp_path: Path) -> None:
    s = enabled
    group = mounts.mount(s.group_session)
    box = group / "postbox"
    assert os.listdir(box) == []
    source = tmp_path / "observation.md"
    source.write_bytes(NOTE)
    handle = _handle(s)
    target = box / f"{handle}.md"
    subprocess.run(["cp", str(source), str(target)], check=True, timeout=30)
    assert os.listdir(box) == []
    for probe in (lambda: os.stat(target), lambda: open(target, "rb").read(),  # noqa: SIM115
                  lambda: os.open(target, os.O_WRONLY)):
        assert _errno(probe) == errno.ENOENT
    [pending] = s.cli.j("postbox", "list", s.alice_session)["pending"]
    assert pending["conversation_id"] == s.conversation
    # A shell redirect works too, and writing through the descriptor never reads back.
    second = box / f"{_handle(s)}.md"
    fd = os.open(second, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"another observation\n")
        assert _errno(lambda: os.pread(fd, 100, 0)) == errno.EACCES
    finally:
        os.close(fd)
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == 2

    # Every bad deposit: the same errno, and nothing filed.
    off = _handle(s, BOB_SENDER)  # Bob's postbox is off
    for name in (f"{handle}.md", "mh_" + "a" * 32 + ".md", "notes.md", f"{off}.md", f"{_handle(s)}.txt"):
        assert _write(box / name, b"x\n") == errno.EACCES, name
    assert _errno(lambda: os.mkdir(box / "sub")) in (errno.EROFS, errno.EACCES)
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == 2


def test_a_deposit_written_with_pauses_is_filed_whole_at_its_close(enabled: Scenario, mounts: Mounts) -> None:
    """A writer left alone for ``WRITER_IDLE_S`` is committed by the settle, but a deposit's close always
    comes, with its handle: the old code filed the first part of a deposit whose writer paused, and the
    rest was refused. Now it is filed once, whole, at the close."""
    s = enabled
    alice = mounts.mount(s.alice_session)
    group = mounts.mount(s.group_session)
    fd = os.open(group / "postbox" / f"{_handle(s)}.md", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, NOTE[:20])
        time.sleep(3 * WRITER_IDLE_S)
        os.write(fd, NOTE[20:])
    finally:
        os.close(fd)
    [pending] = s.cli.j("postbox", "list", s.alice_session)["pending"]
    folder = alice / "postbox" / s.conversation
    wait_until(lambda: folder.exists() and os.listdir(folder), timeout=BOUND_S)
    [name] = os.listdir(folder)
    assert (folder / name).read_bytes() == NOTE


def test_the_owner_reviews_in_its_own_mount(enabled: Scenario, mounts: Mounts) -> None:
    s = enabled
    alice = mounts.mount(s.alice_session)
    group = mounts.mount(s.group_session)
    assert _write(group / "postbox" / f"{_handle(s)}.md", NOTE) == 0
    folder = alice / "postbox" / s.conversation
    wait_until(lambda: folder.exists() and os.listdir(folder), timeout=BOUND_S)
    [name] = os.listdir(folder)
    assert (folder / name).read_bytes() == NOTE
    notices = alice / "postbox" / "NOTICES.md"
    wait_until(notices.exists, timeout=BOUND_S)
    assert "first deposit" in notices.read_text()
    assert _write(folder / name, b"edited") in (errno.EROFS, errno.EACCES)
    grep = subprocess.run(["grep", "-rl", "vegetarian", str(alice / "private")], capture_output=True, timeout=30)
    assert grep.stdout == b""
    item = s.cli.j("postbox", "list", s.alice_session)["pending"][0]["item_id"]
    s.cli.j("postbox", "approve", s.alice_session, item, "--to", "private/notes/menu.md")
    wait_until(lambda: not (folder / name).exists(), timeout=BOUND_S)
    wait_until(lambda: (alice / "private/notes/menu.md").exists(), timeout=BOUND_S)
    assert (alice / "private/notes/menu.md").read_bytes() == NOTE


def test_inside_the_sandbox_a_deposit_is_one_cp(enabled: Scenario) -> None:
    s = enabled
    handle = _handle(s)
    result = s.cli("run", s.group_session, "--", "sh", "-c",
                   f"printf 'seen in the sandbox\\n' > /tmp/o.md && cp /tmp/o.md /memory/postbox/{handle}.md"
                   f" && echo filed; ls -A /memory/postbox; cat /memory/postbox/{handle}.md 2>&1;"
                   f" cp /tmp/o.md /memory/postbox/{handle}.md 2>&1; true")
    assert result.code == 0, result.err
    lines = result.text.splitlines()
    assert lines[0] == "filed"
    assert "No such file or directory" in lines[1]
    assert "Permission denied" in result.text  # the handle was used: the second cp is refused
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == 1


def test_a_deposit_past_its_bound_is_refused_as_it_is_written(enabled: Scenario, mounts: Mounts) -> None:
    from scopefs.catalog.postbox import DEPOSIT_MAX_BYTES

    s = enabled
    group = mounts.mount(s.group_session)
    fd = os.open(group / "postbox" / f"{_handle(s)}.md", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert os.write(fd, b"x" * DEPOSIT_MAX_BYTES) == DEPOSIT_MAX_BYTES
        assert _errno(lambda: os.write(fd, b"y")) == errno.EFBIG
    finally:
        os.close(fd)  # what fitted is filed
    assert len(s.cli.j("postbox", "list", s.alice_session)["pending"]) == 1
