#!/usr/bin/env python3
"""A cold ``grep -r`` through a fresh mount of the FUSE benchmark's tree, next to native, round by round.

For A/B comparisons of the cold read path that take a minute rather than a
whole ``fuse_bench.py`` run: each round mounts the session of a kept
``fuse_bench.py --reuse DIR`` workdir, drops the page cache, greps the
mount, drops it again and greps the native copy.

    .venv/bin/python bench/cold_grep.py bench/out/full --rounds 4   # needs root and fuse3

The mount server inherits the environment, so ``PYTHONPATH=<a git worktree>``
in front runs another commit's server against the same tree, for a
worktree of ``10955bb`` or later, whose servers start with ``python -P``
in ``/``. An older commit's server puts the working directory first on
its import path: run this from that worktree's folder, or the server is
the code of whatever folder the command was started in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scopefs.catalog.home import Home
from scopefs.sandbox.mounts import start, stop

CMD_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}


def drop_caches() -> None:
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=True)
    time.sleep(0.5)


def grep(root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["grep", "-r", "-c", "zyzzogeton", str(root)], stdout=subprocess.DEVNULL, env=CMD_ENV, check=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, help="a fuse_bench.py --reuse workdir (bench/out/full)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    session = json.loads((args.workdir / "manifest.json").read_text())["session_id"]
    native = args.workdir / "native" / "private" / "bench"
    home = Home.open(args.workdir / "home")
    try:
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="cold-grep-") as point:
                start(home, session, point)
                try:
                    time.sleep(1)
                    drop_caches()
                    mounted = grep(Path(point) / "private" / "bench")
                finally:
                    stop(home, point)  # what the mount does after its reads (the audit) is not native's time
                drop_caches()
                direct = grep(native)
                print(f"cold grep -r: mount {mounted:.3f} s, native {direct:.3f} s, {mounted / direct:.2f}×",
                      flush=True)
    finally:
        home.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
