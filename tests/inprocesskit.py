"""Driving a ``ScopeFS`` in this process, request by request, with no kernel.

For tests that need to interleave a mount's requests with another
session's writes exactly, or look at the mount's state between two
requests: ``Tool`` makes the requests a tool's system calls would, and
checks the node invariants (``scopefs.vfs.invariants.inconsistencies``) after
each. There is no FUSE session, so the kernel's page cache is replaced by
nothing (``no_kernel``). Real mounts are ``mountkit.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pyfuse3
import pytest
import trio

from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.invariants import inconsistencies
from scopefs.vfs.layers import Invalidation, Layers
from tests.conftest import Scenario


async def errno_of(call: Awaitable[object]) -> int:
    """The errno a request answered with (0: it succeeded)."""
    try:
        await call
    except pyfuse3.FUSEError as exc:
        return exc.errno
    return 0


@pytest.fixture
def no_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stores into and drops from the kernel's page cache go nowhere: there is no FUSE session."""
    monkeypatch.setattr(pyfuse3, "notify_store", lambda *args, **kwargs: None)
    monkeypatch.setattr(pyfuse3, "invalidate_inode", lambda *args, **kwargs: None)
    monkeypatch.setattr(pyfuse3, "invalidate_entry", lambda *args, **kwargs: None)
    yield


def run_alice_mount(scenario: Scenario, script: Callable[[ScopeFS, Tool], Awaitable[None]]) -> None:
    """``script(fs, tool)`` against an in-process mount of Alice's DM session."""
    home = Home.open(scenario.cli.home)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session))
    try:
        trio.run(script, fs, Tool(fs))
    finally:
        fs.artifacts.close()
        home.close()


@contextlib.contextmanager
def layers_of(scenario: Scenario) -> Iterator[tuple[Layers, Callable[[], list[Invalidation]]]]:
    """A mount's layers over Alice's DM view, with no mount around them, and a call that applies the
    catalog's view of now to them (what the mount's follower does): what the kernel must forget."""
    home = Home.open(scenario.cli.home)
    try:
        layers = Layers(build(home, scenario.alice_session))
        yield layers, lambda: layers.apply(build(home, scenario.alice_session))
    finally:
        home.close()


def as_alice(scenario: Scenario, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(home, alice_session, *args)`` as another session of Alice's runs it (the CLI, another mount)."""
    home = Home.open(scenario.cli.home)
    try:
        return fn(home, scenario.alice_session, *args)
    finally:
        home.close()


class KernelFile:
    """An open file as the kernel handles it for a ``ScopeFS``: no OPEN is sent (it answers ENOSYS),
    ``O_TRUNC`` arrives as a truncation without a handle, reads, writes and closes come by inode."""

    def __init__(self, fs: ScopeFS, ino: int, ctx: Any = None) -> None:
        self.fs = fs
        self.ino = ino
        self.ctx = ctx

    @classmethod
    async def open(cls, fs: ScopeFS, ino: int, flags: int = os.O_RDONLY, ctx: Any = None) -> KernelFile:
        if flags & os.O_TRUNC:
            attr = pyfuse3.EntryAttributes()
            attr.st_size = 0
            fields = SimpleNamespace(update_size=True)  # what the kernel's SETATTR of the size carries
            await fs.setattr(ino, attr, fields, None, ctx)  # type: ignore[arg-type]
        return cls(fs, ino, ctx)

    async def read(self, off: int = 0, size: int = 1 << 20) -> bytes:
        return await self.fs.read(0, off, size, self.ino, self.ctx)

    async def write(self, off: int, data: bytes) -> int:
        return await self.fs.write(0, off, data, self.ino, self.ctx)

    async def flush(self) -> None:
        await self.fs.flush(0, self.ino, self.ctx)


class Tool:
    """Requests as a tool's system calls would make them, each followed by the invariant check."""

    def __init__(self, fs: ScopeFS) -> None:
        self.fs = fs
        self.steps = 0

    def check(self, what: str) -> None:
        self.steps += 1
        assert inconsistencies(self.fs.mount) == [], f"after {what}"

    async def ino(self, path: str) -> int:
        ino = pyfuse3.ROOT_INODE
        for name in path.split("/"):
            ino = (await self.fs.lookup(ino, name.encode())).st_ino
        self.check(f"lookup {path}")
        return ino

    async def folder(self, path: str) -> int:
        return await self.ino(path)

    async def read(self, path: str) -> bytes:
        opened = await KernelFile.open(self.fs, await self.ino(path))
        data = await opened.read()
        await opened.flush()
        self.check("close after reading")
        return data

    async def create(self, folder: str, name: str, data: bytes) -> None:
        info, _ = await self.fs.create(await self.folder(folder), name.encode(), 0o600,
                                       os.O_WRONLY | os.O_CREAT, None)  # type: ignore[arg-type]
        self.check(f"create {name}")
        await self.fs.write(info.fh, 0, data)
        await self.fs.flush(info.fh)
        self.check(f"close {name}")
        await self.fs.release(info.fh)
        self.check(f"release {name}")

    async def overwrite(self, path: str, data: bytes) -> None:
        opened = await KernelFile.open(self.fs, await self.ino(path), os.O_WRONLY | os.O_TRUNC)
        self.check("open for writing, truncated")
        await opened.write(0, data)
        await opened.flush()
        self.check("close after writing")

    async def rename(self, folder: str, old: str, new: str) -> None:
        ino = await self.folder(folder)
        await self.fs.rename(ino, old.encode(), ino, new.encode(), 0, None)  # type: ignore[arg-type]
        self.check(f"rename {old} -> {new}")

    async def unlink(self, folder: str, name: str) -> None:
        await self.fs.unlink(await self.folder(folder), name.encode(), None)  # type: ignore[arg-type]
        self.check(f"unlink {name}")


def listed_in_pieces(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, int]], list[int]]:
    """READDIR's answers, noted as (name, offset of the next); each piece takes as many names as the one
    number in the second list says (one, to begin with), as a listing read in pieces would."""
    listed: list[tuple[str, int]] = []
    room = [1]

    def readdir_reply(token: object, name: bytes, attr: object, next_id: int) -> bool:
        if not room[0]:
            return False
        room[0] -= 1
        listed.append((name.decode(), next_id))
        return True
    monkeypatch.setattr(pyfuse3, "readdir_reply", readdir_reply)
    return listed, room
