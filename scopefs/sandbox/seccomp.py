"""The seccomp filter every ``scopefs run`` command runs under.

The sandbox's isolation comes from bubblewrap: an unprivileged host uid, no
capabilities, fresh namespaces, ``--disable-userns``, a read-only ``/usr``.
This filter is defence in depth on top of that: it removes kernel interfaces
that a shell, Python, coreutils, grep, find, sed, vim or nano never need and
that are either privilege-shaped (they matter the moment anything else goes
wrong) or a large, bug-prone attack surface. ``filter_program()`` returns the
classic-BPF program that ``bwrap --seccomp FD`` loads.

Default ALLOW with a deny list, not an allowlist
    An allowlist for "python3, sh, coreutils, grep, find, sed, vim, nano"
    is 150-200 syscalls whose exact set depends on glibc and tool versions
    (clone3, rseq, faccessat2, close_range, statx, epoll_pwait2 ... arrive
    with library upgrades); a miss surfaces as a confusing crash deep in an
    agent's command. Deny-list rot is addressed instead by the *prologue*:
    every x86_64 syscall number above ``MAX_REVIEWED`` (the last number this
    list was reviewed against, 469 = file_setattr, Linux 6.18) fails with
    ENOSYS, so a syscall added to a future kernel is unavailable in the
    sandbox until someone reviews it. ENOSYS is exactly what an older kernel
    says, and every libc falls back on it.

What is denied, and with which errno (EPERM unless noted)
    * Mounts and the VFS: mount, umount2, pivot_root, chroot, the new mount
      API (open_tree, open_tree_attr, move_mount, fsopen, fsconfig, fsmount,
      fspick, mount_setattr). EPERM, not ENOSYS as flatpak uses for the new
      API: nothing in the sandbox should fall back to mount(2) either (it is
      EPERM too), and EPERM lets a probe tell "blocked" from "kernel too old".
    * Namespaces: unshare, setns, and clone with any CLONE_NEW* flag (one
      masked compare on the flags argument per flag). bwrap's
      ``--disable-userns`` already stops nested user namespaces; this also
      stops mount/pid/net/... namespaces and keeps working if the launcher
      ever drops that option.
    * clone3: ENOSYS. seccomp cannot read clone3's flags (they are behind a
      pointer), so clone3 is refused as a whole, and ENOSYS makes glibc fall
      back to clone(2), whose flags the filter *can* check.
    * Kernel attack surface with no use here: io_uring_setup/enter/register,
      bpf, perf_event_open, userfaultfd, the keyring (keyctl, add_key,
      request_key), modify_ldt, iopl, ioperm, uselib, the NUMA calls flatpak
      blocks (mbind, set_mempolicy, get_mempolicy, migrate_pages,
      move_pages).
    * Reaching into other processes: ptrace, process_vm_readv/writev,
      pidfd_getfd, process_madvise. (Also stops strace/gdb in the sandbox.)
    * File handles: open_by_handle_at (the "shocker" escape: opens any inode
      of a mounted filesystem by handle, bypassing the sandbox's view) and
      name_to_handle_at.
    * Host administration: kexec_load, kexec_file_load, init_module,
      finit_module, delete_module, syslog, acct, quotactl, quotactl_fd,
      swapon, swapoff, reboot, settimeofday, clock_settime, adjtimex,
      clock_adjtime.
    * personality: allowed only for PER_LINUX (0), PER_LINUX32 (8) and the
      query 0xffffffff; flag bits such as ADDR_NO_RANDOMIZE,
      READ_IMPLIES_EXEC or UNAME26 are refused. libseccomp cannot compare one
      argument with three values in one rule, so this check lives in the
      prologue.
    * ioctl TIOCSTI (push characters into the terminal's input: a sandboxed
      process could type commands into the user's shell, CVE-2017-5226) and
      TIOCLINUX (the same via the Linux console, CVE-2023-28100). The request
      is compared under a 32-bit mask: the kernel truncates the request to
      32 bits, so ``TIOCSTI | 1 << 32`` would pass a plain 64-bit compare
      and still be TIOCSTI (CVE-2019-10063).
    * socket() outside AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (and
      AF_UNSPEC, which the kernel rejects anyway): EAFNOSUPPORT, what a
      program probing for an absent family expects. Notably AF_VSOCK, which
      is not network-namespaced: it reaches the hypervisor host from inside
      ``--unshare-net``.

Other ABIs
    i386 (``int 0x80``) and x32 (syscall number | 0x40000000) syscalls fail
    with EPERM, all of them: the filter only describes x86_64, and its
    "bad architecture" action is ERRNO(EPERM) (libseccomp routes x32 numbers
    to it as well). Nothing in the sandbox needs 32-bit code, and a deny list
    written for x86_64 numbers says nothing about the other tables. EPERM
    (not ENOSYS) lets a probe tell "blocked by us" from "kernel has no x32".

Deliberately allowed
    vmsplice: an unprivileged pipe operation that grants nothing; its past
    bugs are kernel bugs of the same kind splice/tee/write have had, and
    blocking it would not remove that class. kcmp, statmount, listmount:
    read-only and limited to what the process may already see.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import platform
import struct

__all__ = ["MAX_REVIEWED", "SeccompUnavailable", "filter_fd", "filter_program"]

MAX_REVIEWED = 469  # file_setattr, the highest x86_64 syscall in Linux 6.18

# x86_64 syscall numbers, hardcoded so that the filter does not depend on how
# many names the installed libseccomp knows (2.5.4 stops at 453).
NR: dict[str, int] = {
    "ioctl": 16, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101, "syslog": 103,
    "uselib": 134, "personality": 135, "modify_ldt": 154, "pivot_root": 155,
    "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176,
    "quotactl": 179, "clock_settime": 227, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "migrate_pages": 256, "unshare": 272, "move_pages": 279,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
    "quotactl_fd": 443, "open_tree_attr": 467,
}

DENY_EPERM: tuple[str, ...] = (
    # mounts and the VFS
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # namespaces (clone is filtered by flag below)
    "unshare", "setns",
    # attack surface
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "modify_ldt", "iopl", "ioperm", "uselib",
    "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    # file handles
    "open_by_handle_at", "name_to_handle_at",
    # host administration
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "syslog", "acct", "quotactl", "quotactl_fd", "swapon", "swapoff", "reboot",
    "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
)
DENY_ENOSYS: tuple[str, ...] = ("clone3",)

CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}  # CLONE_NEWTIME (0x80) is only reachable via clone3/unshare; for clone 0x80 is CSIGNAL.
DENIED_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
ALLOWED_SOCKET_FAMILIES = (0, 1, 2, 10, 16)  # AF_UNSPEC, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
ALLOWED_PERSONALITIES = (0x0, 0x8, 0xFFFFFFFF)  # PER_LINUX, PER_LINUX32, query

# Classic BPF / seccomp constants (linux/filter.h, linux/seccomp.h, linux/audit.h).
_LD_W_ABS, _JEQ, _JGT, _JGE, _RET = 0x20, 0x15, 0x25, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_OFF_NR, _OFF_ARCH, _OFF_A0_LO, _OFF_A0_HI = 0, 4, 16, 20


class SeccompUnavailable(RuntimeError):
    """No filter can be built here; the caller must refuse to run the command."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _prologue() -> bytes:
    """Hand-written checks that run before libseccomp's program.

    x86_64 only (anything else, and x32 numbers, fall through to libseccomp,
    whose bad-arch action is EPERM): numbers above MAX_REVIEWED -> ENOSYS;
    personality(x) -> ALLOW for the values in ALLOWED_PERSONALITIES, else
    EPERM. Classic BPF jumps are relative and only forward, so appending
    libseccomp's program after this one needs no relocation: "LIB" is simply
    the first instruction after the prologue.
    """
    p0, p1, p2 = ALLOWED_PERSONALITIES
    # (code, k, jt-label, jf-label); labels are names or None for "next".
    prog: list[tuple[int, int, str | None, str | None]] = [
        (_LD_W_ABS, _OFF_ARCH, None, None),
        (_JEQ, _AUDIT_ARCH_X86_64, None, "LIB"),
        (_LD_W_ABS, _OFF_NR, None, None),
        (_JGE, _X32_SYSCALL_BIT, "LIB", None),
        (_JGT, MAX_REVIEWED, "ENOSYS", None),
        (_JEQ, NR["personality"], None, "LIB"),
        (_LD_W_ABS, _OFF_A0_HI, None, None),
        (_JEQ, 0, None, "EPERM"),
        (_LD_W_ABS, _OFF_A0_LO, None, None),
        (_JEQ, p0, "ALLOW", None),
        (_JEQ, p1, "ALLOW", None),
        (_JEQ, p2, "ALLOW", "EPERM"),
    ]
    labels = {"EPERM": len(prog), "ALLOW": len(prog) + 1, "ENOSYS": len(prog) + 2, "LIB": len(prog) + 3}

    def off(i: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - i - 1

    out = b"".join(_insn(code, k, off(i, jt), off(i, jf)) for i, (code, k, jt, jf) in enumerate(prog))
    return (out + _insn(_RET, _RET_ERRNO | errno.EPERM) + _insn(_RET, _RET_ALLOW)
            + _insn(_RET, _RET_ERRNO | errno.ENOSYS))


def _libseccomp_program() -> bytes:
    try:
        import pyseccomp as sc  # raises RuntimeError itself when libseccomp is missing
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(f"libseccomp is not usable ({exc}); refusing to run unsandboxed") from exc
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.EPERM))  # i386 and x32: every syscall
        for name in DENY_EPERM:
            flt.add_rule(sc.ERRNO(errno.EPERM), NR[name])
        for name in DENY_ENOSYS:
            flt.add_rule(sc.ERRNO(errno.ENOSYS), NR[name])
        for flag in CLONE_NEW_FLAGS.values():
            flt.add_rule(sc.ERRNO(errno.EPERM), NR["clone"], sc.Arg(0, sc.MASKED_EQ, flag, flag))
        for request in DENIED_IOCTLS.values():
            flt.add_rule(sc.ERRNO(errno.EPERM), NR["ioctl"], sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
        allowed = ALLOWED_SOCKET_FAMILIES
        for call in ("socket", "socketpair"):  # socketpair creates sockets of a family too
            for family in range(allowed[-1]):
                if family not in allowed:
                    flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), NR[call], sc.Arg(0, sc.EQ, family))
            flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), NR[call], sc.Arg(0, sc.GE, allowed[-1] + 1))
        fd = os.memfd_create("scopefs-seccomp-export", os.MFD_CLOEXEC)
        with open(fd, "w+b") as buf:
            flt.export_bpf(buf)
            buf.seek(0)
            return buf.read()
    except OSError as exc:
        raise SeccompUnavailable(f"building the seccomp filter failed: {exc}") from exc


@functools.lru_cache(maxsize=1)
def filter_program() -> bytes:
    """The BPF program (array of ``struct sock_filter``) for ``bwrap --seccomp``.

    Built once per process (libseccomp takes milliseconds, and this is called
    per command). Raises ``SeccompUnavailable`` when the host is not x86_64
    (the syscall numbers above are x86_64's) or libseccomp is unusable.
    """
    if platform.machine() != "x86_64":
        raise SeccompUnavailable(f"the seccomp filter is written for x86_64, not {platform.machine()}")
    program = _prologue() + _libseccomp_program()
    if len(program) % 8 or not 0 < len(program) // 8 <= 4096:
        raise SeccompUnavailable(f"unexpected seccomp program size: {len(program)} bytes")
    return program


def filter_fd() -> int:
    """A fresh fd holding ``filter_program()``, positioned at 0, for ``bwrap --seccomp FD``.

    A sealed memfd (nothing can change the program between here and bwrap's
    read), opened close-on-exec: the launcher passes it with
    ``subprocess.Popen(..., pass_fds=[fd])``, which clears CLOEXEC in the
    child only, and closes its own copy afterwards. bwrap reads it to EOF.
    """
    program = filter_program()
    fd = os.memfd_create("scopefs-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
