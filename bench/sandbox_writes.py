#!/usr/bin/env python3
"""Saves and ``cp -r`` at ``/memory`` inside ``scopefs run``, next to a plain mount and native disk.

The write half of issue 14's point 1 "through ``/memory`` inside
``scopefs run``" (``sandbox_reads.py`` has the reads), on the tree that
``fuse_bench.py`` built (``--reuse``):

* **saves**: ``fuse_bench.py``'s editor save (a temp file in the folder,
  renamed over the note; ``plain``, ``fsync`` or ``durable``), 1,000 per
  system and mode by default. One small program (``SAVER``, the standard
  library only) does them, run by the system's ``python3`` on the host for
  native disk and the plain mount and inside the sandbox for ``/memory``,
  and times each save itself: the sandbox's start is not counted. The
  systems take turns in blocks of half the saves, so a slow minute of the
  machine does not land on one system; every block writes a new revision
  number into each note (a save of the bytes a note holds makes no
  revision), and each block reads its saves back, untimed.
* **cp -r**: the 10,000-note tree copied into ``private/copy`` by ``cp -r``,
  timed by the shell, once per system, each mount fresh. Native disk and
  the plain mount copy from the native tree; a sandbox sees no host
  folder, so the tree is first unpacked (``tar``, untimed) into its
  ``/tmp``, a tmpfs; the native tree is read once before each copy from it:
  every source is in memory when its copy starts. The
  copy is counted and removed again, untimed.

Only one of the plain mount and the sandbox's mount is up at a time: a
mount left up would refresh its view after every commit of the other and
take CPU from it.

    .venv/bin/python bench/sandbox_writes.py --reuse bench/out/full > bench/out/sandbox-writes-1.json   # needs root
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import editor_save  # noqa: E402 - the save itself, sent as text into the sandbox
import write_read as wr  # noqa: E402 - the percentiles every bench reports
from fuse_bench import CMD_ENV, SAVE_MODES, SAVE_TARGETS, TREE, Layout, header, note_bytes, vocabulary  # noqa: E402
from sandbox_reads import SYSTEMS, plain_mount, rotated, sandboxed, sandboxed_argv  # noqa: E402

PYTHON = "/usr/bin/python3"  # the one inside the sandbox (its /usr is the host's): the same saver everywhere

# The saver: ``editor_save``'s text, then this: reads ``[relative path, hex bytes]`` lines on stdin, saves
# each, prints one line of nanoseconds per save, then checks (untimed) that every note holds its bytes and
# no temp file is left.
SAVER = Path(editor_save.__file__).read_text() + r"""
import sys, time
root, mode = sys.argv[1], sys.argv[2]
todo = [(rel, bytes.fromhex(data)) for rel, data in (line.split() for line in sys.stdin if line.strip())]
times = []
for rel, data in todo:
    start = time.perf_counter_ns()
    save(os.path.join(root, rel), data, mode)
    times.append(time.perf_counter_ns() - start)
for rel, data in todo:
    path = os.path.join(root, rel)
    with open(path, "rb") as f:
        if f.read() != data:
            sys.exit("save did not land: " + rel)
    if os.path.exists(temp_of(path)):
        sys.exit("temp file left: " + rel)
print("\n".join(map(str, times)))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def save_block(system: str, root: str, home: Path, session: str, mode: str, todo: list[tuple[str, bytes]]
               ) -> list[int]:
    """The saves of ``todo`` through ``system`` (its root: ``root``), each one's nanoseconds."""
    lines = "".join(f"{rel} {data.hex()}\n" for rel, data in todo)
    if system == "sandbox":
        proc = sandboxed_argv(home, session, [PYTHON, "-c", SAVER, "/memory", mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(lines)
        if proc.returncode != 0:
            raise RuntimeError(f"saves in the sandbox failed ({proc.returncode}): {err[-2000:]}")
    else:
        done = subprocess.run([PYTHON, "-c", SAVER, root, mode], input=lines, capture_output=True, text=True,
                              env=CMD_ENV, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"saves on {system} failed ({done.returncode}): {done.stderr[-2000:]}")
        out = done.stdout
    times = [int(v) for v in out.split()]
    if len(times) != len(todo):
        raise RuntimeError(f"{system}: {len(times)} of {len(todo)} saves reported")
    return times


def saves(work: Path, home: Path, session: str, point: Path, layout: Layout, modes: list[str], n: int, rev: int
          ) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode and system: n, total, p50, p95, mean of the saves (two blocks each, systems in turn)."""
    vocab = vocabulary()
    indices = sorted({k * layout.notes // n for k in range(n)})
    out: dict[str, dict[str, dict[str, float]]] = {}
    for m, mode in enumerate(modes):
        times: dict[str, list[int]] = {s: [] for s in SYSTEMS}
        for half in range(2):
            for system in rotated(2 * m + half):
                rev += 1
                todo = [(layout.rel(i), header(i, rev) + note_bytes(i, vocab)[len(header(i, 0)):])
                        for i in indices[half::2]]
                if system == "plain":
                    with plain_mount(home, session, point):
                        times[system] += save_block(system, str(point), home, session, mode, todo)
                else:
                    times[system] += save_block(system, str(work / "native"), home, session, mode, todo)
            log(f"saves ({mode}) block {half + 1}/2: " + ", ".join(
                f"{s} {statistics.median(times[s]) / 1e6:.2f} ms" for s in SYSTEMS if times[s]))
        out[mode] = {}
        for system, ns in times.items():
            ns.sort()
            out[mode][system] = {"n": len(ns), "total_s": sum(ns) / 1e9, "p50_ms": wr.percentile(ns, 50) / 1e6,
                                 "p95_ms": wr.percentile(ns, 95) / 1e6, "mean_ms": sum(ns) / len(ns) / 1e6}
    return out


def warm_source(source: Path) -> None:
    """Every note of ``source`` read once, untimed: a copy from disk starts from the page cache, as the
    sandbox's copy starts from its tmpfs (an earlier cold read dropped the caches)."""
    subprocess.run(f"find '{source}' -type f -exec cat {{}} + > /dev/null", shell=True, check=True, env=CMD_ENV)


def copy_on_host(source: Path, target: Path, notes: int) -> float:
    if target.exists():
        subprocess.run(["rm", "-rf", str(target)], check=True)
    warm_source(source)
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(target)], check=True, stdin=subprocess.DEVNULL, env=CMD_ENV)
    seconds = time.perf_counter() - start
    copied = sum(len(files) for _, _, files in os.walk(target))
    subprocess.run(["rm", "-rf", str(target)], check=True)
    if copied != notes:
        raise RuntimeError(f"cp -r into {target} left {copied} of {notes} notes")
    return seconds


