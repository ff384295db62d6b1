"""A mount's commits leave the write-ahead log's checkpoint to the follower's thread.

A checkpoint copies the log into the database and syncs the disk twice;
SQLite makes whichever commit crosses 1,000 pages of log pay for it, which
for a mount is a save's close or the commit ahead of its view's refresh. A
mount raises that threshold on its connections and checkpoints, on another
thread, each database it wrote to, once a tick (``vfs.follow``). Seen here
from outside, in the log's shared-memory index: the frames a few saves
through the mount wrote (far fewer than 1,000 pages, so no commit would
have checkpointed them) are copied into the catalog within seconds.
"""

from __future__ import annotations

import struct
from pathlib import Path

from tests.conftest import Scenario
from tests.mountkit import Mounts, mounts, wait_until  # noqa: F401

# The wal-index header (sqlite3/src/wal.c): two copies of WalIndexHdr (48 bytes each), then
# WalCkptInfo, whose first field is nBackfill. mxFrame is the u32 at offset 16 of WalIndexHdr.
MX_FRAME, N_BACKFILL = 16, 96


def log_frames(database: Path) -> tuple[int, int]:
    """(frames in the log, frames of them already copied into the database), read without SQLite."""
    header = (database.parent / (database.name + "-shm")).read_bytes()[:100]
    return struct.unpack_from("=I", header, MX_FRAME)[0], struct.unpack_from("=I", header, N_BACKFILL)[0]


def test_saves_through_a_mount_are_checkpointed_off_the_commit(scenario: Scenario,
                                                               mounts: Mounts) -> None:  # noqa: F811
    where = mounts.mount(scenario.alice_session, "alice")
    catalog = scenario.cli.home / "agents" / "main" / "catalog.sqlite"
    for i in range(5):
        (where / "private" / "notes" / f"saved-{i}.md").write_bytes(f"saved through the mount, {i}\n".encode())
    frames, _ = log_frames(catalog)
    assert 0 < frames < 1_000  # no commit crossed SQLite's own threshold
    wait_until(lambda: log_frames(catalog)[1] == log_frames(catalog)[0] > 0, timeout=10)
