"""Run the real launcher with a probe inside, and watch from the host, for the isolation suite.

``Lab.report(protections, target)`` starts ``sandbox.launch.run`` in a
child process (the launcher), exactly as ``scopefs run`` would, with
planted bait around it:

* a canary variable in the launcher's environment (``/proc/1/environ``);
* a canary file opened by the launcher *without* close-on-exec, so an
  inheritable descriptor that must not reach the sandbox;
* a listener on host loopback TCP and one on a host abstract Unix socket;
* a pty as the sandbox's stdin, which is the launcher's controlling
  terminal (TIOCSTI);
* the host's ``vm.swappiness``, read before and after (the probe writes
  back the value it reads, never another one).

Inside, ``PROBE`` (stdlib only, run by ``/usr/bin/python3``) records what a
process can see and do as one JSON line, runs ``tests/sandbox_probe.py``'s
syscall probes, then waits for SIGUSR1. Meanwhile the host inspects the
sandbox's processes through its own ``/proc`` and, as host root, copies a
setuid-root ``id`` into the running sandbox (``/proc/<pid>/root/memory``,
plain-directory targets only); then it signals, the probe runs ``id`` and
prints a second line. ``Report`` holds both sides. One run takes about a
second and executes every probe, so a test suite reads cached reports.

Nothing here edits the sandbox: a weakened ``Protections`` is only ever
passed to ``launch.run``, the same function the command line uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tty
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scopefs.sandbox import uids
from scopefs.sandbox.bwrap import Protections
from scopefs.sandbox.launch import Target
from tests.mountkit import wait_until
from tests.sandboxrun import leftovers

SWAPPINESS = "/proc/sys/vm/swappiness"
SETPRIV = "/usr/bin/setpriv"
SANDBOX_PROBE = Path(__file__).with_name("sandbox_probe.py")
REPORT_TIMEOUT_S = 90.0
STATE_NAMES = ("catalog.sqlite", "state.sqlite", "hmac.key", "writer.lock")

# The launcher: a child process whose stdin is the pty slave (made its
# controlling terminal) and that holds an inheritable canary descriptor,
# then the real ``launch.run``.
LAUNCHER = r"""
import fcntl, json, os, sys, termios
from scopefs.sandbox import launch
from scopefs.sandbox.bwrap import Protections
spec = json.loads(sys.argv[1])
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
canary = os.open(spec["canary_file"], os.O_RDONLY)
os.set_inheritable(canary, True)  # no FD_CLOEXEC: only close_fds keeps it outside
target = launch.Target(**spec["target"])
sys.exit(launch.run(target, spec["argv"], protections=Protections(**spec["protections"]), timeout=spec["timeout"]))
"""

# Runs inside the sandbox as /usr/bin/python3 (stdlib only). argv[1]: JSON
# spec; argv[2]: the source of tests/sandbox_probe.py. Never writes outside
# the sandbox's /tmp; the sysctl probe writes back the value it just read.
PROBE_MARK = "scopefs-isolation-probe"
PROBE = r"""# scopefs-isolation-probe
import ctypes, errno, json, os, signal, socket, stat, subprocess, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # the host's "go", taken by sigtimedwait
spec = json.loads(sys.argv[1])
# Host paths come hex-encoded: in plain text our own argv (/proc/*/cmdline) would hold them.
spec["host_paths"] = [bytes.fromhex(h).decode() for h in spec["host_paths"]]
out = {}

def err(exc):
    if isinstance(exc, OSError) and exc.errno:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return repr(exc)

