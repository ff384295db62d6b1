"""What a sandbox is made of: the bubblewrap arguments, one protection each.

The sandbox's whole world is its session's mount at ``/memory``, a
read-only ``/usr`` (with the merged-/usr links and the few ``/etc`` files
the tools read), a private size-limited ``/tmp``, a fresh ``/proc`` and a
minimal ``/dev``. The root and ``/dev`` are tmpfs that bwrap makes (owned
by the command's uid and as large as the host's memory), so both are
remounted read-only once built: the only places the command can write are
``/tmp`` (also ``$HOME``, 256 MiB) and ``/memory`` as its view allows.
Every namespace is new: no network but ``lo``, no host
processes, no host IPC. The command runs as an unprivileged uid (inside
and, as the launcher starts bwrap, on the host), with no
capabilities, ``NoNewPrivs``, a seccomp filter, a new terminal session and
no user namespaces of its own.

``Protections`` names each of those so that the isolation suite can take
exactly one away and show that its probe's result flips (a negative
control). Only the launcher's tests ever build a weakened set; the command
line always uses the default, which has them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 1000  # what the command sees as its own uid and gid
TMP_BYTES = 256 << 20
MEMORY = "/memory"
HOSTNAME = "memory"
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Read-only, from the host, when present: how the dynamic linker and the
# tools we promise (vim, nano, python3, coreutils) find their pieces.
# Each bind costs a mount and a remount per command, so only what is read:
# vim and editor are /etc/alternatives links; the dynamic linker reads only
# its cache at run time; python3 needs nothing from /etc.
ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/vim", "/etc/nanorc", "/etc/localtime")
PASSWD = f"memory:x:{SANDBOX_UID}:{SANDBOX_UID}:memory:/tmp:/bin/sh\n"
GROUP = f"memory:x:{SANDBOX_UID}:\n"
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "USER": "memory", "LOGNAME": "memory",
            "LANG": "C.UTF-8", "SHELL": "/bin/sh", "TMPDIR": "/tmp"}


@dataclass(frozen=True)
class Protections:
    """Each protection of the sandbox; all on unless a negative control turns one off."""

    own_uid: bool = True  # run as the session's host uid (else bwrap runs as root: "root mode")
    new_session: bool = True  # setsid: no TIOCSTI into the caller's terminal
    disable_userns: bool = True  # no nested user namespaces (and so no mounts of its own)
    unshare_net: bool = True  # only lo: no host loopback, no abstract sockets of the host
    unshare_pid: bool = True  # no host processes, /proc/1 is the sandbox's own
    seccomp: bool = True  # the deny list of scopefs.sandbox.seccomp
    empty_env: bool = True  # bwrap starts with no environment (it would show in /proc/1/environ)
    close_fds: bool = True  # the launcher's inheritable descriptors stay outside
    drop_caps: bool = True  # off (root mode only): the command keeps every capability (--cap-add ALL)
    options_via_fd: bool = True  # bwrap's options come from a descriptor, not its argv (/proc/1/cmdline)
    read_only_root: bool = True  # / and /dev read-only: no unbounded tmpfs beside the 256 MiB /tmp


FULL = Protections()


@dataclass(frozen=True)
class Layout:
    """Where the mount is and how it is bound."""

    mountpoint: str
    writable: bool
    tty: bool = False
    term: str | None = None


def _host_links() -> list[str]:
    args: list[str] = []
    for link in MERGED_USR_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    return args


def options(layout: Layout, protections: Protections, *, passwd_fd: int, group_fd: int) -> list[str]:
    """bwrap's options (no fds for status or seccomp: the launcher adds those)."""
    args = ["--unshare-user", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if protections.unshare_pid:
        args.append("--unshare-pid")
    if protections.unshare_net:
        args.append("--unshare-net")
    if protections.disable_userns:
        args.append("--disable-userns")
    if protections.new_session:
        args.append("--new-session")
    args += ["--cap-drop", "ALL"] if protections.drop_caps else ["--cap-add", "ALL"]
    args += ["--die-with-parent", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", HOSTNAME,
             "--ro-bind", "/usr", "/usr", *_host_links()]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    args += ["--perms", "0444", "--ro-bind-data", str(passwd_fd), "/etc/passwd",
             "--perms", "0444", "--ro-bind-data", str(group_fd), "/etc/group",
             "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp",
             "--bind" if layout.writable else "--ro-bind", layout.mountpoint, MEMORY]
    if protections.read_only_root:  # last: every mount point above is made on the root before it
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", MEMORY, "--clearenv"]
    env = dict(BASE_ENV)
    if layout.tty and layout.term:
        env["TERM"] = layout.term
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def bwrap_path() -> str | None:
    """The system's bwrap, found on a fixed PATH (never the caller's)."""
    for directory in ("/usr/bin", "/bin", "/usr/local/bin"):
        candidate = Path(directory) / "bwrap"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None
