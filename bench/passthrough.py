#!/usr/bin/env python3
"""A minimal pyfuse3 passthrough filesystem: the baseline of bench/fuse_bench.py.

This is what any Python FUSE project starts from, and nothing more: every
request is answered by the same system call on a real directory, on the
trio thread, with no policy, no catalog and no verification. It sets the
cache knobs the way a reasonable implementation does (entry and attribute
timeouts of 1 s, ``keep_cache`` on every open) and is mounted with the
options scopefs uses (``scopefs.vfs.server.MOUNT_OPTIONS``, with its own fsname and
subtype), so that the difference between it and scopefs is what scopefs
does per request, not how the kernel was told to cache.

Inode numbers are this mount's own (a counter per path), so the root is
``pyfuse3.ROOT_INODE`` and nothing collides with the source's numbers.

    .venv/bin/python bench/passthrough.py SOURCE MOUNTPOINT    # foreground
    fusermount3 -u MOUNTPOINT                                  # stops it
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys

import pyfuse3
import trio

TIMEOUT_S = 1.0
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
# The same as scopefs.vfs.server.MOUNT_OPTIONS, but naming this filesystem. Kept as a
# literal so this file runs without the project on sys.path; fuse_bench.py
# checks it against the real set before mounting.
MOUNT_OPTIONS = frozenset({"fsname=passthrough", "subtype=passthrough", "default_permissions", "nosuid",
                           "nodev", "noexec"})


class Passthrough(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, source: str) -> None:
        super().__init__()
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}
        self.inodes: dict[str, int] = {source: pyfuse3.ROOT_INODE}
        self.lookups: dict[int, int] = {pyfuse3.ROOT_INODE: 1}
        self._next = pyfuse3.ROOT_INODE + 1
        self.dirs: dict[int, tuple[str, list[tuple[bytes, os.stat_result]]]] = {}  # handle -> path, entries
        self._next_dh = 1

    # -- inode bookkeeping -------------------------------------------------

    def _path(self, ino: int) -> str:
        try:
            return self.paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _ino(self, path: str) -> int:
        ino = self.inodes.get(path)
        if ino is None:
            ino, self._next = self._next, self._next + 1
            self.inodes[path], self.paths[ino] = ino, path
        return ino

    def _remember(self, path: str) -> int:
        ino = self._ino(path)
        self.lookups[ino] = self.lookups.get(ino, 0) + 1
        return ino

    def _attr(self, ino: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = attr.attr_timeout = TIMEOUT_S
        attr.st_mode, attr.st_nlink = st.st_mode, st.st_nlink
        attr.st_uid, attr.st_gid, attr.st_rdev = st.st_uid, st.st_gid, st.st_rdev
        attr.st_size, attr.st_blksize, attr.st_blocks = st.st_size, st.st_blksize, st.st_blocks
        attr.st_atime_ns, attr.st_mtime_ns, attr.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        return attr

    @staticmethod
    def _call(fn, *args):  # type: ignore[no-untyped-def]
        try:
            return fn(*args)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    # -- names and attributes ----------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
                     ) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        st = self._call(os.lstat, path)
        return self._attr(self._remember(path), st)

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for ino, count in inode_list:
            if ino == pyfuse3.ROOT_INODE:
                continue
            left = self.lookups.get(ino, 0) - count
            if left > 0:
                self.lookups[ino] = left
                continue
            self.lookups.pop(ino, None)
            path = self.paths.pop(ino, None)
            if path is not None and self.inodes.get(path) == ino:
                del self.inodes[path]

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self._attr(inode, self._call(os.lstat, self._path(inode)))

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        if fields.update_size:
            self._call(os.ftruncate, fh, attr.st_size) if fh is not None else self._call(os.truncate, path,
                                                                                         attr.st_size)
        if fields.update_mode:
            self._call(os.chmod, path, stat.S_IMODE(attr.st_mode))
        if fields.update_atime or fields.update_mtime:
            st = self._call(os.lstat, path)
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            self._call(lambda: os.utime(path, ns=(atime, mtime), follow_symlinks=False))
        return self._attr(inode, self._call(os.lstat, path))

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = self._call(os.statvfs, self.paths[pyfuse3.ROOT_INODE])
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                     "f_favail", "f_namemax"):
            setattr(data, name, getattr(st, name))
        return data

    # -- directories -------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        path = self._path(inode)
        entries = []
        with self._call(os.scandir, path) as it:
            for entry in it:
                try:
                    entries.append((os.fsencode(entry.name), entry.stat(follow_symlinks=False)))
                except OSError:
                    continue  # gone meanwhile
        entries.sort(key=lambda item: item[0])
        dh, self._next_dh = self._next_dh, self._next_dh + 1
        self.dirs[dh] = (path, entries)
        return dh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        base, entries = self.dirs[fh]
        for index in range(start_id, len(entries)):
            name, st = entries[index]
            ino = self._ino(os.path.join(base, os.fsdecode(name)))
            if not pyfuse3.readdir_reply(token, name, self._attr(ino, st), index + 1):
                return
            self.lookups[ino] = self.lookups.get(ino, 0) + 1  # readdirplus counts as a lookup

    async def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
                    ) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        self._call(os.mkdir, path, mode)
        return self._attr(self._remember(path), self._call(os.lstat, path))

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._call(os.rmdir, os.path.join(self._path(parent_inode), os.fsdecode(name)))

    # -- files -------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        fd = self._call(os.open, self._path(inode), flags & ~os.O_CREAT)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = os.path.join(self._path(parent_inode), os.fsdecode(name))
        fd = self._call(os.open, path, flags | os.O_CREAT | os.O_TRUNC, mode)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True), self._attr(self._remember(path), self._call(os.fstat, fd))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self._call(os.pread, fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return self._call(os.pwrite, fh, buf, off)

    async def flush(self, fh: int) -> None:
        self._call(lambda: os.close(os.dup(fh)))  # what close(2) would report, as libfuse's passthrough does

    async def fsync(self, fh: int, datasync: bool) -> None:
        self._call(os.fdatasync if datasync else os.fsync, fh)

    async def release(self, fh: int) -> None:
        os.close(fh)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._call(os.unlink, os.path.join(self._path(parent_inode), os.fsdecode(name)))

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags & RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = os.path.join(self._path(parent_inode_old), os.fsdecode(name_old))
        new = os.path.join(self._path(parent_inode_new), os.fsdecode(name_new))
        if flags & RENAME_NOREPLACE and os.path.lexists(new):  # noqa: ASYNC240 - a plain passthrough, blocking like its peers
            raise pyfuse3.FUSEError(errno.EEXIST)
        self._call(os.rename, old, new)
        # The source's inode now lives at the new path; a replaced target's
        # inode keeps its number until forgotten but has no path any more.
        replaced = self.inodes.pop(new, None)
        if replaced is not None:
            self.paths.pop(replaced, None)
        # Only a folder takes names along: for a file (every save) the scan over all known paths, which
        # after a grep -r holds every note of the tree, would cost a Python loop of tens of thousands
        # of steps per save and be measured as FUSE's cost.
        try:
            is_folder = stat.S_ISDIR(os.lstat(new).st_mode)
        except OSError:  # changed in the source meanwhile: take it for a folder, as every rename once was
            is_folder = True
        if is_folder:
            moved = [(p, i) for p, i in self.inodes.items() if p == old or p.startswith(old + "/")]
        else:
            moved = [(old, self.inodes[old])] if old in self.inodes else []
        for path, ino in moved:
            del self.inodes[path]
            path = new + path[len(old):]
            self.inodes[path], self.paths[ino] = ino, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    fs = Passthrough(os.path.realpath(args.source))
    pyfuse3.init(fs, args.mountpoint, set(MOUNT_OPTIONS))
    stopped = False

    async def run() -> None:
        nonlocal stopped
        async with trio.open_nursery() as nursery:
            async def on_signal() -> None:
                nonlocal stopped
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        stopped = True
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
