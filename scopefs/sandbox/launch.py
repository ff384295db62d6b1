"""Starting one command in a sandbox over a session's mount, and waiting for it.

The order matters and is the point of this module:

1. bwrap is started as the session's unprivileged host uid (real,
   effective and saved uids and gids changed, no supplementary groups:
   the kernel then clears every capability), with an empty environment
   and its options read from a descriptor (``--args``), so neither shows
   in the sandbox's ``/proc/1``.
2. bwrap reports the sandbox's pid 1 and pid namespace
   (``--json-status-fd``) and builds it; building needs only the mount
   root's attributes, which the gate gives the session uid unadmitted.
   The command itself waits behind a shim (``SHIM``) for the launcher's
   "go", and refuses to run at an end of file: a launcher that failed or
   died never lets it start. (bwrap's own ``--block-fd`` takes an end of
   file for a go, and ``--userns-block-fd`` cannot be combined with
   ``--disable-userns``.)
3. The launcher checks that namespace (a pidfd on pid 1, the namespace
   read back through ``/proc``: a pid reused meanwhile is caught), admits
   it at the mount's gate over the control socket, and says "go". The
   admission ends when the launcher's connection closes, so it cannot
   outlive the launcher.
4. The command's exit status comes from ``--json-status-fd``. Any failure
   or a timeout kills the sandbox's pid 1 through the pidfd (its whole pid
   namespace goes with it) before anything else, and the shim's own pipe
   tells whether the command had started, so a refusal that says "nothing
   was run" is true.

``--die-with-parent`` ties the sandbox to the launcher once it runs: if the
launcher is killed, the kernel kills the sandbox too.

The uid change is done by ``subprocess`` itself (``user``, ``group``,
``extra_groups``), not by ``setpriv``: the extra exec, or a ``preexec_fn``
(which forces a full ``fork`` of the launcher), cost about 2 ms of the
few a sandbox costs. The sandboxed command still gets ``NoNewPrivs`` and an
empty bounding set from bwrap (tested by the isolation suite); the outer
bwrap process, which only waits for it, keeps neither capabilities nor
any way to gain one (it execs nothing).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scopefs.catalog.errors import ScopefsError
from scopefs.sandbox import bwrap, terminal
from scopefs.sandbox.admission import Admission
from scopefs.sandbox.bwrap import FULL, Layout, Protections
from scopefs.sandbox.places import run_dir
from scopefs.vfs.gate import pid_namespace

START_TIMEOUT_S = 30.0
TIMED_OUT = 124  # what coreutils' timeout(1) returns
# The command runs behind this shim (the system's own shell, read-only in
# the sandbox): it waits for the launcher's "go", which comes only after
# the sandbox's pid namespace was admitted, refuses at end of file (a
# launcher that failed or died), says that it executes the command, and
# closes both pipes first, so the command inherits nothing. bwrap's
# --block-fd would take an end of file for a go.
SHIM = 'IFS= read -r go <&{fd} && [ "$go" = go ] || exit 125; printf x >&{fd}; exec {fd}<&-; exec "$@"'
SMALL_FD = 10  # dash names descriptors 0-9 only; bash (slower to start by about 0.5 ms) any
MAX_STATUS = 1 << 16
BPF_INSTRUCTION = 8  # bytes of one classic-BPF instruction
FUSE_DEVICE = (10, 229)  # /dev/fuse's major and minor numbers


class SandboxUnavailable(ScopefsError):
    """A safe sandbox cannot be built here, or it failed; the message says whether anything ran (exit 1)."""

    exit_code = 1


class TimedOut(ScopefsError):
    """The command ran out of time; the launcher killed its whole sandbox (exit 124, as timeout(1))."""

    exit_code = TIMED_OUT


@dataclass(frozen=True)
class Target:
    """A live sandbox mount: where it is, whose uid, how to reach its gate."""

    uid: int
    mountpoint: str
    control: str | None  # None: a plain directory with no gate (the isolation suite's controls)
    writable: bool


@functools.cache
def preflight() -> str:
    """bwrap's path, or SandboxUnavailable saying exactly what is missing.

    Remembered once it passed (a failure is not, so it is checked again):
    a gateway calls ``run`` per command. If something goes away later,
    bwrap itself fails and ``run`` still refuses; nothing falls back.
    """
    if os.geteuid() != 0:
        raise SandboxUnavailable("cannot build a sandbox: scopefs run must be started by root (it gives each "
                                 "session its own uid and a mount only that uid can reach); nothing was run")
    path = bwrap.bwrap_path()
    if path is None:
        raise SandboxUnavailable("cannot build a sandbox: bubblewrap (bwrap) is not installed; nothing was run")
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="ascii") as limit:
            if int(limit.read().strip() or "0") <= 0:
                raise SandboxUnavailable("cannot build a sandbox: user namespaces are disabled "
                                         "(user.max_user_namespaces is 0); nothing was run")
    except (OSError, ValueError):
        raise SandboxUnavailable("cannot build a sandbox: user namespaces are unavailable; nothing was run") from None
    if not _is_fuse_device("/dev/fuse"):
        raise SandboxUnavailable("cannot build a sandbox: FUSE (/dev/fuse) is unavailable; nothing was run")
    try:
        _filter_program()
    except Exception as exc:  # noqa: BLE001 - any failure to build the filter refuses the run
        raise SandboxUnavailable(f"cannot build a sandbox: no seccomp filter ({type(exc).__name__}); "
                                 "nothing was run") from None
    return path


@functools.cache
def _filter_program() -> bytes:
    """The seccomp program, compiled once per version of ``sandbox/seccomp.py``.

    Building it with libseccomp costs about 50 ms, more than the sandbox
    itself, so the compiled program is kept in a root-only directory
    under a hash of the module's source. libseccomp is imported only to
    build it: its absence then becomes a clear refusal, not an import
    error of the command line.
    """
    spec = importlib.util.find_spec("scopefs.sandbox.seccomp")
    if spec is None or spec.origin is None:
        raise SandboxUnavailable("cannot build a sandbox: the seccomp filter module is missing; nothing was run")
    key = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:32]
    cached = run_dir("cache", 0o700) / f"seccomp-{key}.bpf"
    with contextlib.suppress(FileNotFoundError):
        program = cached.read_bytes()
        if program and len(program) % BPF_INSTRUCTION == 0:
            return program
    from scopefs.sandbox import seccomp

    program = seccomp.filter_program()
    staged = cached.with_suffix(f".{os.getpid()}.tmp")
    staged.write_bytes(program)
    staged.replace(cached)
    return program


def _is_fuse_device(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == FUSE_DEVICE


def _data_fd(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextlib.contextmanager
def _closing(fds: list[int]) -> Iterator[list[int]]:
    try:
        yield fds
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class StatusStream:
    """bwrap's ``--json-status-fd``: first the sandbox's pid and namespaces, at the end the exit code."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._text = ""
        self._at = 0
        self._decoder = json.JSONDecoder()

    def _next(self, deadline: float | None) -> dict[str, object] | None:
        while len(self._text) < MAX_STATUS:
            while self._at < len(self._text) and self._text[self._at].isspace():
                self._at += 1
            with contextlib.suppress(ValueError):
                doc, self._at = self._decoder.raw_decode(self._text, self._at)
                return doc if isinstance(doc, dict) else {}
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                    return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                return None
            self._text += chunk.decode("utf-8", "replace")
        return None

    def started(self, deadline: float) -> tuple[int, int | None] | None:
        """The sandbox's pid 1 (host pid) and the pid namespace bwrap made for it (None: it made none)."""
        doc = self._next(deadline)
        pid = None if doc is None else doc.get("child-pid")
        if doc is None or not isinstance(pid, int):
            return None
        namespace = doc.get("pid-namespace")
        return pid, namespace if isinstance(namespace, int) else None

    def exit_code(self) -> int | None:
        """The command's exit code, read to the end of the stream; None if bwrap reported none."""
        while (doc := self._next(None)) is not None:
            code = doc.get("exit-code")
            if isinstance(code, int):
                return code
        return None


