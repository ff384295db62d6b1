"""What a process inside a ``scopefs run`` sandbox can do, probed from inside (try-syscall style).

Every probe runs through the real launcher (``sandbox.launch.run``, as the
command line calls it) with all protections, and again with exactly the
protection that should stop it removed (one ``Protections`` field, or root
mode: bwrap started as host root, ``own_uid=False``, over a plain
directory). A probe must come out blocked in the first run and must FLIP in
the second, so no assertion here can pass vacuously: a probe that could not
have seen the leak fails its control.

One sandbox run executes every probe (``tests/isolationkit.py``) and is
cached per set of protections; each test reads the run it needs. The
bait planted around each run: a canary variable in the launcher's
environment, an inheritable canary descriptor in the launcher, listeners on
host loopback TCP and on a host abstract Unix socket, a pty that is the
launcher's controlling terminal as the sandbox's stdin, and a setuid-root
``id`` that host root copies into the running sandbox.

Controls that cannot be built with ``Protections`` are called out where
they occur (``test_proc1_root_does_not_lead_to_the_host``,
``test_no_new_privs``, the five syscalls in ``PRIVILEGED_ONLY``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from scopefs.sandbox.bwrap import FULL, Protections
from scopefs.sandbox.launch import Target
from tests import sandbox_probe, sandboxkit
from tests.conftest import ALICE_FACT, BOB_FACT, CHANNEL_FACT, Scenario
from tests.isolationkit import OWN_MOUNTNS_PROBES, SANDBOX_PROBE, Lab, Report
from tests.isolationkit import lab as make_lab

pytestmark = pytest.mark.slow


def without(*fields: str) -> Protections:
    """FULL with exactly ``fields`` turned off."""
    return replace(FULL, **dict.fromkeys(fields, False))


# Each negative control, named by what it removes. "own_uid" off is root
# mode: bwrap runs as host root (the sandbox's uid 1000 is host uid 0).
CONTROLS: dict[str, Protections] = {
    "empty_env": without("empty_env"),
    "options_via_fd": without("options_via_fd"),
    "close_fds": without("close_fds"),
    "unshare_net": without("unshare_net"),
    "unshare_pid": without("unshare_pid"),
    "seccomp": without("seccomp"),
    "own_uid": without("own_uid"),
    "own_uid+drop_caps": without("own_uid", "drop_caps"),
    "own_uid+drop_caps+seccomp": without("own_uid", "drop_caps", "seccomp"),
    "own_uid+drop_caps+seccomp+unshare_pid": without("own_uid", "drop_caps", "seccomp", "unshare_pid"),
    "new_session+seccomp": without("new_session", "seccomp"),
    "disable_userns+seccomp": without("disable_userns", "seccomp"),
    # single layers of a defence in depth (test_each_layer_alone_still_blocks)
    "new_session": without("new_session"),
    "disable_userns": without("disable_userns"),
}


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """One sandbox uid and its plain directories for the whole module; nothing left behind."""
    with make_lab() as made:
        yield made
        assert made.settle() == {}
    assert made.allocation.lock_fd == -1 and not made.dir.exists()


@pytest.fixture(autouse=True)
def nothing_leaks(lab: Lab) -> Iterator[None]:
    """No live sandbox process, mount, server, place or uid of ours outlives a test (Lab.leftovers).

    Exited-but-unreaped processes are waited for once, at the end of the module.
    """
    yield
    assert lab.settle(zombies=False) == {}


def run(lab: Lab, control: str | None = None) -> Report:
    report = lab.report(FULL if control is None else CONTROLS[control])
    assert report.code == 0, report.stderr
    assert report.after.get("go"), "the host's inspection never reached the sandbox"
    return report


# ---------------------------------------------------------------------------
# Probes: each returns the evidence of a leak (empty: isolated).

Evidence = Callable[[Report, Lab], list[str]]


def _procs(report: Report) -> dict[str, dict[str, Any]]:
    info: dict[str, dict[str, Any]] = report.inside["proc"]["info"]
    return info


def env_canary(report: Report, lab: Lab) -> list[str]:
    """The launcher's environment (a canary variable) in any visible process's environ."""
    return [f"/proc/{pid}/environ has the launcher's canary" for pid, info in _procs(report).items()
            if lab.env_canary in (info["environ"] or "")]


def host_path_in_cmdline(report: Report, lab: Lab) -> list[str]:
    """bwrap's options (the host mountpoint) in any visible process's cmdline."""
    return [f"/proc/{pid}/cmdline names the host mountpoint" for pid, info in _procs(report).items()
            if report.target.mountpoint in (info["cmdline"] or "")]


def inherited_fd(report: Report, lab: Lab) -> list[str]:
    """A descriptor beyond 0-2 that reaches the launcher's canary file (listing or read)."""
    fds = report.inside["fds"]
    found = [f"fd {fd} -> {info['link']}" for fd, info in fds["fds"].items()
             if lab.canary_file.name in info["link"] or lab.fd_canary in info.get("data", "")]
    if lab.canary_file.name in fds["ls"]["out"]:
        found.append("ls -l /proc/self/fd shows the canary file")
    return found