def cmd(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        return {"rc": p.returncode, "out": p.stdout[-400:], "err": p.stderr[-400:]}
    except Exception as exc:
        return {"rc": None, "out": "", "err": repr(exc)}

def proc():
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    info = {}
    for pid in pids:
        d = {}
        for name in ("comm", "cmdline", "environ"):
            try:
                with open("/proc/%d/%s" % (pid, name), "rb") as f:
                    d[name] = f.read().decode("latin-1")
            except OSError as exc:
                d[name] = None
                d[name + "_error"] = err(exc)
        info[str(pid)] = d
    return {"pids": pids, "info": info}

def fds():
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            link = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue  # the listing's own descriptor, closed by now
        d = {"link": link}
        try:
            st = os.fstat(fd)
            d["mode"] = stat.filemode(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                d["data"] = os.pread(fd, 4096, 0).decode("latin-1")
        except OSError as exc:
            d["error"] = err(exc)
        found[name] = d
    return {"fds": found, "ls": cmd(["ls", "-l", "/proc/self/fd"])}

def net():
    r = {}
    for key, family, address in (("tcp", socket.AF_INET, ("127.0.0.1", spec["tcp_port"])),
                                 ("abstract", socket.AF_UNIX, "\0" + spec["abstract"])):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(address)
            r[key] = "connected"
        except OSError as exc:
            r[key] = err(exc)
        finally:
            s.close()
    with open("/proc/net/dev") as f:
        r["interfaces"] = sorted(line.split(":")[0].strip() for line in f.read().splitlines()[2:] if ":" in line)
    return r

def sysctl():
    path = "/proc/sys/vm/swappiness"
    with open(path) as f:
        value = f.read()
    r = {"value": value.strip()}
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())  # the value just read: never a change
        finally:
            os.close(fd)
        r["write"] = "ok"
    except OSError as exc:
        r["write"] = err(exc)
    return r

def ident():
    wanted = ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if line.split(":")[0] in wanted)
    return {"uid": os.getuid(), "euid": os.geteuid(), "status": status}

def _mount_tmpfs(new_namespace):
    # mount(2) of a tmpfs on /tmp/x (mount(8) refuses any uid but 0 itself), in
    # the sandbox's mount namespace or in a new one of its own; in a child.
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        code = 0
        if new_namespace and libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            code = 100 + ctypes.get_errno()
        elif libc.mount(b"none", b"/tmp/x", b"tmpfs", 0, None) != 0:
            code = 200 + ctypes.get_errno()
        else:
            with open("/proc/self/mountinfo") as f:
                code = 0 if any(line.split()[4] == "/tmp/x" for line in f) else 1
            libc.umount2(b"/tmp/x", 0)
        os._exit(code)
    status = os.waitpid(pid, 0)[1]
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code == 0:
        return "mounted"
    if code >= 200:
        return "mount:" + errno.errorcode.get(code - 200, str(code - 200))
    if code >= 100:
        return "unshare:" + errno.errorcode.get(code - 100, str(code - 100))
    return "status:%d" % code

def privilege():
    os.makedirs("/tmp/x", exist_ok=True)
    r = {
        "unshare_U": cmd(["unshare", "-U", "true"]),
        "unshare_Ur": cmd(["unshare", "-Ur", "id", "-u"]),
        "unshare_Urm_mount": cmd(["unshare", "-Urm", "sh", "-c",
                                  "mount -t tmpfs none /tmp/x && grep -c ' /tmp/x ' /proc/self/mountinfo"]),
        "mount_cmd": cmd(["mount", "-t", "tmpfs", "none", "/tmp/x"]),
    }
    if r["mount_cmd"]["rc"] == 0:
        cmd(["umount", "/tmp/x"])
    r["mount_here"] = _mount_tmpfs(False)
    r["mount_new_ns"] = _mount_tmpfs(True)
    r["chroot"] = cmd(["/usr/sbin/chroot", "/proc/1/root", "/bin/true"])
    try:
        r["proc1_root_list"] = sorted(os.listdir("/proc/1/root"))
    except OSError as exc:
        r["proc1_root_list"] = err(exc)
    r["proc1_root_paths"] = {p: os.path.lexists("/proc/1/root" + p) for p in spec["host_paths"]}
    return r

def search():
    # Names everywhere but /proc, /sys and /dev (find(1): fast on the 5 GB /usr);
    # contents everywhere but those and /usr, the host's read-only /usr.
    needles = [bytes.fromhex(h) for h in spec["needles"]]
    names = []
    for name in spec["state_names"]:
        names += ["-o", "-name", name] if names else ["-name", name]
    found = subprocess.run(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "-path", "/dev", ")",
                            "-prune", "-o", "(", *names, ")", "-print"], capture_output=True, text=True, timeout=60)
    hits, errors, scanned = [], 0, 0
    for top, dirs, files in os.walk("/", onerror=lambda e: None):
        if top == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr")]
        for name in files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 64 << 20:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                errors += 1
                continue
            scanned += 1
            for i, needle in enumerate(needles):
                if needle in data:
                    hits.append([path, i])
    return {"hits": hits, "names": found.stdout.split(), "find_rc": found.returncode, "errors": errors,
            "scanned": scanned, "exists": {p: os.path.lexists(p) for p in spec["host_paths"]}}

