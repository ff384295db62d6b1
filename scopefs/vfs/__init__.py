"""The per-session FUSE view (pyfuse3 + trio).

One server per mounted session: ``server`` runs it and ``fs`` answers the
kernel's requests, handing each to the room that owns it (``fs`` lists
them). What the mount shows is ``layers`` (with ``tree`` and ``inodes``);
``content`` serves only verified bytes, ``drafts`` and ``scratch`` hold
what tools are writing, and ``catalog_ops`` is every call into the catalog
and the writer, made on one thread at a time.
"""
