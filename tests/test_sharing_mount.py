"""Sharing through live mounts and the sandbox: copies arrive, and leave at once.

A projection or a published note shows in the mounted views of its
audience as soon as it is committed. A revoked or expired projection is
gone from every mounted view within the functional bound, including the
kernel's page cache: a process that held the copy open is refused (EIO or
EACCES), never served the bytes it cached. The read-only roots stay
read-only through the mount for every subject, the publisher included.
"""

from __future__ import annotations

import errno
import functools
import os

import apsw

from tests.conftest import ALICE_FACT, Scenario
from tests.mountkit import Mounts, errno_of, mounts, wait_until  # noqa: F401 - fixture
from tests.test_vfs_live import BOUND_S, _gone, _pinned, _pread_result

SOURCE = "private/notes/allergy.md"
COPY = "projections/channel/notes/allergy.md"


def _write_errno(path: os.PathLike[str], flags: int = 0) -> int:
    """The errno of opening ``path`` for writing and writing a byte (root's open is not refused; its write is)."""
    try:
        fd = os.open(path, os.O_WRONLY | flags, 0o600)
    except OSError as exc:
        return exc.errno or 0
    try:
        os.write(fd, b"x")
        os.fsync(fd)
    except OSError as exc:
        return exc.errno or 0
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            return exc.errno or 0  # noqa: B012 - a refused commit surfaces at close
    return 0


def _read_recorded(s: Scenario, revision_id: str) -> bool:
    conn = apsw.Connection(str(s.cli.home / "state.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return bool(conn.execute("SELECT 1 FROM audit WHERE operation = 'read' AND decision = 'allow'"
                                 " AND session_id = ? AND revision_id = ?", (s.group_session, revision_id)).fetchall())
    finally:
        conn.close()


def _project(s: Scenario, *expiry: str) -> str:
    return str(s.cli.j("project", s.alice_session, SOURCE, "--to", f"conversation:{s.conversation}",
                       "--purpose", "for the offsite menu", *(expiry or ("--no-expiry",)), "--yes")["projection_id"])


def test_a_revoked_projection_leaves_a_live_mount_and_its_page_cache(scenario: Scenario, mounts: Mounts) -> None:
    s = scenario
    view = mounts.mount(s.group_session)
    assert os.listdir(view / "projections" / "channel") == []
    projection = _project(s)
    note = view / COPY
    wait_until(lambda: note.exists(), timeout=BOUND_S)
    assert note.read_bytes() == ALICE_FACT
    assert _write_errno(note) in (errno.EROFS, errno.EACCES)
    assert _write_errno(view / "projections/channel/x.md", os.O_CREAT) in (errno.EROFS, errno.EACCES)
    assert note.read_bytes() == ALICE_FACT
    with _pinned(note) as held:
        assert held.first == ALICE_FACT
        # A mount records its reads in batches, once a second (``vfs.follow``): the revoke's impact list
        # holds what was recorded by then.
        copy_revision = s.cli.j("projection", "list", "--agent", s.agent)["projections"][0]["copy_revision_id"]
        wait_until(lambda: _read_recorded(s, copy_revision), timeout=BOUND_S)
        out = s.cli.j("projection", "revoke", projection)
        assert out["exposed_session_ids"] == [s.group_session]
        wait_until(lambda: _gone(note), timeout=BOUND_S)
        assert _pread_result(held.fd) in (errno.EACCES, errno.EIO)
    assert os.listdir(view / "projections" / "channel") == []


def test_an_expired_projection_leaves_a_live_mount(scenario: Scenario, mounts: Mounts) -> None:
    s = scenario
    view = mounts.mount(s.group_session)
    _project(s, "--expires", "12s")  # time for the mount to show it and the read that follows, loaded or not
    note = view / COPY
    wait_until(lambda: note.exists(), timeout=BOUND_S)
    with _pinned(note) as held:
        assert held.first == ALICE_FACT
        wait_until(lambda: _gone(note), timeout=BOUND_S + 12)  # the view looks again when the allow expires
        assert _pread_result(held.fd) in (errno.EACCES, errno.EIO)


def test_published_notes_arrive_read_only_for_everyone(scenario: Scenario, mounts: Mounts) -> None:
    s = scenario
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "agent-shared")
    alice, bob = mounts.mount(s.alice_session), mounts.mount(s.bob_session)
    s.cli.j("publish", s.alice_session, SOURCE, "--to", "agent-shared", "--as", "menu.md", "--yes")
    for view in (alice, bob):
        note = view / "agent-shared" / "menu.md"
        wait_until(note.exists, timeout=BOUND_S)
        assert note.read_bytes() == ALICE_FACT
        # The publisher's own mount does not write it either: reading never implies writing.
        assert _write_errno(note) in (errno.EROFS, errno.EACCES)
        assert _write_errno(view / "agent-shared" / "new.md", os.O_CREAT) in (errno.EROFS, errno.EACCES)
        assert errno_of(functools.partial(os.unlink, note)) in (errno.EROFS, errno.EACCES, errno.EPERM)


