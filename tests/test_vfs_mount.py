"""``scopefs mount`` and ``scopefs umount`` (DESIGN.md §7), on real FUSE mounts.

* ``scopefs mount SESSION MOUNTPOINT`` returns once the mount answers and
  serves exactly that session's view; ``--foreground`` stays attached until
  the view is unmounted.
* ``scopefs umount MOUNTPOINT`` ends it cleanly: the server exits, removals
  still in their grace period and the read-audit batch are committed.
* A server killed with SIGKILL leaves a mount whose callers fail at once
  with ENOTCONN instead of hanging; ``scopefs mount`` refuses to mount over
  it and names ``scopefs umount``, which clears it; a remount then works.
* Several sessions are mounted side by side, each seeing only its own view.
* Bad input (unknown session, unusable mount point, umount of a non-mount)
  is exit 2 and mounts nothing; a revoked binding is exit 3.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from scopefs.catalog.digests import FAST_HASH_FROM
from tests.conftest import ALICE_FACT, BOB_FACT, CHANNEL_FACT, SCOPEFS, Scenario, table_dump
from tests.mountkit import Mounts, is_mounted, live_notes, mounts, wait_until  # noqa: F401

ALICE_ROOTS = ["agent-shared", "postbox", "private", "projections"]
GROUP_ROOTS = ["agent-shared", "channel", "postbox", "projections"]
NOTE = "private/notes/allergy.md"
# Run in a child process, so that a hanging FUSE request fails the test (by
# the timeout) instead of hanging the whole suite.
_PROBE = r"""
import errno, json, os, sys
where = sys.argv[1]
out = {}
def probe(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
probe("stat", lambda: os.stat(where))
probe("listdir", lambda: os.listdir(where))
probe("stat-child", lambda: os.stat(os.path.join(where, "private")))
probe("open-note", lambda: open(os.path.join(where, "private", "notes", "allergy.md"), "rb").close())
probe("statvfs", lambda: os.statvfs(where))
print(json.dumps(out))
"""


# -- helpers ----------------------------------------------------------------

def _mount_count(where: Path) -> int:
    """How many mounts sit exactly at ``where`` (stacked mounts count twice)."""
    target = os.path.realpath(where)
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return sum(1 for line in info if line.split()[4] == target)


def _fstype(where: Path) -> str | None:
    target = os.path.realpath(where)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            if left.split()[4] == target:
                found = right.split()[0]
    return found


def _server_running(pid: int) -> bool:
    """Any thread of the process still alive (not zombie). The thread-group leader shows as a zombie
    while its other threads are still exiting, and the FUSE fd closes only when the last one is gone:
    a request sent in between is aborted (ECONNABORTED), not refused (ENOTCONN)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            stat_line = (task / "stat").read_text()
        except OSError:
            continue
        if stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return True
    return False


def _registry_records(scenario: Scenario) -> list[str]:
    """Mount records in the home (the ``.log`` files of servers are not records)."""
    registry = scenario.cli.home / "mounts"
    if not registry.exists():
        return []
    return sorted(p.name for p in registry.iterdir() if not p.name.endswith(".log"))


def _env(scenario: Scenario) -> dict[str, str]:
    return {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home), "LC_ALL": "C"}


def _probe(where: Path) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(where)], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    shown: dict[str, str] = json.loads(proc.stdout)
    return shown


def _read_line(stream: IO[bytes] | None, timeout: float = 30.0) -> bytes:
    """One line from a child's stdout, or b"" if none arrives in time."""
    assert stream is not None, "the child's stdout is not a pipe"
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


def _force_unmount(scenario: Scenario, where: Path) -> None:
    """Remove every mount at ``where`` (stacked ones too); used after a failed refusal."""
    for _ in range(4):
        if not is_mounted(where):
            return
        if scenario.cli("umount", str(where)).code != 0:
            subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True)