def _inheritable_fds() -> list[int]:
    """The launcher's inheritable descriptors (only a weakened sandbox passes them on)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):
            if fd > 2 and os.get_inheritable(fd):
                found.append(fd)
    return found


def run(target: Target, argv: list[str], *, timeout: float | None = None,
        protections: Protections = FULL, bwrap_path: str | None = None) -> int:
    """Run ``argv`` in a sandbox over ``target``'s mount; its exit status.

    stdin, stdout and stderr are the launcher's own (pipes or a terminal).
    A timeout kills the whole sandbox and raises ``TimedOut``.
    """
    if not argv:
        raise SandboxUnavailable("no command given")
    bwrap_exe = bwrap_path or preflight()
    tty = os.isatty(0) or os.isatty(1)
    layout = Layout(target.mountpoint, target.writable, tty=tty, term=os.environ.get("TERM"))
    # One socket to the shim, both ways: the launcher's "go" (EOF: never go),
    # and the shim's word that it executes the command now. One descriptor,
    # so that it is usually below 10 and dash can name it.
    launcher_end, shim_end = (sock.detach() for sock in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    passwd_fd = _data_fd(bwrap.PASSWD.encode(), "passwd")
    group_fd = _data_fd(bwrap.GROUP.encode(), "group")
    owned = [status_r, status_w, launcher_end, shim_end, passwd_fd, group_fd]
    with _closing(owned):
        args = bwrap.options(layout, protections, passwd_fd=passwd_fd, group_fd=group_fd)
        args += ["--json-status-fd", str(status_w)]
        child_fds = [status_w, shim_end, passwd_fd, group_fd]
        if protections.seccomp:
            filter_fd = _data_fd(_filter_program(), "seccomp")
            owned.append(filter_fd)
            child_fds.append(filter_fd)
            args += ["--seccomp", str(filter_fd)]
        shimmed = [*_shim_shell(shim_end), SHIM.format(fd=shim_end), "scopefs-run", *argv]
        if protections.options_via_fd:
            args_fd = _data_fd(b"".join(a.encode() + b"\0" for a in args), "bwrap-args")
            owned.append(args_fd)
            child_fds.append(args_fd)
            command = [bwrap_exe, "--args", str(args_fd), "--", *shimmed]
        else:
            command = [bwrap_exe, *args, "--", *shimmed]
        if not protections.close_fds:
            child_fds += _inheritable_fds()
        identity: dict[str, Any] = {}
        if protections.own_uid:
            identity = {"user": target.uid, "group": target.uid, "extra_groups": []}
        proc = subprocess.Popen(command, env={} if protections.empty_env else dict(os.environ),
                                pass_fds=tuple(child_fds), close_fds=True, process_group=0, **identity)
        try:
            for fd in (status_w, shim_end):
                os.close(fd)
                owned.remove(fd)
            return _supervise(proc, target, StatusStream(status_r), launcher_end, timeout)
        finally:
            if proc.returncode is None:  # only on a bug: never leave bwrap behind
                proc.kill()
                proc.wait()


def _shim_shell(*fds: int) -> list[str]:
    if max(fds) < SMALL_FD:
        return ["/bin/sh", "-c"]
    return ["/bin/bash", "--norc", "--noprofile", "-c"]


def _sandbox_init(status: StatusStream, control: str | None) -> tuple[int, int, int]:
    """The sandbox's pid 1 (host pid and a pidfd) and its pid namespace, checked to be its own."""
    started = status.started(time.monotonic() + START_TIMEOUT_S)
    if started is None:
        raise SandboxUnavailable("cannot build a sandbox: bubblewrap did not start; nothing was run")
    pid, namespace = started
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        raise SandboxUnavailable("cannot build a sandbox: bubblewrap's sandbox ended at once; "
                                 "nothing was run") from None
    found = pid_namespace(pid)
    if found is None or (namespace is not None and found != namespace) or \
            (control is not None and (namespace is None or namespace == pid_namespace(os.getpid()))):
        os.close(pidfd)  # a reused pid, or no pid namespace of its own to admit: admit nothing, kill nothing
        raise SandboxUnavailable("cannot build a sandbox: its pid namespace is not its own; nothing was run")
    return pid, pidfd, found