def extra_fds(report: Report, lab: Lab) -> list[str]:
    """Any descriptor beyond 0-2 at all (the listing's own excepted): bwrap's or the launcher's."""
    return [f"fd {fd} -> {info['link']}" for fd, info in report.inside["fds"]["fds"].items()]


def tcp_bait(report: Report, lab: Lab) -> list[str]:
    """A connection to the host's loopback listener (logged by the listener, or seen inside)."""
    found = [f"the host listener accepted {report.tcp_accepted} connection(s)"] if report.tcp_accepted else []
    return found + (["connect() to 127.0.0.1 succeeded"] if report.inside["net"]["tcp"] == "connected" else [])


def abstract_bait(report: Report, lab: Lab) -> list[str]:
    """A connection to the host's abstract Unix socket."""
    found = [f"the abstract listener accepted {report.abstract_accepted}"] if report.abstract_accepted else []
    return found + (["connect() to the abstract socket succeeded"]
                    if report.inside["net"]["abstract"] == "connected" else [])


def interfaces(report: Report, lab: Lab) -> list[str]:
    """Any network interface but lo in /proc/net/dev."""
    return [f"interface {name}" for name in report.inside["net"]["interfaces"] if name != "lo"]


def _sti(name: str, mark: bytes) -> Evidence:
    def evidence(report: Report, lab: Lab) -> list[str]:
        found = [f"{mark!r} arrived on the pty's input"] if mark in report.pty_input else []
        return found + ([f"{name} succeeded"] if report.inside["syscalls"][name]["ok"] else [])
    evidence.__doc__ = f"TIOCSTI ({name}) pushing {mark!r} into the controlling terminal's input."
    return evidence


tiocsti = _sti("ioctl_tiocsti", sandbox_probe.STI_MARK["ioctl_tiocsti"])
tiocsti_high = _sti("ioctl_tiocsti_high", sandbox_probe.STI_MARK["ioctl_tiocsti_high"])


def sysctl_write(report: Report, lab: Lab) -> list[str]:
    """Writing a host-global sysctl (vm.swappiness; the value just read, so never a change)."""
    result = report.inside["sysctl"]["write"]
    return ["wrote /proc/sys/vm/swappiness"] if result == "ok" else []


def _command(key: str, expect_out: str | None = None) -> Evidence:
    def evidence(report: Report, lab: Lab) -> list[str]:
        done = report.inside["privilege"][key]
        ok = done["rc"] == 0 and (expect_out is None or done["out"].strip() == expect_out)
        return [f"{key}: rc={done['rc']} out={done['out'].strip()!r}"] if ok else []
    return evidence


unshare_u = _command("unshare_U")
unshare_ur = _command("unshare_Ur", "0")  # root in a user namespace of its own
unshare_urm_mount = _command("unshare_Urm_mount", "1")  # and a tmpfs mounted there
unshare_u.__doc__ = "unshare -U: a nested user namespace."
unshare_ur.__doc__ = "unshare -Ur id -u: root (0) in a nested user namespace."
unshare_urm_mount.__doc__ = "unshare -Urm mount -t tmpfs none /tmp/x, seen in mountinfo."


def mount_tmpfs(report: Report, lab: Lab) -> list[str]:
    """mount(2) of a tmpfs on /tmp/x, in the sandbox's mount namespace or in one of its own.

    (mount(8) refuses every uid but 0 by itself, so the probe calls mount(2).
    In the sandbox's own mount namespace it fails even in the control: bwrap
    always runs the command in a user namespace nested below the one that
    owns that mount namespace. The control's flip is the mount in a new
    namespace, unshare(CLONE_NEWNS), which capabilities allow.)
    """
    priv = report.inside["privilege"]
    return [f"{key}: mounted" for key in ("mount_here", "mount_new_ns") if priv[key] == "mounted"]