def _attempt_mount(scenario: Scenario, session: str, where: Path, *, foreground: bool) -> tuple[int | None, str, int]:
    """Run ``scopefs --json mount`` (``--foreground`` too) and report what it did.

    Returns (exit code or None if it kept running, stderr, how many new mounts
    appeared at ``where``). Whatever it mounted is removed again before
    returning, so a failed refusal never leaves a mount behind.
    """
    before = _mount_count(where)
    args = [SCOPEFS, "--json", "mount", *(["--foreground"] if foreground else []), session, str(where)]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(scenario))
    try:
        def settled() -> bool:
            return proc.poll() is not None or _mount_count(where) > before

        wait_until(settled, timeout=40)
        try:
            proc.wait(timeout=2)  # a server that is going to fail has done so by now
        except subprocess.TimeoutExpired:
            pass  # still serving: the mount was not refused
        code = proc.poll()
        added = _mount_count(where) - before
    finally:
        now = _mount_count(where)
        if before == 0 and (now or proc.poll() is None):
            _force_unmount(scenario, where)
        else:
            for _ in range(now - before):  # only what was stacked on top of the existing mount
                subprocess.run(["fusermount3", "-u", str(where)], capture_output=True)
        if proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    return code, err, added


# -- mount and umount ---------------------------------------------------------

def test_mount_returns_once_the_view_answers_and_umount_ends_it_cleanly(scenario: Scenario, tmp_path: Path) -> None:
    cli = scenario.cli
    where = tmp_path / "alice"
    where.mkdir()
    try:
        shown = cli.j("mount", scenario.alice_session, str(where))
        # No waiting: the command returned, so the mount answers now.
        assert sorted(os.listdir(where)) == ALICE_ROOTS
        assert (where / NOTE).read_bytes() == ALICE_FACT
        assert shown["mountpoint"] == os.path.realpath(where)
        assert shown["session_id"] == scenario.alice_session
        assert _fstype(where) == "fuse.scopefs"
        pid = shown["pid"]
        assert isinstance(pid, int) and pid != os.getpid() and _server_running(pid)
        assert b"scopefs.vfs.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert len(_registry_records(scenario)) == 1

        # Work the umount must settle: a removal still in its grace period,
        # and a read whose audit row may still be in the mount's batch (a read
        # of a revision not read here before: a second read of allergy.md would
        # add no row, and its first row may have left the batch already).
        cli.j("write", scenario.alice_session, "private/notes/doomed.md", stdin=b"to be removed\n")
        wait_until(lambda: (where / "private/notes/doomed.md").exists())
        audit_before = len(table_dump(cli.home / "state.sqlite")["audit"])
        assert (where / "private/notes/doomed.md").read_bytes() == b"to be removed\n"
        os.unlink(where / "private/notes/doomed.md")

        done = cli.j("umount", str(where))
    finally:
        if is_mounted(where):
            _force_unmount(scenario, where)
    assert done["mountpoint"] == os.path.realpath(where)
    assert not is_mounted(where)
    assert os.listdir(where) == []  # the plain directory is back, nothing left in it
    assert not _server_running(pid), "umount returned while the server was still running"
    assert _registry_records(scenario) == []
    # Cleanly: the grace-period removal and the read audit were committed.
    assert "notes/doomed.md" not in live_notes(cli.home, scenario.alice)
    assert "notes/allergy.md" in live_notes(cli.home, scenario.alice)
    assert cli("read", scenario.alice_session, "private/notes/doomed.md").code == 3
    audit = sorted(table_dump(cli.home / "state.sqlite")["audit"], key=lambda r: r[0])[audit_before:]
    assert any(r[4] == scenario.alice_session and r[5] == "read" and r[10] == "allow" for r in audit), audit


