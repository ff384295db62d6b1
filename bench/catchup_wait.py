#!/usr/bin/env python3
"""How long a save waits behind the search index's catch-up after a burst of new notes.

A mount indexes the notes saved through it once no save came for
``vfs.owed.INDEX_IDLE_S``, ``INDEX_STEP`` of them per catalog call; a save
that arrives meanwhile waits for the step under way. This copies 100 notes
of ``fuse_bench.py``'s tree into the mount (the index's debt), waits for
the catch-up to begin, then saves (appends to) one of them every 0.7 s, 8
times, over 4 bursts, and prints the saves' times.

    .venv/bin/scopefs --home bench/out/full/home mount SESSION /tmp/bm
    mkdir -p /tmp/cpsrc && cp -r bench/out/full/native/private/bench/d0[0-7] /tmp/cpsrc/
    .venv/bin/python bench/catchup_wait.py /tmp/bm
    fusermount3 -u /tmp/bm
"""
import os
import shutil
import statistics
import sys
import time

mnt = sys.argv[1]
src = sys.argv[2] if len(sys.argv) > 2 else "/tmp/cpsrc"
waits = []
for burst in range(4):
    target = f"{mnt}/private/burst{os.getpid()}_{burst}"
    shutil.copytree(f"{src}/d0{burst}", target)  # 100 new notes: the index's debt
    time.sleep(0.55)  # the catch-up may begin (INDEX_IDLE_S = 0.5)
    for i in range(8):
        time.sleep(0.7)  # each save comes once the index may be catching up again
        path = f"{target}/n00{i:02d}.md"
        began = time.perf_counter()
        with open(path, "ab") as f:
            f.write(b"one more line\n")
        waits.append((time.perf_counter() - began) * 1000)
waits.sort()
print(f"saves {len(waits)}: p50 {statistics.median(waits):.2f} ms, p90 {waits[int(len(waits) * 0.9)]:.2f} ms,"
      f" max {waits[-1]:.2f} ms")