def test_unmodified_tools_in_the_sandbox_see_the_copy_and_never_the_source(scenario: Scenario) -> None:
    s = scenario
    _project(s)
    result = s.cli("run", s.group_session, "--", "sh", "-c",
                   "ls -R /memory/projections; cat /memory/" + COPY + "; grep -rl hazelnuts /memory;"
                   " cp /memory/" + COPY + " /memory/channel/menu-copy.md && echo copied;"
                   " ls /memory/private 2>&1; true")
    assert result.code == 0, result.err
    out = result.text
    assert "allergy.md" in out and ALICE_FACT.decode() in out
    assert "/memory/" + COPY in out
    assert "copied" in out  # the audience may use the copy: it was declassified for exactly them
    assert "No such file or directory" in out  # /memory/private is not there
    alice = s.cli("run", s.bob_session, "--", "sh", "-c", "grep -rl hazelnuts /memory; ls /memory/projections")
    assert "hazelnuts" not in alice.text and "channel" not in alice.text


def test_no_path_in_a_mount_shares_with_a_person(scenario: Scenario, mounts: Mounts) -> None:
    """Crafted names and paths never reach another person: the only ways out are publish, project, deposit."""
    s = scenario
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.alice, "--scope", "agent-shared")
    alice, group = mounts.mount(s.alice_session), mounts.mount(s.group_session)
    refused = (errno.EROFS, errno.EACCES, errno.ENOENT, errno.EPERM)
    attempts = {
        "a projection root": alice / "projections" / "agent-shared" / "x.md",
        "a role's projections": alice / "projections" / "roles" / "ops" / "x.md",
        "a person's name under projections": alice / "projections" / s.bob / "x.md",
        "next to the projection roots": alice / "projections" / "x.md",
        "a role folder": alice / "roles" / "ops" / "x.md",
        "agent-shared, as its publisher": alice / "agent-shared" / "x.md",
        "the group's projections": group / "projections" / "channel" / "x.md",
        "a person's id in the postbox": group / "postbox" / f"{s.bob}.md",
        "a private folder in a group": group / "private" / "x.md",
    }
    for what, path in attempts.items():
        assert _write_errno(path, os.O_CREAT) in refused, what
        assert errno_of(functools.partial(os.mkdir, path.parent / "made")) in refused + (errno.EEXIST,), what
        assert errno_of(functools.partial(os.symlink, "/memory/private/notes/allergy.md", path)) in refused, what
    source = alice / SOURCE
    assert errno_of(lambda: os.link(source, alice / "agent-shared" / "linked.md")) in refused + (errno.EXDEV,)
    assert errno_of(lambda: os.rename(source, alice / "agent-shared" / "moved.md")) in refused + (errno.EXDEV,)
    assert source.read_bytes() == ALICE_FACT
    for session in (s.bob_session, s.group_session):
        assert s.cli("read", session, "agent-shared/moved.md").code == 3
        assert s.cli("read", session, "agent-shared/linked.md").code == 3


def test_a_removed_role_member_loses_its_notes_open_handles_included(scenario: Scenario, mounts: Mounts) -> None:
    """roles/<role>/ and projections/roles/<role>/ go with the membership: held descriptors are refused."""
    s = scenario
    s.cli.j("role", "add", "ops")
    for member in (s.alice, s.bob):
        s.cli.j("member", "add", "role:ops", member)
    s.cli.j("grant", "publisher", "--agent", s.agent, "--principal", s.bob, "--scope", "role:ops")
    s.cli.j("publish", s.bob_session, SOURCE, "--to", "role:ops", "--as", "runbook.md", "--yes")
    s.cli.j("project", s.bob_session, SOURCE, "--to", "role:ops", "--purpose", "for on-call", "--no-expiry",
            "--as", "bob-allergy.md", "--yes")
    view = mounts.mount(s.alice_session)
    published, projected = view / "roles/ops/runbook.md", view / "projections/roles/ops/bob-allergy.md"
    wait_until(lambda: published.exists() and projected.exists(), timeout=BOUND_S)
    with _pinned(published) as held_published, _pinned(projected) as held_projected:
        assert held_published.first == held_projected.first != b""
        s.cli.j("member", "remove", "role:ops", s.alice)
        wait_until(lambda: _gone(published) and _gone(projected), timeout=BOUND_S)
        for held in (held_published, held_projected):
            assert _pread_result(held.fd) in (errno.EACCES, errno.EIO)
    assert not (view / "roles").exists()
    assert os.listdir(view / "projections") == ["agent-shared"]
