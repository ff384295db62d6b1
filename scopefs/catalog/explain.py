"""``scopefs explain``: why a virtual path of a session's view is writable, read-only, or not there.

The verdict is not computed here: it is what ``catalog.access.decide`` (the
pure evaluator, ``catalog.policy.evaluate``, over the resolved target) says,
the same call a read or a write makes, and for folders what the mount's own
picture (``catalog.visible.build``) shows. This module only gathers the
evidence behind that verdict for an operator: the subject kind, the store
kind, the rule that decided (placement in a mount, or the policy entries
that allowed or denied), and the evidence rows (binding, membership,
policy entry) with their revisions and expiries.

A folder the view shows only because one of its roots lies below it
(``roles/``, ``projections/``, a child session's ``private/`` above its cap)
is a read-only folder with no store of its own. The mount's ``.search`` and
``.history`` folders are not part of the memory view and are out of scope:
explain answers ``absent`` for them.

Anything the session may not see (another scope's store, a tombstoned,
expired, held or denied note, a root whose evidence went stale) is
explained exactly as a path that never existed: the answer for those holds
nothing derived from the path, so the two are the same bytes. An operator
who needs the denied detail reads the audit (``scopefs audit``), which
records every refusal with its true reason.

Exit code: explain always answers (0) once the session and the path are
valid input; the verdict, ``absent`` included, is in the output. A session
whose own evidence is gone gets verdict ``denied`` with the session-level
reason ``read`` would also show (``identity-revoked``, say), whatever path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scopefs.catalog.access import Access, Target, current_access, decide, resolve
from scopefs.catalog.db import one
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import AudienceKind, Effect, Entry, Mount, Op, required
from scopefs.catalog.subject import SubjectKind
from scopefs.catalog.visible import build

ABSENT_TEXT = "absent: not in this session's view (no such note, or not permitted)"


@dataclass(frozen=True)
class Explanation:
    session_id: str
    subject_kind: str
    verdict: str  # writable | read-only | deposit-only | absent | denied
    reason: str  # the evaluator's reason code for the verdict
    path: str | None = None  # only for what the session can see
    kind: str | None = None  # note | folder
    store_kind: str | None = None
    store_id: str | None = None
    mount_root: str | None = None
    read_rule: str | None = None
    write_rule: str | None = None
    write_reason: str | None = None
    revision: dict[str, Any] | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: only the fields a visible path has, so an absent answer is always the same."""
        out: dict[str, Any] = {"session_id": self.session_id, "subject_kind": self.subject_kind,
                               "verdict": self.verdict, "reason": self.reason}
        if self.verdict in ("absent", "denied"):
            return out
        out.update(path=self.path, kind=self.kind, store_kind=self.store_kind, store_id=self.store_id,
                   mount_root=self.mount_root, read_rule=self.read_rule, write_rule=self.write_rule,
                   write_reason=self.write_reason, revision=self.revision, evidence=self.evidence)
        return out

    def lines(self) -> list[str]:
        if self.verdict == "absent":
            return [ABSENT_TEXT]
        if self.verdict == "denied":
            return [f"denied: this session's evidence is gone ({self.reason}); nothing in its view is available"]
        lines = [f"{self.path}: {self.verdict} ({self.kind})",
                 f"  subject: {self.subject_kind}; " + (f"store: {self.store_kind} under {self.mount_root}/"
                                                         if self.mount_root is not None
                                                         else "no store: a folder above the view's stores"),
                 f"  read: {self.read_rule}",
                 f"  write: {self.write_rule}" + (f" [{self.write_reason}]" if self.write_reason else "")]
        if self.revision is not None:
            shown = self.revision
            lines.append(f"  revision: {shown['revision_id']} (no. {shown['revision_no']}, valid until "
                         f"{_when(shown['valid_until_us'])})")
        for item in self.evidence:
            ident = next((f"{k}={v}" for k, v in item.items() if k.endswith("_id")), "")
            rev = f" revision {item['evidence_revision']}" if item.get("evidence_revision") is not None else ""
            lines.append(f"  evidence: {item['kind']} {ident}{rev}, expires {_when(item.get('expires_at_us'))}")
        return lines


def _when(us: int | None) -> str:
    return "never" if us is None else f"at {us} (us since the epoch)"