def _supervise(proc: subprocess.Popen[bytes], target: Target, status: StatusStream, shim: int,
               timeout: float | None) -> int:
    """Admit, release, wait; kill the whole sandbox on any failure before the go is withdrawn."""
    pidfd = -1
    admission: Admission | None = None
    try:
        init_pid, pidfd, namespace = _sandbox_init(status, target.control)
        if target.control is not None:
            admission = _admit(target.control, namespace, init_pid, pidfd)
        # Forwarding from before the go: a resize or a Ctrl-C the moment the command starts reaches it,
        # rather than find the launcher with SIGWINCH ignored (lost) or SIGINT its own (the whole
        # sandbox killed). One that comes before the go reaches the shim that waits for it.
        with terminal.forwarding(namespace, init_pid):
            try:
                os.write(shim, b"go\n")
            except (BrokenPipeError, ConnectionResetError):  # the shim's end is gone: bwrap failed before it
                raise SandboxUnavailable("cannot build a sandbox: bubblewrap failed before the command started;"
                                         " nothing was run") from None
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_sandbox(proc, pidfd)
                raise TimedOut(f"the command timed out after {timeout:g}s; its sandbox was killed") from None
    except BaseException:
        _kill_sandbox(proc, pidfd)
        raise
    finally:
        if admission is not None:
            admission.close()
        if pidfd >= 0:
            os.close(pidfd)
    code = status.exit_code()
    if code is not None:
        return code
    if _read_nothing(shim):
        raise SandboxUnavailable("cannot build a sandbox: bubblewrap failed before the command started; "
                                 "nothing was run")
    raise SandboxUnavailable("the sandbox ended abnormally: bubblewrap reported no exit status for the command")