def syscalls():
    env = dict(os.environ, SCOPEFS_PROBE_OWNS_PTY="1")
    p = subprocess.run([sys.executable, "-c", sys.argv[2]], env=env, capture_output=True, text=True, timeout=120)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"_error": {"ok": False, "errno": "no-json:" + p.stderr[-400:]}}

def own_mountns():
    # The same syscall probes from a mount namespace of the sandbox's own
    # (unshare -m): where a process with capabilities would own its mounts.
    p = subprocess.run(["unshare", "-m", sys.executable, "-c", sys.argv[2], *spec["own_mountns_probes"]],
                       capture_output=True, text=True, timeout=60)
    try:
        return {"rc": p.returncode, "results": json.loads(p.stdout)}
    except ValueError:
        return {"rc": p.returncode, "err": p.stderr[-400:]}

def mountinfo():
    with open("/proc/self/mountinfo") as f:
        return f.read()

SECTIONS = {"mountinfo": mountinfo, "own_mountns": own_mountns, "proc": proc, "fds": fds, "net": net,
            "sysctl": sysctl, "ident": ident, "privilege": privilege, "search": search, "syscalls": syscalls}
timing = out["_seconds"] = {}
for name in spec["sections"]:
    started = time.monotonic()
    try:
        out[name] = SECTIONS[name]()
    except Exception as exc:
        out[name] = {"_exception": repr(exc)}
    timing[name] = round(time.monotonic() - started, 3)
print(json.dumps(out), flush=True)

# Phase 2: the host inspects our processes, may plant /memory/id (setuid
# root) and then sends SIGUSR1.
after = {"go": signal.sigtimedwait([signal.SIGUSR1], 60) is not None}
if os.path.exists("/memory/id"):
    st = os.stat("/memory/id")
    after["id_mode"] = oct(st.st_mode)
    after["id_owner"] = st.st_uid
    after["id"] = cmd(["/memory/id", "-u"])
