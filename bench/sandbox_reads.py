#!/usr/bin/env python3
"""The read workloads at ``/memory`` inside ``scopefs run``, next to a plain mount and native disk.

Issue 14, point 1 asks for every figure "through a plain mount and
through ``/memory`` inside ``scopefs run``". A sandbox's mount answers only
admitted processes (``vfs.gate``), so its requests cost a little more than
a plain mount's; the kernel's caches answer both alike. This runs the
same commands as ``fuse_bench.py`` on the tree it built (``--reuse``):

* native: ``<tree>/native``;
* plain: ``scopefs mount`` of the bench session;
* sandbox: ``scopefs run`` of the same session.

One small shell loop (``Shell``) times every command, on the host and
inside the sandbox alike, so the sandbox's start is not counted and every
figure carries the same overhead. Warm: each workload twice per system
untimed, then ``--rounds`` rounds in which the systems take turns command
by command, the plain mount and one sandbox up throughout. Cold
(``--cold-rounds``, default 3): every FUSE figure on a fresh mount (a new
sandbox for ``/memory``), the page cache dropped once the mount is up and
right before the command. Medians are reported, as ratios to native. Saves
and ``cp -r`` at ``/memory`` are ``sandbox_writes.py``'s.

    .venv/bin/python bench/sandbox_reads.py --reuse bench/out/full > bench/out/sandbox-reads-1.json   # needs root
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from fuse_bench import BIG, CMD_ENV, COLD, HOLD_S, TREE, WARM, WORKLOADS, Expect, drop_caches, scopefs_exe  # noqa: E402

SYSTEMS = ("native", "plain", "sandbox")


def rotated(round_no: int) -> list[str]:
    """The systems in turn, a different one first each round: none always runs after the same one."""
    k = round_no % len(SYSTEMS)
    return list(SYSTEMS[k:] + SYSTEMS[:k])


def expected(work: Path) -> dict[str, str]:
    """What each workload prints on the tree ``fuse_bench.py`` built (grep's and rg's matching lines,
    find's files); ``ls -lR`` and ``cat`` print nothing (``Shell.verify`` checks what they read)."""
    manifest = json.loads((work / "manifest.json").read_text())
    matches, notes = str(manifest["matches"]), str(manifest["params"]["notes"])
    return {"grep -r": matches, "rg": matches, "find": notes, "ls -lR": "", "cat big": ""}


def expectation(work: Path) -> Expect:
    manifest = json.loads((work / "manifest.json").read_text())
    notes = manifest["params"]["notes"]
    return Expect(manifest["matches"], notes, manifest["big_sha256"], notes)


def commands(root: str, workloads: tuple[str, ...]) -> dict[str, str]:
    """``fuse_bench.py``'s exact commands, on the tree below ``root``."""
    return {w: WORKLOADS[w].format(dir=f"{root}/{TREE}", big=f"{root}/{BIG}") for w in workloads}


class Shell:
    """A shell that runs the commands it is sent, one per line, and answers each with its nanoseconds.

    The same loop times every system: on the host for native disk and the
    plain mount, inside ``scopefs run`` for ``/memory``. So each figure
    carries the same overhead (a ``sh -c`` and a ``date``) and the same
    locale (the sandbox starts with its own environment: the loop sets
    ``LC_ALL=C`` as ``fuse_bench.py`` does), the sandbox's start is not
    counted, and the systems can take turns command by command while one
    sandbox (and its mount) stays up. A command's output is joined on one
    line (``$out`` unquoted on purpose). What the shell and the sandbox
    print on stderr goes to a file, read if they fail: a pipe nobody reads
    would fill and stop them.
    """

    LOOP = ('export LC_ALL=C; while IFS= read -r cmd; do s=$(date +%s%N); if out=$(sh -c "$cmd"); '
            'then e=$(date +%s%N); echo $((e - s)) $out; else echo failed; fi; done')

    def __init__(self, home: Path | None = None, session: str | None = None) -> None:
        argv = ["sh", "-c", self.LOOP]
        self._errors = tempfile.TemporaryFile(mode="w+")
        if home is not None and session is not None:
            self._proc = sandboxed_argv(home, session, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._errors)
        else:
            self._proc = subprocess.Popen(argv, text=True, env=CMD_ENV, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._errors)

    def timed(self, cmd: str, want: str | None = None) -> float:
        """``cmd``'s time; it must print ``want``, if given (a view that shows less is no figure)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(cmd + "\n")
        self._proc.stdin.flush()
        ns, _, out = self._proc.stdout.readline().strip().partition(" ")
        if not ns.isdigit():
            self.close()
            raise RuntimeError(f"{cmd!r} failed: {ns or 'the shell ended'}")
        if want is not None and out != want:
            self.close()
            raise RuntimeError(f"{cmd!r} printed {out!r}, expected {want}")
        return int(ns) / 1e9

    def verify(self, root: str, expect: Expect) -> None:
        """Untimed: the view at ``root`` lists every note and holds the big file, byte for byte
        (``fuse_bench.py``'s checks; the timed ``ls -lR`` and ``cat`` print nothing to check)."""
        self.timed(f"ls -lR {root}/{TREE} | grep -c '^-'", str(expect.ls_files))
        self.timed(f"sha256sum {root}/{BIG} | cut -c1-64", expect.big_sha256)

    def close(self) -> None:
        """End the loop (and the sandbox); its error if it did not end well."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        code = self._proc.wait()
        self._errors.seek(0)
        errors = self._errors.read()
        self._errors.close()
        if code != 0:
            raise RuntimeError(f"{self._proc.args!r} failed ({code}): {errors[-2000:]}")

    def __enter__(self) -> Shell:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        try:
            self.close()
        except RuntimeError:
            if kind is None:  # the error that ended the block, if any, is the one to see
                raise


@contextlib.contextmanager
def plain_mount(home: Path, session: str, point: Path) -> Iterator[Path]:
    """The session mounted on the host for as long as the block runs (a fresh mount each time)."""
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run([scopefs_exe(), "--home", str(home), "mount", session, str(point)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        yield point
    finally:
        subprocess.run([scopefs_exe(), "--home", str(home), "umount", str(point)], check=False,
                       stdout=subprocess.DEVNULL)


def sandboxed(home: Path, session: str, script: str, **popen: object) -> subprocess.Popen[str]:
    """``sh -c script`` at ``/memory`` inside ``scopefs run`` (stdin and stdout as ``popen`` says)."""
    return sandboxed_argv(home, session, ["sh", "-c", script], **popen)


def sandboxed_argv(home: Path, session: str, argv: list[str], **popen: object) -> subprocess.Popen[str]:
    """``argv`` inside ``scopefs run`` of ``session``, its memory at ``/memory``."""
    return subprocess.Popen([scopefs_exe(), "--home", str(home), "run", session, "--", *argv],
                            text=True, env={**CMD_ENV, "SCOPEFS_HOME": str(home)}, **popen)  # type: ignore[call-overload]


def cold(home: Path, session: str, work: Path, point: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each cold workload on each system, ``rounds`` times, the systems taking turns; every FUSE figure on
    a fresh mount (a sandbox of its own), the page cache dropped right before the command, the mount's
    view checked after it (untimed)."""
    samples: dict[str, dict[str, list[float]]] = {s: {w: [] for w in COLD} for s in SYSTEMS}
    want, expect = expected(work), expectation(work)
    with Shell() as host:
        host.verify(str(work / "native"), expect)
        for r in range(rounds):
            for workload in COLD:
                for system in rotated(r):
                    if system == "native":
                        drop_caches()
                        seconds = host.timed(commands(str(work / "native"), COLD)[workload], want[workload])
                    elif system == "plain":
                        with plain_mount(home, session, point):
                            drop_caches()
                            seconds = host.timed(commands(str(point), COLD)[workload], want[workload])
                            host.verify(str(point), expect)
                    else:
                        with Shell(home, session) as sandbox:
                            sandbox.timed("true")  # the sandbox is up
                            drop_caches()
                            seconds = sandbox.timed(commands("/memory", COLD)[workload], want[workload])
                            sandbox.verify("/memory", expect)
                    samples[system][workload].append(seconds)
            print(f"cold round {r + 1}/{rounds}: " + ", ".join(
                f"{w} " + "/".join(f"{samples[s][w][-1]:.2f}" for s in SYSTEMS) for w in COLD), file=sys.stderr)
    return samples


def warm(home: Path, session: str, work: Path, point: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each warm workload twice per system untimed, then ``rounds`` rounds, the systems taking turns command
    by command, both mounts up throughout (an idle mount that only reads follows no commits)."""
    samples: dict[str, dict[str, list[float]]] = {s: {w: [] for w in WARM} for s in SYSTEMS}
    roots = {"native": str(work / "native"), "plain": str(point), "sandbox": "/memory"}
    want, expect = expected(work), expectation(work)
    with plain_mount(home, session, point), Shell() as host, Shell(home, session) as sandbox:
        shells = {"native": host, "plain": host, "sandbox": sandbox}
        for system in SYSTEMS:
            shells[system].verify(roots[system], expect)
        for _ in range(2):  # the first pass reads through each mount; its audit is written after it
            for system in SYSTEMS:
                for workload, cmd in commands(roots[system], WARM).items():
                    shells[system].timed(cmd, want[workload])
        for r in range(rounds):
            for workload in WARM:
                for system in rotated(r):
                    samples[system][workload].append(
                        shells[system].timed(commands(roots[system], WARM)[workload], want[workload]))
                    if system != "native":
                        time.sleep(HOLD_S + 0.1)  # the next system runs once the mount let its latency bound go
            print(f"warm round {r + 1}/{rounds}: " + ", ".join(
                f"{w} " + "/".join(f"{samples[s][w][-1]:.3f}" for s in SYSTEMS) for w in WARM), file=sys.stderr)
    return samples


def ratios(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {system: {w: statistics.median(samples[system][w]) / statistics.median(samples["native"][w])
                     for w in samples["native"]} for system in ("plain", "sandbox")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", type=Path, required=True, help="a tree fuse_bench.py built (its work directory)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold-rounds", type=int, default=3)
    args = parser.parse_args()
    work = args.reuse.resolve()
    session = json.loads((work / "manifest.json").read_text())["session_id"]
    home = work / "home"
    point = work / "mnt" / "sandbox-bench-plain"
    report: dict[str, object] = {"rounds": args.rounds, "cold_rounds": args.cold_rounds}
    parts = {"warm": warm(home, session, work, point, args.rounds)}
    if args.cold_rounds:
        parts["cold"] = cold(home, session, work, point, args.cold_rounds)
    for mode, samples in parts.items():
        medians = {s: {w: statistics.median(v) for w, v in per.items()} for s, per in samples.items()}
        report[mode] = {"samples": samples, "median_s": medians, "ratio": ratios(samples)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