def _admit(control: str, namespace: int, init_pid: int, pidfd: int) -> Admission:
    """Admit ``namespace``, the pid namespace of the sandbox whose pid 1 is ``init_pid`` (``pidfd``),
    handing the mount a descriptor of it to hold (``sandbox.admission``)."""
    try:
        held = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        raise SandboxUnavailable("cannot admit the sandbox: its pid namespace is gone; nothing was run") from None
    try:
        alive = True
        try:
            signal.pidfd_send_signal(pidfd, 0)  # pid 1 still the sandbox's: its pid was not reused meanwhile
        except ProcessLookupError:
            alive = False
        if not alive or os.fstat(held).st_ino != namespace:  # a pid reused since: admit nothing
            raise SandboxUnavailable("cannot build a sandbox: its pid namespace is not its own; nothing was run")
        return Admission(control, namespace, held)
    except OSError as exc:  # ConnectionError, a missing socket, a timeout
        raise SandboxUnavailable(f"cannot admit the sandbox at its mount ({type(exc).__name__}); "
                                 "nothing was run") from None
    finally:
        os.close(held)


def _kill_sandbox(proc: subprocess.Popen[bytes], pidfd: int) -> None:
    """SIGKILL the sandbox's pid 1 (which takes its whole pid namespace) and bwrap; wait for bwrap.

    Done before the go pipe closes, though the shim would refuse to go on
    at its end of file anyway: a sandbox that was not released never runs
    the command, even if this launcher is killed right now.
    """
    if pidfd >= 0:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _read_nothing(fd: int) -> bool:
    """Whether the shim never said it executes the command (its end is closed by now).

    A reset counts as nothing: the shim's end closed with the "go" unread.
    """
    try:
        return os.read(fd, 1) == b""
    except ConnectionResetError:
        return True
