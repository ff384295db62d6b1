"""A small pyfuse3 file system that exercises the vendored patch (``vendor/pyfuse3``).

``python tests/fork_fs.py MOUNTPOINT LOG`` serves ``/a.txt`` and ``/d/b.txt``
from memory, answers ``open`` and ``opendir`` with ENOSYS, wants only
``d/b.txt``'s closes (``flush_wanted``) and appends one
line per request it receives to LOG (``opcode fh inode [detail]``), so a
test can see exactly what the kernel sent, and a line ``wait N`` each time
the session loop tells it that it goes back to waiting, N being the
requests it received so far (``main(on_wait=)``). An optional third
argument is the loop's poll budget in nanoseconds (``main(poll_ns=)``).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

import pyfuse3
import trio

ROOT, A, D, B = pyfuse3.ROOT_INODE, 2, 3, 4
CHILDREN = {ROOT: [(b"a.txt", A), (b"d", D)], D: [(b"b.txt", B)]}


class ForkFS(pyfuse3.Operations):
    inode_requests = True
    enable_atomic_o_trunc = False
    flush_wanted = frozenset({B})  # a close of a.txt is answered in C, one of d/b.txt reaches flush()

    def __init__(self, log_path: str) -> None:
        super().__init__()
        self.data = {A: bytearray(b"alpha\n" * 1000), B: bytearray(b"beta\n")}
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the server's life

    def note(self, *fields: object) -> None:
        self.log.write(" ".join(str(f) for f in fields) + "\n")

    def attr(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 60
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        if ino in CHILDREN:
            a.st_mode = stat.S_IFDIR | 0o755
        else:
            a.st_mode = stat.S_IFREG | 0o644
            a.st_size = len(self.data[ino])
        return a

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self.attr(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        for child, ino in CHILDREN.get(parent_inode, []):
            if child == name:
                return self.attr(ino)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if fields.update_size:
            self.note("setattr", fh, inode, attr.st_size, "mtime" if fields.update_mtime else "-")
            del self.data[inode][attr.st_size:]
        return self.attr(inode)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        self.note("open", 0, inode)
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        self.note("opendir", 0, inode)
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def read(self, fh: int, off: int, size: int, inode: int = 0,
                   ctx: pyfuse3.RequestContext | None = None) -> bytes:
        self.note("read", fh, inode, ctx.pid if ctx is not None else None)
        return bytes(self.data[inode][off:off + size])

    async def write(self, fh: int, off: int, buf: bytes, inode: int = 0,
                    ctx: pyfuse3.RequestContext | None = None) -> int:
        self.note("write", fh, inode, ctx.pid if ctx is not None else None)
        data = self.data[inode]
        data[len(data):off] = bytes(max(0, off - len(data)))
        data[off:off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh: int, inode: int = 0, ctx: pyfuse3.RequestContext | None = None) -> None:
        self.note("flush", fh, inode)

    async def release(self, fh: int, inode: int = 0) -> None:
        self.note("release", fh, inode)

    async def fsync(self, fh: int, datasync: bool, inode: int = 0) -> None:
        await trio.to_thread.run_sync(lambda: None)  # a handler that waits for a worker thread, as scopefs's do
        self.note("fsync", fh, inode)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken, inode: int = 0,
                      ctx: pyfuse3.RequestContext | None = None) -> None:
        self.note("readdir", fh, inode, start_id)
        entries = CHILDREN[inode]
        for index in range(start_id, len(entries)):
            name, ino = entries[index]
            if not pyfuse3.readdir_reply(token, name, self.attr(ino), index + 1):
                return


def main() -> None:
    mountpoint, log_path = sys.argv[1], sys.argv[2]
    poll_ns = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
    fs = ForkFS(log_path)
    pyfuse3.init(fs, mountpoint, {"fsname=forkfs", "default_permissions"})
    try:
        trio.run(lambda: pyfuse3.main(poll_ns=poll_ns, on_wait=lambda received: fs.note("wait", received)))
    finally:
        pyfuse3.close()


if __name__ == "__main__":
    main()