def chroot(report: Report, lab: Lab) -> list[str]:
    """chroot /proc/1/root."""
    done = report.inside["privilege"]["chroot"]
    return ["chroot /proc/1/root succeeded"] if done["rc"] == 0 else []


def host_processes(report: Report, lab: Lab) -> list[str]:
    """Processes other than the sandbox's own (bwrap and the probe) in /proc; the test's own pid."""
    found = [f"pid {pid} ({(info['comm'] or '?').strip()})" for pid, info in _procs(report).items()
             if (info["comm"] or "").strip() not in ("bwrap", "python3")]
    if str(os.getpid()) in _procs(report):
        found.append(f"the test process (host pid {os.getpid()})")
    return found


def host_uid(report: Report, lab: Lab) -> list[str]:
    """Root anywhere: the uid inside, and every sandbox process's host uid (must be the target's)."""
    found = [f"uid {report.inside['ident']['uid']} inside"] if report.inside["ident"]["uid"] == 0 else []
    for pid, status in report.host_procs.items():
        ids = {int(v) for v in status["Uid"].split()}
        if ids != {report.target.uid}:
            found.append(f"host pid {pid} ({status['Name']}) runs as uid {sorted(ids)}")
    return found


def capabilities(report: Report, lab: Lab) -> list[str]:
    """Any effective or permitted capability, inside or on any sandbox process (bwrap included)."""
    inside = report.inside["ident"]["status"]
    found = [f"inside {key} {inside[key]}" for key in ("CapEff", "CapPrm") if int(inside[key], 16)]
    return found + [f"host pid {pid} ({st['Name']}) CapEff {st['CapEff']}"
                    for pid, st in report.host_procs.items() if int(st["CapEff"], 16)]


def seccomp_mode(report: Report, lab: Lab) -> list[str]:
    """The command not under a seccomp filter (Seccomp: 2), inside or seen from the host."""
    found = [] if report.inside["ident"]["status"]["Seccomp"] == "2" else ["inside Seccomp is not 2"]
    leaf = report.host_procs[report.leaf]["Seccomp"]
    return found + ([] if leaf == "2" else [f"host sees Seccomp {leaf}"])


@dataclass(frozen=True)
class Probe:
    name: str
    evidence: Evidence
    controls: tuple[str, ...]


PROBES = [
    Probe("proc1_environ", env_canary, ("empty_env",)),
    Probe("proc1_cmdline", host_path_in_cmdline, ("options_via_fd",)),
    Probe("inherited_fd", inherited_fd, ("close_fds",)),
    Probe("no_fd_beyond_2", extra_fds, ("close_fds",)),
    Probe("loopback_tcp", tcp_bait, ("unshare_net",)),
    Probe("abstract_socket", abstract_bait, ("unshare_net",)),
    Probe("tiocsti", tiocsti, ("new_session+seccomp",)),
    Probe("tiocsti_1<<32", tiocsti_high, ("new_session+seccomp",)),
    Probe("global_sysctl", sysctl_write, ("own_uid",)),
    Probe("unshare-U", unshare_u, ("disable_userns+seccomp",)),
    Probe("unshare-Ur", unshare_ur, ("disable_userns+seccomp",)),
    Probe("unshare-Urm_mount", unshare_urm_mount, ("disable_userns+seccomp",)),
    Probe("mount_tmpfs", mount_tmpfs, ("own_uid+drop_caps+seccomp",)),
    Probe("chroot", chroot, ("own_uid+drop_caps+seccomp",)),
    Probe("host_processes", host_processes, ("unshare_pid",)),
    Probe("host_uid", host_uid, ("own_uid",)),
    Probe("capabilities", capabilities, ("own_uid+drop_caps",)),
    Probe("seccomp_mode", seccomp_mode, ("seccomp",)),
    Probe("only_lo", interfaces, ("unshare_net",)),
]


@pytest.mark.parametrize("probe, control", [pytest.param(p, c, id=f"{p.name}-without-{c}")
                                            for p in PROBES for c in p.controls])
