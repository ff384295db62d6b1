"""The admin's review of an agent's quarantine: release a migrated note where it belongs, or purge.

The seed's scope table gives the quarantine one reader, "admin review":
migration sends there what structural evidence could not give a person
(``writer.migrate``), a derivation that mixed audiences is filed there
(``writer.derive``), and ``doctor --fix`` moves there artifacts that no
longer hash (``tampered-<revision>``) and files no revision names.
``quarantine list`` shows all of it without content; these are the two
decisions a review makes on it.

* ``release``: a migrated note is copied, through the write transaction,
  into the private store of a person with a live binding (the owner
  assignment the migration could not prove, which the seed lets an admin
  confirm), into a conversation's channel store (a group's transcript,
  confirmed as that group's), or into agent-shared or a role's store (an
  admin's explicit mark). The copy keeps trust origin ``migration``. A
  release is a move: in the same transaction the quarantined note is
  forgotten (every revision; its bytes leave the disk after the commit, as
  ``forget``'s do) and an audit row names it, so a note is released once
  and its text is nowhere but in the copy, which its new owner can forget.
  A note already at the destination is never overwritten, and the
  destination's audience (the binding, the role, the conversation) is
  decided again inside both commits. A derivation filed for mixing
  audiences is not released: widening it is what the quarantine
  prevents, and only the session that made it can split it.
* ``purge``: a quarantined note is forgotten, with every revision and its
  bytes, as ``forget`` does, but without rejecting its claims, since the
  text was ambiguous rather than wrong. A tampered copy or a stray file is
  unlinked once its audit row is written.

Both only preview unless ``yes``. Both write as the broker
(``writer.broker``) and are audited with ids only: no byte of a note is
printed, logged or audited, and a refusal does not echo what was asked.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import apsw

from scopefs.catalog import ids
from scopefs.catalog.artifacts import read_verified
from scopefs.catalog.audit import drain_quietly, enqueue, settle
from scopefs.catalog.db import immediate, one
from scopefs.catalog.errors import BadInput, Conflict, Denied
from scopefs.catalog.fsafe import open_dir
from scopefs.catalog.home import Home
from scopefs.catalog.identity import get_principal, has_live_binding
from scopefs.catalog.paths import Parts, split_virtual_path
from scopefs.catalog.policy import ALLOW, Decision, Op
from scopefs.catalog.reasons import Reason
from scopefs.catalog.sharing import parse_audience
from scopefs.catalog.stores import active_at, find_store, path_conflict
from scopefs.writer.admin import StoredNote, forget_plan, forget_stored, known_agent, stored_note
from scopefs.writer.broker import broker_access
from scopefs.writer.derive import QUARANTINE
from scopefs.writer.forget import check_count, forget_files, forget_rows
from scopefs.writer.quarantine import folder_entries, tampered_revision
from scopefs.writer.transaction import Provenance, WriteResult, write_copy

RELEASE = "quarantine-release"
PURGE = "quarantine-purge"
TRUST_ORIGIN = "migration"  # a released note is still the migration's copy (``writer.migrate``)
MIGRATION_ROOT = "migration"
_NOT_THERE = "no such note in the quarantine (scopefs quarantine list shows what it holds)"


@dataclass(frozen=True)
class Released:
    preview: dict[str, Any]
    result: WriteResult | None  # None: only previewed


@dataclass(frozen=True)
class Purged:
    notes: list[StoredNote]
    files: list[str]  # names in the quarantine folder
    applied: bool
    forget_id: str | None

    def as_dict(self, agent_id: str) -> dict[str, Any]:
        return {"agent_id": agent_id, "applied": self.applied, "forget_id": self.forget_id,
                "notes": [{"path": q.shown, "resource_id": q.resource_id, "revision_id": q.revision.revision_id}
                          for q in self.notes],
                "files": [{"name": name, "revision_id": tampered_revision(name)} for name in self.files]}


def quarantined(catalog: apsw.Connection, agent_id: str, path: str) -> StoredNote:
    """The live quarantined note at ``path`` (as ``quarantine list`` prints it), else BadInput."""
    parts = split_virtual_path(path)
    return stored_note(catalog, agent_id, *QUARANTINE, parts, "/".join(parts), _NOT_THERE)


def _migration_class(catalog: apsw.Connection, agent_id: str, revision_id: str) -> str | None:
    """The migration's class of the item this revision is; None for anything else (a derivation filed for
    mixing audiences)."""
    row = one(catalog, "SELECT class FROM migration_items WHERE agent_id = ? AND revision_id = ?",
              (agent_id, revision_id))
    return None if row is None else str(row[0])


# -- release -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Destination:
    scope_kind: str
    audience_id: str
    spelled: str  # how the preview names it: private:<principal>, agent-shared, role:<name>, conversation:<id>
    owner: str | None  # the person whose live binding the copy needs, for a private store
    to: str | None  # the --to spelling, decided again inside both commits (a role retired, say)


def _destination(home: Home, agent_id: str, owner: str | None, to: str | None) -> _Destination:
    if (owner is None) == (to is None):
        raise BadInput("release names one destination: --owner PRINCIPAL (their private store) or --to"
                       " agent-shared|role:ROLE|conversation:CONVERSATION")
    if owner is not None:
        principal = get_principal(home.state(), owner)  # BadInput if unknown
        if principal.kind != "human" or principal.state != "active" or not has_live_binding(home.state(), owner):
            raise BadInput("--owner must be an active human principal with a live channel binding")
        return _Destination("user", owner, f"private:{owner}", owner, None)
    assert to is not None
    audience = parse_audience(home.state(), agent_id, to)
    if audience.kind == "conversation":  # a group's transcript, confirmed to be that group's: its channel store
        return _Destination("channel", audience.principal_id, audience.spelled, None, to)
    scope_kind, audience_id = audience.published_store()
    return _Destination(scope_kind, audience_id, audience.spelled, None, to)


def _still_there(home: Home, agent_id: str, destination: _Destination) -> bool:
    """Whether the destination's audience still stands: the person's binding, the role, the conversation."""
    if destination.owner is not None:
        return has_live_binding(home.state(), destination.owner)
    assert destination.to is not None
    try:
        return _destination(home, agent_id, None, destination.to) == destination
    except BadInput:
        return False


def _default_inner(note: StoredNote) -> Parts:
    """Where a released note goes unless ``--as`` says: its source path, without ``migration/<area>/``."""
    parts = note.parts
    if len(parts) > 2 and parts[0] == MIGRATION_ROOT:
        return parts[2:]
    return parts


def _taken(catalog: apsw.Connection, agent_id: str, to: _Destination, inner: Parts) -> str | None:
    """Why the copy cannot land at ``inner``: a note there (never overwritten), or a folder or note in the way."""
    path = "/".join(inner)
    if active_at(catalog, agent_id, to.scope_kind, to.audience_id, path) is not None:
        return "a note is at that destination already and is never overwritten; name another with --as"
    store = find_store(catalog, agent_id, to.scope_kind, to.audience_id)
    why = path_conflict(catalog, agent_id, store.store_id, path) if store is not None else None
    return None if why is None else f"invalid --as path: {why}"


def release(home: Home, agent_id: str, path: str, *, owner: str | None = None, to: str | None = None,
            as_path: str | None = None, yes: bool = False) -> Released:
    """Preview, or (``yes``) carry out, the release of the migrated note at ``path`` (module docstring)."""
    agent = known_agent(home, agent_id)
    catalog = home.catalog(agent)
    note = quarantined(catalog, agent, path)
    klass = _migration_class(catalog, agent, note.revision.revision_id)
    if klass is None:
        raise BadInput("only a note the migration quarantined can be released; a derivation filed for mixing"
                       " audiences stays until the session that made it splits it, or it is purged")
    destination = _destination(home, agent, owner, to)
    inner = split_virtual_path(as_path) if as_path is not None else _default_inner(note)
    why = _taken(catalog, agent, destination, inner)
    if why is not None:
        raise BadInput(why)
    preview = {"agent_id": agent, "path": note.shown, "revision_id": note.revision.revision_id,
               "class": klass, "size": note.revision.size, "to": destination.spelled,
               "as": "/".join(inner)}
    if not yes:
        return Released(preview, None)
    data = read_verified(home, agent, note.store, note.revision)  # a tampered note is never released (exit 4)
    plan = forget_plan(catalog, agent, [note])  # a move: the quarantined text leaves with the release

    def authority(conn: apsw.Connection, _activating: bool) -> Decision:
        if not note.still(conn, agent) or _taken(conn, agent, destination, inner) is not None:
            return Decision(False, Reason.REVISION_STALE)
        if not _still_there(home, agent, destination):
            return Decision(False, Reason.IDENTITY_REVOKED if destination.owner else Reason.MEMBERSHIP_STALE)
        return ALLOW

    with broker_access(home, agent, Op.IMPORT, RELEASE) as access:
        def record(conn: apsw.Connection, _resource_id: str, _revision_id: str) -> None:
            forget_rows(access, conn, ids.random_token(), plan, [], RELEASE, revision_id=note.revision.revision_id)

        try:
            result = write_copy(access, destination.scope_kind, destination.audience_id, inner, data,
                                Provenance(Op.IMPORT, TRUST_ORIGIN, authority, record))
        except Denied:
            if note.still(catalog, agent) and _taken(catalog, agent, destination, inner) is None:
                raise  # the audience went: the refusal as it is (exit 3)
            raise Conflict("the quarantined note or the destination changed meanwhile; nothing was released") from None
    drain_quietly(home.state(), catalog, agent)
    forget_files(home, agent, catalog, plan)
    return Released(preview, result)


# -- purge ---------------------------------------------------------------------------------------------------

def _file_name(entry: str) -> str:
    """A quarantine file's name as the operator typed it, checked before it is compared with anything."""
    try:
        fits = 0 < len(entry.encode("utf-8")) <= 255
    except UnicodeEncodeError:
        fits = False
    if not fits or "\0" in entry or entry in (".", ".."):
        raise BadInput(_NOT_THERE)
    return entry


