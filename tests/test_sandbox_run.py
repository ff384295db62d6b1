"""``scopefs run``: the command's status and streams, and nothing left behind.

Every test compares the host's sandbox leftovers (places, held uids,
mounts, servers, sandbox-uid processes) before and after, so a run that
leaks any of them fails: on success, on a timeout, when the launcher is
killed and when the mount server dies under the sandbox.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ALICE_FACT, BOB_FACT, SCOPEFS, Scenario
from tests.mountkit import wait_until
from tests.sandboxrun import leftovers, sandbox_processes, server_processes, settle, stdout_into

if TYPE_CHECKING:  # for an annotation only: the tests import the sandbox modules where they use them
    from scopefs.sandbox.launch import Target

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # compares the host's sandbox leftovers


def _env(scenario: Scenario, **extra: str) -> dict[str, str]:
    return {**os.environ, "SCOPEFS_HOME": str(scenario.cli.home), **extra}


def test_exit_status_and_streams_pass_through(scenario: Scenario) -> None:
    before = leftovers()
    result = scenario.cli("run", scenario.alice_session, "--", "sh", "-c",
                          "cat private/notes/allergy.md; tr a-z A-Z; echo to-stderr >&2; exit 7",
                          stdin=b"piped in\n")
    assert result.code == 7
    assert result.out == ALICE_FACT + b"PIPED IN\n"
    assert "to-stderr" in result.err
    assert settle(before) == {}


def test_the_view_is_the_sessions_own(scenario: Scenario) -> None:
    alice = scenario.cli("run", scenario.alice_session, "--", "sh", "-c", "grep -r allergic /memory; ls /memory")
    bob = scenario.cli("run", scenario.bob_session, "--", "sh", "-c", "grep -r allergic /memory; ls /memory")
    assert alice.code == 0 and bob.code == 0
    assert ALICE_FACT.strip() in alice.out and BOB_FACT.strip() not in alice.out
    assert BOB_FACT.strip() in bob.out and ALICE_FACT.strip() not in bob.out


def test_a_read_only_view_is_bound_read_only(scenario: Scenario) -> None:
    ambiguous = scenario.cli.j("session", "open", "--agent", scenario.agent, "--shared-main")["session_id"]
    result = scenario.cli("run", ambiguous, "--", "sh", "-c",
                          "grep ' /memory ' /proc/self/mountinfo; touch /memory/x 2>&1; echo rc=$?")
    assert result.code == 0
    mount_line = result.text.splitlines()[0]
    assert " ro," in mount_line or " ro " in mount_line, mount_line
    assert "Read-only file system" in result.text and "rc=1" in result.text


def test_timeout_kills_the_whole_sandbox(scenario: Scenario) -> None:
    before = leftovers()
    started = time.monotonic()
    result = scenario.cli("run", scenario.alice_session, "--timeout", "1s", "--", "sh", "-c",
                          "sleep 300 & sleep 300; wait")
    assert result.code == 124
    assert "timed out" in result.err
    assert time.monotonic() - started < 60  # functional bound: it did not wait for sleep 300
    assert settle(before) == {}


def test_a_dead_server_shows_enotconn_never_the_bare_directory(scenario: Scenario) -> None:
    before = leftovers()
    launcher = subprocess.Popen(
        [SCOPEFS, "run", scenario.alice_session, "--", "sh", "-c",
         ("cat private/notes/allergy.md; read line; ls /memory 2>&1; cat /memory/private/notes/allergy.md 2>&1;"
          " echo done")],
        env=_env(scenario), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout is not None and launcher.stdin is not None
        assert launcher.stdout.readline() == ALICE_FACT  # the sandbox is up and reading
        servers = server_processes() - before["servers"]
        assert len(servers) == 1
        os.kill(servers.pop(), signal.SIGKILL)
        launcher.stdin.write(b"go\n")
        launcher.stdin.close()
        rest = launcher.stdout.read().decode()
        launcher.wait(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert "Transport endpoint is not connected" in rest
    assert "allergic" not in rest and rest.strip().endswith("done")
    assert settle(before) == {}


def test_a_kept_mount_is_reused_and_taken_down(scenario: Scenario) -> None:
    before = leftovers()
    scenario.cli("session", "up", scenario.alice_session, check=True)
    try:
        kept = server_processes() - before["servers"]
        assert len(kept) == 1
        for _ in range(2):
            result = scenario.cli("run", scenario.alice_session, "--", "cat", "private/notes/allergy.md")
            assert result.code == 0 and result.out == ALICE_FACT
            assert server_processes() - before["servers"] == kept  # no mount per command
        assert scenario.cli("session", "up", scenario.alice_session).code == 1  # a conflict: it is up
    finally:
        scenario.cli("session", "down", scenario.alice_session, check=True)
    assert settle(before) == {}
    assert scenario.cli("session", "down", scenario.alice_session).code == 2


def _kept_target(scenario: Scenario) -> tuple[int, str]:
    from scopefs.catalog.home import Home
    from scopefs.sandbox import sessions

    found = sessions.kept(Home.open(scenario.cli.home), scenario.alice_session)
    assert found is not None
    return found[1].uid, found[1].mountpoint


def test_the_mount_answers_only_its_sandboxes(scenario: Scenario) -> None:
    """Host root and a host process with the session uid are refused; the sandbox is not."""
    scenario.cli("session", "up", scenario.alice_session, check=True)
    try:
        uid, mountpoint = _kept_target(scenario)
        as_root = subprocess.run(["cat", f"{mountpoint}/private/notes/allergy.md"], capture_output=True, check=False)
        as_uid = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat",
                                 f"{mountpoint}/private/notes/allergy.md"], capture_output=True, check=False)
        listing = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "ls",
                                  mountpoint], capture_output=True, check=False)
        other_uid = subprocess.run(["setpriv", f"--reuid={uid + 1}", f"--regid={uid + 1}", "--clear-groups",
                                    "ls", mountpoint], capture_output=True, check=False)
        inside = scenario.cli("run", scenario.alice_session, "--", "cat", "private/notes/allergy.md")
    finally:
        scenario.cli("session", "down", scenario.alice_session, check=True)
    for refused in (as_root, as_uid, listing, other_uid):
        assert refused.returncode != 0 and b"allergic" not in refused.stdout
        assert b"Permission denied" in refused.stderr
    assert inside.code == 0 and inside.out == ALICE_FACT  # the negative control: the sandbox is served


def _in_private_mount_ns(scenario: Scenario, setup: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``scopefs run`` after ``setup`` in a private mount namespace; the command would
    leave a marker on the host if it ever ran unsandboxed."""
    marker = tmp_path / "ran-unsandboxed"
    script = (f"set -e; {setup}; exec {SCOPEFS} run {scenario.alice_session} -- "
              f"sh -c 'echo ran > {marker}; echo ran'")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, env=_env(scenario), timeout=120, check=False)
    assert not marker.exists()
    return done


