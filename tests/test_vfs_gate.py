"""The gate of a sandbox's mount, in process: who gets answers, and for how long a handle works.

A ``ScopeFS`` with a ``Gate`` runs in this process; requests carry a
stand-in for pyfuse3's request context (the gate reads only ``uid`` and
``pid``). The real mounts and sandboxes are in ``test_sandbox_*.py``;
these tests pin the rules themselves.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import pyfuse3
import pytest
import trio

from scopefs.catalog.home import Home
from scopefs.catalog.visible import build
from scopefs.vfs.fs import ScopeFS
from scopefs.vfs.gate import Gate, pid_namespace
from scopefs.vfs.inodes import Node
from scopefs.vfs.invariants import inconsistencies
from tests.conftest import ALICE_FACT, Scenario
from tests.inprocesskit import errno_of

SESSION_UID = 1_544_000_001  # any uid: nothing runs as it, only the contexts claim it


@dataclass
class Context:
    uid: int
    pid: int
    gid: int = 0
    umask: int = 0o022


def context(uid: int, pid: int) -> pyfuse3.RequestContext:
    """A ``Context``, typed as the ``pyfuse3.RequestContext`` the file system's methods take (the tests
    cannot make one: pyfuse3 fills it in C)."""
    return cast(pyfuse3.RequestContext, Context(uid, pid))


def _run(scenario: Scenario, test: Callable[[ScopeFS, Gate, int], Awaitable[None]]) -> None:
    """``test(fs, gate, inode of private/notes/allergy.md)`` on Alice's view with a gate."""
    home = Home.open(scenario.cli.home)
    gate = Gate(SESSION_UID)
    fs = ScopeFS(home, scenario.alice_session, build(home, scenario.alice_session), gate=gate,
                 owner=(SESSION_UID, SESSION_UID))

    async def main() -> None:
        namespace = pid_namespace(os.getpid())
        assert namespace is not None
        gate.admit(namespace)
        ino = pyfuse3.ROOT_INODE
        me = context(SESSION_UID, os.getpid())
        for name in ("private", "notes", "allergy.md"):
            ino = (await fs.lookup(ino, name.encode(), me)).st_ino
        gate.dismiss(namespace)
        await test(fs, gate, ino)
        assert inconsistencies(fs.mount) == []  # the node table agrees with the handles and layers

    try:
        trio.run(main)
    finally:
        fs.artifacts.close()
        home.close()


def test_only_the_session_uid_from_an_admitted_namespace_is_answered(scenario: Scenario) -> None:
    async def test(fs: ScopeFS, gate: Gate, ino: int) -> None:
        mine = pid_namespace(os.getpid())
        assert mine is not None
        me, root = context(SESSION_UID, os.getpid()), context(0, os.getpid())
        assert await errno_of(fs.read(0, 0, 4096, ino, me)) == errno.EACCES  # right uid, not admitted
        assert await errno_of(fs.lookup(pyfuse3.ROOT_INODE, b"private", me)) == errno.EACCES
        gate.admit(mine)
        assert await errno_of(fs.read(0, 0, 4096, ino, root)) == errno.EACCES  # admitted namespace, wrong uid
        assert await errno_of(fs.read(0, 0, 4096, ino, context(SESSION_UID, 0))) == errno.EACCES  # pid unseen
        assert await errno_of(fs.write(0, 0, b"x", ino, root)) == errno.EACCES
        assert await errno_of(fs.readdir(0, 0, None, pyfuse3.ROOT_INODE, root)) == errno.EACCES  # type: ignore[arg-type]
        assert await fs.read(0, 0, 4096, ino, me) == ALICE_FACT  # the control: uid and namespace both right
        # The root's constant attributes, for the session uid only (bwrap needs them first).
        gate.dismiss(mine)
        assert (await fs.getattr(pyfuse3.ROOT_INODE, me)).st_uid == SESSION_UID
        assert await errno_of(fs.getattr(pyfuse3.ROOT_INODE, root)) == errno.EACCES
        assert await errno_of(fs.getattr(ino, me)) == errno.EACCES

    _run(scenario, test)


