#!/usr/bin/env python3
"""What-if experiments for RESULTS.md: the scopefs server with one cost taken out.

Nothing here changes scopefs. Each variant is the unmodified server with
one method swapped at start-up (monkeypatched in its own process). The
point is to rank the suggested speed-ups by measured gain instead of by
guesswork. None of these variants is a proposal as written: each one drops
something scopefs does on purpose (see RESULTS.md for the safe form of
each).

* ``audit-once``: a revision's read exposure is audited once per mount,
  not once per 1 s batch window (``_exposed`` is no longer cleared at each
  flush).
* ``noflush``: ``flush`` answers ENOSYS, so the kernel stops sending FLUSH
  at all. This is what a ``noflush`` open flag on read-only handles would
  save. It breaks commit-on-close, which is fine for the read-only grep it
  is used with here.
* ``fdcache``: a verified artifact's fd is kept, and later opens ``dup`` it
  (after the same stamp check) instead of resolving the locator again with
  ``openat2``.
* ``audit-off``: no read exposure is recorded at all.
* ``chunk64k``: hash with 64 KiB reads instead of 1 MiB ones.
* ``all``: ``audit-once``, ``noflush`` and ``fdcache`` together.
* Variants can be combined with ``+``.

All of them run on a workdir built by ``fuse_bench.py --reuse DIR``:

    .venv/bin/python bench/fuse_whatif.py warm 7 bench/out/full     # warm grep -r, all variants mounted at once
    .venv/bin/python bench/fuse_whatif.py cold 4 bench/out/full stock audit-off chunk64k
    .venv/bin/python bench/fuse_whatif.py save bench/out/full       # in-process split of one save's view update
"""

from __future__ import annotations

import errno
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
WARM_VARIANTS = ["stock", "audit-once", "noflush", "fdcache", "all"]
NEEDLE = "zyzzogeton"


def patch(variant: str) -> None:
    import pyfuse3

    from scopefs.catalog import digests
    from scopefs.vfs import content
    from scopefs.vfs import fs as vfs_fs
    from scopefs.vfs.follow import Follow
    from scopefs.vfs.reads import Reads

    parts = {"audit-once", "noflush", "fdcache"} if variant == "all" else set(variant.split("+")) - {"stock"}
    if "audit-off" in parts:
        Reads.expose = lambda self, note: None
    if "audit-once" in parts:
        flush_audit = Follow.flush_audit

        async def audit_once(self, **options):  # type: ignore[no-untyped-def]
            keep = set(self._reads._exposed)
            await flush_audit(self, **options)
            self._reads._exposed = keep
        Follow.flush_audit = audit_once
    if "noflush" in parts:
        async def no_flush(self, fh):  # type: ignore[no-untyped-def]
            raise pyfuse3.FUSEError(errno.ENOSYS)
        vfs_fs.ScopeFS.flush = no_flush
    if "fdcache" in parts:
        open_ = content.Artifacts.open
        cache: dict[str, tuple[int, content.Stamp]] = {}

        def cached_open(self, note, **options):  # type: ignore[no-untyped-def]
            hit = cache.get(note.revision_id)
            if hit is not None:
                fd = os.dup(hit[0])
                if content.Stamp.of(fd) == hit[1]:
                    return fd, hit[1], None
                os.close(fd)
            fd, stamp, verified = open_(self, note, **options)
            if note.revision_id in self._verified:
                cache[note.revision_id] = (os.dup(fd), stamp)
            return fd, stamp, verified
        content.Artifacts.open = cached_open
    if "chunk64k" in parts:
        digests.HASH_CHUNK = 1 << 16
    unknown = parts - {"audit-off", "audit-once", "noflush", "fdcache", "chunk64k"}
    if unknown:
        sys.exit(f"unknown variant part(s): {sorted(unknown)}")


def serve(variant: str, home: str, session_id: str, mountpoint: str) -> None:
    patch(variant)
    from scopefs.catalog.home import Home
    from scopefs.vfs.server import serve as serve_view

    serve_view(Home.open(Path(home)), session_id, mountpoint, on_ready=lambda: print("ready", flush=True))


def sh(cmd: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd!r}: {proc.stderr.decode()[-300:]}")
    return time.perf_counter() - start, proc.stdout.decode().strip()