@pytest.mark.parametrize("setup, says", [
    ("mount --bind /dev/null /usr/bin/bwrap", "bubblewrap"),
    ("mount --bind /dev/null /dev/fuse", "FUSE"),
    (("mkdir -p /run/scopefs/cache; mount -t tmpfs none /run/scopefs/cache;"
      " for f in /usr/lib/x86_64-linux-gnu/libseccomp.so.2*; do mount --bind /dev/null $f; done"), "seccomp"),
])
def test_refuses_when_a_safe_sandbox_cannot_be_built(scenario: Scenario, tmp_path: Path, setup: str,
                                                      says: str) -> None:
    before = leftovers()
    done = _in_private_mount_ns(scenario, setup, tmp_path)
    assert done.returncode == 1, done.stderr
    assert says in done.stderr and "nothing was run" in done.stderr
    assert "ran" not in done.stdout
    assert settle(before) == {}


def test_control_the_same_namespace_trick_runs_when_nothing_is_hidden(scenario: Scenario, tmp_path: Path) -> None:
    done = _in_private_mount_ns(scenario, "true", tmp_path)
    assert done.returncode == 0 and done.stdout == "ran\n"


def test_refuses_without_user_namespaces(scenario: Scenario, tmp_path: Path) -> None:
    """The kernel's limit reads 0 (a file with 0 is bound over it in a private mount namespace:
    this VM does not let even root lower the real limit)."""
    zero = tmp_path / "zero"
    zero.write_text("0\n")
    done = _in_private_mount_ns(scenario, f"mount --bind {zero} /proc/sys/user/max_user_namespaces", tmp_path)
    assert done.returncode == 1
    assert "user namespaces" in done.stderr and "nothing was run" in done.stderr


