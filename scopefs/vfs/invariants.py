"""The ``Node`` invariants of one mount, checked between two awaits: for tests and debugging.

``vfs.inodes`` states what must hold of the node table, the layers and
the handle table together; every test that drives a mount in process
(``tests/inprocesskit.py``) asks after each step. Apart from
``MountState`` because nothing that serves a request needs it.
"""

from __future__ import annotations

from scopefs.vfs.inodes import Kind
from scopefs.vfs.mount import MountState


def inconsistencies(mount: MountState) -> list[str]:
    """The ``Node`` invariants (``vfs.inodes``) that do not hold right now, as inode-numbered lines.

    For tests and debugging, between two awaits: an empty list means the
    node table, the layers and the handle table agree. Names only inode
    numbers and kinds, never a note's path.
    """
    found: list[str] = []
    layers = mount.layers
    opens: dict[int, int] = {}
    for handle in mount.handles.all():
        opens[handle.node.ino] = opens.get(handle.node.ino, 0) + 1
    for node in layers.inodes.nodes.values():
        where = f"inode {node.ino} ({node.kind.value})"
        if node.resource_id is not None and node.kind is not Kind.NOTE:
            found.append(f"{where}: a resource id on a non-note")
        if (node.kind is Kind.NOTE and node.attached and node.resource_id is not None
                and layers.by_resource.get(node.resource_id) is not node):
            found.append(f"{where}: an attached note the resource map does not name")
        if node.draft is not None and node.kind not in (Kind.NOTE, Kind.SCRATCH):
            found.append(f"{where}: a draft on a folder or query node")
        if node.frozen is not None and node.kind not in (Kind.SCRATCH, Kind.REVISION):
            found.append(f"{where}: a frozen revision on something other than a scratch file or a revision")
        if node.kind is Kind.REVISION and node.frozen is None:
            found.append(f"{where}: a revision node without its revision")
        if (node.query is not None) != (node.kind in (Kind.QUERIES, Kind.RESULTS)):
            found.append(f"{where}: a query where there should be none, or none where there should be one")
        if node.kind in (Kind.QUERIES, Kind.RESULTS, Kind.HISTORY, Kind.REVISION) and node.attached:
            found.append(f"{where}: an attached query or history node")
        if node.opens != opens.get(node.ino, 0):
            found.append(f"{where}: {node.opens} opens counted, {opens.get(node.ino, 0)} handles")
        if node.opens < 0 or node.lookups < 0:
            found.append(f"{where}: a negative count")
    for resource_id, node in layers.by_resource.items():
        if node.resource_id != resource_id or layers.inodes.get(node.ino) is not node:
            found.append(f"inode {node.ino}: the resource map names a node that is not that resource's")
    return found
