"""Findings of an adversarial review of the sandbox and mount commands, each a regression test.

* A kept sandbox mount does not outlive the session's evidence: ``run``
  authorizes the session every time, so a revoked session is refused
  alike with or without ``session up`` (exit 3, ``identity-revoked``) and
  the command never runs.
* Starting a mount is one step: of concurrent ``session up`` calls of one
  session, or ``mount`` calls on one directory, exactly one starts a
  server; the others are refused as a second call after it would be, and
  ``session down`` / ``umount`` then leave nothing behind.
* A mount point in the home or ``/run/scopefs``, or around either, is
  refused before anything is mounted (it would hide the broker's files
  from the broker).
* Inside the sandbox only ``/tmp`` (256 MiB) and ``/memory`` can be
  written: ``/`` and ``/dev`` are read-only, not tmpfs as large as the
  host's memory. A negative control with exactly that protection removed
  shows the probe would see the difference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scopefs.sandbox.bwrap import FULL, TMP_BYTES
from tests.conftest import SCOPEFS, Result, Scenario
from tests.mountkit import view_servers, wait_until
from tests.sandboxrun import leftovers, server_processes, settle, stdout_into

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # compares the host's sandbox leftovers

RUNS = "sh -c 'echo the-command-ran'"
RACERS = 4


def _env(scenario: Scenario) -> dict[str, str]:
    return {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home), "LC_ALL": "C"}


def _race(scenario: Scenario, commands: list[list[str]]) -> list[Result]:
    """Start every command at once and wait for all of them."""
    procs = [subprocess.Popen([SCOPEFS, *argv], env=_env(scenario), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for argv in commands]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append(Result(proc.returncode, out, err.decode("utf-8", "replace")))
    return results


def _mount_count(where: Path) -> int:
    """How many mounts sit exactly at ``where`` (stacked mounts count each)."""
    target = os.path.realpath(where)
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return sum(1 for line in info if line.split()[4] == target)


def _settled_servers(where: Path, timeout: float = 30.0) -> set[int]:
    """The servers of ``where`` still running once they had ``timeout`` to exit."""
    deadline = time.monotonic() + timeout
    while (found := view_servers(where)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _lazy_unmount(where: Path) -> None:
    subprocess.run(["fusermount3", "-uz", os.path.realpath(where)], capture_output=True, check=False)


def _clear_mounts(where: Path) -> None:
    """Remove every mount at ``where`` and end its servers (after a failed assertion, stacked ones too)."""
    for _ in range(8):
        if _mount_count(where) == 0:
            break
        _lazy_unmount(where)
    for pid in view_servers(where):
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not view_servers(where), timeout=30)


def _stop_extra_servers(before: dict[str, set[Any]]) -> None:
    """SIGTERM sandbox mount servers started since ``before`` that nothing stopped (the bug's leftovers)."""
    for pid in server_processes() - before["servers"]:
        os.kill(pid, signal.SIGTERM)


# -- a kept mount follows revocation -----------------------------------------------------------

def _revoked_run(scenario: Scenario) -> tuple[Result, Result]:
    """``run`` of a revoked session, as text and as JSON."""
    return (scenario.cli("run", scenario.alice_session, "--", "sh", "-c", "echo the-command-ran"),
            scenario.cli("--json", "run", scenario.alice_session, "--", "sh", "-c", "echo the-command-ran"))


def test_a_revoked_session_runs_nothing_with_or_without_a_kept_mount(scenario: Scenario) -> None:
    from scopefs.catalog.home import Home
    from scopefs.sandbox import sessions

    before = leftovers()
    scenario.cli("session", "up", scenario.alice_session, check=True)
    try:
        control = scenario.cli("run", scenario.alice_session, "--", "sh", "-c", "echo the-command-ran")
        scenario.cli.j("binding", "revoke", scenario.alice_binding)
        assert sessions.kept(Home.open(scenario.cli.home), scenario.alice_session) is not None  # still up
        with_kept = _revoked_run(scenario)
    finally:
        scenario.cli("session", "down", scenario.alice_session, check=True)
    without_kept = _revoked_run(scenario)
    assert control.code == 0 and control.out == b"the-command-ran\n"  # the command prints when it runs
    for text, as_json in (with_kept, without_kept):
        assert (text.code, text.out, text.err) == (3, b"", "scopefs: denied: identity-revoked\n")
        assert as_json.code == 3
        assert as_json.json() == {"error": "denied: identity-revoked", "exit_code": 3, "reason": "identity-revoked"}
    assert with_kept == without_kept
    assert settle(before) == {}


# -- one start at a time -----------------------------------------------------------------------

def test_concurrent_session_ups_start_exactly_one_server(scenario: Scenario) -> None:
    before = leftovers()
    try:
        results = _race(scenario, [["--json", "session", "up", scenario.alice_session]] * RACERS)
        started = server_processes() - before["servers"]
        downs = [scenario.cli("session", "down", scenario.alice_session) for _ in range(2)]
    finally:
        _stop_extra_servers(before)
    winners = [r for r in results if r.code == 0]
    losers = [r for r in results if r.code != 0]
    assert len(winners) == 1, [(r.code, r.err) for r in results]
    for loser in losers:
        assert (loser.code, loser.err) == (1, "scopefs: this session's sandbox mount is already up\n")
        assert loser.json()["exit_code"] == 1
    assert started == {winners[0].json()["pid"]}  # the losers started no server
    assert [d.code for d in downs] == [0, 2]
    assert settle(before) == {}  # down stopped the only one: no server, mount, place or uid is left


def _four_sessions(scenario: Scenario) -> list[str]:
    shared_main = scenario.cli.j("session", "open", "--agent", scenario.agent, "--shared-main")["session_id"]
    return [scenario.alice_session, scenario.bob_session, scenario.group_session, shared_main]


def test_concurrent_mounts_on_one_directory_mount_exactly_one_view(scenario: Scenario, tmp_path: Path) -> None:
    where = tmp_path / "one-directory"
    where.mkdir()
    sessions = _four_sessions(scenario)
    try:
        results = _race(scenario, [["--json", "mount", session, str(where)] for session in sessions])
        stacked, servers = _mount_count(where), view_servers(where)
        unmounted = scenario.cli("umount", str(where))
        after, servers_after = _mount_count(where), _settled_servers(where)
    finally:
        _clear_mounts(where)
    winners = [r for r in results if r.code == 0]
    assert len(winners) == 1, [(r.code, r.err) for r in results]
    for loser in (r for r in results if r.code != 0):
        assert (loser.code, loser.err) == (1, f"scopefs: {os.path.realpath(where)} is already a mount point\n")
    assert stacked == 1 and servers == {winners[0].json()["pid"]}
    assert unmounted.code == 0 and after == 0  # umount uncovers the plain directory, no other view
    assert servers_after == set()
    assert os.listdir(where) == []


def test_a_mount_and_an_umount_of_one_directory_keep_its_record(scenario: Scenario, tmp_path: Path) -> None:
    """Mount, umount and mount again at once: whatever order wins, the record matches what is mounted."""
    where = tmp_path / "dir"
    where.mkdir()
    try:
        scenario.cli("mount", scenario.alice_session, str(where), check=True)
        results = _race(scenario, [["umount", str(where)], ["mount", scenario.bob_session, str(where)]])
        mounted = _mount_count(where)
        records = [json.loads(p.read_text()) for p in (scenario.cli.home / "mounts").iterdir()
                   if not p.name.endswith(".log")]
        if mounted:
            assert scenario.cli("umount", str(where)).code == 0
        servers_after = _settled_servers(where)
    finally:
        _clear_mounts(where)
    assert results[0].code == 0 and mounted <= 1
    assert len(records) == mounted  # no record of a mount that is gone, none missing for the live one
    assert [r["session_id"] for r in records] == ([scenario.bob_session] if mounted else [])
    assert list((scenario.cli.home / "mounts").glob("*.lock")) == [] and servers_after == set()


@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
def test_a_directory_another_filesystem_is_mounted_on_is_refused(scenario: Scenario, tmp_path: Path,
                                                                  foreground: bool) -> None:
    """Not only our own mounts: a tmpfs there is never covered (a guard; this held before the review)."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(where)], check=True)
    try:
        result = _attempt_mount(scenario, scenario.alice_session, where, foreground=foreground)
        assert _mount_count(where) == 1
    finally:
        _clear_mounts(where)
        subprocess.run(["umount", str(where)], capture_output=True, check=False)
    assert (result.code, result.err) == (1, f"scopefs: {os.path.realpath(where)} is already a mount point\n")


# -- never over the broker's own folders -------------------------------------------------------

def _attempt_mount(scenario: Scenario, session: str, where: Path, *, foreground: bool) -> Result:
    """``scopefs mount`` (or ``--foreground``); whatever it mounted is removed before returning."""
    before = _mount_count(where)
    args = [SCOPEFS, "mount", *(["--foreground"] if foreground else []), session, str(where)]
    proc = subprocess.Popen(args, env=_env(scenario), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proc.poll() is not None or _mount_count(where) > before, timeout=40)
        if _mount_count(where) > before:
            _lazy_unmount(where)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in view_servers(where):
        os.kill(pid, signal.SIGTERM)
    return Result(proc.returncode, out, err.decode("utf-8", "replace"))


@pytest.fixture
def run_scopefs_folder() -> Iterator[Path]:
    """An empty folder of our own in /run/scopefs (where the sandbox places, sockets and uid locks live)."""
    folder = Path("/run/scopefs") / f"hardening-{secrets.token_hex(8)}"
    folder.parent.mkdir(mode=0o711, exist_ok=True)
    folder.mkdir()
    try:
        yield folder
    finally:
        folder.rmdir()


def _broker_place(kind: str, scenario: Scenario, tmp_path: Path, run_folder: Path) -> tuple[Path, str]:
    """A mount point in or around the broker's folders, and how the refusal names it."""
    home = scenario.cli.home
    staging = home / "agents" / scenario.agent / "staging"
    if kind == "staging":
        return staging, "is inside the scopefs home"
    if kind == "link-to-staging":
        link = tmp_path / "innocent-looking"
        link.symlink_to(staging)
        return link, "is inside the scopefs home"
    if kind == "home":
        return home, "is the scopefs home"
    if kind == "parent-of-home":
        return home.parent, "holds the scopefs home"
    if kind == "run-scopefs":
        return run_folder, "is inside /run/scopefs"
    raise AssertionError(kind)


@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
@pytest.mark.parametrize("kind", ["staging", "link-to-staging", "home", "parent-of-home", "run-scopefs"])
def test_a_mount_point_in_or_around_the_brokers_folders_is_refused(scenario: Scenario, tmp_path: Path,
                                                                  run_scopefs_folder: Path, kind: str,
                                                                  foreground: bool) -> None:
    where, says = _broker_place(kind, scenario, tmp_path, run_scopefs_folder)
    result = _attempt_mount(scenario, scenario.alice_session, where, foreground=foreground)
    resolved = os.path.realpath(where)
    assert result.code == 2, (result.code, result.err)
    assert result.err.startswith(f"scopefs: mount point {resolved} {says};") and result.err.count("\n") == 1
    assert _mount_count(where) == 0 and not view_servers(where)
    # The broker still works through its own folders.
    scenario.cli.j("write", scenario.alice_session, "private/notes/after.md", stdin=b"still writable\n")
    assert scenario.cli("read", scenario.alice_session, "private/notes/after.md").out == b"still writable\n"


# -- only /tmp and /memory are writable --------------------------------------------------------

WRITE_PROBE = r"""
import errno, json, os, sys
out = {"HOME": os.environ.get("HOME")}
def attempt(name, call):
    try:
        call()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def create(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
def allocate(path, size):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
        os.unlink(path)
for path in ("/x", "/etc/x", "/dev/x", "/dev/shm/x", "/usr/x"):
    attempt("create " + path, lambda: create(path))
for path in ("/var", "/home", "/run"):
    attempt("mkdir " + path, lambda: os.mkdir(path))
attempt("create $HOME/.x", lambda: create(os.path.join(os.environ["HOME"], ".x")))
attempt("create /tmp/x", lambda: create("/tmp/x"))
attempt("allocate /tmp 1 MiB", lambda: allocate("/tmp/small", 1 << 20))
attempt("allocate /tmp past its size", lambda: allocate("/tmp/big", int(sys.argv[1])))
attempt("write /memory", lambda: open("/memory/private/notes/probe.md", "w").write("probe\n"))
print(json.dumps(out))
"""
PAST_TMP = str(TMP_BYTES + (1 << 20))


def test_only_tmp_and_memory_are_writable_in_the_sandbox(scenario: Scenario) -> None:
    result = scenario.cli("run", scenario.alice_session, "--", "python3", "-c", WRITE_PROBE, PAST_TMP)
    assert result.code == 0, result.err
    found = json.loads(result.out)
    outside = {k: v for k, v in found.items() if k.startswith(("create /", "mkdir"))
               and not k.startswith("create /tmp")}
    assert outside == dict.fromkeys(outside, "EROFS") and len(outside) == 8, found
    assert found["HOME"] == "/tmp" and found["create $HOME/.x"] == "ok" and found["create /tmp/x"] == "ok"
    assert found["allocate /tmp 1 MiB"] == "ok"
    assert found["allocate /tmp past its size"] == "ENOSPC"
    assert found["write /memory"] == "ok"


def _probe_in_process(scenario: Scenario, tmp_path: Path, read_only_root: bool) -> dict[str, str]:
    """The probe through ``launch.run`` over a tied session mount, with or without the read-only root."""
    from scopefs.catalog.home import Home
    from scopefs.sandbox import sessions
    from scopefs.sandbox.launch import run

    proc, target = sessions.start(Home.open(scenario.cli.home), scenario.alice_session, tied=True)
    out = tmp_path / f"probe-{read_only_root}"
    try:
        with stdout_into(out):
            code = run(target, ["python3", "-c", WRITE_PROBE, PAST_TMP],
                       protections=dataclasses.replace(FULL, read_only_root=read_only_root))
    finally:
        sessions.stop_server(proc.pid, target.mountpoint)
        proc.wait()
    assert code == 0
    written: dict[str, str] = json.loads(out.read_bytes())
    return written


def test_control_without_the_read_only_root_the_probe_writes_outside(scenario: Scenario, tmp_path: Path) -> None:
    """Exactly the protection removed: the probe sees / and /dev writable (so it proves something)."""
    before = leftovers()
    full = _probe_in_process(scenario, tmp_path, True)
    weak = _probe_in_process(scenario, tmp_path, False)
    assert full["create /x"] == full["create /dev/x"] == full["mkdir /var"] == "EROFS"
    assert weak["create /x"] == weak["create /dev/x"] == weak["mkdir /var"] == "ok"
    assert weak["create /usr/x"] == "EROFS"  # a read-only bind stays one either way
    assert settle(before) == {}
