"""Delegation: a child session that sees at most what its parent sees, and only inside its caps.

The seed ("Delegation and autonomous runs"): a child's view is its
parent's authorized view, intersected with the child's task capability
snapshot, with the child's own session visibility, and with the current
revocation and membership state. Here:

* A child is opened under a parent session of the same agent
  (``catalog.children``) and stamped once: a ``sessions`` row carrying the
  parent's subject unchanged (never inferred), and a ``session_delegations``
  row naming the parent and the caps. Triggers make both write-once.
* Its access is computed from the parent's *current* access every time
  (``catalog.access``), up a chain of at most ``MAX_DEPTH`` parents; a
  parent that is closed, revoked or unknown, a chain too deep, or one whose
  rows disagree, fails the child closed with the reason the rest uses. So a
  child loses access the moment its parent does, and a stored child id
  never outlives its parent's evidence; closing a child changes nothing
  above it.
* ``restrict`` narrows the parent's view to the caps: a mount stays only if
  a cap covers it or lies inside it, and inside a mount only what lies
  strictly below a cap is in the view (``View.permits``; every lane asks
  ``View.mount_for`` or that predicate). A cap that names nothing of the
  parent's view grants nothing and is dropped without a word: the child
  cannot tell a root the parent lacks from one that does not exist.

Capability syntax, on purpose small and bounded: a cap is a virtual folder
of the view, ``ROOT[/FOLDER...]``, optionally written with a trailing
``/**`` (the same thing: everything below it). Each component follows the
rules of ``catalog.paths`` (no ``..``, no absolute paths, no control
characters, NFC); a component holding ``*``, ``?``, ``[`` or ``]`` is
refused so that nobody reads a glob into it. At most ``MAX_CAPS`` caps;
duplicates and caps inside another cap collapse. No regex, no other
wildcard, nothing resolved against what exists.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apsw

from scopefs.catalog.db import one
from scopefs.catalog.errors import BadInput
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.view import View

MAX_CAPS = 32
MAX_DEPTH = 8  # parents above a child, at most; a longer chain fails closed
_GLOB = frozenset("*?[]")

Cap = tuple[str, ...]  # a cap's components, root first: ("private", "projects")


@dataclass(frozen=True)
class Delegation:
    session_id: str
    parent_session_id: str
    caps: tuple[str, ...]  # as stored: "private/projects", ...
    created_at: int

    @property
    def cap_parts(self) -> tuple[Cap, ...]:
        return tuple(tuple(cap.split("/")) for cap in self.caps)


def parse_caps(patterns: Sequence[str]) -> tuple[str, ...]:
    """The caps ``patterns`` name, canonical (sorted, none inside another); BadInput for anything else."""
    if not patterns:
        raise BadInput("a child session needs at least one --cap")
    if len(patterns) > MAX_CAPS:
        raise BadInput(f"at most {MAX_CAPS} --cap patterns")
    found: list[Cap] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise BadInput("a --cap is text")
        text = pattern[:-3] if pattern.endswith("/**") else pattern
        parts = split_virtual_path(text)  # BadInput for '..', absolute, empty, control characters, ...
        if any(_GLOB & set(part) for part in parts):
            raise BadInput("a --cap is a folder of the view, e.g. private/projects or agent-shared/**;"
                           " no other wildcards")
        found.append(parts)
    return tuple("/".join(cap) for cap in _minimal(found))


def _minimal(caps: Iterable[Cap]) -> list[Cap]:
    """``caps`` without duplicates and without any cap inside another one, sorted."""
    unique = sorted(set(caps))
    return [cap for cap in unique if not any(other != cap and cap[: len(other)] == other for other in unique)]


def _below(inner: Cap, outer: Cap) -> bool:
    """Whether folder ``inner`` is ``outer`` or inside it."""
    return inner[: len(outer)] == outer


def intersect(first: Iterable[Cap], second: Iterable[Cap]) -> tuple[Cap, ...]:
    """The caps that let in exactly what both sets let in (for a child of a child)."""
    second = tuple(second)
    both: list[Cap] = []
    for a in first:
        for b in second:
            if _below(b, a):
                both.append(b)
            elif _below(a, b):
                both.append(a)
    return tuple(_minimal(both))


def restrict(view: View, caps: Iterable[Cap]) -> View:
    """``view`` narrowed to ``caps`` (and to the caps it already had): pure, never wider than ``view``."""
    caps = tuple(_minimal(caps))
    if view.caps is not None:
        caps = intersect(view.caps, caps)

    def touches(root: str, cap: Cap) -> bool:
        parts = tuple(root.split("/"))
        return _below(parts, cap) or _below(cap, parts)

    mounts = tuple(m for m in view.mounts if any(touches(m.root, cap) for cap in caps))
    # A cap that touches no mount names nothing of the view: it is dropped, and grants nothing.
    kept = tuple(cap for cap in caps if any(touches(m.root, cap) for m in mounts))
    excluded = tuple((root, reason) for root, reason in view.excluded if any(touches(root, cap) for cap in kept))
    capture = view.capture
    if capture is not None and not any(_below(tuple(capture.split("/")), cap) for cap in kept):
        capture = None  # new memories go to a whole root, never to part of one
    return dataclasses.replace(view, mounts=mounts, excluded=excluded, capture=capture, caps=kept)


def delegation_of(catalog: apsw.Connection, agent_id: str, session_id: str) -> Delegation | None:
    """The session's delegation row, or None for a session opened on its own."""
    row = one(catalog, "SELECT parent_session_id, caps, created_at FROM session_delegations"
                       " WHERE session_id = ? AND agent_id = ?", (session_id, agent_id))
    if row is None:
        return None
    caps = json.loads(row[1])
    return Delegation(session_id, row[0], tuple(str(cap) for cap in caps), row[2])


def record_delegation(catalog: apsw.Connection, agent_id: str, delegation: Delegation) -> None:
    """Stamp the delegation of a child just inserted (inside the caller's transaction)."""
    catalog.execute("INSERT INTO session_delegations (session_id, agent_id, parent_session_id, caps, created_at)"
                    " VALUES (?, ?, ?, ?, ?)", (delegation.session_id, agent_id, delegation.parent_session_id,
                                                 json.dumps(list(delegation.caps)), delegation.created_at))


def depth_of(catalog: apsw.Connection, agent_id: str, session_id: str) -> int:
    """How many parents lie above ``session_id`` (0: opened on its own); ``MAX_DEPTH + 1`` once past the bound."""
    depth, current = 0, session_id
    while depth <= MAX_DEPTH:
        found = delegation_of(catalog, agent_id, current)
        if found is None:
            return depth
        depth, current = depth + 1, found.parent_session_id
    return depth
