"""The staged-rename write transaction (DESIGN.md §6).

1. Validate the expected active revision and policy; write the content to a
   0600 staging file.
2. One short SQLite transaction: re-read the resource and re-evaluate the
   policy, insert the pending revision, the write intent and the audit
   outbox row. No file I/O inside, and no disk sync at its commit.
3. Rename the staged file to its broker-generated final locator (never
   replacing anything), hash the final file and prepare its search rows,
   all outside any transaction; a durable write first fsyncs the file and
   the store directory.
4. A second short transaction: check the pending row against the final hash
   and the base revision, re-evaluate the policy, activate, supersede the
   old revision, settle the intent and the outbox row. No stat, open or read
   inside.

A close through a mount (not durable, not a broker copy) skips step 2: it
leaves a marker in the staging folder instead (``writer.placing``), renames
and hashes, and records and activates the revision in one transaction with
the same checks (``_commit_once``). Nothing slow stands between its rename
and its commit, and the second transaction only doubled a save's catalog
work.

Durability follows POSIX (DESIGN.md §6). A durable write (the command
line, the API, an ``fsync`` through a mount) syncs the artifact and its
directory before step 4, whose commit syncs the catalog: it survives power
loss. A write that is not durable (a close through a mount) syncs nothing:
it is committed, visible everywhere, and survives the death of any
process, because the kernel's page cache holds its bytes; its commit lists
it in ``unsynced_revisions`` with that page cache, so that after a power loss
recovery verifies its artifact and rolls back what did not reach the disk
(``writer.recovery``), and ``writer.sync`` makes it durable on demand.

Readers only ever resolve active revisions, so a crash at any point exposes
nothing pending; ``writer.recovery`` rolls back what remains. An fsync
failure is never retried: the write fails, its files are removed and
nothing is activated.

The content is staged before the writer lock is taken: a slow or endless
stdin holds only its own staging file (under its own flock, so doctor can
tell it is in flight), never the lock recovery needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import apsw

from scopefs.catalog import ids
from scopefs.catalog.access import (
    Access,
    Expected,
    Target,
    authorize_session,
    decide,
    expect_resource,
    refuse_unseen,
    resolve,
    revalidate,
)
from scopefs.catalog.artifacts import check_size, open_artifact, open_store_dir
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.clock import now_us
from scopefs.catalog.db import CATALOG_FAILURES, immediate, relaxed, scalar
from scopefs.catalog.digests import hash_fd, sha256_for
from scopefs.catalog.errors import BadInput, Conflict, Denied, IntegrityError, storage_error
from scopefs.catalog.fsafe import open_dir, renameat2_noreplace
from scopefs.catalog.home import Home
from scopefs.catalog.human import TRUST_ORIGIN as HUMAN_ORIGIN
from scopefs.catalog.index import current_model, prepare_from_fd
from scopefs.catalog.lineage import add_lineage, inherited_validity, is_derived, is_held
from scopefs.catalog.paths import Parts, check_parts, split_virtual_path
from scopefs.catalog.policy import Decision, Mount, Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import ResourceRow, StoreRow, active_revision, find_resource, path_conflict, policy_entries
from scopefs.catalog.subject import SubjectKind
from scopefs.catalog.view import READ_WRITE, View
from scopefs.writer import lock, placing
from scopefs.writer.commit import PolicyChanged, activate, roll_back, settle_active
from scopefs.writer.facts import ContentFacts, content_facts, read_head
from scopefs.writer.recovery import recover_pending_if_idle
from scopefs.writer.steps import Step, checkpoint
from scopefs.writer.stores import ensure_store

CHUNK = 1 << 20

# A note whose current revision may no longer be read only because of its
# lifecycle (held by its lineage, past its validity) may still be written
# anew by whoever writes its store: that is how an owner re-derives it, or
# renews it. Its old content is never shown to the writer.
RENEWABLE = frozenset({Reason.LINEAGE_DENY, Reason.EXPIRED})

_TRUST_ORIGIN = {
    SubjectKind.USER: "verified-user",
    SubjectKind.CONVERSATION: "conversation",
    SubjectKind.SERVICE: "service",
}



def _trust_origin(access: Access) -> str:
    """Where an ordinary write comes from: the session's kind of subject, or a human at the console."""
    if access.session.human:
        return HUMAN_ORIGIN  # ``scopefs browse``: the person themself, not a chat turn
    return _TRUST_ORIGIN.get(access.session.subject.kind, "unattributed")


