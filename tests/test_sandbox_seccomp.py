"""The sandbox's seccomp filter: what it decides, and what it does in a real bwrap.

Three layers:

* ``filter_program()`` run through a small classic-BPF interpreter: exact
  decisions for chosen (arch, nr, args), including what no probe can show
  (syscall numbers the running kernel does not have yet).
* ``tests/sandbox_probe.py`` inside real sandboxes (tests/sandboxkit.py):
  with the filter every probe is blocked; without it (negative control) the
  same probe is not. Some calls are also refused by the kernel to an
  unprivileged caller with EPERM, which would hide whether seccomp did it;
  for those, the control is bwrap run as real root with every capability
  and no user namespace (``privileged=True``), and the filter must block
  them there too.
* Ordinary tools (sh, coreutils, grep, find, sed, python3, vim, nano) work
  under the filter.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import struct
import sys
import termios
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scopefs.sandbox import seccomp
from tests import sandbox_probe, sandboxkit

PROBE = Path(__file__).with_name("sandbox_probe.py").read_bytes()
PY = "/usr/bin/python3"

# ---------------------------------------------------------------- expectations

# The errno a probe gets when the filter blocks it (EPERM unless listed).
BLOCKED_ERRNO = {"clone3": "ENOSYS", "socket_vsock": "EAFNOSUPPORT", "socket_packet": "EAFNOSUPPORT",
                 "socketpair_vsock": "EAFNOSUPPORT"}
# Probes the filter must leave alone: same result with and without it.
ALLOWED = {"getpid", "ioctl_tiocgwinsz", "clone_plain_einval", "personality_query", "personality_linux",
           "personality_linux32", "socket_unix", "socket_inet6", "socket_netlink"}
# Probes an unprivileged sandbox cannot flip without the filter: something
# else stops them too. Their negative control is the privileged one.
NEEDS_PRIVILEGED_CONTROL = {
    "acct": "CAP_SYS_PACCT (initial namespace) is checked before the pointer",
    "fsopen": "may_mount(): CAP_SYS_ADMIN over the mount namespace, checked first",
    "fsmount": "may_mount()",
    "fspick": "may_mount()",
    "move_mount": "may_mount()",
    "mount_setattr": "may_mount()",
    "pivot_root": "may_mount()",
    "unshare_newns": "CAP_SYS_ADMIN",
    "unshare_newuser": "bwrap --disable-userns (ENOSPC); the privileged control drops it",
    "reboot": "CAP_SYS_BOOT before the magic numbers",
    "swapon": "CAP_SYS_ADMIN (initial namespace)",
    "swapoff": "CAP_SYS_ADMIN (initial namespace)",
    "syslog": "dmesg_restrict: CAP_SYSLOG (initial namespace)",
    "socket_packet": "CAP_NET_RAW (EPERM)",
}
BLOCKED = sorted(set(sandbox_probe.PROBES) - ALLOWED)


def blocked_errno(name: str) -> str:
    return BLOCKED_ERRNO.get(name, "EPERM")


def is_blocked(result: dict[str, Any], name: str) -> bool:
    return not result["ok"] and result["errno"] == blocked_errno(name)


def flipped(result: dict[str, Any], name: str) -> bool:
    """Neither the filter's errno nor a bare EPERM: the call got past every gate."""
    return result["ok"] or result["errno"] not in {blocked_errno(name), "EPERM"}


# ------------------------------------------------------- the program, offline

AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
ALLOW, ERRNO = 0x7FFF0000, 0x00050000


