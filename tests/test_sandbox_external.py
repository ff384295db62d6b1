"""A session mount for a sandbox scopefs does not launch: ``scopefs mount --for-uid``.

A gateway that runs its own containers binds the mount at ``/memory`` and
runs the container as one uid. Here bubblewrap stands in for docker: it is
started directly (never through ``scopefs run``), as that uid, with
``--bind MOUNTPOINT /memory``, and the kernel hands FUSE the uid the
process has on the host, as it would for a container's process. Also a
root-run runtime (``unshare`` and ``mount --rbind``, as dockerd and runc
do it) binding the mount before the uid uses it.

Shown: the uid lists, reads and writes its view at ``/memory``; host root
and another uid are refused; once the session ends (closed, or its binding
revoked) the server unmounts itself and a sandbox still running sees
``ENOTCONN`` for everything, a descriptor it held included (no byte from
the page cache), and a new sandbox sees an empty directory; ``scopefs
umount`` ends the binds the same way. Every test leaves nothing mounted
and no process behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import pytest
import trio

from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.sandbox import external, mounts, uids
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.gate import UidGate
from tests.conftest import ALICE_FACT, BOB_FACT, Scenario
from tests.inprocesskit import errno_of, no_kernel  # noqa: F401 - a fixture
from tests.mountkit import is_mounted, wait_until
from tests.test_vfs_gate import context

pytestmark = pytest.mark.slow

# Each test worker has its own pair: a test's teardown kills whatever runs as them and asserts that
# nothing did, so a pair shared by the workers would fail, or kill, another worker's sandbox.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
FOR_UID = 1234 + 2 * _WORKER  # the container's uid: nothing on the test machine runs as it
OTHER_UID = FOR_UID + 1
ROOT_MODE = stat.S_IFDIR | 0o500  # the mount root's constant mode (no view can write at its root)
BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"

HOLDER = """
import json, os, sys
note = os.open("/memory/private/notes/allergy.md", os.O_RDONLY)
print(json.dumps({"read": os.pread(note, 4096, 0).decode(), "list": sorted(os.listdir("/memory"))}), flush=True)
sys.stdin.readline()  # the session ends meanwhile

def attempt(call):
    try:
        return repr(call())
    except OSError as exc:
        return exc.errno

print(json.dumps({"read": attempt(lambda: os.pread(note, 4096, 0)), "list": attempt(lambda: os.listdir("/memory")),
                  "open": attempt(lambda: open("/memory/private/notes/allergy.md", "rb").read()),
                  "stat": attempt(lambda: os.stat("/memory").st_mode)}), flush=True)
"""


def as_uid(uid: int) -> list[str]:
    """A host process that runs as ``uid`` (real, effective and file-system uid), without privileges."""
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]


def sandbox(uid: int, mountpoint: Path, command: Sequence[str]) -> list[str]:
    """bubblewrap as a stand-in for a container: started as ``uid``, the mount bound at /memory."""
    return [*as_uid(uid), BWRAP, "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--bind", str(mountpoint), "/memory", "--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/bin",
            "--", *command]


def run(argv: Sequence[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120, check=False)


def _settled_processes(timeout: float = 10.0) -> list[int]:
    """Processes of the test's uids still there after ``timeout`` (a sandbox's own pid 1 and its
    children are reaped a moment after the sandbox's command returned)."""
    deadline = time.monotonic() + timeout
    while True:
        left = uids.processes_of(FOR_UID) + uids.processes_of(OTHER_UID)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@dataclass
class Place:
    """A mount point the uid can reach (every folder above it searchable), made by root."""

    scenario: Scenario
    base: Path
    mountpoint: Path
    server_pid: int | None = None

    def mount(self, session_id: str, *extra: str) -> dict[str, object]:
        answer = self.scenario.cli.j("mount", session_id, str(self.mountpoint), "--for-uid", str(FOR_UID), *extra)
        pid = answer["pid"]
        assert isinstance(pid, int)
        self.server_pid = pid
        return answer

    def server_alive(self) -> bool:
        return self.server_pid is not None and mounts.server_alive(self.server_pid, external.MODULE)