def test_blocked_and_flips_without_its_protection(lab: Lab, probe: Probe, control: str) -> None:
    full = run(lab)
    assert probe.evidence(full, lab) == [], f"{probe.name} leaks through the full sandbox"
    weak = run(lab, control)
    assert probe.evidence(weak, lab), (f"{probe.name}: removing {control} did not flip the probe, "
                                       "so it proves nothing")


# Defence in depth: where two protections stop the same thing, each alone must.
LAYERS = [
    ("tiocsti", tiocsti, "new_session"),  # the filter alone
    ("tiocsti", tiocsti, "seccomp"),  # setsid alone
    ("tiocsti_1<<32", tiocsti_high, "new_session"),
    ("tiocsti_1<<32", tiocsti_high, "seccomp"),
    ("unshare-U", unshare_u, "disable_userns"),  # the filter alone
    ("unshare-U", unshare_u, "seccomp"),  # --disable-userns alone
    ("mount_tmpfs", mount_tmpfs, "seccomp"),  # no capabilities alone
    ("mount_tmpfs", mount_tmpfs, "own_uid+drop_caps"),  # the filter alone (root mode, every capability)
    ("chroot", chroot, "seccomp"),
    ("chroot", chroot, "own_uid+drop_caps"),
]


@pytest.mark.parametrize("name, evidence, control", [pytest.param(*layer, id=f"{layer[0]}-without-{layer[2]}")
                                                     for layer in LAYERS])
def test_each_layer_alone_still_blocks(lab: Lab, name: str, evidence: Evidence, control: str) -> None:
    """The other layer still holds; the flip itself is shown by test_blocked_and_flips_without_its_protection."""
    assert evidence(run(lab, control), lab) == [], f"{name}: without {control} nothing else stops it"


def test_a_setuid_root_binary_gives_no_root(lab: Lab) -> None:
    """Host root plants a root-owned 4755 ``id`` into the running sandbox; run inside it is not root.

    Control: the very same file, run on the host by the session's uid (no
    sandbox, no no_new_privs), says 0. (Planted through
    ``/proc/<pid>/root/memory``: the sandbox's /tmp is a tmpfs of its own
    user namespace, where host uid 0 cannot own a file, EOVERFLOW.)
    """
    report = run(lab)
    overflow_uid = int(Path("/proc/sys/kernel/overflowuid").read_text())
    assert report.after["id_owner"] == overflow_uid  # host root, unmapped inside: "nobody"
    assert int(report.after["id_mode"], 8) & 0o4000, report.after  # the setuid bit is there inside
    assert report.after["id"]["rc"] == 0 and report.after["id"]["out"].strip() != "0", report.after
    assert report.extra["host_id"]["out"].strip() == "0", report.extra  # the control: setuid works on the host


def test_proc1_root_does_not_lead_to_the_host(lab: Lab) -> None:
    """/proc/1 is the sandbox's own init, and /proc/1/root/<host-only file> is not there.

    Controls: without the pid namespace (root mode, every capability, no
    filter) /proc/1 IS the host's init; the path check itself, made from
    the host, finds the host-only file. Even then /proc/1/root stays closed
    (EACCES): the sandbox always has a user namespace of its own (no
    ``Protections`` field removes it), and the kernel refuses ptrace-class
    access from it to host processes. That is asserted too, as the layer
    that remains.
    """
    host_only = str(lab.canary_file)
    full = run(lab)
    assert _procs(full)["1"]["comm"] == "bwrap\n"
    assert full.inside["privilege"]["proc1_root_paths"] == {host_only: False}
    assert full.inside["search"]["exists"] == {host_only: False}

    weak = run(lab, "own_uid+drop_caps+seccomp+unshare_pid")
    host_init = Path("/proc/1/cmdline").read_bytes().decode("latin-1")
    assert _procs(weak)["1"]["cmdline"] == host_init  # the control flips: this is the host's pid 1
    assert weak.inside["privilege"]["proc1_root_list"] == "EACCES"
    assert weak.inside["privilege"]["proc1_root_paths"] == {host_only: False}
    # The same check from the host, through a process whose root is the host's (ours; the host's
    # pid 1 here is a VM agent whose /proc entries even host root may not open):
    assert os.path.lexists(f"/proc/{os.getpid()}/root{host_only}")