def bpf_eval(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = AUDIT_ARCH_X86_64) -> int:
    """Run a seccomp classic-BPF program on one ``struct seccomp_data``; returns the action."""
    data = struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *(list(args) + [0] * 6)[:6])
    insns: list[tuple[int, int, int, int]] = [struct.unpack_from("<HBBI", program, i)
                                              for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x06:  # ret #k
            return k
        elif code == 0x05:  # ja
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            cond = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if cond else jf
        else:
            raise AssertionError(f"opcode {code:#x} not understood by this interpreter")


def nr(name: str) -> int:
    return seccomp.NR[name]


TIOCSTI, TIOCLINUX, TIOCGWINSZ = 0x5412, 0x541C, 0x5413
EPERM, ENOSYS, EAFNOSUPPORT = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS, ERRNO | errno.EAFNOSUPPORT
DECISIONS = [
    # (label, nr, args, arch, action)
    ("getpid", 39, (), AUDIT_ARCH_X86_64, ALLOW),
    ("read", 0, (0, 0, 0), AUDIT_ARCH_X86_64, ALLOW),
    ("vmsplice is allowed", 278, (), AUDIT_ARCH_X86_64, ALLOW),
    ("statmount", 457, (), AUDIT_ARCH_X86_64, ALLOW),
    ("last reviewed nr", seccomp.MAX_REVIEWED, (), AUDIT_ARCH_X86_64, ALLOW),
    ("first unreviewed nr", seccomp.MAX_REVIEWED + 1, (), AUDIT_ARCH_X86_64, ENOSYS),
    ("far future nr", 1000, (), AUDIT_ARCH_X86_64, ENOSYS),
    ("highest non-x32 nr", 0x3FFFFFFF, (), AUDIT_ARCH_X86_64, ENOSYS),
    ("open_tree_attr (unknown to libseccomp 2.5.4)", 467, (), AUDIT_ARCH_X86_64, EPERM),
    ("clone3", nr("clone3"), (), AUDIT_ARCH_X86_64, ENOSYS),
    ("x32 getpid", 39 | 0x40000000, (), AUDIT_ARCH_X86_64, EPERM),
    ("x32 read", 0x40000000, (), AUDIT_ARCH_X86_64, EPERM),
    ("i386 getpid", 20, (), AUDIT_ARCH_I386, EPERM),
    ("i386 read", 3, (), AUDIT_ARCH_I386, EPERM),
    ("TIOCSTI", 16, (0, TIOCSTI), AUDIT_ARCH_X86_64, EPERM),
    ("TIOCSTI | 1<<32", 16, (0, TIOCSTI | 1 << 32), AUDIT_ARCH_X86_64, EPERM),
    ("TIOCSTI | 0xdead<<32", 16, (0, TIOCSTI | 0xDEAD << 32), AUDIT_ARCH_X86_64, EPERM),
    ("TIOCLINUX | 1<<32", 16, (0, TIOCLINUX | 1 << 32), AUDIT_ARCH_X86_64, EPERM),
    ("TIOCGWINSZ", 16, (0, TIOCGWINSZ), AUDIT_ARCH_X86_64, ALLOW),
    ("fork-like clone", nr("clone"), (0x01200011,), AUDIT_ARCH_X86_64, ALLOW),
    ("pthread clone", nr("clone"), (0x003D0F00,), AUDIT_ARCH_X86_64, ALLOW),
    ("personality PER_LINUX", nr("personality"), (0,), AUDIT_ARCH_X86_64, ALLOW),
    ("personality PER_LINUX32", nr("personality"), (8,), AUDIT_ARCH_X86_64, ALLOW),
    ("personality query", nr("personality"), (0xFFFFFFFF,), AUDIT_ARCH_X86_64, ALLOW),
    ("personality ADDR_NO_RANDOMIZE", nr("personality"), (0x0040000,), AUDIT_ARCH_X86_64, EPERM),
    ("personality READ_IMPLIES_EXEC", nr("personality"), (0x0400000,), AUDIT_ARCH_X86_64, EPERM),
    ("personality 1", nr("personality"), (1,), AUDIT_ARCH_X86_64, EPERM),
    ("personality high bits", nr("personality"), (1 << 32,), AUDIT_ARCH_X86_64, EPERM),
    ("personality -1 as long", nr("personality"), (0xFFFFFFFFFFFFFFFF,), AUDIT_ARCH_X86_64, EPERM),
    ("socket AF_UNIX", 41, (1,), AUDIT_ARCH_X86_64, ALLOW),
    ("socket AF_INET", 41, (2,), AUDIT_ARCH_X86_64, ALLOW),
    ("socket AF_INET6", 41, (10,), AUDIT_ARCH_X86_64, ALLOW),
    ("socket AF_NETLINK", 41, (16,), AUDIT_ARCH_X86_64, ALLOW),
    ("socket AF_AX25", 41, (3,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socket AF_KEY", 41, (15,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socket AF_PACKET", 41, (17,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socket AF_ALG", 41, (38,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socket AF_VSOCK", 41, (40,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socket AF_VSOCK | 1<<32", 41, (40 | 1 << 32,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socketpair AF_VSOCK", 53, (40,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socketpair AF_PACKET", 53, (17,), AUDIT_ARCH_X86_64, EAFNOSUPPORT),
    ("socketpair AF_UNIX", 53, (1,), AUDIT_ARCH_X86_64, ALLOW),
]
DECISIONS += [(f"{name} denied", nr(name), (), AUDIT_ARCH_X86_64, EPERM) for name in seccomp.DENY_EPERM]
DECISIONS += [(f"clone {flag}", nr("clone"), (value | 17,), AUDIT_ARCH_X86_64, EPERM)
              for flag, value in seccomp.CLONE_NEW_FLAGS.items()]


@pytest.mark.parametrize("label, number, args, arch, action", DECISIONS, ids=[d[0] for d in DECISIONS])
def test_filter_decision(label: str, number: int, args: tuple[int, ...], arch: int, action: int) -> None:
    got = bpf_eval(seccomp.filter_program(), number, args, arch)
    assert got == action, f"{label}: {got:#x} != {action:#x}"


def test_syscall_tables_agree_with_libseccomp() -> None:
    """The filter's and the probe's hardcoded x86_64 numbers match libseccomp's table."""
    import pyseccomp

    for name, number in {**seccomp.NR, **sandbox_probe.NR}.items():
        assert seccomp.NR.get(name, number) == sandbox_probe.NR.get(name, number) == number, name
        known = pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, name)
        assert known in (number, -1), f"{name}: libseccomp says {known}, we say {number}"
    assert all(name in sandbox_probe.NR for name in seccomp.NR)


def test_filter_program_is_cached_and_fd_is_fresh_sealed_cloexec() -> None:
    program = seccomp.filter_program()
    assert seccomp.filter_program() is program
    fd = seccomp.filter_fd()
    try:
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.read(fd, len(program) + 1) == program
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 8, 0)
    finally:
        os.close(fd)
    first, second = seccomp.filter_fd(), seccomp.filter_fd()  # fresh fds, each at offset 0
    try:
        assert first != second
        assert os.read(first, len(program)) == os.read(second, len(program)) == program
    finally:
        os.close(first)
        os.close(second)


def test_missing_libseccomp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without libseccomp the caller gets SeccompUnavailable (a RuntimeError), never a program."""
    seccomp.filter_program.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails like an absent package
    try:
        with pytest.raises(seccomp.SeccompUnavailable, match="refusing to run unsandboxed"):
            seccomp.filter_program()
        assert issubclass(seccomp.SeccompUnavailable, RuntimeError)
    finally:
        seccomp.filter_program.cache_clear()


# --------------------------------------------------------- probes in sandboxes

def run_probe(*names: str, **kwargs: object) -> dict[str, dict[str, Any]]:
    proc = sandboxkit.run([PY, "/probe.py", *names], files={"/probe.py": PROBE}, **kwargs)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    results: dict[str, dict[str, Any]] = json.loads(proc.stdout)
    return results


CONFIGS = {
    "filtered": {"seccomp": True},
    "unfiltered": {"seccomp": False},
    "privileged_unfiltered": {"seccomp": False, "privileged": True},
    "privileged_filtered": {"seccomp": True, "privileged": True},
}


@pytest.fixture(scope="module")
def probes() -> dict[str, dict[str, dict[str, Any]]]:
    """Every probe once in each configuration."""
    return {label: run_probe(**kwargs) for label, kwargs in CONFIGS.items()}


def test_every_probe_has_an_expectation() -> None:
    assert set(NEEDS_PRIVILEGED_CONTROL) <= set(BLOCKED)
    assert ALLOWED <= set(sandbox_probe.PROBES)


@pytest.mark.root
@pytest.mark.parametrize("name", BLOCKED)
def test_probe_blocked_by_filter_only(probes: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    """Blocked with the filter (even as root with every capability), not without it."""
    results = {label: probes[label][name] for label in probes}
    assert is_blocked(results["filtered"], name), results
    assert is_blocked(results["privileged_filtered"], name), results
    assert flipped(results["privileged_unfiltered"], name), results
    if name not in NEEDS_PRIVILEGED_CONTROL:
        assert flipped(results["unfiltered"], name), results


@pytest.mark.root
@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_probe_allowed_by_filter(probes: dict[str, dict[str, dict[str, Any]]], name: str) -> None:
    """The filter does not change these results (EBADF stays EBADF, success stays success)."""
    assert probes["filtered"][name] == probes["unfiltered"][name], (probes["filtered"][name],
                                                                    probes["unfiltered"][name])
    assert not is_blocked(probes["filtered"][name], name)


@pytest.mark.root
@pytest.mark.parametrize("with_filter", [True, False], ids=["filtered", "unfiltered"])
def test_filter_is_active_in_the_sandbox(with_filter: bool) -> None:
    """The kit really loads (or, for the control, really omits) the program."""
    proc = sandboxkit.run(["grep", "^Seccomp:", "/proc/self/status"], seccomp=with_filter)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [b"Seccomp:", b"2" if with_filter else b"0"]


# ------------------------------------------------------------------ TIOCSTI

def read_until(fd: int, marker: bytes, limit_s: float = 30.0) -> bytes:
    """Read ``fd`` until ``marker`` arrives (the bound is a hang guard, not a timing assert)."""
    data = b""
    while marker not in data:
        ready, _, _ = select.select([fd], [], [], limit_s)
        if not ready:
            raise AssertionError(f"{marker!r} never arrived; got {data!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every slave fd closed
            raise AssertionError(f"pty closed before {marker!r}; got {data!r}") from None
        data += chunk
    return data


def make_controlling_tty() -> None:
    """In the child: new session, with stdin (the pty slave) as its controlling terminal."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.fixture
def pty() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] |= termios.ECHO | termios.ICANON  # echo is how an injected byte reaches the master
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.root
@pytest.mark.parametrize("with_filter", [True, False], ids=["filtered", "unfiltered"])
def test_tiocsti_into_controlling_tty(pty: tuple[int, int], with_filter: bool) -> None:
    """The sandbox's controlling tty is a pty we own; no --new-session in either run, so
    only the filter stands between TIOCSTI and the terminal. Filtered: nothing injected;
    unfiltered (the negative control): the injected bytes echo back to the master."""
    if Path("/proc/sys/dev/tty/legacy_tiocsti").read_text().strip() == "0":
        pytest.skip("kernel refuses TIOCSTI to everyone (dev.tty.legacy_tiocsti=0): no control possible")
    master, slave = pty
    names = list(sandbox_probe.STI_MARK)
    results = run_probe(*names, seccomp=with_filter, new_session=False, stdin=slave,
                        env={"SCOPEFS_PROBE_OWNS_PTY": "1"}, preexec_fn=make_controlling_tty)
    os.write(slave, b"\n[end-of-run]\n")  # flushes pending echoes, then marks the end
    seen = read_until(master, b"[end-of-run]")
    for name, mark in sandbox_probe.STI_MARK.items():
        if with_filter:
            assert results[name] == {"ok": False, "errno": "EPERM"}, results
            assert mark not in seen, seen
        else:
            assert results[name] == {"ok": True, "errno": None}, results
            assert mark in seen, seen


# ---------------------------------------------------------- tools still work

TEXT = b"alpha\nold line\nneedle here\n"
# /usr/bin/vim is an /etc/alternatives symlink and this sandbox has no /etc: use its target.
VIM = os.path.realpath("/usr/bin/vim")
TOOLS = {
    "sh": (["sh", "-c", "x=$((6*7)); echo \"$x\" | tr 4 X"], b"X2\n"),
    "ls": (["ls", "/data"], b"notes.txt\nsub\n"),
    "cat": (["cat", "/data/notes.txt"], TEXT),
    "grep -r": (["grep", "-rn", "needle", "/data"],
                b"/data/notes.txt:3:needle here\n/data/sub/deep.txt:1:needle deep\n"),
    "find": (["find", "/data", "-name", "*.txt"], b"/data/notes.txt\n/data/sub/deep.txt\n"),
    "sed -i": (["sh", "-c", "cp /data/notes.txt /tmp/f && sed -i 's/old/new/' /tmp/f && cat /tmp/f"],
               TEXT.replace(b"old", b"new")),
    "python3 threads+subprocess": ([PY, "-c", """
import concurrent.futures, os, subprocess
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    total = sum(pool.map(lambda n: n * n, range(100)))
child = subprocess.run(["sh", "-c", "echo from-child"], capture_output=True, check=True).stdout
pid = os.fork()
if pid == 0:
    os._exit(7)
print(total, child.decode().strip(), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""], b"328350 from-child 7\n"),
    "vim -Es": (["sh", "-c", (f"printf 'one\\n' > /tmp/v.txt && {VIM} -Es -u NONE -i NONE -N"
                              " -c 'normal Gotwo from vim' -c 'wq' /tmp/v.txt && cat /tmp/v.txt")],
                b"one\ntwo from vim\n"),
}
FILES = {"/data/notes.txt": TEXT, "/data/sub/deep.txt": b"needle deep\n"}


@pytest.mark.root
@pytest.mark.parametrize("tool", list(TOOLS))
def test_tool_works_under_filter(tool: str) -> None:
    command, expected = TOOLS[tool]
    proc = sandboxkit.run(command, files=FILES, env={"HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    if tool in ("find", "grep -r"):  # directory order may vary
        assert sorted(proc.stdout.splitlines(keepends=True)) == sorted(expected.splitlines(keepends=True))
    else:
        assert proc.stdout == expected, proc.stderr.decode(errors="replace")


@pytest.mark.root
def test_nano_works_under_filter(pty: tuple[int, int]) -> None:
    """nano on a pty: type a line, ^O Enter to write, ^X to quit; then the file is printed."""
    master, slave = pty
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    script = "nano /tmp/n.txt; printf '\\n<<%s>>\\n' \"$(cat /tmp/n.txt)\""
    with sandboxkit.popen(["sh", "-c", script], stdin=slave, stdout=slave, stderr=slave,
                          env={"TERM": "xterm", "HOME": "/tmp"}) as proc:
        seen = read_until(master, b"GNU nano")
        os.write(master, b"typed in nano")
        seen += read_until(master, b"typed in nano")
        os.write(master, b"\x0f")  # ^O: write out
        seen += read_until(master, b"File Name to Write")
        os.write(master, b"\r")
        seen += read_until(master, b"Wrote")
        os.write(master, b"\x18")  # ^X: exit
        seen += read_until(master, b">>")
        assert proc.wait(timeout=60) == 0
    printed = re.search(rb"<<(.*?)>>", seen, re.DOTALL)
    assert printed is not None and printed.group(1) == b"typed in nano", seen[-400:]