def test_a_sandbox_that_fails_to_build_never_runs_the_command(tmp_path: Path) -> None:
    """bwrap failing during setup (here: its bind source is missing) is an error, not exit 1 of the command."""
    from scopefs.sandbox import uids
    from scopefs.sandbox.launch import SandboxUnavailable, Target, run

    marker = tmp_path / "ran"
    allocation = uids.allocate()
    try:
        with pytest.raises(SandboxUnavailable, match="nothing was run"):
            run(Target(allocation.uid, str(tmp_path / "missing"), None, False), ["sh", "-c", f"echo ran > {marker}"])
    finally:
        allocation.release()
    assert not marker.exists()


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.05, 0.5])
def test_a_killed_launcher_leaves_nothing(scenario: Scenario, delay: float) -> None:
    """Killed as soon as the sandbox's first process exists (before the go, just after it, or
    with the command running): the command never runs on, orphaned, and nothing is left.
    (bwrap's --block-fd would run it at the pipe's end of file.)"""
    before = leftovers()
    launcher = subprocess.Popen([SCOPEFS, "run", scenario.alice_session, "--", "sleep", "300"],
                                env=_env(scenario), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: sandbox_processes() - before["processes"], timeout=30, interval=0.001)
        time.sleep(delay)
        launcher.kill()
        launcher.wait()
        assert settle(before) == {}
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _session_mount(scenario: Scenario) -> tuple[subprocess.Popen[bytes], Target]:
    from scopefs.catalog.home import Home
    from scopefs.sandbox import sessions

    return sessions.start(Home.open(scenario.cli.home), scenario.alice_session, tied=True)


def test_a_sandbox_that_cannot_be_admitted_never_runs(scenario: Scenario) -> None:
    """The mount's gate cannot be reached: refused, the sandbox killed, nothing ran."""
    import dataclasses

    from scopefs.sandbox import sessions
    from scopefs.sandbox.launch import SandboxUnavailable, run

    before = leftovers()
    proc, target = _session_mount(scenario)
    try:
        assert target.control is not None  # a session mount's target names its control socket
        with pytest.raises(SandboxUnavailable, match="nothing was run"):
            run(dataclasses.replace(target, control=str(Path(target.control).with_name("gone.sock"))),
                ["sleep", "300"])
    finally:
        sessions.stop_server(proc.pid, target.mountpoint)
        proc.wait()
    assert settle(before) == {}


def test_an_unadmitted_sandbox_of_the_session_uid_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    """The gate's own case: the right uid, from a pid namespace nobody admitted (the same
    sandbox, but started without going through the control socket)."""
    import dataclasses

    from scopefs.sandbox import sessions
    from scopefs.sandbox.launch import run

    proc, target = _session_mount(scenario)
    out = tmp_path / "out"
    try:
        with stdout_into(out):
            admitted = run(target, ["cat", "/memory/private/notes/allergy.md"])
            unadmitted = run(dataclasses.replace(target, control=None),
                             ["sh", "-c", "cat /memory/private/notes/allergy.md 2>&1; ls /memory 2>&1; true"])
    finally:
        sessions.stop_server(proc.pid, target.mountpoint)
        proc.wait()
    text = out.read_bytes()
    assert admitted == 0 and unadmitted == 0
    assert text.count(ALICE_FACT) == 1  # only the admitted sandbox read it
    assert text.count(b"Permission denied") == 2


def test_a_killed_kept_server_is_swept_by_the_next_run(scenario: Scenario) -> None:
    before = leftovers()
    scenario.cli("session", "up", scenario.alice_session, check=True)
    kept = server_processes() - before["servers"]
    assert len(kept) == 1
    os.kill(kept.pop(), signal.SIGKILL)
    result = scenario.cli("run", scenario.alice_session, "--", "cat", "private/notes/allergy.md")
    assert result.code == 0 and result.out == ALICE_FACT  # a dead kept mount is not used
    assert scenario.cli("session", "down", scenario.alice_session).code == 2  # nothing is up any more
    assert settle(before) == {}
