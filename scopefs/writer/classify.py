"""Where each legacy file goes: a pure function of structure, never of content.

The seed's classification rules ("Migration and compatibility"), decided
from which file it is and which OpenClaw session key names a transcript:

1. The workspace's memory (``USER.md``, ``MEMORY.md``/``memory.md``, daily
   notes, ``memory/**/*.md``, ``DREAMS.md`` without its machine blocks) goes
   to one person's ``private/`` only with ``--owner``, and only when no
   other person is known to have talked to this agent: ``sessions.json``
   was read whole from real folders (else ``no-session-index`` or
   ``session-index-unreadable``: who talked here cannot be said), and
   every direct-message key of this agent resolves through the binding
   table to that owner. A DM key that resolves to nobody (never bound, or
   its binding revoked) or that lacks the account to be resolved at all
   counts as another person: fail closed. Anyone else in one workspace:
   quarantine (``several-people``), whoever asks.
2. A transcript goes to the owner's ``private/transcripts/`` only with a
   proven one-to-one binding: exactly one session key names it, the key
   carries channel, account and sender (``agent:<id>:<channel>:<account>:direct:<peer>``,
   OpenClaw's ``per-account-channel-peer`` shape), and that tuple resolves
   to the owner's live binding. Group, shared-main, unbound, another
   person's, incomplete or unrecognised keys: quarantine. Everything
   transcript-derived (``memory/.dreams/``, the dreaming phase reports and
   blocks) is quarantined too.
3. What the operator marks with ``--shared PATH`` goes to ``agent-shared/``,
   unless it is transcript-derived (rule 2 wins; ``writer.migrate``
   refuses such a mark outright).
4. Anything else whose owner is not decided this way: quarantine, never
   ``agent-shared/``. The derived index databases are rebuilt, never
   copied; symlinks, special files, names that are not UTF-8, files over
   the size bound and notes whose ``valid-until``/``superseded-by`` front
   matter no write would accept are skipped and listed.

``resolve`` is the only outside fact (a binding lookup); the function
reads no file and no database itself, so tests drive it directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from scopefs.catalog.errors import BadInput
from scopefs.catalog.paths import check_parts
from scopefs.writer.legacy import MACHINE_PHASES, Found, Layout, SessionIndex

PRIVATE, SHARED, QUARANTINE, REBUILD, SKIP = "private", "agent-shared", "quarantine", "rebuild", "skip"
COPIED = frozenset({PRIVATE, SHARED, QUARANTINE})

Resolver = Callable[[str, str, str], "tuple[str, str] | None"]  # (channel, account, sender) -> (binding, principal)

_DAILY = re.compile(r"memory/\d{4}-\d{2}-\d{2}(-[^/]{1,200})?\.md")
# Both spellings present: which one OpenClaw last used is not a structural fact, so the lower-case twin waits in
# quarantine for review rather than becoming a second long-term memory.
_LOWER_TWINS = {"memory.md": "MEMORY.md", "dreams.md": "DREAMS.md"}
_SKIPPED_KINDS = {"symlink": "symlink", "other": "not-regular", "unnamed": "name-not-utf8",
                  "too-large": "too-large", "hard-link": "hard-link"}


@dataclass(frozen=True)
class Item:
    """One line of the plan: a file (or a part of DREAMS.md), where it goes and why."""

    source: str
    part: str
    klass: str
    action: str
    reason: str
    inner: tuple[str, ...] = ()  # the path inside the destination store
    sha256: str = ""
    size: int = 0
    source_sha256: str = ""
    binding_id: str | None = None  # a transcript's proven binding, rechecked at every commit

    @property
    def destination(self) -> str | None:
        if self.action == PRIVATE:
            return "/".join(("private", *self.inner))
        if self.action == SHARED:
            return "/".join(("agent-shared", *self.inner))
        return QUARANTINE if self.action == QUARANTINE else None

    @property
    def key(self) -> str:
        """What identifies the source part across runs (digested with the home's key before it is stored)."""
        return f"{self.source}#{self.part}" if self.part else self.source

    def quarantined(self, reason: str) -> Item:
        """This item sent to quarantine instead (a destination decided against after classification)."""
        area, _, rel = self.source.partition("/")
        inner = _named(("migration", area, *rel.split("/")), self.part)
        if inner is None:  # a path at the length limit: two more components do not fit
            return Item(self.source, self.part, self.klass, SKIP, "name-invalid", (), self.sha256, self.size,
                        self.source_sha256)
        return Item(self.source, self.part, self.klass, QUARANTINE, reason, inner, self.sha256, self.size,
                    self.source_sha256)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "part": self.part or None, "class": self.klass, "action": self.action,
                "destination": self.destination, "reason": self.reason, "sha256": self.sha256 or None,
                "size": self.size}


