#!/usr/bin/env python3
"""What one FUSE request costs a warm ``grep -r``: a trivial in-memory server in four modes.

The decision behind ``vendor/pyfuse3`` and ``vfs.fs`` (no open, no opendir,
polling for the next request), measured: 10,000 notes of 460 bytes in 100
folders, served from memory by a pyfuse3 server that does nothing else, and
the same tree on the disk. Each mode is a fresh mount, warmed twice, then
timed five times (best of five, seconds).

* ``stock``: OPEN, FLUSH and RELEASE per file, as pyfuse3 does by default;
* ``no-open``: OPEN answers ENOSYS (reads by inode); FLUSH still comes;
* ``no-open+poll``: the same, the server polling 200 us for the next request;
* ``no-open+no-flush``: FLUSH answers ENOSYS too: no request per file at all.

    .venv/bin/python bench/request_cost.py            # needs root and fuse3 (about a minute)

A server: ``python bench/request_cost.py --serve MODE MOUNTPOINT``.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyfuse3
import trio

NOTES, FOLDERS = 10_000, 100
MODES = ("stock", "no-open", "no-open+poll", "no-open+no-flush")


def content(folder: int, note: int) -> bytes:
    return (b"line %d %d hello world\n" % (folder, note)) * 20


class Trivial(pyfuse3.Operations):
    enable_atomic_o_trunc = False

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.inode_requests = mode != "stock"
        self.files: dict[int, bytes] = {}
        self.dirs: dict[int, list[tuple[bytes, int]]] = {pyfuse3.ROOT_INODE: []}
        self.names: dict[tuple[int, bytes], int] = {}
        ino = pyfuse3.ROOT_INODE + 1
        for d in range(FOLDERS):
            folder, ino = ino, ino + 1
            self.dirs[pyfuse3.ROOT_INODE].append((b"d%d" % d, folder))
            self.dirs[folder] = []
            for n in range(NOTES // FOLDERS):
                self.files[ino] = content(d, n)
                self.dirs[folder].append((b"n%d.md" % n, ino))
                ino += 1
        for parent, children in self.dirs.items():
            for name, child in children:
                self.names[(parent, name)] = child

    def attr(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 30
        if ino in self.dirs:
            a.st_mode = stat.S_IFDIR | 0o755
        else:
            a.st_mode = stat.S_IFREG | 0o644
            a.st_size = len(self.files[ino])
        return a

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self.attr(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        ino = self.names.get((parent_inode, name))
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.attr(ino)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if self.mode != "stock":
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken, inode: int = 0,
                      ctx: pyfuse3.RequestContext | None = None) -> None:
        children = self.dirs[fh or inode]
        for index in range(start_id, len(children)):
            name, ino = children[index]
            if not pyfuse3.readdir_reply(token, name, self.attr(ino), index + 1):
                return

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if self.mode != "stock":
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int, inode: int = 0,
                   ctx: pyfuse3.RequestContext | None = None) -> bytes:
        return self.files[fh or inode][off:off + size]

    async def flush(self, fh: int, inode: int = 0, ctx: pyfuse3.RequestContext | None = None) -> None:
        if self.mode == "no-open+no-flush":
            raise pyfuse3.FUSEError(errno.ENOSYS)

    async def release(self, fh: int, inode: int = 0) -> None:
        pass

    async def releasedir(self, fh: int, inode: int = 0) -> None:
        pass


def serve(mode: str, mountpoint: str) -> None:
    pyfuse3.init(Trivial(mode), mountpoint, {"fsname=trivial", "default_permissions"})
    try:
        trio.run(lambda: pyfuse3.main(poll_ns=200_000 if mode == "no-open+poll" else 0))
    finally:
        pyfuse3.close()


def grep_seconds(root: Path) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(["grep", "-r", "zzz", str(root)], stdout=subprocess.DEVNULL, check=False)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3])
        return 0
    with tempfile.TemporaryDirectory(prefix="request-cost-") as work:
        native = Path(work) / "native"
        for d in range(FOLDERS):
            (native / f"d{d}").mkdir(parents=True)
            for n in range(NOTES // FOLDERS):
                (native / f"d{d}" / f"n{n}.md").write_bytes(content(d, n))
        for _ in range(2):
            grep_seconds(native)
        base = grep_seconds(native)
        print(f"{'native':18} {base:7.3f} s")
        for mode in MODES:
            point = Path(work) / mode
            point.mkdir()
            server = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(point)])
            try:
                deadline = time.monotonic() + 20
                while not os.path.ismount(point):
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit(f"{mode}: no mount")
                    time.sleep(0.05)
                for _ in range(2):
                    subprocess.run(["grep", "-r", "zzz", str(point)], stdout=subprocess.DEVNULL, check=False)
                took = grep_seconds(point)
                print(f"{mode:18} {took:7.3f} s  {took / base:5.2f}x native")
            finally:
                subprocess.run(["fusermount3", "-u", str(point)], check=False)
                server.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