def test_several_sessions_mounted_at_once_each_see_their_own_view(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    alice = mounts.mount(scenario.alice_session, "alice")
    bob = mounts.mount(scenario.bob_session, "bob")
    group = mounts.mount(scenario.group_session, "group")

    assert sorted(os.listdir(alice)) == ALICE_ROOTS
    assert sorted(os.listdir(bob)) == ALICE_ROOTS
    assert sorted(os.listdir(group)) == GROUP_ROOTS
    assert (alice / NOTE).read_bytes() == ALICE_FACT
    assert (bob / NOTE).read_bytes() == BOB_FACT
    assert (group / "channel/offsite.md").read_bytes() == CHANNEL_FACT
    assert os.listdir(alice / "private/notes") == ["allergy.md"]
    assert os.listdir(bob / "private/notes") == ["allergy.md"]
    assert os.listdir(group / "channel") == ["offsite.md"]

    # A write through one mount lands in that session's store only.
    (alice / "private/notes/alice-only.md").write_bytes(b"alice wrote this\n")
    (group / "channel/group-only.md").write_bytes(b"the group wrote this\n")
    assert scenario.cli("read", scenario.alice_session, "private/notes/alice-only.md").out == b"alice wrote this\n"
    assert scenario.cli("read", scenario.group_session, "channel/group-only.md").out == b"the group wrote this\n"
    assert os.listdir(bob / "private/notes") == ["allergy.md"]
    assert not (bob / "private/notes/alice-only.md").exists()
    assert not (alice / "channel").exists() and not (bob / "channel").exists()
    assert not (group / "private").exists()
    assert "notes/alice-only.md" not in live_notes(scenario.cli.home, scenario.bob)

    # Unmounting one leaves the others serving.
    mounts.umount(bob)
    assert not is_mounted(bob)
    assert (alice / NOTE).read_bytes() == ALICE_FACT
    assert (group / "channel/offsite.md").read_bytes() == CHANNEL_FACT


def test_a_killed_server_leaves_a_mount_that_fails_fast_and_umount_clears_it(scenario: Scenario,
                                                                             mounts: Mounts) -> None:  # noqa: F811
    cli = scenario.cli
    where = mounts.root / "alice"
    where.mkdir(parents=True)
    mounts.active.append(where)  # teardown unmounts it whatever happens below
    pid = cli.j("mount", scenario.alice_session, str(where))["pid"]
    assert (where / NOTE).read_bytes() == ALICE_FACT

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _server_running(pid))
    assert is_mounted(where), "the kernel's mount stays behind a killed server"

    # Callers fail at once with ENOTCONN; a hang would trip the timeouts.
    # (A plain stat(2) of a name whose attributes the kernel still caches is
    # answered from that cache; it must not hang either.)
    probed = _probe(where)
    assert {probed.pop("stat"), probed.pop("stat-child")} <= {"ok", "ENOTCONN"}
    assert probed == {"listdir": "ENOTCONN", "open-note": "ENOTCONN", "statvfs": "ENOTCONN"}
    for tool in (["ls", str(where)], ["stat", str(where)]):
        proc = subprocess.run(tool, capture_output=True, text=True, timeout=20, env=_env(scenario))
        assert proc.returncode != 0 and "Transport endpoint is not connected" in proc.stderr, (tool, proc)

    # Mounting over the stale mount is refused, naming the way out. (The
    # message is checked at the end, so that the recovery below is checked
    # even when the message is wrong.)
    messages = []
    for args in (("mount", scenario.alice_session, str(where)), ("mount", scenario.bob_session, str(where))):
        refused = cli(*args, timeout=60)
        assert refused.code == 2, (refused.code, refused.err)
        assert refused.err.count("\n") == 1
        messages.append(refused.err)
    assert _mount_count(where) == 1

    cleared = cli("umount", str(where))
    assert cleared.code == 0, cleared.err
    assert not is_mounted(where)
    assert os.listdir(where) == []
    assert _registry_records(scenario) == []

    # A remount serves the view again, from a new server.
    new_pid = cli.j("mount", scenario.alice_session, str(where))["pid"]
    assert new_pid != pid and _server_running(new_pid)
    assert sorted(os.listdir(where)) == ALICE_ROOTS
    assert (where / NOTE).read_bytes() == ALICE_FACT
    assert cli("umount", str(where)).code == 0
    assert not is_mounted(where) and not _server_running(new_pid)
    assert all("scopefs umount" in m for m in messages), messages


