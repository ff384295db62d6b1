"""sqlite-vec inside the catalog's SQLite: loading it, and packing vectors for it.

The search index keeps its vectors in a ``vec0`` virtual table next to the
FTS5 table, in the same database file as the revisions they point at, so
one transaction can write or retire both with the revision. The
extension ships as a wheel (``sqlite-vec``), loaded into apsw's bundled
SQLite; a catalog that cannot load it refuses vector search loudly rather
than silently searching by words alone (the caller degrades and says so).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import apsw

from scopefs.catalog.errors import StorageError


def load(conn: apsw.Connection) -> str:
    """Load sqlite-vec into ``conn``; its version. StorageError if it cannot be loaded."""
    try:
        import sqlite_vec

        conn.enable_load_extension(True)
        try:
            conn.load_extension(sqlite_vec.loadable_path())
        finally:
            conn.enable_load_extension(False)  # nothing else may be loaded through this connection
        return str(conn.execute("SELECT vec_version()").fetchall()[0][0])
    except (ImportError, apsw.Error) as exc:
        raise StorageError(f"the vector extension (sqlite-vec) cannot be loaded: {type(exc).__name__}") from None


def pack(vector: Sequence[float]) -> bytes:
    """A vector as sqlite-vec's float32 blob."""
    return struct.pack(f"<{len(vector)}f", *vector)