@pytest.fixture
def place(scenario: Scenario) -> Iterator[Place]:
    # Not under pytest's tmp_path: /tmp/pytest-of-root is 0700, and the sandbox's uid must reach the
    # mount point to bind it (a runtime that binds as root, as docker does, would not need this).
    base = Path(tempfile.mkdtemp(prefix="scopefs-external-", dir="/tmp"))
    os.chmod(base, 0o711)
    (base / "memory").mkdir()
    found = Place(scenario, base, base / "memory")
    try:
        yield found
    finally:
        left_mounted = is_mounted(found.mountpoint)
        if left_mounted and scenario.cli("umount", str(found.mountpoint)).code != 0:
            subprocess.run(["fusermount3", "-uz", str(found.mountpoint)], capture_output=True, check=False)
        left_running = found.server_alive()
        if left_running:
            mounts.await_exit(found.server_pid or 0, external.MODULE, timeout=10)
        left_processes = _settled_processes()
        for uid in (FOR_UID, OTHER_UID):
            uids.kill_processes(uid)
        shutil.rmtree(base, ignore_errors=True)
        assert not left_mounted and not left_running and not left_processes, "the test left something behind"


def close_session(scenario: Scenario, session_id: str) -> None:
    """End the session the way an operator does: ``scopefs session close``."""
    scenario.cli.j("session", "close", session_id)


# -- the uid, and nobody else ------------------------------------------------------


def test_the_uid_uses_its_view_at_memory_and_nobody_else_can(place: Place, scenario: Scenario) -> None:
    answer = place.mount(scenario.alice_session)
    assert answer["for_uid"] == FOR_UID and answer["for_gid"] == FOR_UID

    inside = run(sandbox(FOR_UID, place.mountpoint, [
        "sh", "-c", "id -u; stat -c '%u:%g %a' /memory/private/notes/allergy.md; ls /memory;"
                    " grep -r allergic /memory; printf 'from the container\\n' > /memory/private/notes/new.md;"
                    " cat /memory/private/notes/new.md"]))
    assert inside.returncode == 0, inside.stderr
    lines = inside.stdout.decode().splitlines()
    assert lines[0] == str(FOR_UID)
    assert lines[1] == f"{FOR_UID}:{FOR_UID} 600"  # shown as the uid's own files
    assert set(lines[2:5]) == {"agent-shared", "postbox", "private"}
    assert ALICE_FACT in inside.stdout and BOB_FACT not in inside.stdout
    assert lines[-1] == "from the container"
    written = scenario.cli("read", scenario.alice_session, "private/notes/new.md", check=True)
    assert written.out == b"from the container\n"  # a revision of Alice's store, made through the mount

    # Host root: refused for everything that reaches the server (only the root's constant attributes,
    # which a runtime reads before it binds, are given to it). What the kernel answers from its caches
    # without asking (the listing and pages the container brought in) root can read, as it can read
    # the home's artifacts themselves: README, "What the kernel answers without asking".
    assert os.stat(place.mountpoint).st_uid == FOR_UID
    cached = os.open(place.mountpoint / "private" / "notes" / "allergy.md", os.O_RDONLY)
    try:
        os.posix_fadvise(cached, 0, 0, os.POSIX_FADV_DONTNEED)  # drops the clean pages: the next read asks
        with pytest.raises(PermissionError):
            os.pread(cached, 4096, 0)
    finally:
        os.close(cached)
    with pytest.raises(PermissionError):
        os.stat(place.mountpoint / ".search" / "allergic")  # a query is looked up anew every time
    with pytest.raises(PermissionError):
        os.statvfs(place.mountpoint)

    # Another uid: cannot even bind it, nor read it on the host.
    other = run(sandbox(OTHER_UID, place.mountpoint, ["ls", "/memory"]))
    assert other.returncode != 0 and other.stdout == b""
    other_host = run([*as_uid(OTHER_UID), "cat", str(place.mountpoint / "private/notes/allergy.md")])
    assert other_host.returncode != 0 and ALICE_FACT not in other_host.stdout
    assert "Permission denied" in other_host.stderr.decode()

    # The uid is the whole credential: a host process running as it is served too (README says so).
    host_uid = run([*as_uid(FOR_UID), "cat", str(place.mountpoint / "private/notes/allergy.md")])
    assert host_uid.stdout == ALICE_FACT

    scenario.cli("umount", str(place.mountpoint), check=True)
    assert not is_mounted(place.mountpoint)


