#!/usr/bin/env python3
"""The warm read workloads at ``/memory`` inside ``scopefs run``, next to a plain mount and native disk.

Issue 14, point 1 asks for every figure "through a plain mount and
through ``/memory`` inside ``scopefs run``". A sandbox's mount answers only
admitted processes (``vfs.gate``), so its requests cost a little more than
a plain mount's; the kernel's caches answer both alike. This runs the
same commands as ``fuse_bench.py`` on the tree it built (``--reuse``):

* native: ``<tree>/native``;
* plain: ``scopefs mount`` of the bench session;
* sandbox: ``scopefs run`` of the same session, the commands timed inside
  by the shell (``date +%s%N``), so the sandbox's start is not counted.

Each workload is run once to warm the caches, then ``--rounds`` times;
medians are reported, as ratios to native.

    .venv/bin/python bench/sandbox_reads.py --reuse bench/out/full > bench/out/sandbox-reads-1.json   # needs root
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from fuse_bench import CMD_ENV, TREE, WORKLOADS, scopefs_exe  # noqa: E402

WARM = ("grep -r", "rg", "find", "ls -lR")


def timed(cmd: str) -> float:
    started = time.perf_counter()
    subprocess.run(["sh", "-c", cmd], env=CMD_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def in_sandbox(home: Path, session: str, commands: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Each command once to warm up, then ``rounds`` times, timed by the shell inside one sandbox."""
    script = []
    for name, cmd in commands.items():
        script.append(f"{cmd} >/dev/null")
        for _ in range(rounds):
            script.append(f"s=$(date +%s%N); {cmd} >/dev/null; e=$(date +%s%N); echo \"{name}\t$((e - s))\"")
    done = subprocess.run([scopefs_exe(), "--home", str(home), "run", session, "--", "sh", "-c", "\n".join(script)],
                          capture_output=True, text=True, env={**CMD_ENV, "SCOPEFS_HOME": str(home)}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scopefs run failed ({done.returncode}): {done.stderr[-2000:]}")
    out: dict[str, list[float]] = {name: [] for name in commands}
    for line in done.stdout.splitlines():
        name, _, ns = line.rpartition("\t")
        if name in out:
            out[name].append(int(ns) / 1e9)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", type=Path, required=True, help="a tree fuse_bench.py built (its work directory)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = args.reuse.resolve()
    session = json.loads((work / "manifest.json").read_text())["session_id"]
    home = work / "home"
    point = work / "mnt" / "sandbox-bench-plain"
    point.mkdir(parents=True, exist_ok=True)

    def commands(root: str) -> dict[str, str]:
        return {w: WORKLOADS[w].format(dir=f"{root}/{TREE}", big=f"{root}/private/big.bin") for w in WARM}

    samples: dict[str, dict[str, list[float]]] = {"native": {}, "plain": {}}
    subprocess.run([scopefs_exe(), "--home", str(home), "mount", session, str(point)], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        for system, root in (("native", str(work / "native")), ("plain", str(point))):
            for name, cmd in commands(root).items():
                timed(cmd)
                samples[system][name] = [timed(cmd) for _ in range(args.rounds)]
    finally:
        subprocess.run([scopefs_exe(), "--home", str(home), "umount", str(point)], check=False,
                       stdout=subprocess.DEVNULL)
    samples["sandbox"] = in_sandbox(home, session, commands("/memory"), args.rounds)
    report: dict[str, object] = {"rounds": args.rounds, "samples": samples, "median_s": {}, "ratio": {}}
    for system, per in samples.items():
        report["median_s"][system] = {w: statistics.median(v) for w, v in per.items()}  # type: ignore[index]
    for system in ("plain", "sandbox"):
        report["ratio"][system] = {  # type: ignore[index]
            w: statistics.median(samples[system][w]) / statistics.median(samples["native"][w]) for w in WARM}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