def explain(home: Home, session_id: str, path: str) -> Explanation:
    """Why ``path`` is what it is in the session's view now (see the module docstring)."""
    parts = split_virtual_path(path)  # BadInput before anything is looked up
    access, problem = current_access(home, session_id)
    kind = access.session.subject.kind.value
    if problem is not None:
        return Explanation(session_id, kind, "denied", str(problem))
    absent = _above_roots(access, parts) or Explanation(session_id, kind, "absent", "outside-view")
    access = access.narrowed(parts)
    if parts in tuple(tuple(r.split("/")) for r in access.view.roots()):
        return _root(access, parts, absent)
    target = resolve(access, parts)
    if target.mount is None:
        return absent
    read = decide(access, target, Op.READ)
    if not read:
        return _folder(home, access, parts, target.mount, absent)
    assert target.store is not None and target.revision is not None
    write = decide(access, target, Op.REPLACE)
    entries = _entry_rows(access, target)
    evidence = _evidence(home, access, target.mount)
    used = [e for e in entries if e["entry_id"] in _deciding(access, entries, Op.READ) | _deciding(
        access, entries, Op.REPLACE)]
    revision = {"revision_id": target.revision.revision_id, "revision_no": target.revision.revision_no,
                "valid_until_us": target.revision.valid_until}
    return Explanation(
        session_id, kind, "writable" if write else "read-only", str(read.reason), path="/".join(parts), kind="note",
        store_kind=target.mount.scope_kind, store_id=target.store.store_id, mount_root=target.mount.root,
        read_rule=_rule(access, target.mount, entries, Op.READ),
        write_rule=_rule(access, target.mount, entries, Op.REPLACE) if write else _refusal(target.mount, entries,
                                                                                              access),
        write_reason=None if write else str(write.reason), revision=revision,
        evidence=evidence + [_entry_evidence(e) for e in used])


def _above_roots(access: Access, parts: tuple[str, ...]) -> Explanation | None:
    """A folder the view shows only because a root lies below it (``roles/`` above ``roles/eng``, a child
    session's ``private/`` above its cap ``private/notes``): read-only by placement, no store of its own.

    Computed from this session's own roots (``View.roots``: live mounts, or the caps that narrow them), the
    same folders its mount lists, so it says nothing the session's ``ls`` does not show."""
    if not any(len(root) > len(parts) and root[: len(parts)] == parts
               for root in (tuple(r.split("/")) for r in access.view.roots())):
        return None
    return Explanation(access.session.session_id, access.session.subject.kind.value, "read-only", "allowed",
                       path="/".join(parts), kind="folder", read_rule="placement: lists the folders below it",
                       write_rule="placement: no store here; notes go in a store below")


def _root(access: Access, parts: tuple[str, ...], absent: Explanation) -> Explanation:
    """A folder the view always shows (a mount's root, or a delegated cap), even while empty."""
    found = access.view.folder_mount(parts)
    if found is None:
        return absent
    mount = found[0]
    return _folder_answer(access, parts, mount)


def _folder(home: Home, access: Access, parts: tuple[str, ...], mount: Mount, absent: Explanation) -> Explanation:
    """A name with no readable note: a folder if the mount's picture shows a note below it, else absent."""
    picture = build(home, access.session.session_id)
    if not any(note[: len(parts)] == parts and len(note) > len(parts) for note in picture.notes):
        return absent
    return _folder_answer(access, parts, mount)


def _folder_answer(access: Access, parts: tuple[str, ...], mount: Mount) -> Explanation:
    if Op.APPEND in mount.placement:
        verdict, rule = "writable", "placement: new notes may be created here (append by placement)"
    elif Op.DEPOSIT in mount.placement:
        verdict, rule = "deposit-only", "placement: deposits only; nothing lists or reads back"
    else:
        verdict, rule = "read-only", "placement: no write capability in this mount"
    read_rule = ("placement" if Op.READ in mount.placement
                 else "no read by placement: each note needs a live allow entry" if Op.READ in mount.ceiling
                 else "nothing readable")
    return Explanation(access.session.session_id, access.session.subject.kind.value, verdict, "allowed",
                       path="/".join(parts), kind="folder", store_kind=mount.scope_kind, mount_root=mount.root,
                       read_rule=read_rule, write_rule=rule, evidence=_evidence(access.home, access, mount))