def test_a_handle_stops_working_when_its_namespace_is_dismissed(scenario: Scenario) -> None:
    """A descriptor passed out of a sandbox, or held past its admission, reads and writes nothing."""
    async def test(fs: ScopeFS, gate: Gate, ino: int) -> None:
        mine = pid_namespace(os.getpid())
        assert mine is not None
        me = context(SESSION_UID, os.getpid())
        writeback = context(0, 0)  # the kernel writing back a mapping: no credentials at all (FUSE's nocreds)
        gate.admit(mine)
        assert await fs.read(0, 0, 4096, ino, me) == ALICE_FACT
        assert await fs.write(0, 0, b"changed", ino, me) == len(b"changed")  # makes the writer's handle
        assert await fs.write(0, 0, b"changed", ino, writeback) == len(b"changed")  # through that handle
        # A caller the gate refuses is not the kernel's writeback, writer or not: the session uid from a
        # pid namespace this server cannot see, or root.
        assert await errno_of(fs.write(0, 0, b"changed", ino, context(SESSION_UID, 0))) == errno.EACCES
        assert await errno_of(fs.write(0, 0, b"changed", ino, context(0, os.getpid()))) == errno.EACCES
        gate.dismiss(mine)
        assert await errno_of(fs.read(0, 0, 4096, ino, me)) == errno.EACCES
        assert await errno_of(fs.write(0, 0, b"changed", ino, me)) == errno.EACCES
        assert await errno_of(fs.write(0, 0, b"changed", ino, writeback)) == errno.EACCES
        assert await errno_of(fs.readdir(0, 0, None, pyfuse3.ROOT_INODE, me)) == errno.EACCES  # type: ignore[arg-type]
        # Admitted again: the kernel reuses a freed namespace's number for the next sandbox, and the
        # old sandbox's writer handle must not come back to life in it.
        gate.admit(mine)
        assert await errno_of(fs.write(0, 0, b"changed", ino, writeback)) == errno.EACCES
        assert await fs.read(0, 0, 4096, ino, me) == b"changed" + ALICE_FACT[7:]  # the new sandbox reads
        gate.dismiss(mine)

    _run(scenario, test)


def test_a_writeback_with_no_writer_is_the_sandbox_s_that_last_read_the_file_while_it_is_admitted(
        scenario: Scenario) -> None:
    """The kernel writes a mapping's dirty pages back with no caller, possibly after every writer went (a
    close lets it go). Only a sandbox whose request read the file, or was given its writer, and only while
    it is admitted, gets it: never a file nobody admitted touched, never a sandbox dismissed since, even
    under its number again."""
    async def test(fs: ScopeFS, gate: Gate, ino: int) -> None:
        mine = pid_namespace(os.getpid())
        assert mine is not None
        me = context(SESSION_UID, os.getpid())
        writeback = context(0, 0)
        assert await errno_of(fs.read(0, 0, 4096, ino, me)) == errno.EACCES  # not admitted: refused,
        gate.admit(mine)
        assert await errno_of(fs.write(0, 0, b"mapped", ino, writeback)) == errno.EACCES  # so not touched
        assert await fs.read(0, 0, 4096, ino, me) == ALICE_FACT
        assert await fs.write(0, 0, b"mapped", ino, writeback) == len(b"mapped")  # the reader's sandbox's
        await fs.flush(0, ino, me)  # committed; the writer goes
        assert await fs.read(0, 0, 4096, ino, me) == b"mapped" + ALICE_FACT[6:]
        gate.dismiss(mine)
        assert await errno_of(fs.write(0, 0, b"MAPPED", ino, writeback)) == errno.EACCES
        gate.admit(mine)  # the kernel reuses a freed namespace's number for the next sandbox
        assert await errno_of(fs.write(0, 0, b"MAPPED", ino, writeback)) == errno.EACCES
        gate.dismiss(mine)

    _run(scenario, test)


def test_a_read_whose_sandbox_is_dismissed_while_it_verifies_is_refused_and_vouches_for_nothing(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A READ awaits (a verification, a hash); a dismissal meanwhile revokes its sandbox. Its bytes are then
    refused, and it must not leave its namespace behind for writebacks: the next sandbox may get the number."""
    async def test(fs: ScopeFS, gate: Gate, ino: int) -> None:
        mine = pid_namespace(os.getpid())
        assert mine is not None
        me, writeback = context(SESSION_UID, os.getpid()), context(0, 0)
        read_inode = fs.reads.read_inode

        async def dismissed_meanwhile(node: Node, off: int, size: int) -> bytes:
            data = await read_inode(node, off, size)
            gate.dismiss(mine)
            return data

        gate.admit(mine)
        monkeypatch.setattr(fs.reads, "read_inode", dismissed_meanwhile)
        assert await errno_of(fs.read(0, 0, 4096, ino, me)) == errno.EACCES
        monkeypatch.undo()
        gate.admit(mine)  # the next sandbox, under the same number
        assert await errno_of(fs.write(0, 0, b"mapped", ino, writeback)) == errno.EACCES
        gate.dismiss(mine)

    _run(scenario, test)


@pytest.mark.parametrize("admissions", [1, 2])
def test_an_admission_is_counted(admissions: int) -> None:
    """Two launchers admitting the same namespace: the first dismissal leaves the second's."""
    gate = Gate(SESSION_UID)
    for _ in range(admissions):
        gate.admit(42)
    gate.dismiss(42)
    assert gate.holds(42) is (admissions == 2)
