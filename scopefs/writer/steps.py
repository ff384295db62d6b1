"""Named points between the steps of the write transaction.

Production code calls ``checkpoint`` at each boundary and nothing happens.
The crash and power-loss tests install a hook in a child process that stops
there and lets the parent SIGKILL it or shut the filesystem down, so every
interleaving of "crash" and "step" is exercised by the real code. The
members are listed in the order a write passes them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class Step(StrEnum):
    STAGED = "staged"  # 1: staged file written and fsynced (before any lock or catalog row)
    STORE_DIR_MADE = "store-dir-made"  # lazy store: directory exists, no catalog row yet
    STORE_ROW = "store-row"  # lazy store: catalog row committed
    PENDING = "pending"  # 2: pending revision, intent and outbox committed (a durable write, a copy)
    MARKED = "marked"  # 2': a close's one-transaction write (``_commit_once``) left its marker, nothing placed yet
    RENAMED = "renamed"  # 3a: staged file renamed to its final locator
    FINALIZED = "finalized"  # 3b: file and directory fsynced (durable only), final hash computed
    ACTIVATED = "activated"  # 4: revision active, resource repointed (a close: its one commit)
    AUDITED = "audited"  # after: outbox drained to the shared audit
    # A forget (``writer.forget``): one transaction, then the bytes leave the disk.
    FORGETTING = "forgetting"  # inside the forget's transaction, before its commit
    FORGOTTEN = "forgotten"  # committed; the forgotten artifacts are still on disk
    # A backup (``writer.backup``): a cell's catalog is snapshotted, its artifacts not yet copied.
    BACKUP_SNAPSHOT = "backup-snapshot"
    BACKUP_CELL_DONE = "backup-cell-done"  # a cell snapshotted and copied; later cells and the state not yet
    # A migration (``writer.migrate``): between its phases, around the writes of its items.
    MIGRATION_BACKED_UP = "migration-backed-up"  # backup complete, run recorded, nothing copied yet
    MIGRATION_COPIED = "migration-copied"  # every item copied; hashes, index and denial matrix not yet checked
    MIGRATION_VERIFIED = "migration-verified"  # verified and reindexed; no cutover marker yet


# The write transaction's own points, in order (a forget's, a backup's and a migration's come after them and are
# their own).
MIGRATION_STEPS: tuple[Step, ...] = (Step.MIGRATION_BACKED_UP, Step.MIGRATION_COPIED, Step.MIGRATION_VERIFIED)
WRITE_STEPS: tuple[Step, ...] = tuple(
    s for s in Step if s not in (Step.FORGETTING, Step.FORGOTTEN, Step.BACKUP_SNAPSHOT, Step.BACKUP_CELL_DONE,
                               *MIGRATION_STEPS))

_hook: Callable[[Step], None] | None = None


def set_hook(hook: Callable[[Step], None] | None) -> None:
    global _hook
    _hook = hook


def checkpoint(step: Step) -> None:
    if _hook is not None:
        _hook(step)
