"""The lifecycle of derived memory through live mounts and the sandbox.

A derived note shows in the mounts that may read it; when its source is
removed or forgotten it leaves every live mount within the functional
bound, including the kernel's page cache (a process that held it open is
refused, never served the cached bytes). A note past its ``valid-until``
leaves a live mount at its time with no write to wake it. A forgotten
claim cannot be saved back through the mount, and editing a note's
human-notes block through the mount is a person's right.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

from scopefs.catalog.humanblock import END, START
from tests.conftest import ALICE_FACT, SCOPEFS, Scenario
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401 - fixture
from tests.test_sharing_mount import _write_errno
from tests.test_vfs_live import BOUND_S, _gone, _pinned, _pread_result

SOURCE = "private/notes/allergy.md"
DIGEST = b"Digest: the offsite lunch avoids hazelnut desserts\n"


def test_a_descendant_leaves_a_live_mount_and_its_page_cache_with_its_source(scenario: Scenario,
                                                                           mounts: Mounts) -> None:
    s = scenario
    view = mounts.mount(s.alice_session)
    s.cli.j("derive", s.alice_session, "--from", SOURCE, "--to", "private/summaries/d1.md", stdin=DIGEST)
    s.cli.j("derive", s.alice_session, "--from", "private/summaries/d1.md", "--to", "private/summaries/d2.md",
            stdin=b"Second-level digest of the lunch plan\n")
    d1, d2 = view / "private/summaries/d1.md", view / "private/summaries/d2.md"
    wait_until(lambda: d2.exists(), timeout=BOUND_S)
    assert d1.read_bytes() == DIGEST
    with _pinned(d1) as held:
        assert held.first == DIGEST
        os.unlink(view / SOURCE)  # rm through the mount: a tombstone, and its descendants are held
        wait_until(lambda: _gone(d1) and _gone(d2), timeout=BOUND_S)
        assert _pread_result(held.fd) in (errno.EACCES, errno.EIO)
    assert os.listdir(view / "private") == ["notes"] or sorted(os.listdir(view / "private")) == ["notes"]
    grep = subprocess.run(["grep", "-r", "hazelnut", str(view)], capture_output=True, timeout=30)
    assert grep.stdout == b""


def test_a_forgotten_claim_cannot_be_saved_back_through_the_mount(scenario: Scenario, mounts: Mounts) -> None:
    s = scenario
    s.cli.j("forget", s.alice_session, SOURCE)
    alice, group = mounts.mount(s.alice_session), mounts.mount(s.group_session)
    for target in (alice / "private/again.md", group / "channel/again.md"):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        failed = 0
        try:
            os.write(fd, ALICE_FACT)
            os.fsync(fd)
        except OSError as exc:
            failed = exc.errno or 0
        finally:
            try:
                os.close(fd)
            except OSError as exc:
                failed = failed or exc.errno or 0
        assert failed == errno.EACCES
        assert _content_or_gone(target) in (None, b"")  # at most the empty note the create made
    assert _write_errno(alice / "private/fine.md", os.O_CREAT) == 0


def _content_or_gone(path: Path) -> bytes | None:
    """What ``path`` holds, or None if it is not there, in one step: a stat then a read could see the
    name go in between (a note whose first save was refused is forgotten by the kernel just after)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def test_a_note_past_its_validity_leaves_a_live_mount_by_itself(scenario: Scenario, mounts: Mounts) -> None:
    s = scenario
    view = mounts.mount(s.alice_session)
    valid_s = 12  # the write, the mount showing it and the reads below all happen before it runs out
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + valid_s))
    s.cli.j("write", s.alice_session, "private/notes/soon.md", "--valid-until", until,
            stdin=b"A fact that is true for a few seconds only\n")
    note = view / "private/notes/soon.md"
    wait_until(lambda: note.exists(), timeout=BOUND_S)
    assert note.read_bytes().endswith(b"A fact that is true for a few seconds only\n")
    with _pinned(note):
        wait_until(lambda: _gone(note), timeout=BOUND_S + valid_s)
    assert "soon.md" not in os.listdir(view / "private/notes")


def test_people_edit_the_human_block_through_the_mount_and_a_capture_keeps_it(scenario: Scenario,
                                                                           mounts: Mounts) -> None:
    s = scenario
    view = mounts.mount(s.alice_session)
    note = view / "private/notes/page.md"
    note.write_bytes(b"Machine text\n" + START + b"\nmine: call Bob on Mondays\n" + END + b"\n")
    edited = b"Machine text\n" + START + b"\nmine: call Bob on Tuesdays now\n" + END + b"\n"
    note.write_bytes(edited)  # a person may change it freely
    wait_until(lambda: s.cli("read", s.alice_session, "private/notes/page.md").out == edited, timeout=BOUND_S)
    regenerated = b"Regenerated text\n" + START + b"\nmachine guess\n" + END + b"\n"
    s.cli.j("write", s.alice_session, "private/notes/page.md", "--origin", "capture", stdin=regenerated)
    assert s.cli("read", s.alice_session, "private/notes/page.md").out == \
        b"Regenerated text\n" + START + b"\nmine: call Bob on Tuesdays now\n" + END + b"\n"
    damaged = s.cli("write", s.alice_session, "private/notes/page.md", "--origin", "capture",
                    stdin=b"Regenerated without the block at all\n")
    assert damaged.code == 2 and "human-notes block" in damaged.err


def test_derived_notes_and_their_loss_inside_scopefs_run(scenario: Scenario) -> None:
    s = scenario
    s.cli.j("derive", s.alice_session, "--from", SOURCE, "--to", "private/summaries/d1.md", stdin=DIGEST)
    run = subprocess.run([SCOPEFS, "run", s.alice_session, "--", "cat", "/memory/private/summaries/d1.md"],
                         capture_output=True, timeout=120, env={**os.environ, "SCOPEFS_HOME": str(s.cli.home)})
    assert run.returncode == 0 and run.stdout == DIGEST, run.stderr
    s.cli.j("forget", s.alice_session, SOURCE)
    run = subprocess.run([SCOPEFS, "run", s.alice_session, "--", "sh", "-c",
                          "ls -R /memory/private; grep -r hazelnut /memory || echo none"],
                         capture_output=True, timeout=120, env={**os.environ, "SCOPEFS_HOME": str(s.cli.home)})
    assert run.returncode == 0, run.stderr
    assert b"d1.md" not in run.stdout and run.stdout.rstrip().endswith(b"none")