@dataclass(frozen=True)
class WriteResult:
    resource_id: str
    revision_id: str
    revision_no: int
    sha256: str
    size: int
    created: bool  # a new resource, not a new revision of an existing one
    store_id: str  # the store it landed in, from the commit itself (a mount queues its index by it)


RowsHook = Callable[[apsw.Connection, str, str], None]  # (catalog, resource_id, revision_id), inside a transaction


def _no_rows(_catalog: apsw.Connection, _resource_id: str, _revision_id: str) -> None:
    return None


@dataclass(frozen=True)
class Provenance:
    """What makes a write the broker's copy rather than a subject's own write.

    A published or projected copy lands in a store its author holds no
    placement in; the authority for it is a decision of its own (a live
    publisher grant, the source still active), which ``authority`` re-makes
    inside both commit transactions (``activating``: the second), as
    ``_recheck`` does for the view's policy.

    ``record`` writes the copy's lineage and bookkeeping (a projection's
    row and allows, a postbox item) in the transaction that activates it,
    so they exist exactly when the copy does: a write rolled back at any
    step, or by recovery after a crash, leaves none of them behind.
    ``reserve`` runs in the first transaction, for what must be taken
    before the content is placed (a message handle, a rate slot); it stays
    taken if the write fails, which fails closed.
    """

    operation: Op  # what the audit calls it: publish, project, ...
    trust_origin: str
    authority: Callable[[apsw.Connection, bool], Decision]  # (catalog, activating)
    record: RowsHook = _no_rows
    reserve: RowsHook = _no_rows
    # Inside the activation: a time the revision may be valid no longer than (a derivation's sources').
    valid_until: Callable[[apsw.Connection], int | None] | None = None


def _chunks(source: bytes | BinaryIO) -> Iterator[bytes]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        for start in range(0, len(view), CHUNK):
            yield bytes(view[start:start + CHUNK])
        return
    while True:
        chunk = source.read(CHUNK)
        if not chunk:
            return
        yield chunk


