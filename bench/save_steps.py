#!/usr/bin/env python3
"""Where an editor's save through a mount spends its time, system call by system call.

``fuse_bench.py`` times whole saves, interleaved with native disk and the
passthrough; this times each step of the plain save (create the temp
file, write it, close it, rename it over the note) on a view that is
already mounted, so a change to one step shows in that step. Each save
writes new bytes (a random salt per run): a save of bytes equal to the
note's makes no revision and would time nothing.

The content is ``fuse_bench.py``'s (1-4 KiB of prose from a vocabulary of
about 3,000 words) unless ``--content synthetic`` (300 tokens from 997):
what a save costs depends on it, since keeping the search index in step
(chunks, FTS5 rows, the embedding) grows with the words a note holds.

    .venv/bin/scopefs --home bench/out/full/home mount SESSION /tmp/bm     # the session of bench/out/full/manifest.json
    .venv/bin/python bench/save_steps.py /tmp/bm --saves 300
    .venv/bin/scopefs --home bench/out/full/home umount /tmp/bm

The tree is ``fuse_bench.py``'s (``private/bench/dNN/nNNNN.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuse_bench  # noqa: E402 - the tree's content, from the script next to this one

STEPS = ("create", "write", "close", "rename", "total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the mounted view (or a native copy of the tree, for comparison)")
    parser.add_argument("--saves", type=int, default=300)
    parser.add_argument("--notes", type=int, default=10_000, help="notes in the tree (default 10000)")
    parser.add_argument("--content", choices=("realistic", "synthetic"), default="realistic")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    salt = os.urandom(4).hex()
    vocab = fuse_bench.vocabulary()

    def content(i: int, k: int) -> bytes:
        if args.content == "synthetic":
            return (f"# note {i} save {k} {salt}\n" + " ".join(f"word{(i * 7 + j) % 997}" for j in range(300))).encode()
        return f"# note {i} save {k} {salt}\n".encode() + fuse_bench.note_bytes(i, vocab)
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    for k in range(args.saves):
        i = (k * 37) % args.notes
        folder = f"{args.root}/private/bench/d{i // 100:02d}"
        name = f"n{i:04d}.md"
        data = content(i, k)
        t0 = time.perf_counter_ns()
        fd = os.open(f"{folder}/.{name}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        t1 = time.perf_counter_ns()
        os.write(fd, data)
        t2 = time.perf_counter_ns()
        os.close(fd)
        t3 = time.perf_counter_ns()
        os.rename(f"{folder}/.{name}.tmp", f"{folder}/{name}")
        t4 = time.perf_counter_ns()
        for step, start, end in zip(STEPS, (t0, t1, t2, t3, t0), (t1, t2, t3, t4, t4), strict=True):
            times[step].append((end - start) / 1e6)
    report = {step: {"p50_ms": statistics.median(v), "mean_ms": statistics.mean(v),
                     "p95_ms": sorted(v)[int(len(v) * 0.95)]} for step, v in times.items()}
    if args.json:
        json.dump({"saves": args.saves, "content": args.content, "steps": report}, sys.stdout, indent=1)
        print()
    else:
        for step, figures in report.items():
            print(f"{step:7s} p50 {figures['p50_ms']:6.2f} ms   mean {figures['mean_ms']:6.2f}   "
                  f"p95 {figures['p95_ms']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