# -- --foreground ------------------------------------------------------------

def _foreground(scenario: Scenario, mounts: Mounts) -> tuple[Path, subprocess.Popen[bytes]]:  # noqa: F811
    """``scopefs --json mount --foreground`` of Alice's session, registered for cleanup."""
    where = mounts.root / "fg"
    where.mkdir(parents=True)
    mounts.active.append(where)
    proc = subprocess.Popen([SCOPEFS, "--json", "mount", "--foreground", scenario.alice_session, str(where)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(scenario))
    return where, proc


def test_foreground_stays_attached_until_scopefs_umount(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    where, proc = _foreground(scenario, mounts)
    try:
        line = _read_line(proc.stdout)
        assert line, f"no readiness line; exit {proc.poll()}"
        shown = json.loads(line)
        assert shown["mountpoint"] == os.path.realpath(where) and shown["session_id"] == scenario.alice_session
        assert shown["pid"] == proc.pid  # the server is this process: it is attached
        # Ready means answering.
        assert sorted(os.listdir(where)) == ALICE_ROOTS
        assert (where / NOTE).read_bytes() == ALICE_FACT
        (where / "private/notes/fg.md").write_bytes(b"written in the foreground\n")
        assert proc.poll() is None, "--foreground returned while mounted"

        done = scenario.cli("umount", str(where))
        assert done.code == 0, done.err
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
        assert not is_mounted(where)
        assert os.listdir(where) == []
        assert scenario.cli("read", scenario.alice_session, "private/notes/fg.md").out == \
            b"written in the foreground\n"
    finally:
        if proc.poll() is None:
            _force_unmount(scenario, where)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_foreground_server_unmounts_itself_on_sigterm(scenario: Scenario, mounts: Mounts) -> None:  # noqa: F811
    where, proc = _foreground(scenario, mounts)
    try:
        assert _read_line(proc.stdout), f"no readiness line; exit {proc.poll()}"
        assert (where / NOTE).read_bytes() == ALICE_FACT
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not is_mounted(where), "SIGTERM must unmount, not leave a stale mount"
        assert os.listdir(where) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


# -- bad input -------------------------------------------------------------

MODES = {"background": False, "foreground": True}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("session", ["malformed", "well-formed"])
def test_an_unknown_session_is_bad_input_and_mounts_nothing(scenario: Scenario, tmp_path: Path, mode: str,
                                                            session: str) -> None:
    where = tmp_path / "mnt"
    where.mkdir()
    unknown = "no-such-session" if session == "malformed" else "s_" + "a" * 26
    code, err, added = _attempt_mount(scenario, unknown, where, foreground=MODES[mode])
    assert (code, added) == (2, 0), err
    assert err.startswith("scopefs: ") and err.count("\n") == 1
    assert os.listdir(where) == []
    assert _registry_records(scenario) == []


def _prepare(kind: str, scenario: Scenario, tmp_path: Path) -> tuple[Path, object]:
    """A mount point that must be refused, and what it holds (checked unchanged after)."""
    where = tmp_path / "mnt"
    if kind == "missing":
        return where, None
    if kind == "regular-file":
        where.write_bytes(b"not a directory\n")
        return where, where.read_bytes()
    where.mkdir()
    if kind == "non-empty":
        (where / "keep.txt").write_bytes(b"a file that must stay visible\n")
        return where, ["keep.txt"]
    raise AssertionError(kind)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["non-empty", "missing", "regular-file"])
def test_an_unusable_mountpoint_is_bad_input_and_mounts_nothing(scenario: Scenario, tmp_path: Path, mode: str,
                                                                kind: str) -> None:
    where, held = _prepare(kind, scenario, tmp_path)
    code, err, added = _attempt_mount(scenario, scenario.alice_session, where, foreground=MODES[mode])
    assert (code, added) == (2, 0), (code, added, err)
    assert err.startswith("scopefs: ") and err.count("\n") == 1, err
    if kind == "missing":
        assert not os.path.lexists(where)
    elif kind == "regular-file":
        assert where.read_bytes() == held
    else:
        assert os.listdir(where) == held
    assert _registry_records(scenario) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_live_mount_is_never_mounted_over(scenario: Scenario, mounts: Mounts, mode: str) -> None:  # noqa: F811
    """Stacking Bob's view on Alice's live one is refused in both modes (exit 1: the first mount won)."""
    live = mounts.mount(scenario.alice_session, "live")
    code, err, added = _attempt_mount(scenario, scenario.bob_session, live, foreground=MODES[mode])
    assert (code, added) == (1, 0), (code, added, err)
    assert err.startswith("scopefs: ") and err.count("\n") == 1, err
    assert (live / NOTE).read_bytes() == ALICE_FACT  # still Alice's view, not Bob's


@pytest.mark.parametrize("mode", MODES)
def test_a_stale_mount_is_refused_naming_umount_before_anyone_touched_it(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                                         mode: str) -> None:
    """The refusal must not depend on whether a caller happened to list the dead mount first."""
    stale = mounts.mount(scenario.alice_session, "stale")
    pid = next(json.loads(p.read_text())["pid"] for p in (scenario.cli.home / "mounts").iterdir()
               if not p.name.endswith(".log") and json.loads(p.read_text())["mountpoint"] == str(stale))
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _server_running(pid))
    code, err, added = _attempt_mount(scenario, scenario.alice_session, stale, foreground=MODES[mode])
    assert (code, added) == (2, 0), (code, added, err)
    assert "scopefs umount" in err, err


