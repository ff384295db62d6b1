#!/usr/bin/env python3
"""What a sandboxed command costs: ``scopefs run`` against a plain ``bwrap``.

Four ways to run ``true``, taking turns round by round in one run:

* ``bwrap``: a plain ``bwrap ... true`` with the same namespaces and
  binds as ours (read-only /usr, /proc, /dev, tmpfs /tmp, a directory at
  /memory), started by root from this process: the floor.
* ``bwrap-same``: bwrap with exactly the options our launcher gives it
  (same binds, ``/etc`` files, seccomp program), started directly as the
  session's uid: what our sandbox's layout costs, without the launcher.
* ``launch``: our launcher's ``sandbox.launch.run`` over a session mount
  that is already up, called from this process: what a long-lived
  gateway pays per command (setpriv, memfds, seccomp, admission at the
  mount's gate, the JSON status).
* ``cli-kept``: ``scopefs run SESSION -- true`` with ``scopefs session up``
  done before: the command line's cost per command when the mount is kept.
* ``cli-cold``: ``scopefs run SESSION -- true`` with no kept mount: mount
  server, view build, sandbox, teardown.

    .venv/bin/python bench/sandbox_bench.py [--rounds 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scopefs.catalog.home import Home
from scopefs.sandbox import bwrap, launch, sessions

SCOPEFS = str(Path(sys.executable).with_name("scopefs"))


def _cli(home: Path, *args: str) -> dict:
    out = subprocess.run([SCOPEFS, "--json", *args], check=True, capture_output=True,
                         env={**os.environ, "SCOPEFS_HOME": str(home)}).stdout
    return json.loads(out)


def make_session(home: Path) -> str:
    subprocess.run([SCOPEFS, "init"], check=True, capture_output=True, env={**os.environ, "SCOPEFS_HOME": str(home)})
    _cli(home, "agent", "add", "main")
    principal = _cli(home, "principal", "add", "Bench", "--kind", "human")["principal_id"]
    _cli(home, "bind", principal, "--channel", "bench", "--account", "a", "--sender", "s")
    session = _cli(home, "session", "open", "--agent", "main", "--dm", "--channel", "bench", "--account", "a",
                   "--sender", "s")["session_id"]
    subprocess.run([SCOPEFS, "write", session, "private/notes/a.md"], input=b"hello\n", check=True,
                   capture_output=True, env={**os.environ, "SCOPEFS_HOME": str(home)})
    return session


def plain_bwrap(directory: str) -> list[str]:
    return [bwrap.bwrap_path() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", directory, "/memory", "--", "true"]


def same_as_launcher(target: launch.Target) -> tuple[list[str], tuple[int, ...]]:
    """bwrap's command line as the launcher builds it (options inline, data in memfds)."""
    fds = []
    for data in (bwrap.PASSWD.encode(), bwrap.GROUP.encode(), launch._filter_program()):
        fd = os.memfd_create("bench")
        os.write(fd, data)
        fds.append(fd)

    layout = bwrap.Layout(target.mountpoint, target.writable)
    args = bwrap.options(layout, bwrap.FULL, passwd_fd=fds[0], group_fd=fds[1])
    return [bwrap.bwrap_path() or "bwrap", *args, "--seccomp", str(fds[2]), "--", "true"], tuple(fds)


def run_same(command: list[str], fds: tuple[int, ...], uid: int) -> None:
    for fd in fds:  # bwrap reads each from its offset: rewind the shared descriptions
        os.lseek(fd, 0, os.SEEK_SET)
    subprocess.run(command, check=True, pass_fds=fds, env={}, user=uid, group=uid, extra_groups=[])


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scopefs-sbench-") as tmp:
        home_path = Path(tmp) / "home"
        session = make_session(home_path)
        env = {**os.environ, "SCOPEFS_HOME": str(home_path)}
        empty = Path(tmp) / "empty"
        empty.mkdir()
        plain = plain_bwrap(str(empty))
        proc, target = sessions.start(Home.open(home_path), session, tied=True)
        devnull = os.open(os.devnull, os.O_RDWR)
        saved = [os.dup(fd) for fd in (0, 1, 2)]

        def api() -> None:
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            try:
                assert launch.run(target, ["true"]) == 0
            finally:
                for fd, keep in zip((0, 1, 2), saved, strict=True):
                    os.dup2(keep, fd)

        def cli_run() -> None:
            subprocess.run([SCOPEFS, "run", session, "--", "true"], check=True, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

        same = same_as_launcher(target)
        ways = {"bwrap": lambda: subprocess.run(plain, check=True),
                "bwrap-same": lambda: run_same(*same, target.uid),
                "launch": api}
        samples: dict[str, list[float]] = {name: [] for name in ("bwrap", "bwrap-same", "launch", "cli-kept",
                                                                 "cli-cold")}
        try:
            for _ in range(3):  # warm-up
                for fn in ways.values():
                    fn()
            for round_no in range(args.rounds):
                order = list(ways.items())
                order = order[round_no % len(order):] + order[:round_no % len(order)]
                for name, fn in order:
                    samples[name].append(timed(fn))
        finally:
            sessions.stop_server(proc.pid, target.mountpoint)
            proc.wait()
        subprocess.run([SCOPEFS, "session", "up", session], check=True, env=env, capture_output=True)
        try:
            cli_run()
            for _ in range(args.rounds):
                samples["cli-kept"].append(timed(cli_run))
        finally:
            subprocess.run([SCOPEFS, "session", "down", session], check=True, env=env, capture_output=True)
        for _ in range(max(5, args.rounds // 3)):
            samples["cli-cold"].append(timed(cli_run))
    report = {name: {"n": len(v), "p50_ms": statistics.median(v) * 1e3,
                     "p95_ms": sorted(v)[max(0, int(len(v) * 0.95) - 1)] * 1e3} for name, v in samples.items()}
    floor = report["bwrap"]["p50_ms"]
    for row in report.values():
        row["x_bwrap"] = row["p50_ms"] / floor
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{'way':10} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'x bwrap':>8}")
        for name, row in report.items():
            print(f"{name:10} {row['n']:>4} {row['p50_ms']:8.1f} {row['p95_ms']:8.1f} {row['x_bwrap']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