def purge(home: Home, agent_id: str, entries: list[str], *, yes: bool = False) -> Purged:
    """Preview, or (``yes``) carry out, the purge of ``entries``: note paths (with a ``/``) or file names."""
    check_count(entries, "quarantine entries to purge")
    agent = known_agent(home, agent_id)
    catalog = home.catalog(agent)
    notes: dict[str, StoredNote] = {}
    files: list[str] = []
    present = folder_entries(home, agent)
    for entry in entries:
        if not isinstance(entry, str):
            raise BadInput(_NOT_THERE)
        if "/" in entry:
            note = quarantined(catalog, agent, entry)
            notes.setdefault(note.resource_id, note)
        elif _file_name(entry) not in present:
            raise BadInput(_NOT_THERE)
        elif present[entry] is None:
            raise BadInput("that quarantine entry is not a regular file; an operator removes it by hand")
        elif entry not in files:
            files.append(entry)
    if not yes:
        return Purged(list(notes.values()), files, False, None)
    forget_id = forget_stored(home, agent, list(notes.values()), PURGE).forget_id if notes else None
    if files:
        _unlink_files(home, agent, files)
    return Purged(list(notes.values()), files, True, forget_id)


def _unlink_files(home: Home, agent_id: str, files: list[str]) -> None:
    """Audit rows first, then the unlinks: a crash between leaves a file to purge again, never a silent one."""
    catalog = home.catalog(agent_id)
    with broker_access(home, agent_id, Op.DELETE, PURGE) as access, immediate(catalog):
        for name in files:
            event = access.event(PURGE, "allow", Reason.ALLOWED, revision_id=tampered_revision(name))
            settle(catalog, enqueue(catalog, agent_id, event), decision="allow", reason=Reason.ALLOWED)
    drain_quietly(home.state(), catalog, agent_id)
    qfd = open_dir(home.quarantine_dir(agent_id))
    try:
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile (a forget, doctor)
                os.unlink(name, dir_fd=qfd)
        os.fsync(qfd)
    finally:
        os.close(qfd)
