#!/usr/bin/python3
"""Syscall probes that run INSIDE a scopefs sandbox (bubblewrap's try-syscall style).

Standalone and stdlib-only: it runs as ``/usr/bin/python3`` in the sandbox,
with no project on the path. Each probe makes one x86_64 syscall (raw
numbers, hardcoded) with arguments chosen so that, if the syscall is
ALLOWED, it fails with a distinctive benign errno (EFAULT from a bad
pointer, EBADF from fd -1, EINVAL from impossible flags, ENOSYS from a
kernel without the feature) or succeeds harmlessly; if the seccomp filter
BLOCKS it, it fails with the filter's errno (EPERM; ENOSYS for clone3;
EAFNOSUPPORT for socket families). Interpreting results is the test's job.

Harmless even when run unsandboxed as root (the privileged negative
control): nothing real is mounted, loaded, rebooted or changed (bad
pointers and invalid flags stop every such call before it acts), and every
probe runs in a forked child, so unshare(), personality() or ptrace() only
ever change a process that exits right away. The TIOCSTI probes inject
characters into fd 0 only when ``SCOPEFS_PROBE_OWNS_PTY=1`` says the caller
owns that terminal (and fd 0 is a tty); otherwise they use fd -1.

Usage: ``python3 sandbox_probe.py [NAME ...]`` runs all probes or the named
ones and prints one JSON object: name -> {"ok": bool, "errno": name|null}.
A probe whose child dies of a signal reports ``"errno": "signal:SIGSEGV"``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import signal
import socket
import sys
from collections.abc import Callable

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
NR = {
    "ioctl": 16, "getpid": 39, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101, "syslog": 103,
    "uselib": 134, "personality": 135, "modify_ldt": 154, "pivot_root": 155,
    "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172,
    "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "clock_settime": 227, "mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "migrate_pages": 256, "unshare": 272, "move_pages": 279, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
    "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
    "open_tree_attr": 467,
}
X32_BIT = 0x40000000
WRONG = 1  # a user-space address that is never mapped: EFAULT, never a side effect
TIOCSTI, TIOCLINUX, TIOCGWINSZ = 0x5412, 0x541C, 0x5413
CLONE_FS, CLONE_SIGHAND = 0x200, 0x800
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
MS_NOUSER = 1 << 31
ADDR_NO_RANDOMIZE = 0x0040000
AF_VSOCK, AF_PACKET = 40, 17
# Written into the terminal's input by the TIOCSTI probes (only with a pty the caller owns).
STI_MARK = {"ioctl_tiocsti": b"[sti-lo]", "ioctl_tiocsti_high": b"[sti-hi]"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

Result = tuple[int, int]  # (return value, errno)


def sc(nr: int, *args: object) -> Result:
    """syscall(nr, args...) with every int passed as a full 64-bit register."""
    conv = [ctypes.c_ulong(a & 0xFFFFFFFFFFFFFFFF) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *conv)
    return ret, (ctypes.get_errno() if ret < 0 else 0)


def closing(result: Result) -> Result:
    """For probes that may create an fd: close it if the call succeeded."""
    if result[0] >= 0:
        os.close(result[0])
    return result


def _tiocsti(name: str, request: int) -> Result:
    fd = 0 if os.environ.get("SCOPEFS_PROBE_OWNS_PTY") == "1" and os.isatty(0) else -1
    last: Result = (0, 0)
    for byte in STI_MARK[name] if fd == 0 else b"x":
        last = sc(NR["ioctl"], fd, request, ctypes.byref(ctypes.c_char(byte)))
        if last[0] < 0:
            break
    return last


def _ptrace_child() -> Result:
    """PTRACE_ATTACH to our own child (Yama scope 1 refuses ancestors such as pid 1)."""
    pid = os.fork()
    if pid == 0:
        signal.pause()
        os._exit(0)
    try:
        ret = sc(NR["ptrace"], PTRACE_ATTACH, pid, 0, 0)
        if ret[0] == 0:
            os.waitpid(pid, 0)  # the attach stop
            sc(NR["ptrace"], PTRACE_DETACH, pid, 0, 0)
        return ret
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _process_vm(nr: int) -> Result:
    """Copy 8 bytes within our own address space (pid 1 would be refused by Yama)."""
    src, dst = ctypes.create_string_buffer(b"probe!!", 8), ctypes.create_string_buffer(8)
    local = _Iovec(ctypes.cast(dst, ctypes.c_void_p), 8)
    remote = _Iovec(ctypes.cast(src, ctypes.c_void_p), 8)
    if nr == NR["process_vm_writev"]:
        local, remote = remote, local
    return sc(nr, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)


def _i386_getpid() -> Result:
    """getpid via ``int 0x80`` (the i386 ABI), from a tiny code page."""
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20; int 0x80; ret
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
    ret = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
    return (ret, -ret) if -4096 < ret < 0 else (ret, 0)


def _socket(family: int, kind: int) -> Result:
    try:
        socket.socket(family, kind).close()
    except OSError as exc:
        return -1, exc.errno or 0
    return 0, 0


def _socketpair(family: int, kind: int) -> Result:
    try:
        for end in socket.socketpair(family, kind):
            end.close()
    except OSError as exc:
        return -1, exc.errno or 0
    return 0, 0


PROBES: dict[str, Callable[[], Result]] = {
    # terminals
    "ioctl_tiocsti": lambda: _tiocsti("ioctl_tiocsti", TIOCSTI),
    "ioctl_tiocsti_high": lambda: _tiocsti("ioctl_tiocsti_high", TIOCSTI | 1 << 32),
    "ioctl_tioclinux": lambda: sc(NR["ioctl"], -1, TIOCLINUX, WRONG),
    "ioctl_tioclinux_high": lambda: sc(NR["ioctl"], -1, TIOCLINUX | 1 << 32, WRONG),
    # namespaces; CLONE_SIGHAND without CLONE_VM makes clone fail EINVAL before it creates anything
    "clone3": lambda: sc(NR["clone3"], WRONG, 88),
    "clone_newuser": lambda: sc(NR["clone"], CLONE_NEWUSER | CLONE_SIGHAND, 0, 0, 0, 0),
    "clone_newns": lambda: sc(NR["clone"], CLONE_NEWNS | CLONE_SIGHAND, 0, 0, 0, 0),
    "clone_newnet": lambda: sc(NR["clone"], CLONE_NEWNET | CLONE_SIGHAND, 0, 0, 0, 0),
    "unshare_newuser": lambda: sc(NR["unshare"], CLONE_NEWUSER),
    "unshare_newns": lambda: sc(NR["unshare"], CLONE_NEWNS),
    "setns": lambda: sc(NR["setns"], -1, 0),
    # mounts
    "mount": lambda: sc(NR["mount"], 0, ctypes.c_char_p(b"/"), 0, MS_NOUSER, 0),
    "umount2": lambda: sc(NR["umount2"], ctypes.c_char_p(b"/"), 0x7FFF0000),
    "pivot_root": lambda: sc(NR["pivot_root"], WRONG, WRONG),
    "chroot": lambda: sc(NR["chroot"], WRONG),
    "open_tree": lambda: closing(sc(NR["open_tree"], -1, WRONG, 0)),
    "open_tree_attr": lambda: closing(sc(NR["open_tree_attr"], -1, WRONG, 0, 0, 0)),
    "move_mount": lambda: sc(NR["move_mount"], -1, WRONG, -1, WRONG, 0),
    "fsopen": lambda: closing(sc(NR["fsopen"], WRONG, 0)),
    "fsconfig": lambda: sc(NR["fsconfig"], -1, 0, 0, 0, 0),
    "fsmount": lambda: closing(sc(NR["fsmount"], -1, 0, 0)),
    "fspick": lambda: closing(sc(NR["fspick"], -1, WRONG, 0)),
    "mount_setattr": lambda: sc(NR["mount_setattr"], -1, WRONG, 0, WRONG, 32),
    # kernel attack surface
    "io_uring_setup": lambda: closing(sc(NR["io_uring_setup"], 1, WRONG)),
    "io_uring_enter": lambda: sc(NR["io_uring_enter"], -1, 0, 0, 0, 0, 0),
    "io_uring_register": lambda: sc(NR["io_uring_register"], -1, 0, 0, 0),
    "bpf": lambda: closing(sc(NR["bpf"], 0, WRONG, 8)),
    "perf_event_open": lambda: closing(sc(NR["perf_event_open"], WRONG, 0, -1, -1, 0)),
    "userfaultfd": lambda: closing(sc(NR["userfaultfd"], 1 | 2)),  # USER_MODE_ONLY | bad bit
    "keyctl": lambda: sc(NR["keyctl"], 1, WRONG, 0, 0, 0),  # JOIN_SESSION_KEYRING(bad name)
    "add_key": lambda: sc(NR["add_key"], WRONG, WRONG, 0, 0, -2),
    "request_key": lambda: sc(NR["request_key"], WRONG, WRONG, 0, 0),
    "modify_ldt": lambda: sc(NR["modify_ldt"], 0, WRONG, 16),
    "iopl": lambda: sc(NR["iopl"], 0),
    "ioperm": lambda: sc(NR["ioperm"], 0, 0, 0),
    "uselib": lambda: sc(NR["uselib"], WRONG),
    "mbind": lambda: sc(NR["mbind"], 0, 0, 0, 0, 0, 0),
    "set_mempolicy": lambda: sc(NR["set_mempolicy"], 0, 0, 0),
    "get_mempolicy": lambda: sc(NR["get_mempolicy"], 0, 0, 0, 0, 0),
    "migrate_pages": lambda: sc(NR["migrate_pages"], 0, 64, WRONG, WRONG),
    "move_pages": lambda: sc(NR["move_pages"], 0, 0, 0, 0, 0, 0),
    # other processes
    "ptrace_attach": _ptrace_child,
    "process_vm_readv": lambda: _process_vm(NR["process_vm_readv"]),
    "process_vm_writev": lambda: _process_vm(NR["process_vm_writev"]),
    "pidfd_getfd": lambda: sc(NR["pidfd_getfd"], -1, 0, 0),
    "process_madvise": lambda: sc(NR["process_madvise"], -1, WRONG, 1, 0, 0),
    # file handles
    "open_by_handle_at": lambda: closing(sc(NR["open_by_handle_at"], -1, WRONG, 0)),
    "name_to_handle_at": lambda: sc(NR["name_to_handle_at"], -1, WRONG, WRONG, WRONG, 0),
    # host administration (0x100 is an invalid kexec flag)
    "kexec_load": lambda: sc(NR["kexec_load"], 0, 0, 0, 0x100),
    "kexec_file_load": lambda: sc(NR["kexec_file_load"], -1, -1, 0, 0, 0x100),
    "init_module": lambda: sc(NR["init_module"], WRONG, 0, WRONG),
    "finit_module": lambda: sc(NR["finit_module"], -1, WRONG, 0),
    "delete_module": lambda: sc(NR["delete_module"], WRONG, 0),
    "syslog": lambda: sc(NR["syslog"], 10, 0, 0),  # SYSLOG_ACTION_SIZE_BUFFER
    "acct": lambda: sc(NR["acct"], WRONG),  # never NULL: acct(NULL) turns accounting off
    "quotactl": lambda: sc(NR["quotactl"], 0x800004, WRONG, 0, 0),  # Q_GETFMT on a bad path
    "quotactl_fd": lambda: sc(NR["quotactl_fd"], -1, 0, 0, 0),
    "swapon": lambda: sc(NR["swapon"], WRONG, 0),
    "swapoff": lambda: sc(NR["swapoff"], WRONG),
    "reboot": lambda: sc(NR["reboot"], 0, 0, 0, 0),  # wrong magic: EINVAL once permitted
    "settimeofday": lambda: sc(NR["settimeofday"], WRONG, 0),
    "clock_settime": lambda: sc(NR["clock_settime"], 0, WRONG),
    "adjtimex": lambda: sc(NR["adjtimex"], WRONG),
    "clock_adjtime": lambda: sc(NR["clock_adjtime"], 0, WRONG),
    "personality_flags": lambda: sc(NR["personality"], ADDR_NO_RANDOMIZE),
    # sockets outside the allowed families
    "socket_vsock": lambda: _socket(AF_VSOCK, socket.SOCK_STREAM),
    "socket_packet": lambda: _socket(AF_PACKET, socket.SOCK_RAW),
    "socketpair_vsock": lambda: _socketpair(AF_VSOCK, socket.SOCK_STREAM),
    # other ABIs
    "x32_getpid": lambda: sc(NR["getpid"] | X32_BIT),
    "x32_ioctl_tiocgwinsz": lambda: sc(NR["ioctl"] | X32_BIT, -1, TIOCGWINSZ, WRONG),
    "i386_getpid": _i386_getpid,
    # must stay ALLOWED under the filter
    "getpid": lambda: sc(NR["getpid"]),
    "ioctl_tiocgwinsz": lambda: sc(NR["ioctl"], -1, TIOCGWINSZ, WRONG),
    "clone_plain_einval": lambda: sc(NR["clone"], CLONE_SIGHAND, 0, 0, 0, 0),
    "personality_query": lambda: sc(NR["personality"], 0xFFFFFFFF),
    "personality_linux": lambda: sc(NR["personality"], 0),
    "personality_linux32": lambda: sc(NR["personality"], 8),
    "socket_unix": lambda: _socket(socket.AF_UNIX, socket.SOCK_STREAM),
    "socket_inet6": lambda: _socket(socket.AF_INET6, socket.SOCK_DGRAM),
    "socket_netlink": lambda: _socket(socket.AF_NETLINK, socket.SOCK_RAW),
}


def run_probe(name: str) -> dict[str, object]:
    """Run one probe in a forked child, so its side effects die with it."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            ret, err = PROBES[name]()
            out = {"ok": ret >= 0, "errno": errno.errorcode.get(err, str(err)) if ret < 0 else None}
        except BaseException as exc:  # noqa: BLE001 - report any failure, never hang the parent
            out = {"ok": False, "errno": f"exception:{type(exc).__name__}:{exc}"}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while chunk := os.read(rfd, 4096):
        data += chunk
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"ok": False, "errno": f"signal:{signal.Signals(os.WTERMSIG(status)).name}"}
    found: dict[str, object] = json.loads(data)
    return found


def main(argv: list[str]) -> int:
    names = argv or list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        print(f"unknown probe(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    print(json.dumps({name: run_probe(name) for name in names}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
