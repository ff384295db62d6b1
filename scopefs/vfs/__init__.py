"""The per-session FUSE view (pyfuse3 + trio).

One server per mounted session: ``server`` runs it, ``fs`` answers the
kernel's requests, ``namespace`` (with ``tree`` and ``inodes``) is what the
mount shows, ``content`` serves only verified bytes, ``drafts`` and
``scratch`` hold what tools are writing, ``catalog_ops`` is every call into
the catalog and the writer (made on one thread at a time).
"""