def test_umount_of_something_not_mounted_is_bad_input(scenario: Scenario, mounts: Mounts, tmp_path: Path) -> None:  # noqa: F811
    cli = scenario.cli
    plain = tmp_path / "plain"
    plain.mkdir()
    (tmp_path / "file").write_bytes(b"x\n")
    other = mounts.mount(scenario.bob_session, "bob")  # a live mount elsewhere must not be touched
    once = mounts.mount(scenario.alice_session, "once")
    mounts.umount(once)
    for target in (plain, tmp_path / "missing", tmp_path / "file", once):
        result = cli("umount", str(target))
        assert result.code == 2, (target, result.code, result.err)
        assert result.err.startswith("scopefs: ") and result.err.count("\n") == 1
    assert is_mounted(other) and (other / NOTE).read_bytes() == BOB_FACT
    assert (tmp_path / "file").read_bytes() == b"x\n" and os.listdir(plain) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_session_whose_binding_was_revoked_cannot_be_mounted(scenario: Scenario, tmp_path: Path,
                                                               mounts: Mounts, mode: str) -> None:  # noqa: F811
    scenario.cli.j("binding", "revoke", scenario.alice_binding)
    where = tmp_path / "mnt"
    where.mkdir()
    code, err, added = _attempt_mount(scenario, scenario.alice_session, where, foreground=MODES[mode])
    assert (code, added) == (3, 0), (code, added, err)
    assert "identity-revoked" in err
    assert os.listdir(where) == []
    json_refusal = scenario.cli("--json", "mount", scenario.alice_session, str(where))
    assert json_refusal.code == 3 and json_refusal.json()["reason"] == "identity-revoked"
    assert _registry_records(scenario) == []
    # Bob's binding is untouched: his session still mounts.
    bob = mounts.mount(scenario.bob_session, "bob")
    assert (bob / NOTE).read_bytes() == BOB_FACT