@dataclass(frozen=True)
class KeyShape:
    kind: str  # dm | dm-incomplete | group | main | other
    agent: str = ""
    channel: str = ""
    account: str = ""
    sender: str = ""


def parse_session_key(key: str) -> KeyShape:
    """An OpenClaw session key's shape; only the full direct-message shape carries a binding tuple."""
    parts = key.split(":")
    if len(parts) < 3 or parts[0] != "agent" or any(not p for p in parts):
        return KeyShape("other")
    agent, rest = parts[1], parts[2:]
    if rest == ["main"]:
        return KeyShape("main", agent)
    if len(rest) == 4 and rest[2] == "direct":
        return KeyShape("dm", agent, rest[0], rest[1], rest[3])
    if "direct" in rest:
        return KeyShape("dm-incomplete", agent)
    if len(rest) >= 3 and rest[1] in ("group", "channel"):
        return KeyShape("group", agent)
    return KeyShape("other", agent)


@dataclass(frozen=True)
class _Transcripts:
    decided: dict[str, tuple[str, str | None, str | None]]  # session id -> (reason, binding, principal)
    people: frozenset[str]  # principals that held a direct conversation with this agent; UNKNOWN: not resolved


UNKNOWN_PERSON = ""  # a DM partner no live binding names: never the owner, as far as anyone can prove


def _transcripts(sessions: SessionIndex, openclaw_agent: str, resolve: Resolver) -> _Transcripts:
    decided: dict[str, tuple[str, str | None, str | None]] = {}
    people: set[str] = set()
    for sid, keys in sessions.keys_by_session.items():
        shapes = [parse_session_key(k) for k in keys]
        for shape in shapes:  # anyone behind any DM key counts as a person of this workspace
            if shape.kind == "dm" and shape.agent == openclaw_agent:
                found = resolve(shape.channel, shape.account, shape.sender)
                people.add(found[1] if found is not None else UNKNOWN_PERSON)
            elif shape.kind == "dm-incomplete" and shape.agent == openclaw_agent:
                people.add(UNKNOWN_PERSON)  # no account: no binding can say it was the owner
        if len(keys) != 1:
            decided[sid] = ("ambiguous-key", None, None)
            continue
        shape = shapes[0]
        if shape.kind != "other" and shape.agent != openclaw_agent:
            decided[sid] = ("other-agent", None, None)
        elif shape.kind == "dm":
            found = resolve(shape.channel, shape.account, shape.sender)
            decided[sid] = ("bound-dm", *found) if found else ("unbound", None, None)
        else:
            decided[sid] = ({"main": "shared-main", "group": "group-transcript", "dm-incomplete":
                             "dm-key-lacks-account"}.get(shape.kind, "unrecognized-key"), None, None)
    return _Transcripts(decided, frozenset(people))


TRANSCRIPT_DERIVED = frozenset({"dreaming-state", "dream-report", "dream-phase"})


def transcript_derived(rel: str) -> bool:
    """Whether a workspace path holds (or, ``DREAMS.md``, may hold) what the dreaming sweep took from transcripts."""
    return rel in ("DREAMS.md", "dreams.md") or rel.startswith(("memory/.dreams/", "memory/dreaming/"))


def _workspace_class(found: Found) -> str:
    rel = found.rel
    if rel == "USER.md":
        return "user-profile"
    if rel in ("MEMORY.md", "memory.md"):
        return "long-term-memory"
    if rel in ("DREAMS.md", "dreams.md"):
        return "dream-phase" if found.part in MACHINE_PHASES else "dreams"
    if rel.startswith("memory/.dreams/"):
        return "dreaming-state"
    if rel.startswith("memory/dreaming/"):
        return "dream-report"
    if _DAILY.fullmatch(rel):
        return "daily-note"
    if rel.startswith("memory/") and rel.endswith(".md"):
        return "memory-note"
    return "other"


def _inner(found: Found, action: str) -> tuple[str, ...] | None:
    if action == QUARANTINE:
        parts = ("migration", found.area, *found.parts)
    elif found.area == "state":  # a transcript proven to be the owner's
        parts = ("transcripts", found.parts[-1])
    else:
        parts = found.parts
    return _named(parts, found.part)


