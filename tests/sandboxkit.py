"""Run a command in a bubblewrap sandbox shaped like ``scopefs run``'s, for tests.

A stand-in for the real launcher (which may later replace it): the command
starts as an unprivileged host uid via ``setpriv`` (no groups, no
capabilities, no_new_privs), then ``bwrap`` gives it fresh namespaces, a
read-only ``/usr`` (with the usual /bin, /lib, /lib64 symlinks), its own
/proc, /dev and /tmp, an empty environment except PATH, ``--disable-userns``
and ``--new-session``, and optionally ``--seccomp FD`` with
``scopefs.sandbox.seccomp.filter_fd()``.

Switches exist only to build negative controls: ``seccomp=False`` (no
filter), ``new_session=False`` (the caller's terminal stays the controlling
tty, for TIOCSTI tests) and ``privileged=True``, which runs bwrap as real
root with every capability and no user namespace, so that the kernel's own
privilege checks (EPERM for an unprivileged caller) cannot hide whether
seccomp is what blocks a call. The launcher never has such modes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from scopefs.sandbox.seccomp import filter_fd

SANDBOX_UID = 3999999
BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"


def _data_fd(data: bytes) -> int:
    fd = os.memfd_create("sandboxkit-file", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextlib.contextmanager
def popen(command: Sequence[str], *, seccomp: bool = True, privileged: bool = False,
          new_session: bool = True, files: Mapping[str, bytes] | None = None,
          env: Mapping[str, str] | None = None, uid: int = SANDBOX_UID,
          **popen_kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``command`` in the sandbox; yields the Popen, kills it on exit.

    ``files`` maps sandbox paths to contents (``--ro-bind-data``, read-only);
    ``env`` adds variables to the otherwise empty environment; other keyword
    arguments go to ``subprocess.Popen`` (stdin, stdout, preexec_fn, ...).
    """
    fds: list[int] = []
    try:
        argv = [] if privileged else [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                      "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        argv += [BWRAP, "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
                 "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--die-with-parent"]
        if privileged:  # no user namespace: capabilities are real (init namespace) ones
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                     "--unshare-cgroup", "--cap-add", "ALL"]
        else:
            argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
        if new_session:
            argv.append("--new-session")
        for path, data in (files or {}).items():
            fds.append(_data_fd(data))
            argv += ["--ro-bind-data", str(fds[-1]), path]
        if seccomp:
            fds.append(filter_fd())
            argv += ["--seccomp", str(fds[-1])]
        argv += ["--clearenv", "--setenv", "PATH", "/usr/bin"]
        for key, value in (env or {}).items():
            argv += ["--setenv", key, value]
        argv += ["--", *command]
        proc = subprocess.Popen(argv, pass_fds=fds, **popen_kwargs)
    finally:
        for fd in fds:
            os.close(fd)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run(command: Sequence[str], *, input: bytes | None = None, timeout: float = 120,
        **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``popen`` to completion, capturing stdout and stderr (stdin /dev/null unless given)."""
    kwargs.setdefault("stdin", subprocess.PIPE if input is not None else subprocess.DEVNULL)
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    with popen(command, **kwargs) as proc:
        out, err = proc.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
