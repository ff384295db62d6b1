"""Who asks: the rules a request's caller meets on this mount, and whose sandbox a file's writes are.

A plain mount has no gate: whoever the kernel's modes let in may use it,
and every rule here answers yes. A sandbox's mount has one (``vfs.gate``):
a request that carries a caller must come from an admitted sandbox; a
handle works only while the sandbox that opened it is admitted; and a
write that carries no caller (the kernel writing back a mapping's dirty
pages) is taken as made by the sandbox that last read the file or was
given its writer, while that sandbox is admitted (``writeback_opener``
says why that is the only answer the mount can give).

Kept apart from ``vfs.mount`` because none of it depends on the view: it
is the same for every note, and it is what a review of the gate reads.
"""

from __future__ import annotations

import errno

import pyfuse3

from scopefs.vfs.errors import fail
from scopefs.vfs.gate import Gate
from scopefs.vfs.handles import Handle, HandleTable
from scopefs.vfs.inodes import Inodes, Node


class Callers:
    """The rules for callers of one mount, given its gate (None: a plain mount) and what they hold."""

    def __init__(self, gate: Gate | None, handles: HandleTable, inodes: Inodes) -> None:
        self.gate = gate
        self._handles = handles
        self._inodes = inodes

    def admit(self, ctx: pyfuse3.RequestContext | None, *, root_attributes: bool = False) -> None:
        if not self.allows(ctx, root_attributes=root_attributes):
            raise fail(errno.EACCES)

    def allows(self, ctx: pyfuse3.RequestContext | None, *, root_attributes: bool = False) -> bool:
        """Whether the caller of a request may use this mount (always, on a mount without a gate)."""
        return self.gate is None or self.gate.allows(ctx, root_attributes=root_attributes)

    def opener(self, ctx: pyfuse3.RequestContext | None) -> int | None:
        """The admitted pid namespace asking (EACCES if none): for a handle about to be given out, and for
        a ``READ``, whose node keeps it (``writeback_opener``)."""
        if self.gate is None:
            return None
        namespace = self.gate.namespace_of(ctx)
        if namespace is None:
            raise fail(errno.EACCES)
        return namespace

    def give(self, handle: Handle) -> int:
        """A file handle for ``handle``, if the sandbox that asked is still admitted.

        Checked again here, with no await before the handle is in the
        table, because a create or a first write awaits (a draft loaded from
        its note) and its sandbox may be dismissed meanwhile: a handle given
        after that would outlive the dismissal's revocation.
        """
        self.check_opener(handle.pid_namespace)
        if handle.writable:
            handle.node.touched_from = handle.pid_namespace
        return self._handles.give(handle)

    def writeback_opener(self, node: Node, ctx: pyfuse3.RequestContext | None) -> int | None:
        """For a writer about to be made by a ``WRITE``: the admitted pid namespace it belongs to.

        The caller's, as ``opener``; or, when the kernel writes back a
        shared mapping's dirty pages (a ``WRITE`` with no caller: pid 0,
        uid 0), the namespace of the last request that read the node or
        of the last handle given to write it, if that namespace is still
        admitted. No request says who mapped a file or dirtied its pages
        (no open reaches the mount, and a write to a cached page sends
        nothing), and the writer that wrote before may be gone: any close
        commits and lets go of it, and Python's ``mmap`` closes a duplicate
        of its descriptor when the mapping goes. Without this, a sandbox's
        writes through a mapping failed EACCES (fsx found it). A page gets
        dirty only through a descriptor opened for writing, which the
        modes give the session uid alone; the gate's limit for a host
        process of that uid is the one README's boundary section states
        for pages the kernel serves from its cache.
        """
        if is_writeback(ctx) and node.touched_from is not None and not self.allows(ctx):
            self.check_opener(node.touched_from)
            return node.touched_from
        return self.opener(ctx)

    def read_by(self, node: Node, caller: int | None) -> None:
        """A ``READ`` of ``node`` from the admitted namespace ``caller`` is about to be answered.

        Checked again, since the read may have awaited (a verification, a
        hash) and a dismissal meanwhile revokes what that sandbox holds: its
        bytes are refused, as through its handles. Kept as the namespace a
        later writeback of the node's pages is taken as (``writeback_opener``).
        """
        self.check_opener(caller)
        node.touched_from = caller

    def forget(self, pid_namespace: int) -> None:
        """A sandbox is gone: no writeback is taken as its any more, even once the kernel gives its
        namespace's number to another sandbox."""
        for node in self._inodes.nodes.values():
            if node.touched_from == pid_namespace:
                node.touched_from = None

    def check_handle(self, handle: Handle) -> None:
        """Reads and writes need the pid namespace that opened the handle to be admitted still."""
        self.check_opener(handle.pid_namespace)

    def check_opener(self, pid_namespace: int | None) -> None:
        """EACCES on a sandbox's mount once the pid namespace that opened a file or folder is gone."""
        if self.gate is not None and not self.gate.holds(pid_namespace):
            raise fail(errno.EACCES)


def is_writeback(ctx: pyfuse3.RequestContext | None) -> bool:
    """Whether a request carries no credentials, as the kernel's writeback of a mapping's dirty pages
    does (uid 0, pid 0). Root calling from a pid namespace this server cannot see looks the same; root
    is trusted anyway (it can read and write the home itself)."""
    return ctx is not None and ctx.pid == 0 and ctx.uid == 0
