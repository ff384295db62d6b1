"""The search's candidate prefilter: a SQL predicate that may over-include.

The seed's one required property: every resource the pure evaluator would
allow is inside the prefilter's candidate set (tests/test_search_prefilter.py
checks it with generated policy states). Confidentiality never depends on
this predicate; ``catalog.search`` decides every candidate with the pure
evaluator before anything is ranked. It exists so that the ranking SQL only
ever walks the view's own stores, and so that over-fetch rarely has to go
round again: beyond placement in the view's stores it already drops what a
live matching deny removes and, for mounts that grant nothing by placement,
what no live matching allow admits.

Each condition mirrors a step of ``catalog.policy.evaluate`` and can only be
looser: a mount's ceiling is ignored (an allow it would not admit stays a
candidate), and an allow of either half of ``read`` (read or retrieve)
keeps a candidate.

A delegated session's caps (``catalog.delegation``) narrow the candidates
to the paths they let in, here already (so that notes outside them are
never walked, and never take a place in an arm's pages) and again in the
postfilter, which decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import apsw

from scopefs.catalog.policy import Mount, Op, required
from scopefs.catalog.stores import MountedStore, mounted_stores
from scopefs.catalog.subject import Subject

_READ_NEEDS = required(Op.READ)
_CAPS = ", ".join(f"'{op.value}'" for op in sorted(_READ_NEEDS))


@dataclass(frozen=True)
class Scope:
    """Where a search may look: the view's stores, who asks, and when."""

    agent_id: str
    subject: Subject
    stores: tuple[MountedStore, ...]
    now: int
    about: str | None = None  # a verified subject principal the results must carry
    caps: tuple[tuple[str, ...], ...] | None = None  # a delegated session's (``View.caps``); None: no caps

    def store(self, store_id: str) -> MountedStore | None:
        return next((s for s in self.stores if s.store_id == store_id), None)

    def permits(self, store_id: str, path: str) -> bool:
        """Whether the caps let in the note at ``path`` of the store (``View.permits``)."""
        store = self.store(store_id)
        if store is None:
            return False
        parts = (*store.mount.root.split("/"), *path.split("/"))
        return self.caps is None or any(len(parts) > len(cap) and parts[: len(cap)] == cap for cap in self.caps)

    def _capped(self) -> str | None:
        """The caps as (store, path prefix) pairs for ``predicate``; None without caps."""
        if self.caps is None:
            return None
        pairs = []
        for store in self.stores:
            root = tuple(store.mount.root.split("/"))
            for cap in self.caps:
                if root[: len(cap)] == cap:
                    pairs.append([store.store_id, ""])
                elif len(cap) > len(root) and cap[: len(root)] == root:
                    pairs.append([store.store_id, "/".join(cap[len(root):]) + "/"])
        return json.dumps(pairs)

    def params(self) -> dict[str, object]:
        """Named parameters of ``predicate``."""
        return {
            "agent": self.agent_id,
            "stores": json.dumps([s.store_id for s in self.stores]),
            "placed": json.dumps([s.store_id for s in self.stores if _READ_NEEDS <= s.mount.placement]),
            "principal": self.subject.principal_id,
            "kind": self.subject.kind.value,
            "now": self.now,
            "about": self.about,
            "capped": self._capped(),
        }


def scope_for(conn: apsw.Connection, agent_id: str, subject: Subject, mounts: tuple[Mount, ...], now: int,
              about: str | None = None, caps: tuple[tuple[str, ...], ...] | None = None) -> Scope:
    """Where a search of a view with ``mounts`` (and ``caps``, ``View.caps``) may look, as of ``now``."""
    return Scope(agent_id, subject, tuple(mounted_stores(conn, agent_id, mounts)), now, about, caps)


def _entries_matching(effect: str, store: str, resource: str) -> str:
    return (f"SELECT 1 FROM policy_entries e JOIN policies p USING (policy_id)"
            f" WHERE e.agent_id = :agent AND p.agent_id = :agent AND p.state = 'active' AND e.revoked_at IS NULL"
            f" AND e.effect = '{effect}' AND e.capability IN ({_CAPS})"
            f" AND (e.expires_at IS NULL OR e.expires_at > :now)"
            f" AND ((p.target_kind = 'store' AND p.target_id = {store})"
            f"      OR (p.target_kind = 'resource' AND p.target_id = {resource}))"
            f" AND (e.audience_kind = 'any' OR (e.audience_kind = 'principal' AND e.audience_id = :principal)"
            f"      OR (e.audience_kind = 'subject-kind' AND e.audience_id = :kind))")


def predicate(*, store: str, resource: str, revision: str) -> str:
    """The candidate condition over the given column expressions (named parameters from ``Scope.params``)."""
    return (
        f"{store} IN (SELECT value FROM json_each(:stores))"
        f" AND EXISTS (SELECT 1 FROM revisions pv JOIN resources pr ON pr.resource_id = pv.resource_id"
        f"             WHERE pv.revision_id = {revision} AND pv.agent_id = :agent AND pv.state = 'active'"
        f"               AND pr.state = 'live' AND pr.resource_id = {resource} AND pr.store_id = {store}"
        f"               AND (:capped IS NULL OR EXISTS (SELECT 1 FROM json_each(:capped) k"
        f"                    WHERE json_extract(k.value, '$[0]') = {store} AND substr(pr.path, 1,"
        f"                    length(json_extract(k.value, '$[1]'))) = json_extract(k.value, '$[1]'))))"
        f" AND NOT EXISTS ({_entries_matching('deny', store, resource)})"
        f" AND ({store} IN (SELECT value FROM json_each(:placed))"
        f"      OR EXISTS ({_entries_matching('allow', store, resource)}))"
        f" AND (:about IS NULL OR {resource} IN"
        f"      (SELECT rs.resource_id FROM resource_subjects rs WHERE rs.agent_id = :agent"
        f"       AND rs.principal_id = :about))"
    )


_RESOURCES = ("SELECT r.resource_id FROM resources r JOIN revisions v ON v.resource_id = r.resource_id"
              " AND v.state = 'active' WHERE r.agent_id = :agent AND "
              + predicate(store="r.store_id", resource="r.resource_id", revision="v.revision_id"))


def candidate_resources(conn: apsw.Connection, scope: Scope) -> set[str]:
    """Every resource the predicate admits (what the property test compares with the evaluator)."""
    return {row[0] for row in conn.execute(_RESOURCES, scope.params())}