def copy_in_sandbox(home: Path, session: str, source: Path, notes: int) -> float:
    """The tree unpacked into the sandbox's tmpfs, then ``cp -r`` into ``/memory`` timed by the shell."""
    script = ("export LC_ALL=C && rm -rf /memory/private/copy && mkdir /tmp/src && tar -xf - -C /tmp/src && "
              "s=$(date +%s%N) && cp -r /tmp/src/" + source.name + " /memory/private/copy && e=$(date +%s%N) && "
              "echo $((e - s)) && find /memory/private/copy -type f | wc -l && rm -rf /memory/private/copy")
    tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(source.parent), source.name], stdout=subprocess.PIPE)
    try:
        proc = sandboxed(home, session, script, stdin=tar.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert tar.stdout is not None
        tar.stdout.close()  # the sandbox holds the pipe now
        stdout, stderr = proc.communicate()
    finally:
        if tar.wait(timeout=60) != 0:
            raise RuntimeError("tar of the tree failed")
    if proc.returncode != 0:
        raise RuntimeError(f"cp -r in the sandbox failed ({proc.returncode}): {stderr[-2000:]}")
    out = stdout.split()
    if len(out) != 2 or int(out[1]) != notes:
        raise RuntimeError(f"cp -r into /memory printed {out!r}, expected a time and {notes} notes")
    return int(out[0]) / 1e9


def copies(work: Path, home: Path, session: str, point: Path, notes: int) -> dict[str, float]:
    source = work / "native" / TREE
    out = {"native": copy_on_host(source, work / "native" / "private" / "copy", notes)}
    log(f"cp -r native: {out['native']:.2f} s")
    with plain_mount(home, session, point):
        out["plain"] = copy_on_host(source, point / "private" / "copy", notes)
    log(f"cp -r plain mount: {out['plain']:.2f} s")
    out["sandbox"] = copy_in_sandbox(home, session, source, notes)
    log(f"cp -r sandbox: {out['sandbox']:.2f} s")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", type=Path, required=True, help="a tree fuse_bench.py built (its work directory)")
    parser.add_argument("--saves", type=int, default=1000, help="saves per system and mode (default 1000)")
    parser.add_argument("--save-modes", default=",".join(SAVE_MODES), help="comma-separated; empty: no saves")
    parser.add_argument("--no-copy", dest="copy", action="store_false", help="skip the cp -r")
    args = parser.parse_args()
    modes = [m for m in args.save_modes.split(",") if m]
    if any(m not in SAVE_MODES for m in modes):
        raise SystemExit(f"--save-modes: choose from {', '.join(SAVE_MODES)}")
    if args.saves < 2:
        raise SystemExit("--saves: at least 2 (two blocks per system)")
    work = args.reuse.resolve()
    manifest_path = work / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    session, home, point = manifest["session_id"], work / "home", work / "mnt" / "sandbox-bench-plain"
    layout = Layout(manifest["params"]["notes"], manifest["params"]["folders"])
    rev = manifest["rev"]
    manifest["rev"] = rev + 2 * len(SYSTEMS) * len(modes)  # every block's revision number, taken before it is used
    manifest_path.write_text(json.dumps(manifest, indent=1))
    report: dict[str, object] = {"saves_per_mode": args.saves, "modes": modes}
    found = saves(work, home, session, point, layout, modes, args.saves, rev)
    report["saves"] = found
    report["saves_ratio"] = {mode: {s: per[s]["total_s"] / per["native"]["total_s"] for s in ("plain", "sandbox")}
                             for mode, per in found.items()}
    report["save_targets"] = {mode: SAVE_TARGETS[mode] for mode in modes}
    if args.copy:
        copied = copies(work, home, session, point, layout.notes)
        report["copy_s"] = copied
        report["copy_ratio"] = {s: copied[s] / copied["native"] for s in ("plain", "sandbox")}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
