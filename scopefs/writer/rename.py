"""Renaming a note inside its store: one transaction, no file touched.

Artifacts are named by broker-generated locators, never by note paths, so a
rename only moves the resource's logical path; the resource keeps its
identity and its revisions. Renaming over an existing note tombstones that
note in the same transaction (POSIX ``rename`` replaces the target). A
rename between two roots would move content across audiences and is
refused as a cross-device link: tools such as ``mv`` then copy, which goes
through the ordinary write path and its policy checks.
"""

from __future__ import annotations

from scopefs.catalog.access import Expected, authorize_session, decide, existing_target, expect_resource, resolve
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.db import immediate
from scopefs.catalog.errors import BadInput
from scopefs.catalog.home import Home
from scopefs.catalog.paths import Parts, check_parts, split_virtual_path
from scopefs.catalog.policy import Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import path_conflict
from scopefs.writer import lock
from scopefs.writer.tombstone import tombstone_rows


class CrossRoot(BadInput):
    """Source and destination lie under different roots of the view."""


class TargetExists(BadInput):
    """The destination exists and the caller asked not to replace it."""


def rename_note(home: Home, session_id: str, source: str, destination: str, *, replace: bool = True,
                actor_id: str | None = None) -> str:
    """Move the note at ``source`` to ``destination`` (strings, as the command line has them)."""
    return rename_parts(home, session_id, split_virtual_path(source), split_virtual_path(destination),
                        replace=replace, actor_id=actor_id)


def rename_parts(home: Home, session_id: str, src_parts: Parts, dst_parts: Parts, *, replace: bool = True,
                 actor_id: str | None = None, expected_resource_id: Expected = None,
                 expected_target_id: Expected = None) -> str:
    """Move the note at ``src_parts`` to ``dst_parts``; returns its resource id.

    ``expected_resource_id``: the note the caller means to move;
    ``expected_target_id``: the note it means to replace at the destination,
    or ``VACANT`` if it saw none there. If either path holds something else
    by the time the transaction runs, Conflict and nothing changes
    (``catalog.access.expect_resource``): a rename never tombstones a note
    its caller did not know was there.
    """
    check_parts(src_parts)
    check_parts(dst_parts)
    access = authorize_session(home, session_id, Op.DELETE, actor_id=actor_id, parts=src_parts)
    catalog = home.catalog(access.agent_id)
    with lock.shared(home.lock_path(access.agent_id)):
        with immediate(catalog):
            src = existing_target(access, src_parts, Op.DELETE, expected_resource_id=expected_resource_id)
            dst = resolve(access, dst_parts)
            expect_resource(dst.resource, expected_target_id)
            if dst.mount != src.mount:
                raise CrossRoot("cannot rename across roots; copy the note instead")
            if not dst.inner:
                raise BadInput("invalid path: name a note inside the root")
            assert src.store is not None and src.resource is not None and src.revision is not None
            replaced = dst.resource is not None and dst.revision is not None
            if dst.resource is not None and replaced and dst.resource.resource_id == src.resource.resource_id:
                return src.resource.resource_id  # rename onto itself: nothing to do
            if replaced:
                if not replace:
                    raise TargetExists("the destination exists")
                existing_target(access, dst_parts, Op.REPLACE, expected_resource_id=expected_target_id)
                existing_target(access, dst_parts, Op.DELETE, expected_resource_id=expected_target_id)
            else:
                decision = decide(access, dst, Op.APPEND)
                if not decision:
                    raise access.refuse(Op.APPEND, decision.reason, store_id=src.store.store_id)
                why = path_conflict(catalog, access.agent_id, src.store.store_id, dst.inner_path)
                if why is not None:
                    raise BadInput(f"invalid path: {why}")
            event_id = enqueue(catalog, access.agent_id, access.event(
                "rename", "allow", Reason.ALLOWED, store_id=src.store.store_id,
                revision_id=src.revision.revision_id))
            if replaced:
                assert dst.resource is not None and dst.revision is not None
                tombstone_rows(catalog, dst.resource.resource_id, dst.revision.revision_id)
            catalog.execute("UPDATE resources SET path = ? WHERE resource_id = ?",
                            (dst.inner_path, src.resource.resource_id))
            settle(catalog, event_id, decision="allow", reason=Reason.ALLOWED)
    drain_quietly(home.state(), catalog, access.agent_id)
    return src.resource.resource_id