def _named(parts: tuple[str, ...], part: str) -> tuple[str, ...] | None:
    """The store path for a file (or a DREAMS.md part, ``DREAMS.md.light``); None if it is no valid path."""
    if part:
        parts = (*parts[:-1], f"{parts[-1]}.{part}")
    try:
        return check_parts(parts)
    except BadInput:
        return None


def classify(layout: Layout, *, owner: str | None, resolve: Resolver, shared: Iterable[str],
             openclaw_agent: str) -> list[Item]:
    """The plan for ``layout`` (module docstring); one item per file or DREAMS.md part, in scan order."""
    marked = frozenset(shared)
    t = _transcripts(layout.sessions, openclaw_agent, resolve)
    if owner is None:
        memory_reason = "no-owner"
    elif not layout.sessions.present:
        memory_reason = "no-session-index"
    elif not layout.sessions.readable:
        memory_reason = "session-index-unreadable"
    elif t.people - {owner}:
        memory_reason = "several-people"
    else:
        memory_reason = "owner-confirmed"
    present = {f.rel for f in layout.found if f.area == "workspace"}
    items = []
    for found in layout.found:
        if found.area == "workspace":  # transcript-derived first: no mark makes it reference material
            klass = _workspace_class(found)
            if found.rel in marked and klass not in TRANSCRIPT_DERIVED:
                klass = "reference"
        else:
            klass = _state_class(found, layout, openclaw_agent)
        action, reason, binding = _decide(found, klass, memory_reason, marked, present, layout, t, owner)
        inner: tuple[str, ...] = ()
        if action in COPIED and not found.front_matter_ok:
            action, reason, binding = SKIP, "front-matter-invalid", None
        if action in COPIED:
            got = _inner(found, action)
            if got is None:
                action, reason, binding = SKIP, "name-invalid", None
            else:
                inner = got
        items.append(Item(found.source, found.part, klass, action, reason, inner, found.sha256, found.size,
                          found.source_sha256, binding))
    return items


def _state_class(found: Found, layout: Layout, openclaw_agent: str) -> str:
    rel = found.rel
    if rel.startswith((f"agents/{openclaw_agent}/agent/openclaw-agent.sqlite", "memory/")):
        return "index-db"
    if rel == f"{layout.sessions_dir}/sessions.json":
        return "session-index"
    if rel.startswith(f"{layout.sessions_dir}/") and rel.endswith(".jsonl") and rel.count("/") == 3:
        return "transcript"
    if rel.startswith(f"{layout.sessions_dir}/"):
        return "transcript-archive"
    return "agent-runtime"


def _decide(found: Found, klass: str, memory_reason: str, marked: frozenset[str], present: set[str],
            layout: Layout, t: _Transcripts, owner: str | None) -> tuple[str, str, str | None]:
    if klass == "index-db":
        return REBUILD, "derived-index", None
    if found.kind != "file":
        return SKIP, _SKIPPED_KINDS.get(found.kind, "not-regular"), None
    if klass == "session-index":
        return SKIP, "session-metadata", None  # routing keys with raw sender ids: read, never copied
    if klass == "agent-runtime":
        return SKIP, "not-memory", None  # credentials, model settings: never copied
    if found.area == "workspace":
        if klass in TRANSCRIPT_DERIVED:
            return QUARANTINE, "transcript-derived", None
        if found.part == "damaged":
            return QUARANTINE, "dream-markers-damaged", None
        if found.rel in marked:
            return SHARED, "admin-marked", None
        if not found.utf8:
            return QUARANTINE, "not-utf8", None
        if _LOWER_TWINS.get(found.rel) in present:
            return QUARANTINE, "duplicate-root-file", None
        if klass == "other":
            return QUARANTINE, "not-a-memory-note", None
        if memory_reason != "owner-confirmed":
            return QUARANTINE, memory_reason, None
        return PRIVATE, memory_reason, None
    if klass == "transcript-archive":
        return QUARANTINE, "transcript-unreferenced", None
    if not layout.sessions.readable:
        return QUARANTINE, "session-index-unreadable", None
    sid = found.parts[-1][: -len(".jsonl")]
    reason, binding, principal = t.decided.get(sid, ("transcript-unreferenced", None, None))
    if not found.utf8:
        return QUARANTINE, "not-utf8", None
    if reason != "bound-dm":
        return QUARANTINE, reason, None
    if owner is None:
        return QUARANTINE, "no-owner", None
    if principal != owner:
        return QUARANTINE, "other-person", None
    return PRIVATE, "bound-dm-owner", binding