def test_no_new_privs(lab: Lab) -> None:
    """NoNewPrivs is 1 inside and for every sandbox process seen from the host.

    No ``Protections`` field removes it (bwrap sets it in every mode), so
    the control is the reader's: the launcher, read the same way from the
    host, shows 0. Its effect is proven by the setuid test.
    """
    report = run(lab)
    assert report.inside["ident"]["status"]["NoNewPrivs"] == "1"
    assert {st["NoNewPrivs"] for st in report.host_procs.values()} == {"1"}
    assert report.launcher["NoNewPrivs"] == "0"


# ---------------------------------------------------------------------------
# tests/sandbox_probe.py's syscall probes, through the real launcher.

# The filter's own answer for what it blocks (EPERM unless listed).
FILTER_ERRNO = {"clone3": "ENOSYS", "socket_vsock": "EAFNOSUPPORT", "socket_packet": "EAFNOSUPPORT",
                 "socketpair_vsock": "EAFNOSUPPORT"}
# Must work the same with and without the filter.
ALLOWED = ("getpid", "ioctl_tiocgwinsz", "clone_plain_einval", "personality_query", "personality_linux",
           "personality_linux32", "socket_unix", "socket_inet6", "socket_netlink")
# The kernel refuses these to any sandbox the launcher can build (they need
# capabilities of the initial user namespace): their control is a
# privileged bubblewrap (tests/sandboxkit.py: real root, no user namespace).
PRIVILEGED_ONLY = ("acct", "reboot", "swapon", "swapoff", "syslog")
# Where removing the filter alone is not enough, the other protection that
# also stops the call goes too.
SYSCALL_CONTROL = {
    "unshare_newns": "own_uid+drop_caps+seccomp",  # needs CAP_SYS_ADMIN in its user namespace
    "unshare_newuser": "disable_userns+seccomp",  # --disable-userns: ENOSPC
    "ioctl_tiocsti": "new_session+seccomp",  # setsid: not the controlling terminal
    "ioctl_tiocsti_high": "new_session+seccomp",
    **dict.fromkeys(OWN_MOUNTNS_PROBES, "own_uid+drop_caps+seccomp"),  # run in a mount namespace of its own
}
BLOCKED = sorted(set(sandbox_probe.PROBES) - set(ALLOWED))


def _syscall(report: Report, name: str) -> dict[str, Any]:
    result: dict[str, Any]
    if name in OWN_MOUNTNS_PROBES and not report.protections.seccomp:
        own = report.inside["own_mountns"]
        assert own["rc"] == 0, own
        result = own["results"][name]
        return result
    result = report.inside["syscalls"][name]
    return result


@pytest.fixture(scope="module")
def privileged_results() -> dict[str, dict[str, Any]]:
    """PRIVILEGED_ONLY without the filter in a privileged bubblewrap (harmless arguments: see sandbox_probe)."""
    done = sandboxkit.run(["python3", "-c", SANDBOX_PROBE.read_text(), *PRIVILEGED_ONLY],
                          privileged=True, seccomp=False)
    assert done.returncode == 0, done.stderr
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return results


@pytest.mark.parametrize("name", BLOCKED)
def test_syscall_blocked_and_flips(lab: Lab, name: str, privileged_results: dict[str, dict[str, Any]]) -> None:
    expected = FILTER_ERRNO.get(name, "EPERM")
    full = run(lab).inside["syscalls"][name]
    assert full == {"ok": False, "errno": expected}, f"{name} inside the full sandbox: {full}"
    if name in PRIVILEGED_ONLY:
        weak = privileged_results[name]
    else:
        weak = _syscall(run(lab, SYSCALL_CONTROL.get(name, "seccomp")), name)
    assert weak != full, f"{name}: the control still answers {weak}, so the probe proves nothing"


@pytest.mark.parametrize("name", ALLOWED)
def test_syscall_the_tools_need_is_untouched(lab: Lab, name: str) -> None:
    full = run(lab).inside["syscalls"][name]
    assert full == run(lab, "seccomp").inside["syscalls"][name]


def test_every_syscall_probe_is_classified() -> None:
    assert set(ALLOWED) <= set(sandbox_probe.PROBES)
    assert set(SYSCALL_CONTROL) | set(PRIVILEGED_ONLY) <= set(BLOCKED)


# ---------------------------------------------------------------------------
# No state directory, catalog or key inside; other sessions' bytes nowhere.

def _needles(home: Path) -> tuple[bytes, ...]:
    key = (home / "hmac.key").read_bytes()
    assert len(key) >= 16
    return ALICE_FACT.strip(), BOB_FACT.strip(), CHANNEL_FACT.strip(), key


