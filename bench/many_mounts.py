#!/usr/bin/env python3
"""Many session mounts at once: memory per idle mount, and how a woken one answers (issue 14, point 6).

``--mounts`` people, each with a verified DM session and ``--notes`` notes in
their private store, each session mounted (``scopefs.sandbox.mounts.start``,
what ``scopefs mount`` runs). Then:

* idle RSS of every mount server (``/proc/PID/status``: VmRSS) and its
  proportional share (``smaps_rollup``: Pss, shared pages counted once
  over all processes), after ``--settle`` seconds with nothing asked of
  them, and the CPU all of them used meanwhile (``/proc/PID/stat``);
* the CPU the other mounts spend when one note is read through one mount
  (its read audit is a commit to ``state.sqlite``, which wakes them all);
* woken in turn: for each mount, a cold ``grep -r`` over its notes, a
  second, warm one, and a third (``warm again``), timed, next to the same
  greps over a native copy of the same notes. The first warm one still
  pays a ``GETATTR`` per note: the kernel marks a file's access time stale
  after each ``READ`` it sends, and ``grep``'s ``fstat`` then asks the
  server once; the third is what a woken mount answers from then on;
* RSS again after that.

    .venv/bin/python bench/many_mounts.py --json > bench/out/many-mounts.json   # needs root, fuse3

Every mount is unmounted on the way out.
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

from scopefs.catalog import identity
from scopefs.catalog.agents import add_agent
from scopefs.catalog.home import Home
from scopefs.catalog.sessions import DirectMessage, open_session
from scopefs.sandbox.mounts import MountRecord, start, stop
from scopefs.writer.transaction import write_note

AGENT, CHANNEL, ACCOUNT = "main", "telegram", "bench-bot"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of_a_wake(records: list[MountRecord], settle: float, reads: int = 5) -> float:
    """CPU milliseconds each of the other mounts spends, over the 3 s after one note is read through
    one mount, above what it spends idle: the read's audit batch is a commit to ``state.sqlite``,
    and every mount wakes on every commit there (``vfs.watch``). The median of ``reads`` reads."""
    others = records[1:]
    before = sum(cpu_s(r.pid) for r in others)
    time.sleep(settle)
    idle_ms = (sum(cpu_s(r.pid) for r in others) - before) * 1000 / len(others) / settle
    spent = []
    for n in range(reads):
        before = sum(cpu_s(r.pid) for r in others)
        (Path(records[0].mountpoint) / "private" / "notes" / f"n{n:03d}.md").read_bytes()
        time.sleep(3)
        spent.append((sum(cpu_s(r.pid) for r in others) - before) * 1000 / len(others) - 3 * idle_ms)
    return statistics.median(spent)


def timed_grep(root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["grep", "-r", "-c", "needle", str(root)], stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"min": ordered[0], "p50": statistics.median(ordered), "p95": ordered[int(0.95 * (len(ordered) - 1))],
            "max": ordered[-1], "total": sum(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mounts", type=int, default=100)
    parser.add_argument("--notes", type=int, default=50, help="notes per person (default 50)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds idle before measuring (default 10)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="many-mounts-"))
    home, _ = Home.init(work / "home")
    add_agent(home, AGENT)
    state = home.state()
    sessions = []
    for i in range(args.mounts):
        principal = identity.add_principal(state, f"Person {i}", "human")
        identity.bind(state, home.hmac_key(), principal, CHANNEL, ACCOUNT, str(700_000 + i))
        session = open_session(home, AGENT, DirectMessage(CHANNEL, ACCOUNT, str(700_000 + i))).session_id
        native = work / "native" / f"m{i:03d}" / "private" / "notes"
        native.mkdir(parents=True)
        for n in range(args.notes):
            data = (f"note {n} of person {i}\n" + ("needle\n" if n % 10 == 0 else "") + "x" * 900 + "\n").encode()
            write_note(home, session, f"private/notes/n{n:03d}.md", data)
            (native / f"n{n:03d}.md").write_bytes(data)
        sessions.append(session)
    records = []
    try:
        started = time.perf_counter()
        for i, session in enumerate(sessions):
            point = work / "mnt" / f"m{i:03d}"
            point.mkdir(parents=True)
            records.append(start(home, session, str(point)))
        mount_s = time.perf_counter() - started
        time.sleep(args.settle)
        cpu_before = sum(cpu_s(r.pid) for r in records)
        time.sleep(args.settle)
        idle_cpu = (sum(cpu_s(r.pid) for r in records) - cpu_before) / args.settle
        idle = [rss_mib(r.pid) for r in records]
        idle_pss = [pss_mib(r.pid) for r in records]
        wake_cpu = cpu_of_a_wake(records, args.settle)
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
        cold, warm, again, native_cold, native_warm = [], [], [], [], []
        for i, record in enumerate(records):
            cold.append(timed_grep(Path(record.mountpoint)))
            warm.append(timed_grep(Path(record.mountpoint)))
            again.append(timed_grep(Path(record.mountpoint)))
            native_cold.append(timed_grep(work / "native" / f"m{i:03d}"))
            native_warm.append(timed_grep(work / "native" / f"m{i:03d}"))
        time.sleep(args.settle)
        after = [rss_mib(r.pid) for r in records]
        report = {"mounts": args.mounts, "notes_per_mount": args.notes, "mount_all_s": mount_s,
                  "idle_cpu_share": idle_cpu, "idle_rss_mib": summary(idle), "idle_pss_mib": summary(idle_pss),
                  "wake_cpu_ms_per_mount": wake_cpu,
                  "rss_after_reads_mib": summary(after),
                  "grep_cold_s": summary(cold), "grep_warm_s": summary(warm), "grep_warm_again_s": summary(again),
                  "native_grep_cold_s": summary(native_cold), "native_grep_warm_s": summary(native_warm),
                  "warm_ratio_p50": statistics.median(warm) / statistics.median(native_warm),
                  "warm_again_ratio_p50": statistics.median(again) / statistics.median(native_warm),
                  "cold_ratio_p50": statistics.median(cold) / statistics.median(native_cold)}
    finally:
        for record in records:
            stop(home, record.mountpoint)
        home.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