def _size_hint(source: bytes | BinaryIO) -> int | None:
    """How many bytes ``source`` will give, where that is known without reading it (it picks the hash)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source)
    if isinstance(source, io.BytesIO):  # (a mount's empty draft: guessing would load OpenSSL's hash for it)
        return len(source.getvalue()) - source.tell()  # (the bytes it was made from, not a copy)
    try:
        info = os.fstat(source.fileno())
    except (AttributeError, OSError, ValueError):  # not backed by a descriptor (a pipe's wrapper, a stream...)
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(dirfd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dirfd)


@dataclass
class _Staged:
    """A staged file: written (not synced), flocked while this write holds it."""

    name: str
    fd: int
    sha256: str
    size: int
    consumed: bool = False  # renamed away; no longer ours to remove


@contextlib.contextmanager
def _staged(staging_fd: int, source: bytes | BinaryIO) -> Iterator[_Staged]:
    """Step 1: stage ``source``; removed on exit unless renamed."""
    name = ids.random_token()
    try:
        # Unnamed until it is locked: doctor can never see this file without
        # its flock, and a crash before the link leaves nothing behind.
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=staging_fd)
    except OSError as exc:
        raise storage_error("cannot create the staging file", exc) from exc
    staged = _Staged(name, fd, "", 0, consumed=True)  # nothing to remove until it has a name
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # "in flight" for doctor, released by the kernel if we die
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=staging_fd, follow_symlinks=True)
        except OSError as exc:
            raise storage_error("cannot name the staging file", exc) from exc
        staged.consumed = False
        digest = sha256_for(_size_hint(source))
        size = 0
        try:
            for chunk in _chunks(source):
                size += len(chunk)
                check_size(size)
                digest.update(chunk)
                _write_all(fd, chunk)
        except OSError as exc:
            raise storage_error("cannot stage the note", exc) from exc
        staged.sha256, staged.size = digest.hexdigest(), size
        checkpoint(Step.STAGED)
        yield staged
    finally:
        if not staged.consumed:
            _unlink_quietly(staging_fd, name)
        os.close(fd)


def _plan(access: Access, parts: Parts, expected_resource_id: Expected) -> tuple[Target, Op]:
    """Resolve, validate and decide a write; raises before anything changes.

    Replacing a note requires being able to read it: a writer never
    overwrites content it may not see.
    """
    target = resolve(access, parts)
    expect_resource(target.resource, expected_resource_id)
    if target.mount is None:
        raise access.refuse_outside(Op.APPEND, parts)
    if not target.inner:
        raise BadInput("invalid path: name a note inside the root, e.g. private/notes/x.md")
    store_id = target.store.store_id if target.store else None
    revision_id = target.revision.revision_id if target.revision else None
    op = Op.REPLACE if target.revision is not None else Op.APPEND
    if op is Op.REPLACE:
        visible = decide(access, target, Op.READ)
        if not visible and visible.reason not in RENEWABLE:
            raise refuse_unseen(access, op, visible.reason, store_id=store_id, revision_id=revision_id,
                                expected=expected_resource_id)
    decision = decide(access, target, op)
    if not decision:
        raise access.refuse(op, decision.reason, store_id=store_id, revision_id=revision_id)
    if target.store is not None and target.resource is None:
        why = path_conflict(access.home.catalog(access.agent_id), access.agent_id, target.store.store_id,
                            target.inner_path)
        if why is not None:
            raise BadInput(f"invalid path: {why}")
    return target, op


def _stays_derived(catalog: apsw.Connection, base: str, provenance: Provenance | None) -> bool:
    """Whether a new revision over ``base`` is derived from it: an edit of a derived note is still the
    derived note (a person's sed over a digest keeps the digest's audience, and goes with its sources).

    Not for a copy (a publish, a projection: its own decision), a deposit or a release (independent by
    review), and not over a base that may no longer be read (held, expired: its bytes do not flow into
    the new revision, which is the owner's fresh start).
    """
    if provenance is not None and provenance.operation not in (Op.APPEND, Op.DERIVE):
        return False
    if not is_derived(catalog, base) or is_held(catalog, base):
        return False
    until = inherited_validity(catalog, [base])
    return until is None or now_us() < until


def _recheck(access: Access, target: Target, op: Op) -> Decision:
    """The policy decision again, with the policy rows as they are now.

    Called inside the commit transactions, right after the base revision
    was verified unchanged, so only the policy (and the time, for expiry)
    can differ from the plan: one query for the entries, then the pure
    evaluator. No file I/O.
    """
    assert target.store is not None
    fresh = dataclasses.replace(access, now=now_us())
    entries = policy_entries(access.home.catalog(access.agent_id), access.agent_id, target.store.store_id,
                             target.resource.resource_id if target.resource else None)
    current = dataclasses.replace(target, entries=entries)
    if op is Op.REPLACE:
        visible = decide(fresh, current, Op.READ)
        if not visible and visible.reason not in RENEWABLE:
            return visible
    return decide(fresh, current, op)


@dataclass(frozen=True)
class _Pending:
    resource_id: str
    revision_id: str
    revision_no: int
    base_revision_id: str | None
    intent_id: str | None  # None in a close's one transaction
    event_id: str
    created: bool


def _record_pending(access: Access, store: StoreRow, target: Target, op: Op,
                    staged: _Staged, locator: str, expected_resource_id: Expected,
                    provenance: Provenance | None = None) -> _Pending:
    """Step 2: one short transaction, no file I/O."""
    catalog = access.home.catalog(access.agent_id)
    with relaxed(catalog), immediate(catalog):  # a lost pending row leaves an orphan file doctor quarantines
        return _pending_rows(access, store, target, op, staged, locator, expected_resource_id, provenance,
                             revision_id=ids.new_id("revision"), intent=True)


def _pending_rows(access: Access, store: StoreRow, target: Target, op: Op, staged: _Staged, locator: str,
                  expected_resource_id: Expected, provenance: Provenance | None, *, revision_id: str,
                  intent: bool) -> _Pending:
    """Check the base and the policy again and record the pending revision, inside the caller's transaction.

    Step 2's rows, and the first half of a close's one transaction
    (``_commit_once``), which has no intent: its marker stands for it.
    """
    agent_id = access.agent_id
    catalog = access.home.catalog(agent_id)
    path = target.inner_path
    expected_base = target.revision.revision_id if target.revision else None
    now = now_us()
    resource = find_resource(catalog, agent_id, store.store_id, path)
    expect_resource(resource, expected_resource_id)
    current = active_revision(catalog, agent_id, resource.resource_id) if resource else None
    if (current.revision_id if current else None) != expected_base:
        raise Conflict("the note changed while it was being written; nothing was written, try again")
    decision = _recheck(access, dataclasses.replace(target, store=store), op)
    if decision and provenance is not None:
        decision = provenance.authority(catalog, False)
    if not decision:
        raise PolicyChanged(decision)
    created = resource is None
    if created:
        why = path_conflict(catalog, agent_id, store.store_id, path)
        if why is not None:
            raise BadInput(f"invalid path: {why}")
        resource_id = ids.new_id("resource")
        catalog.execute(
            "INSERT INTO resources (resource_id, agent_id, store_id, path, created_at) VALUES (?, ?, ?, ?, ?)",
            (resource_id, agent_id, store.store_id, path, now),
        )
    else:
        assert resource is not None
        resource_id = resource.resource_id
    revision_no = scalar(catalog, "SELECT coalesce(max(revision_no), 0) + 1 FROM revisions WHERE resource_id = ?",
                         (resource_id,))
    intent_id = ids.new_id("intent") if intent else None
    event = access.event(provenance.operation if provenance else op, "allow", Reason.ALLOWED,
                         store_id=store.store_id, revision_id=revision_id)
    event_id = enqueue(catalog, agent_id, event)
    catalog.execute(
        "INSERT INTO revisions (revision_id, agent_id, resource_id, revision_no, base_revision_id, content_sha256,"
        " size, locator, state, session_id, actor_id, trust_origin, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
        (revision_id, agent_id, resource_id, revision_no, expected_base, staged.sha256, staged.size, locator,
         access.session.session_id, access.actor_id,
         provenance.trust_origin if provenance else _trust_origin(access), now),
    )
    if intent_id is not None:
        catalog.execute(
            "INSERT INTO write_intents (intent_id, agent_id, revision_id, store_id, staged_name, final_locator,"
            " expected_sha256, event_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (intent_id, agent_id, revision_id, store.store_id, staged.name, locator, staged.sha256, event_id,
             now),
        )
    if provenance is not None:
        provenance.reserve(catalog, resource_id, revision_id)
    return _Pending(resource_id, revision_id, revision_no, expected_base, intent_id, event_id, created)


def _abandon(access: Access, staging_fd: int, store_fd: int, staged: _Staged, locator: str | None,
             pending: _Pending, *, content_durable: bool, reason: Reason, decision: str) -> None:
    """Undo a transaction that failed after step 2, and drain its audit row.

    Which goes first depends on what failed. If the content's own fsyncs
    failed, the files go first: should the rollback transaction fail too,
    recovery must find no file rather than bytes whose fsync failed. If the
    content is durable (the failure came later, e.g. in the activation
    commit, whose outcome is then unknown), the rows go first and the files
    only if the rollback really happened: a commit that reached the WAL, or
    one that succeeded just before an exception, must never point at a file
    we removed. ``locator`` is None until our rename succeeded: a name we
    did not create is never removed.
    """
    catalog = access.home.catalog(access.agent_id)
    intent_id = pending.intent_id
    assert intent_id is not None  # only the two-transaction write abandons a pending row

    def rows() -> bool:
        try:
            return roll_back(catalog, access.agent_id, revision_id=pending.revision_id, intent_id=intent_id,
                             event_id=pending.event_id, reason=reason, decision=decision)
        except CATALOG_FAILURES:
            return False

    def files() -> None:
        if locator is not None:
            _unlink_quietly(store_fd, locator)
        if not staged.consumed:
            _unlink_quietly(staging_fd, staged.name)
            staged.consumed = True
        for fd in (store_fd, staging_fd):
            with contextlib.suppress(OSError):
                os.fsync(fd)

    if content_durable:
        if rows():
            files()
        # else: the rows are active (keep the file) or unknown (recovery settles both)
    else:
        files()
        rows()
    drain_quietly(access.home.state(), catalog, access.agent_id)


def _final_hash(store_fd: int, locator: str) -> tuple[str, int]:
    fd = open_artifact(store_fd, locator)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def _record_rows(access: Access, pending: _Pending, facts: ContentFacts, provenance: Provenance | None) -> None:
    """What is written with the activation besides the revision: lineage, front matter facts, a copy's rows."""
    catalog = access.home.catalog(access.agent_id)
    inherited = provenance.valid_until(catalog) if provenance and provenance.valid_until else None
    base = pending.base_revision_id
    if base is not None and _stays_derived(catalog, base, provenance):
        add_lineage(catalog, access.agent_id, pending.revision_id, base, "derive")
        from_base = inherited_validity(catalog, [base])
        if from_base is not None:
            inherited = from_base if inherited is None else min(inherited, from_base)
    facts.record(catalog, access.agent_id, pending.revision_id, inherited)
    if provenance is not None:
        provenance.record(catalog, pending.resource_id, pending.revision_id)


def _commit(access: Access, store: StoreRow, target: Target, op: Op,
            staging_fd: int, staged: _Staged, expected_resource_id: Expected, *, durable: bool = True,
            provenance: Provenance | None = None, defer_index: bool = False) -> WriteResult:
    """Steps 2-4 for an already staged file, under the shared writer lock."""
    home, agent_id = access.home, access.agent_id
    catalog = home.catalog(agent_id)
    shown_op = provenance.operation if provenance else op
    locator = ids.random_token()
    facts = content_facts(home, read_head(staged.fd, staged.size))  # bad front matter: nothing was written
    if facts.check(catalog, agent_id).allowed and access.cell:  # a pool write: the session's own cell forgot too
        own_catalog = home.catalog(access.session.agent_id)
        if not facts.check(own_catalog, access.session.agent_id):
            raise access.refuse(shown_op, Reason.FORGOTTEN, store_id=store.store_id)
    store_fd = open_store_dir(home, agent_id, store.path_key)
    marker = None
    try:
        if not durable and provenance is None:
            pending, marker = _commit_once(access, store, target, op, staging_fd, store_fd, staged, locator, facts,
                                           expected_resource_id, defer_index=defer_index)
        else:
            pending = _commit_twice(access, store, target, op, staging_fd, store_fd, staged, locator, facts,
                                    expected_resource_id, durable=durable, provenance=provenance,
                                    defer_index=defer_index)
    finally:
        os.close(store_fd)
    checkpoint(Step.ACTIVATED)
    if marker is not None:  # committed: a crash before this leaves a marker that recovery only removes
        placing.unmark(staging_fd, marker)
    if durable:  # otherwise the caller drains in batches (a mount: ``vfs.follow``), or the next start does
        drain_quietly(home.state(), home.catalog(agent_id), agent_id)
    checkpoint(Step.AUDITED)
    return WriteResult(pending.resource_id, pending.revision_id, pending.revision_no, staged.sha256, staged.size,
                       pending.created, store.store_id)


def _commit_twice(access: Access, store: StoreRow, target: Target, op: Op, staging_fd: int, store_fd: int,
                  staged: _Staged, locator: str, facts: ContentFacts, expected_resource_id: Expected, *,
                  durable: bool, provenance: Provenance | None, defer_index: bool) -> _Pending:
    """Steps 2-4 as DESIGN.md §6 has them: a pending revision, the file placed (and synced), the activation.

    For every write that promises more than a close: a durable one, whose
    syncs between the two commits can take long (its pending row tells
    recovery and doctor about the file meanwhile), and a copy, whose
    reservation must stay taken if the write then fails.
    """
    home, agent_id = access.home, access.agent_id
    catalog = home.catalog(agent_id)
    shown_op = provenance.operation if provenance else op
    revalidate(access, shown_op)
    try:
        pending = _record_pending(access, store, target, op, staged, locator, expected_resource_id, provenance)
    except PolicyChanged as changed:
        raise access.refuse(shown_op, changed.decision.reason, store_id=store.store_id) from None
    checkpoint(Step.PENDING)
    # What activation re-checks: the same target, now with its resource
    # (new or not), so entries added to it meanwhile count too.
    planned = dataclasses.replace(target, store=store, resource=ResourceRow(
        pending.resource_id, store.store_id, target.inner_path, "live"))
    assert pending.intent_id is not None

    def recheck() -> Decision:
        decision = _recheck(access, planned, op)
        if decision and provenance is not None:
            decision = provenance.authority(catalog, True)
        return facts.check(catalog, agent_id) if decision else decision

    renamed = placed = False
    try:
        renameat2_noreplace(staging_fd, staged.name, store_fd, locator)
        renamed = staged.consumed = True
        checkpoint(Step.RENAMED)
        if durable:
            os.fsync(staged.fd)  # an error here is final: never retried, never trusted
            os.fsync(store_fd)
        placed = True
        final_sha256, _ = _final_hash(store_fd, locator)
        checkpoint(Step.FINALIZED)
        # The slow part, before the transaction; a mount leaves it to the index's catch-up.
        index = None if defer_index else prepare_from_fd(staged.fd, current_model(home.catalog(agent_id)))
        revalidate(access, shown_op)
        activate(catalog, agent_id, resource_id=pending.resource_id, store_id=store.store_id,
                 revision_id=pending.revision_id, index=index, base_revision_id=pending.base_revision_id,
                 intent_id=pending.intent_id, event_id=pending.event_id, expected_sha256=staged.sha256,
                 final_sha256=final_sha256, recheck=recheck,
                 unsynced=None if durable else home.page_cache(),
                 record=lambda: _record_rows(access, pending, facts, provenance))
    except BaseException as exc:
        refusal = exc.decision if isinstance(exc, PolicyChanged) else None
        _abandon(access, staging_fd, store_fd, staged, locator if renamed else None, pending,
                 content_durable=placed,
                 reason=refusal.reason if refusal is not None else Reason.REVISION_STALE,
                 decision="deny" if refusal is not None else "error")
        if refusal is not None:  # the outbox row already carries the audit of this refusal
            raise access.denied(shown_op, refusal.reason) from None
        if isinstance(exc, OSError):
            raise storage_error("cannot finalize the note", exc) from exc
        raise
    return pending


def _commit_once(access: Access, store: StoreRow, target: Target, op: Op, staging_fd: int, store_fd: int,
                 staged: _Staged, locator: str, facts: ContentFacts, expected_resource_id: Expected, *,
                 defer_index: bool) -> tuple[_Pending, placing.Placing]:
    """A close through a mount: the file placed first, then one transaction records and activates it.

    A close syncs nothing, so nothing slow stands between placing its file
    and committing it, and a second transaction would only double the
    catalog work of every save. What the pending row told recovery, a
    marker in the staging folder tells it (``writer.placing``): a crash
    between the rename and the commit leaves a file no revision names, and
    the next write or doctor removes it. Everything the two transactions
    check, this one checks: the session, the base revision, the policy,
    forgotten content, the final hash. A refusal changes nothing and is
    audited as one; any other failure after the rename is audited as an
    error (``_failed``). The caller removes the marker once the commit is
    past (``Step.ACTIVATED``).
    """
    home, agent_id = access.home, access.agent_id
    catalog = home.catalog(agent_id)
    revision_id = ids.new_id("revision")
    try:
        marker = placing.mark(staging_fd, store.path_key, locator, revision_id, staged.name)
    except OSError as exc:
        raise storage_error("cannot finalize the note", exc) from exc
    renamed = committing = False
    try:
        checkpoint(Step.MARKED)
        renameat2_noreplace(staging_fd, staged.name, store_fd, locator)
        renamed = staged.consumed = True
        checkpoint(Step.RENAMED)
        final_sha256, _ = _final_hash(store_fd, locator)
        if final_sha256 != staged.sha256:
            raise IntegrityError("the final file does not match what was staged; nothing was activated")
        checkpoint(Step.FINALIZED)
        index = None if defer_index else prepare_from_fd(staged.fd, current_model(catalog))
        revalidate(access, op)
        with relaxed(catalog), immediate(catalog):
            pending = _pending_rows(access, store, target, op, staged, locator, expected_resource_id, None,
                                    revision_id=revision_id, intent=False)
            decision = facts.check(catalog, agent_id)
            if not decision:
                raise PolicyChanged(decision)
            settle_active(catalog, agent_id, resource_id=pending.resource_id, store_id=store.store_id,
                          revision_id=revision_id, base_revision_id=pending.base_revision_id, intent_id=None,
                          event_id=pending.event_id, index=index, unsynced=home.page_cache(),
                          record=lambda: _record_rows(access, pending, facts, None), now=now_us())
            committing = True  # the body is done: from here on only the COMMIT can fail
    except BaseException as exc:
        # A refusal is audited by whoever refused; a conflict or a bad path is the caller's answer (as a
        # pending row's transaction gave it); anything else after the marker is an error of the close's own.
        audit = not isinstance(exc, (PolicyChanged, Denied, Conflict, BadInput))
        landed = _failed(access, store, op, revision_id, committing=committing, audit=audit)
        if landed is False and renamed:  # a commit that reached the log keeps its file, whatever was raised
            _unlink_quietly(store_fd, locator)
        if landed is False:
            placing.unmark(staging_fd, marker)
        # landed True (the commit is there after all) or unknown: the marker stays, for recovery to settle
        # by the catalog.
        if isinstance(exc, PolicyChanged):
            raise access.refuse(op, exc.decision.reason, store_id=store.store_id) from None
        if isinstance(exc, OSError):
            raise storage_error("cannot finalize the note", exc) from exc
        raise
    return pending, marker


def _failed(access: Access, store: StoreRow, op: Op, revision_id: str, *, committing: bool,
            audit: bool) -> bool | None:
    """After a close's failure: whether its commit landed; None when that cannot be told.

    Only a failure of the COMMIT itself (``committing``) can have landed, and
    it may have even though it raised: its frames may sit at the end of the
    write-ahead log, replayable at the next open. A commit that is visible is
    final. One that is not is final only once a later commit has overwritten
    that tail: the error audit row (``audit``: what the pending row's
    rollback used to record) is that commit, and the catalog is asked again
    after it. If it cannot be written, nothing can be told.
    """
    catalog = access.home.catalog(access.agent_id)

    def visible() -> bool:
        return placing.landed(catalog, access.agent_id, revision_id)

    try:
        if not catalog.getautocommit():  # a rollback that failed: try once more, our own rows would show
            catalog.execute("ROLLBACK")
        if committing and visible():
            return True
        if audit:
            event = access.event(op, "error", Reason.REVISION_STALE, store_id=store.store_id,
                                 revision_id=revision_id)
            with relaxed(catalog), immediate(catalog):
                settle(catalog, enqueue(catalog, access.agent_id, event), decision="error",
                       reason=Reason.REVISION_STALE)
            drain_quietly(access.home.state(), catalog, access.agent_id)  # as a failed durable write's is
        return visible() if committing else False
    except CATALOG_FAILURES:
        return None if committing else False


def write_note(home: Home, session_id: str, path: str, source: bytes | BinaryIO, *,
               actor_id: str | None = None, durable: bool = True) -> WriteResult:
    """Write ``source`` as the next revision of the note at virtual ``path`` (a string, as the CLI has it)."""
    return write_parts(home, session_id, split_virtual_path(path), source, actor_id=actor_id, durable=durable)


def write_parts(home: Home, session_id: str, parts: Parts, source: bytes | BinaryIO, *,
                actor_id: str | None = None, expected_resource_id: Expected = None,
                durable: bool = True, provenance: Provenance | None = None, defer_index: bool = False,
                in_memory: bool = False) -> WriteResult:
    """Write ``source`` as the next revision of the note at ``parts``.

    Validation, authorization and the policy decision happen before any
    input is read; the content is then staged, abandoned writes of crashed
    processes are rolled back, and the write is planned again under the
    writer lock (the note may have moved on meanwhile) and committed. A
    refusal changes nothing but the audit.

    ``expected_resource_id``: the note the caller means to write (None: a
    new note, or whatever the path holds). It is checked at both plans and
    again inside the transaction that records the revision, so a rename
    landing meanwhile makes this a Conflict rather than a revision of
    another note (``catalog.access.expect_resource``).

    ``durable``: survive power loss once this returns (the default, for the
    command line and the API). False is a close through a mount: committed
    and visible at once, survives any process's death, may be rolled back
    after a power loss (module docstring), and its audit row waits in the
    outbox for the caller's next drain.

    ``in_memory``: ``source`` is already whole in memory (a mount's draft),
    so there is no input to wait for and nothing to gain by refusing before
    staging it: the write is planned once, under the writer lock, where
    every plan counts anyway.

    ``defer_index``: activate without search rows, queued in
    ``index_backlog`` (a mount's saves: cutting and embedding is a third of
    a save). The mount makes them once idle, and every search catches the
    stores it reads up first (``catalog.index.catch_up``), so no search
    misses the revision.

    ``provenance``: a write the session makes by placement but that is more
    than its own words (a derivation): its trust origin, an authority
    re-decided in both commits, and rows written with the activation.
    """
    check_parts(parts)
    access = authorize_session(home, session_id, Op.APPEND, actor_id=actor_id, parts=parts)
    if not in_memory:  # refuse before waiting for input; a mount's draft is already whole
        recover_pending_if_idle(home, access.agent_id)  # a crashed write must not block this plan
        _plan(access, parts, expected_resource_id)
    staging_fd = open_dir(home.staging_dir(access.agent_id))
    try:
        with _staged(staging_fd, source) as staged:
            recover_pending_if_idle(home, access.agent_id)
            with lock.shared(home.lock_path(access.agent_id)):
                target, op = _plan(access, parts, expected_resource_id)
                assert target.mount is not None  # _plan refused a path outside every mount
                store = target.store or ensure_store(access, target.mount)
                return _commit(access, store, target, op, staging_fd, staged, expected_resource_id, durable=durable,
                               provenance=provenance, defer_index=defer_index)
    finally:
        os.close(staging_fd)


def write_copy(access: Access, scope_kind: str, audience_id: str, inner: Parts, source: bytes,
               provenance: Provenance) -> WriteResult:
    """Write ``source`` into a store no view writes by placement, as ``access``'s broker-made copy.

    The caller decided the authority (``provenance.authority``, re-made in
    both commit transactions); the copy itself goes through the same
    staged-rename transaction as every write, through a view holding that
    one store and nothing else, so the plan, the conflict checks and the
    recovery are the ones every note has. Always durable: it is a command's
    answer.

    A delegated session writes only inside its caps, where its parent
    writes (``catalog.delegation``): it makes no copy outside its view but
    a deposit (its caps let ``postbox/`` in, ``writer.postbox`` checks).
    """
    if access.delegated and provenance.operation is not Op.DEPOSIT:
        raise access.refuse(provenance.operation, Reason.DEFAULT_DENY)
    check_parts(inner)
    mount = Mount("copy", scope_kind, audience_id, READ_WRITE, READ_WRITE)
    broker = dataclasses.replace(access, view=View(access.view.subject, (mount,)))
    parts = ("copy", *inner)
    home = access.home
    recover_pending_if_idle(home, access.agent_id)
    staging_fd = open_dir(home.staging_dir(access.agent_id))
    try:
        with _staged(staging_fd, source) as staged:
            with lock.shared(home.lock_path(access.agent_id)):
                target, op = _plan(broker, parts, None)
                store = target.store or ensure_store(broker, mount)
                return _commit(broker, store, target, op, staging_fd, staged, None, provenance=provenance)
    finally:
        os.close(staging_fd)


def check_write(home: Home, session_id: str, parts: Parts) -> None:
    """Raise (audited) if writing ``parts`` now would be refused; writes nothing."""
    access = authorize_session(home, session_id, Op.APPEND, parts=check_parts(parts))
    _plan(access, parts, None)


__all__ = ["Provenance", "WriteResult", "check_write", "write_copy", "write_note", "write_parts"]