def _state_evidence(report: Report, *, view_may_hold: set[int], host_paths: tuple[str, ...]) -> list[str]:
    """State files by name anywhere, host paths (as files or in mountinfo), and needles
    outside /memory (or in it, unless the view may hold them)."""
    search = report.inside["search"]
    found = [f"host path visible: {p}" for p, seen in search["exists"].items() if seen]
    found += [f"mountinfo names {p}" for p in host_paths if p in report.inside["mountinfo"]]
    found += [f"state file by name: {p}" for p in search["names"]]
    for path, needle in search["hits"]:
        if not path.startswith("/memory/") or needle not in view_may_hold:
            found.append(f"needle {needle} in {path}")
    return found


@pytest.fixture
def real_mounts(scenario: Scenario, lab: Lab) -> Iterator[Callable[[str], Target]]:
    """sessions.start for scenario sessions; every server stopped at teardown (and checked by the lab)."""
    from scopefs.catalog.home import Home
    from scopefs.sandbox import sessions

    started: list[tuple[subprocess.Popen[bytes], Target]] = []

    def start(session_id: str) -> Target:
        proc, target = sessions.start(Home.open(scenario.cli.home), session_id, tied=True)
        started.append((proc, target))
        lab.track(proc.pid, target)
        return target

    try:
        yield start
    finally:
        for proc, target in started:
            sessions.stop_server(proc.pid, target.mountpoint)
            proc.wait()


def test_no_state_directory_catalog_or_key_inside(lab: Lab, scenario: Scenario,
                                                  real_mounts: Callable[[str], Target]) -> None:
    """Bob's real gated sandbox: no home, catalog, key or /run/scopefs; Alice's bytes nowhere.

    (It also passes every probe of PROBES, which the plain-directory runs control.)

    Its own fact may be in /memory (its view); nothing else anywhere. The
    search covers names everywhere but /proc, /sys and /dev, and contents
    everywhere but those and the host's read-only /usr.
    Nor does /proc/self/mountinfo name any of those host paths.
    Controls: Alice's sandbox finds her canary in her view; a sandbox whose
    /memory is the host directory holding the home (root mode, read-only)
    finds the catalog, state and key files, every canary, and its host path
    in mountinfo.
    """
    home = scenario.cli.home
    needles = _needles(home)
    bob, alice = real_mounts(scenario.bob_session), real_mounts(scenario.alice_session)
    host_paths = (str(home), str(home / "agents" / "main" / "catalog.sqlite"), str(home / "state.sqlite"),
                  str(home / "hmac.key"), "/run/scopefs", bob.mountpoint, str(bob.control))
    in_mountinfo = (str(home.parent), *host_paths)

    in_bob = lab.report(FULL, bob, needles=needles, host_paths=host_paths)
    assert in_bob.code == 0, in_bob.stderr
    for probe in PROBES:  # what the plain-directory runs show holds in the gated sandbox as well
        assert probe.evidence(in_bob, lab) == [], f"{probe.name} leaks through Bob's gated sandbox"
    assert _state_evidence(in_bob, view_may_hold={1}, host_paths=in_mountinfo) == []
    assert [hit for hit in in_bob.inside["search"]["hits"] if hit[1] == 1], "Bob's own view: the search reads it"

    in_alice = lab.report(FULL, alice, needles=needles, host_paths=host_paths)
    assert in_alice.code == 0, in_alice.stderr
    assert ["/memory/private/notes/allergy.md", 0] in in_alice.inside["search"]["hits"]  # control: hers, seen
    assert _state_evidence(in_alice, view_may_hold={0}, host_paths=in_mountinfo) == []

    exposed = Target(lab.uid, str(home.parent), None, False)
    shown = lab.report(without("own_uid"), exposed, needles=needles, host_paths=host_paths)
    assert shown.code == 0, shown.stderr
    evidence = _state_evidence(shown, view_may_hold=set(), host_paths=in_mountinfo)
    assert f"mountinfo names {home.parent}" in evidence
    names = {Path(p).name for p in shown.inside["search"]["names"]}
    assert {"catalog.sqlite", "state.sqlite", "hmac.key"} <= names, evidence
    assert {needle for _, needle in shown.inside["search"]["hits"]} == {0, 1, 2, 3}, evidence