def test_a_root_run_runtime_binds_it_as_docker_does(place: Place, scenario: Scenario) -> None:
    """dockerd and runc stat the bind source and bind it as root, then start the container as the uid."""
    place.mount(scenario.alice_session, "--for-gid", "4321")
    target = place.base / "container-memory"
    target.mkdir()
    script = (f"stat -c '%u:%g' {place.mountpoint} && mount --rbind {place.mountpoint} {target} && "
              f"{' '.join(as_uid(FOR_UID))} cat {target}/private/notes/allergy.md && "
              f"{' '.join(as_uid(FOR_UID))} stat -c '%u:%g' {target}/private")
    done = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{FOR_UID}:4321\n".encode() + ALICE_FACT + f"{FOR_UID}:4321\n".encode()
    scenario.cli("umount", str(place.mountpoint), check=True)


# -- the session's end ---------------------------------------------------------------


def _start_holder(place: Place) -> subprocess.Popen[bytes]:
    """A sandbox that reads, holds the note open, and waits for a line before trying again."""
    holder = subprocess.Popen(sandbox(FOR_UID, place.mountpoint, ["python3", "-c", HOLDER]),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert holder.stdout is not None
    before = json.loads(holder.stdout.readline() or b"null")
    assert before == {"read": ALICE_FACT.decode(), "list": ["agent-shared", "postbox", "private", "projections"]}
    return holder


def _held_through(place: Place, end: Callable[[], None]) -> dict[str, object]:
    """What a sandbox holding the note open finds once ``end()`` ended the mount's service."""
    holder = _start_holder(place)
    try:
        end()
        out, err = holder.communicate(b"go\n", timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err
    found = json.loads(out)
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("end", ["closed", "binding-revoked"])
def test_the_mount_ends_with_the_session(place: Place, scenario: Scenario, end: str) -> None:
    place.mount(scenario.alice_session)

    def session_ends() -> None:
        if end == "closed":
            close_session(scenario, scenario.alice_session)
        else:
            scenario.cli("binding", "revoke", scenario.alice_binding, check=True)
        wait_until(lambda: not is_mounted(place.mountpoint))  # the server unmounted itself
        wait_until(lambda: not place.server_alive())

    after = _held_through(place, session_ends)
    # The bind held by the running sandbox: nothing, not even the page the held descriptor read. A stat
    # of /memory itself may be answered from the kernel's attribute cache: the root's constant attributes.
    assert after.pop("stat") in (errno.ENOTCONN, repr(ROOT_MODE))
    assert after == {"read": errno.ENOTCONN, "list": errno.ENOTCONN, "open": errno.ENOTCONN}
    # A sandbox started now binds the bare mount point: empty.
    fresh = run(sandbox(FOR_UID, place.mountpoint, ["ls", "-A", "/memory"]))
    assert fresh.returncode == 0 and fresh.stdout == b""
    # And the session cannot be mounted again.
    again = scenario.cli("mount", scenario.alice_session, str(place.mountpoint), "--for-uid", str(FOR_UID))
    assert again.code == 3 and not is_mounted(place.mountpoint)


def test_umount_ends_the_binds_too(place: Place, scenario: Scenario) -> None:
    """A bind holds the filesystem after the host's mount point lets go; ``scopefs umount`` stops the
    server itself, so the container's /memory stops answering too."""
    place.mount(scenario.alice_session)

    def umount() -> None:
        scenario.cli("umount", str(place.mountpoint), check=True)
        assert not is_mounted(place.mountpoint) and not place.server_alive()

    after = _held_through(place, umount)
    assert after.pop("stat") in (errno.ENOTCONN, repr(ROOT_MODE))
    assert set(after.values()) == {errno.ENOTCONN}


# -- refusals ----------------------------------------------------------------------


def test_unsafe_targets_and_places_are_refused(place: Place, scenario: Scenario) -> None:
    session, where = scenario.alice_session, str(place.mountpoint)
    for uid in ("0", "65534", str(uids.UID_BASE + 7), "-1", str(1 << 32)):
        refused = scenario.cli("mount", session, where, "--for-uid", uid)
        assert refused.code == 2, (uid, refused.err)
    assert scenario.cli("mount", session, where, "--for-uid", str(FOR_UID), "--for-gid", "0").code == 2
    assert scenario.cli("mount", session, where, "--for-gid", str(FOR_UID)).code == 2

    loose = place.base / "loose"
    (loose / "memory").mkdir(parents=True)
    os.chmod(loose, 0o777)  # anyone could swap memory for a link between the check and root's mount
    refused = scenario.cli("mount", session, str(loose / "memory"), "--for-uid", str(FOR_UID))
    assert refused.code == 2 and "changed by other users" in refused.err
    theirs = place.base / "theirs"
    theirs.mkdir()
    os.chown(theirs, FOR_UID, FOR_UID)
    refused = scenario.cli("mount", session, str(theirs), "--for-uid", str(FOR_UID))
    assert refused.code == 2 and "owned by root" in refused.err
    inside_home = scenario.cli.home / "mnt"
    inside_home.mkdir()
    assert scenario.cli("mount", session, str(inside_home), "--for-uid", str(FOR_UID)).code == 2
    foreground = scenario.cli("mount", session, str(loose / "memory"), "--for-uid", str(FOR_UID), "--foreground")
    assert foreground.code == 2
    assert not any(is_mounted(p) for p in (place.mountpoint, loose / "memory", theirs, inside_home))


# -- the gate's rules, in process -----------------------------------------------------


def test_the_uid_gate_in_process(scenario: Scenario, no_kernel: None) -> None:
    """Any process of the uid (no admission needed); root gets the root's attributes only; once the
    mount stops, nobody, and handles opened before are revoked."""
    home = Home.open(scenario.cli.home)
    gate = UidGate(FOR_UID)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session), gate=gate,
                 owner=(FOR_UID, FOR_UID))

    async def main() -> None:
        me, root, other = context(FOR_UID, 0), context(0, os.getpid()), context(OTHER_UID, os.getpid())
        ino = pyfuse3.ROOT_INODE
        for name in ("private", "notes", "allergy.md"):
            ino = (await fs.lookup(ino, name.encode(), me)).st_ino  # pid 0: a caller in another pid namespace
        assert await fs.read(0, 0, 4096, ino, me) == ALICE_FACT
        assert (await fs.getattr(pyfuse3.ROOT_INODE, root)).st_uid == FOR_UID
        for who in (root, other):
            assert await errno_of(fs.lookup(pyfuse3.ROOT_INODE, b"private", who)) == errno.EACCES
            assert await errno_of(fs.read(0, 0, 4096, ino, who)) == errno.EACCES
            assert await errno_of(fs.write(0, 0, b"x", ino, who)) == errno.EACCES
            assert await errno_of(fs.getattr(ino, who)) == errno.EACCES
            assert await errno_of(fs.statfs(who)) == errno.EACCES
        assert await errno_of(fs.getattr(pyfuse3.ROOT_INODE, other)) == errno.EACCES
        gate.dismiss_all()  # what the mount does when it stops
        assert await errno_of(fs.read(0, 0, 4096, ino, me)) == errno.EACCES
        assert await errno_of(fs.lookup(pyfuse3.ROOT_INODE, b"private", me)) == errno.EACCES
        assert await errno_of(fs.getattr(pyfuse3.ROOT_INODE, root)) == errno.EACCES

    try:
        trio.run(main)
    finally:
        fs.artifacts.close()
        home.close()