def test_a_mount_server_loads_no_tls_and_ssl_still_works_where_it_is_used(scenario: Scenario,
                                                                           mounts: Mounts) -> None:  # noqa: F811
    """``vfs.lean``: a hundred idle mounts each leave libssl (2.2 MiB of RSS each) and, until a large
    note is read or saved, libcrypto (3.5 MiB) unloaded (an empty note's commit loaded it, a review
    found); notes small and large still verify."""
    where = mounts.root / "alice"
    where.mkdir(parents=True)
    mounts.active.append(where)
    pid = scenario.cli.j("mount", scenario.alice_session, str(where))["pid"]
    assert (where / NOTE).read_bytes() == ALICE_FACT
    (where / "private" / "small-save.md").write_bytes(b"a small save\n")
    assert (where / "private" / "small-save.md").read_bytes() == b"a small save\n"
    (where / "private" / "empty.md").touch()  # an empty note: its draft is committed from bytes in memory
    folder = os.open(where / "private", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)  # commits the empty note now (``Commits.committed_under``)
    finally:
        os.close(folder)
    assert scenario.cli("read", scenario.alice_session, "private/empty.md").out == b""
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libpython" in maps or "python" in maps  # the map of the server itself, not an empty file
    assert "libssl" not in maps and "/_ssl." not in maps
    assert "libcrypto" not in maps
    large = bytes(range(256)) * (FAST_HASH_FROM // 128)
    (where / "private" / "large-save.md").write_bytes(large)
    assert (where / "private" / "large-save.md").read_bytes() == large
    assert scenario.cli("read", scenario.alice_session, "private/large-save.md").out == large
    assert "libcrypto" in Path(f"/proc/{pid}/maps").read_text()  # the large note's hash loaded it
    # In a process that does use TLS after the server module was imported, ssl is the real thing.
    code = ("import scopefs.vfs.server, ssl, sys, trio\n"
            "ctx = ssl.create_default_context()\n"
            "assert isinstance(ctx, ssl.SSLContext) and trio.SSLStream is not None\n"
            "assert sys.modules['_ssl'] is not None\n"
            "import trio._ssl as t\n"
            "assert t._stdlib_ssl.SSLContext is ssl.SSLContext\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_mount_server_runs_the_installed_scopefs_in_slash_whatever_the_caller_s_folder(
        scenario: Scenario, tmp_path: Path) -> None:
    """``scopefs mount`` run in a folder that holds a ``scopefs`` package (a decoy that only leaves a mark):
    the server imports the installed one, not the decoy (``python -m`` puts the working directory first
    on the import path unless told not to), and works in ``/``, so it keeps no caller's folder busy."""
    decoy, marked = tmp_path / "decoy", tmp_path / "the-decoy-ran"
    (decoy / "scopefs" / "vfs").mkdir(parents=True)
    (decoy / "scopefs" / "__init__.py").write_text("")
    (decoy / "scopefs" / "vfs" / "__init__.py").write_text("")
    (decoy / "scopefs" / "vfs" / "server.py").write_text(f"open({str(marked)!r}, 'w').close()\n")
    where = tmp_path / "mnt"
    where.mkdir()
    env = {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home)}
    mounted = subprocess.run([SCOPEFS, "mount", scenario.alice_session, str(where)], cwd=decoy, env=env,
                             capture_output=True, timeout=60, check=False)
    try:
        assert mounted.returncode == 0, mounted.stderr
        assert not marked.exists(), "the mount server ran the scopefs of the caller's folder"
        assert (where / NOTE).read_bytes() == ALICE_FACT
        servers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).count(str(where).encode())]
        assert servers and all(os.readlink(f"/proc/{pid}/cwd") == "/" for pid in servers)
    finally:
        scenario.cli("umount", str(where))


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