print(json.dumps(after), flush=True)
"""

ALL_SECTIONS = ("proc", "fds", "net", "sysctl", "ident", "privilege", "search", "syscalls", "own_mountns",
                "mountinfo")
# The new mount API and pivot_root: the kernel refuses them unless the caller
# has CAP_SYS_ADMIN over its mount namespace, so their controls run them in
# a mount namespace of the sandbox's own.
OWN_MOUNTNS_PROBES = ("fsopen", "fsmount", "fspick", "move_mount", "mount_setattr", "pivot_root")


@dataclass
class Report:
    """What one sandbox run showed, from inside (``inside``, ``after``) and from the host."""

    protections: Protections
    target: Target
    code: int
    inside: dict[str, Any]
    after: dict[str, Any]
    host_procs: dict[int, dict[str, Any]]  # the launcher's descendants, seen from the host
    launcher: dict[str, Any]  # the launcher process itself, seen from the host
    leaf: int  # host pid of the probe
    tcp_accepted: int
    abstract_accepted: int
    pty_input: bytes
    stderr: str
    swappiness: tuple[str, str]  # host value before and after
    launcher_pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _status(pid: int) -> dict[str, Any]:
    wanted = ("Name", "Uid", "Gid", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp")
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        found: dict[str, Any] = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k in wanted}
    found["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().decode("latin-1")
    found["ns_pid"] = os.stat(f"/proc/{pid}/ns/pid").st_ino
    return found


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True  # gone


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from the host's /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat_line = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            ppid = int(stat_line.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        for child in sorted(children.get(queue.pop(0), [])):
            found.append(child)
            queue.append(child)
    return found


def _read_line(fd: int, deadline: float, buf: bytearray) -> bytes | None:
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _drain_nonblocking(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 4096):
            data += chunk
    os.set_blocking(fd, True)
    return data


def _accepted(listener: socket.socket) -> int:
    listener.setblocking(False)
    count = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            conn, _ = listener.accept()
            conn.close()
            count += 1
    return count


def plant_setuid_id(sandbox_pid: int) -> None:
    """As host root, put a root-owned mode-4755 copy of /usr/bin/id at the sandbox's ``/memory/id``.

    Through the sandbox's own root (``/proc/<pid>/root``), into the plain
    directory bound at ``/memory``: the host filesystem, where root can own
    a file. (The sandbox's ``/tmp`` is a tmpfs of its user namespace, where
    host uid 0 is unmapped: creating a file there fails with EOVERFLOW.)
    """
    where = f"/proc/{sandbox_pid}/root/memory"
    part = f"{where}/.id.part"
    shutil.copyfile("/usr/bin/id", part)
    os.chown(part, 0, 0)
    os.chmod(part, 0o4755)
    os.rename(part, f"{where}/id")


class Lab:
    """A sandbox uid, plain-directory targets for it and for root mode, and the bait."""

    def __init__(self) -> None:
        self.allocation = uids.allocate()
        self.uid = self.allocation.uid
        self.dir = Path(tempfile.mkdtemp(prefix="scopefs-iso-", dir="/tmp"))
        os.chmod(self.dir, 0o711)
        self.env_canary = "isoenv-" + os.urandom(12).hex()
        self.fd_canary = "isofd-" + os.urandom(12).hex()
        self.canary_file = self.dir / f"canary-{os.urandom(4).hex()}"
        self.canary_file.write_text(self.fd_canary)
        os.chmod(self.canary_file, 0o600)  # root's: only an inherited descriptor could read it
        self.abstract = "scopefs-bait-" + os.urandom(8).hex()
        self._cache: dict[tuple[Protections, Target, tuple[bytes, ...], tuple[str, ...]], Report] = {}
        self.servers: set[int] = set()
        self.targets: list[Target] = []
        for name, owner in (("u", self.uid), ("r", 0)):  # own_uid mode / root mode
            place = self.dir / name
            place.mkdir(mode=0o711)
            (place / "memory").mkdir(mode=0o700)
            os.chown(place / "memory", owner, owner)

    def track(self, server_pid: int, target: Target) -> None:
        """A real sandbox mount this module started (its leftovers are checked too)."""
        self.servers.add(server_pid)
        self.targets.append(target)

    def leftovers(self, *, zombies: bool = True) -> dict[str, set[Any]]:
        """``tests.sandboxrun.leftovers()``, narrowed to what this lab made.

        Other suites may run sandboxes on the same host at the same time, so
        the global lists move on their own. What is ours: processes of our
        uids, and any process still running our probe (root mode runs it as
        host uid 0); the uids, places, mounts and servers of mounts we started.
        The lab's own uid is held on purpose until ``close``. ``zombies=False``
        leaves out exited processes nobody has reaped yet: after each run the
        namespace's init (bwrap) is reparented to the host's pid 1 as a zombie
        until that reaps it (here a VM agent, which takes a second or two).
        """
        now = leftovers()
        uids_ = {self.uid} | {t.uid for t in self.targets}
        probes = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if PROBE_MARK.encode() in Path(entry.path, "cmdline").read_bytes():
                        probes.add(int(entry.name))
        processes = {p for p in now["processes"] if p[1] in uids_} | {(p, -1) for p in probes}
        if not zombies:
            processes = {p for p in processes if not _is_zombie(p[0])}
        return {"processes": processes,
                "uids": now["uids"] & {t.uid for t in self.targets},
                "places": now["places"] & {Path(t.mountpoint).parent.name for t in self.targets},
                "mounts": now["mounts"] & {t.mountpoint for t in self.targets},
                "servers": now["servers"] & self.servers}

    def settle(self, *, timeout: float = 15.0, zombies: bool = True) -> dict[str, set[Any]]:
        """What of ours is still there once the host had ``timeout`` to clean up (empty: nothing)."""
        left: dict[str, set[Any]] = {}

        def clean() -> bool:
            left.clear()
            left.update({key: found for key, found in self.leftovers(zombies=zombies).items() if found})
            return not left

        with contextlib.suppress(AssertionError):
            wait_until(clean, timeout=timeout, interval=0.05)
        return left

    def plain(self, protections: Protections) -> Target:
        """An ungated plain directory the sandbox's host uid owns."""
        which = "u" if protections.own_uid else "r"
        return Target(self.uid, str(self.dir / which / "memory"), None, True)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.allocation.release()

    def report(self, protections: Protections, target: Target | None = None, *,
               needles: tuple[bytes, ...] = (), host_paths: tuple[str, ...] = ()) -> Report:
        """One sandbox run with every probe (cached: one run per distinct argument set)."""
        target = target or self.plain(protections)
        key = (protections, target, needles, host_paths)
        if key not in self._cache:
            self._cache[key] = self._run(protections, target, needles, (str(self.canary_file), *host_paths))
        return self._cache[key]

    def _run(self, protections: Protections, target: Target, needles: tuple[bytes, ...],
             host_paths: tuple[str, ...]) -> Report:
        with contextlib.ExitStack() as stack:
            tcp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            tcp.bind(("127.0.0.1", 0))
            tcp.listen(16)
            unix = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            unix.bind("\0" + self.abstract)
            unix.listen(16)
            master, slave = pty.openpty()
            stack.callback(os.close, master)
            stack.callback(os.close, slave)
            tty.setraw(slave)  # injected bytes stay in the input queue, readable below
            err = stack.enter_context(tempfile.TemporaryFile())
            spec = {"sections": list(ALL_SECTIONS), "tcp_port": tcp.getsockname()[1], "abstract": self.abstract,
                    "needles": [n.hex() for n in needles], "host_paths": [p.encode().hex() for p in host_paths],
                    "state_names": list(STATE_NAMES), "own_mountns_probes": list(OWN_MOUNTNS_PROBES)}
            argv = ["python3", "-c", PROBE, json.dumps(spec), SANDBOX_PROBE.read_text()]
            launch_spec = {"canary_file": str(self.canary_file), "target": asdict(target), "argv": argv,
                           "protections": asdict(protections), "timeout": REPORT_TIMEOUT_S}
            before = Path(SWAPPINESS).read_text()
            proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, json.dumps(launch_spec)],
                                    stdin=slave, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin", "ISO_CANARY": self.env_canary},
                                    cwd=Path(__file__).resolve().parent.parent)
            try:
                assert proc.stdout is not None
                out_fd, buf = proc.stdout.fileno(), bytearray()
                deadline = time.monotonic() + REPORT_TIMEOUT_S
                line = _read_line(out_fd, deadline, buf)
                if line is None:
                    proc.kill()
                    proc.wait()
                    err.seek(0)
                    raise AssertionError(f"the sandbox printed no report (exit {proc.returncode}): "
                                         f"{err.read().decode(errors='replace')[-3000:]}")
                inside = json.loads(line)
                launcher = _status(proc.pid)
                host_procs = {}
                for pid in descendants(proc.pid):
                    with contextlib.suppress(OSError):
                        host_procs[pid] = _status(pid)
                leaves = [pid for pid, st in host_procs.items()
                          if st["Name"] == "python3" and st["cmdline"].startswith("python3\0-c\0")]
                assert len(leaves) == 1, host_procs
                leaf = leaves[0]
                planted = None
                if Path(target.mountpoint).is_relative_to(self.dir):  # our plain directory: host root writes there
                    plant_setuid_id(leaf)
                    planted = os.path.join(target.mountpoint, "id")
                os.kill(leaf, signal.SIGUSR1)
                tail = _read_line(out_fd, deadline, buf)
                after = json.loads(tail) if tail else {}
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                extra: dict[str, Any] = {}
                if planted is not None:
                    if target.uid == self.uid and protections.own_uid:  # the same file, run on the host
                        host = subprocess.run([SETPRIV, f"--reuid={self.uid}", f"--regid={self.uid}",
                                               "--clear-groups", planted, "-u"], capture_output=True, text=True,
                                              check=False)
                        extra["host_id"] = {"rc": host.returncode, "out": host.stdout, "err": host.stderr}
                    os.unlink(planted)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()  # type: ignore[union-attr]
            swappiness = (before, Path(SWAPPINESS).read_text())
            if swappiness[0] != swappiness[1]:
                raise AssertionError(f"the host's vm.swappiness changed during a sandbox run: {swappiness}")
            err.seek(0)
            return Report(protections, target, code, inside, after, host_procs, launcher, leaf,
                          _accepted(tcp), _accepted(unix), _drain_nonblocking(slave),
                          err.read().decode(errors="replace"), swappiness,
                          launcher_pid=proc.pid, extra=extra)


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    made = Lab()
    try:
        yield made
    finally:
        made.close()