class Servers:
    """Started servers and their mount points; ``stop`` unmounts everything it started."""

    def __init__(self, work: Path) -> None:
        self.work = work
        manifest = json.loads((work / "manifest.json").read_text())
        self.session_id, self.matches = manifest["session_id"], str(manifest["matches"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.points: dict[str, Path] = {}

    def start(self, variant: str) -> Path:
        point = self.work / "mnt-whatif" / variant
        point.mkdir(parents=True, exist_ok=True)
        if variant == "passthrough":
            proc = subprocess.Popen([sys.executable, str(BENCH_DIR / "passthrough.py"), str(self.work / "ptsrc"),
                                     str(point)], stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 30
            while not os.path.ismount(point):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the passthrough did not mount")
                time.sleep(0.02)
        else:
            proc = subprocess.Popen([sys.executable, __file__, "serve", variant, str(self.work / "home"),
                                     self.session_id, str(point)], stdout=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"variant {variant} did not mount")
        self.procs[variant], self.points[variant] = proc, point
        return point

    def stop(self, variant: str) -> None:
        point, proc = self.points.pop(variant, None), self.procs.pop(variant, None)
        if point is not None:
            subprocess.run(["fusermount3", "-u", str(point)], capture_output=True, check=False)
            if os.path.ismount(point):
                subprocess.run(["fusermount3", "-u", "-z", str(point)], capture_output=True, check=False)
        if proc is not None:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for variant in list(self.points):
            self.stop(variant)

    def grep(self, point: Path) -> float:
        seconds, out = sh(f"grep -r {NEEDLE} {point}/private/bench | wc -l")
        if out != self.matches:
            raise RuntimeError(f"grep on {point} printed {out}, expected {self.matches}")
        return seconds


def report(times: dict[str, list[float]]) -> None:
    base = statistics.median(times["stock"]) if "stock" in times else None
    for variant, values in times.items():
        med = statistics.median(values)
        change = f"  {100 * (med / base - 1):+.0f}% vs stock" if base else ""
        print(f"{variant:22s} median {med:.3f} s  min {min(values):.3f}{change}  all {[round(v, 2) for v in values]}")


def warm(rounds: int, work: Path, variants: list[str]) -> None:
    """Every variant and the passthrough mounted at once; warm grep -r, order rotating per round."""
    servers = Servers(work)
    names = (variants or WARM_VARIANTS) + ["passthrough"]
    try:
        for name in names:
            servers.start(name)
        for name in names:
            for _ in range(2):
                servers.grep(servers.points[name])
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(servers.grep(servers.points[name]))
            print(f"round {r + 1}: " + " ".join(f"{n}={times[n][-1]:.2f}" for n in names), flush=True)
        report(times)
    finally:
        servers.stop_all()


def cold(rounds: int, work: Path, variants: list[str]) -> None:
    """One variant at a time: fresh mount, caches dropped, grep -r, unmount."""
    servers = Servers(work)
    names = (variants or ["stock", "audit-off"]) + ["passthrough"]
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                point = servers.start(name)
                try:
                    os.sync()
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                    times[name].append(servers.grep(point))
                finally:
                    servers.stop(name)
            print(f"round {r + 1}: " + " ".join(f"{n}={times[n][-1]:.2f}" for n in names), flush=True)
        report(times)
    finally:
        servers.stop_all()


def save(work: Path) -> None:
    """One save's commit, then the view update the server does after it, timed in process."""
    from scopefs.catalog.home import Home
    from scopefs.catalog.visible import build, refresh
    from scopefs.vfs.layers import Layers
    from scopefs.vfs.names import skeleton
    from scopefs.writer.transaction import write_note

    session_id = json.loads((work / "manifest.json").read_text())["session_id"]
    home = Home.open(work / "home")
    try:
        ns = Layers(build(home, session_id))
        rel = "private/bench/d07/n0700.md"
        data = (work / "native" / rel).read_bytes()
        t_write, t_refresh, t_apply = [], [], []
        for k in range(30):
            start = time.perf_counter()
            write_note(home, session_id, rel, data[:-2] + bytes([65 + k % 26]) + b"\n")
            t_write.append(time.perf_counter() - start)
            start = time.perf_counter()
            new = refresh(home, ns.view)
            t_refresh.append(time.perf_counter() - start)
            start = time.perf_counter()
            ns.apply(new)
            t_apply.append(time.perf_counter() - start)
        siblings = ns.names(("private", "bench", "d07"))
        start = time.perf_counter()
        for _ in range(20):
            mark = skeleton(".n0700.md.tmp")
            any(o != ".n0700.md.tmp" and skeleton(o) == mark for o in siblings)
        confusable_ms = (time.perf_counter() - start) / 20 * 1e3
        write_note(home, session_id, rel, data)  # back to the bytes the other two systems hold

        def med(v: list[float]) -> float:
            return statistics.median(v) * 1e3

        print(f"notes in view {len(ns.view.notes)}; per save, median ms: write_note {med(t_write):.2f}, "
              f"refresh {med(t_refresh):.2f}, Layers.apply {med(t_apply):.2f}, "
              f"confusable check over {len(siblings)} siblings {confusable_ms:.2f}")
    finally:
        home.close()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, *rest = argv
    if cmd == "serve":
        serve(*rest)
        return 0

    def on_signal(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if cmd == "warm":
        warm(int(rest[0]), Path(rest[1]).resolve(), rest[2:])
    elif cmd == "cold":
        cold(int(rest[0]), Path(rest[1]).resolve(), rest[2:])
    elif cmd == "save":
        save(Path(rest[0]).resolve())
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
