"""Who may use a sandbox's mount: its session uid, from an admitted sandbox.

A sandbox mount is made by root with ``allow_other`` so that the
session's unprivileged uid can reach it, which also lets every other uid's
requests reach this server. Modes (inodes owned by the session uid, a 0700
mount directory) keep other uids out in the kernel; the gate refuses them
here as well, and refuses the session uid itself unless the request comes
from a process in a pid namespace the launcher admitted (one per running
sandbox). A host process that merely has the session uid is therefore
refused too.

The check runs on every request that carries a context (lookups, opens,
creates, renames, attribute reads...). Requests without one act on a
handle that an admitted open created (a file's or a folder's); reads,
writes and listings through it also stop when its namespace is dismissed
(a descriptor passed out of the sandbox is then useless), while flush and
release still run, since they finish what the sandbox already wrote.

The handles a namespace opened are revoked the moment its last admission
ends (``on_gone``): the kernel reuses a freed namespace's inode number for
the next namespace it makes, so a later sandbox admitted under the same
number must not bring a passed-out descriptor back to life.

A read served from the kernel's page cache reaches no server at all, so a
dismissal also drops the pages of every file that namespace opened
(``on_dismissed``, which the mount sets) before the launcher hears that
the admission ended: once ``scopefs run`` returns, a descriptor its
sandbox passed out reads nothing more. Another sandbox of the same
session that is still running may bring a page back into the cache; a
descriptor held from a finished one can read that page while it stays.
The pid in the context is the caller's thread id in this server's pid
namespace, resolved through ``/proc`` per request, never cached: a pid can
be reused by another process, a namespace inode cannot while it is alive.

``UidGate`` is the gate of a mount made for a sandbox that scopefs does not
launch (a gateway's own container, ``scopefs mount --for-uid``): nobody can
admit that sandbox's pid namespace, so the uid alone is the credential. Every
handle is opened under one admission (``EVERYONE``), which ends when the
mount stops, and root gets only the root's constant attributes, which a
container runtime reads as root before it binds the mount. A person's own
mount (``scopefs browse``) gives root not even those.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher imports this module; it must not pull pyfuse3 in
    import pyfuse3


def pid_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s pid namespace, or None if it cannot be read."""
    if pid <= 0:
        return None  # the caller is not visible from here
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


class Gate:
    """The session uid and the pid namespaces of its running sandboxes."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self._namespaces: dict[int, int] = {}  # namespace inode -> how many admissions hold it
        # Set by the mount: revoke a namespace's handles the moment it is gone (no await), and
        # then drop the pages of what it opened.
        self.on_gone: Callable[[int], None] | None = None
        self.on_dismissed: Callable[[int], Awaitable[None]] | None = None

    def admit(self, namespace: int) -> None:
        self._namespaces[namespace] = self._namespaces.get(namespace, 0) + 1

    def dismiss(self, namespace: int) -> bool:
        """One admission of ``namespace`` ends; True if none is left (its handles are revoked now,
        and the caller awaits ``dismissed`` for its pages)."""
        left = self._namespaces.get(namespace, 0) - 1
        if left > 0:
            self._namespaces[namespace] = left
            return False
        if self._namespaces.pop(namespace, None) is None:
            return False
        if self.on_gone is not None:
            self.on_gone(namespace)
        return True

    def dismiss_all(self) -> None:
        """The mount stops: every admission ends at once (their pages are the mount's to drop)."""
        for namespace in list(self._namespaces):
            self._namespaces[namespace] = 1
            self.dismiss(namespace)

    async def dismissed(self, namespace: int) -> None:
        """After the last admission of ``namespace`` ended: its pages go (see the module docstring)."""
        if self.on_dismissed is not None:
            await self.on_dismissed(namespace)

    @property
    def admitted(self) -> frozenset[int]:
        return frozenset(self._namespaces)

    def holds(self, namespace: int | None) -> bool:
        """Whether ``namespace`` is still admitted (an open handle is usable only while it is)."""
        return namespace is not None and namespace in self._namespaces

    def allows(self, ctx: pyfuse3.RequestContext | None, *, root_attributes: bool = False) -> bool:
        """Whether to answer ``ctx``'s request.

        ``root_attributes``: the request only reads the mount root's
        attributes, which are constant and say nothing about the view.
        bubblewrap needs them (the bind's source type, the ``--chdir``
        permission check) before its sandbox can be admitted: the sandbox's
        pid namespace is admitted once bwrap has reported it and before the
        command is executed.
        """
        if ctx is None or ctx.uid != self.uid:
            return False
        return root_attributes or self.namespace_of(ctx) is not None

    def namespace_of(self, ctx: pyfuse3.RequestContext | None) -> int | None:
        """The admitted pid namespace ``ctx`` comes from, or None (not the uid, not admitted)."""
        if ctx is None or ctx.uid != self.uid:
            return None
        namespace = pid_namespace(ctx.pid)
        return namespace if self.holds(namespace) else None


class UidGate(Gate):
    """Only processes running as one uid, wherever they run (host, container, another sandbox).

    The uid is the host-side one, as the kernel hands it to FUSE: a
    container's uid mapped through its user namespace (Docker's
    userns-remap, rootless runtimes) is the mapped one. Refusals are the
    sandbox gate's: ``EACCES`` for every request that reaches the server.
    """

    EVERYONE = 0  # the one admission every handle is opened under: no pid namespace has inode 0

    def __init__(self, uid: int, *, root_attributes: bool = True) -> None:
        super().__init__(uid)
        # False for a person's own mount (``scopefs browse``): no runtime binds it, so root gets nothing either.
        self.root_attributes = root_attributes
        self.admit(self.EVERYONE)  # ended by ``dismiss_all`` when the mount stops: then nobody is answered

    def allows(self, ctx: pyfuse3.RequestContext | None, *, root_attributes: bool = False) -> bool:
        """The uid, until the mount stops; root, for the root's constant attributes only.

        Docker (runc) stats a bind's source as root before it binds it; the
        root's attributes are the same for every view (modes, owner, the
        mount's start time), so they tell root nothing about the view.
        """
        if ctx is None or not self.holds(self.EVERYONE):
            return False
        return ctx.uid == self.uid or (root_attributes and self.root_attributes and ctx.uid == 0)

    def namespace_of(self, ctx: pyfuse3.RequestContext | None) -> int | None:
        """``EVERYONE`` for the uid while the mount serves, else None (no handle is given)."""
        if ctx is None or ctx.uid != self.uid or not self.holds(self.EVERYONE):
            return None
        return self.EVERYONE