def _entry_rows(access: Access, target: Target) -> list[dict[str, Any]]:
    """The policy entries ``decide`` weighed, with their ids (the same rows ``stores.policy_entries`` reads)."""
    assert target.store is not None and target.resource is not None
    agent = access.agent_id
    rows = access.home.catalog(agent).execute(
        "SELECT e.entry_id, e.policy_id, e.policy_revision, e.effect, e.capability, e.audience_kind, e.audience_id,"
        " e.expires_at FROM policy_entries e JOIN policies p USING (policy_id)"
        " WHERE e.agent_id = ? AND p.agent_id = ? AND p.state = 'active' AND e.revoked_at IS NULL"
        " AND ((p.target_kind = 'store' AND p.target_id = ?) OR (p.target_kind = 'resource' AND p.target_id = ?))"
        " ORDER BY e.entry_id",
        (agent, agent, target.store.store_id, target.resource.resource_id)).fetchall()
    return [{"entry_id": r[0], "policy_id": r[1], "policy_revision": r[2],
             "entry": Entry(Effect(str(r[3])), Op(str(r[4])), AudienceKind(str(r[5])), str(r[6]),
                            None if r[7] is None else int(r[7]))} for r in rows]


def _applicable(access: Access, entries: list[dict[str, Any]], op: Op) -> list[dict[str, Any]]:
    needs = required(op)
    return [e for e in entries if e["entry"].live(access.now) and e["entry"].matches(access.session.subject)
            and e["entry"].capability in needs]


def _deciding(access: Access, entries: list[dict[str, Any]], op: Op) -> set[str]:
    return {e["entry_id"] for e in _applicable(access, entries, op)}


def _rule(access: Access, mount: Mount, entries: list[dict[str, Any]], op: Op) -> str:
    """Which step allowed ``op``: placement in the mount, or live allow entries within its ceiling."""
    needs = required(op)
    by_placement = needs <= mount.placement
    allows = [e for e in _applicable(access, entries, op) if e["entry"].effect is Effect.ALLOW]
    if by_placement:
        return f"placement in {mount.root}/ grants {', '.join(sorted(needs))}"
    return "allow entr" + ("y " if len(allows) == 1 else "ies ") + ", ".join(e["entry_id"] for e in allows) + \
        f" within the ceiling of {mount.root}/"


def _refusal(mount: Mount, entries: list[dict[str, Any]], access: Access) -> str:
    denies = [e for e in _applicable(access, entries, Op.REPLACE) if e["entry"].effect is Effect.DENY]
    if denies:
        return "deny entr" + ("y " if len(denies) == 1 else "ies ") + ", ".join(e["entry_id"] for e in denies)
    if not required(Op.REPLACE) <= mount.ceiling:
        return f"{mount.root}/ is read-only for this subject (no write in its placement or ceiling)"
    return "no placement and no live allow entry for replace"


def _entry_evidence(e: dict[str, Any]) -> dict[str, Any]:
    entry: Entry = e["entry"]
    return {"kind": "policy-entry", "entry_id": e["entry_id"], "policy_id": e["policy_id"],
            "evidence_revision": e["policy_revision"], "effect": str(entry.effect),
            "capability": str(entry.capability), "expires_at_us": entry.expires_at}


def _evidence(home: Home, access: Access, mount: Mount) -> list[dict[str, Any]]:
    """The identity evidence the view rests on for this mount, with revisions and expiries."""
    session = access.session
    subject = session.subject
    state = home.state()
    out: list[dict[str, Any]] = []
    if subject.kind is SubjectKind.USER and session.binding_id is not None:
        row = one(state, "SELECT evidence_revision, created_at FROM identity_bindings WHERE binding_id = ?",
                  (session.binding_id,))
        if row is not None:
            out.append({"kind": "binding", "binding_id": session.binding_id, "evidence_revision": row[0],
                        "created_at_us": row[1], "expires_at_us": None})
    elif subject.kind is SubjectKind.CONVERSATION:
        out.append({"kind": "conversation", "conversation_id": subject.principal_id, "expires_at_us": None})
    elif subject.kind is SubjectKind.SERVICE:
        out.append({"kind": "service-principal", "principal_id": subject.principal_id, "expires_at_us": None})
    if mount.scope_kind == "role" or (mount.scope_kind == "projection" and mount.root.startswith("projections/roles/")):
        row = one(state, "SELECT membership_id, evidence_revision, expires_at FROM memberships"
                         " WHERE group_id = ? AND principal_id = ? AND removed_at IS NULL",
                  (mount.audience_id, subject.principal_id))
        if row is not None:
            out.append({"kind": "membership", "membership_id": row[0], "role_id": mount.audience_id,
                        "evidence_revision": row[1], "expires_at_us": row[2]})
    if mount.cell:
        out.append({"kind": "pool", "pool": mount.cell.split(":", 1)[-1], "expires_at_us": None})
    return out
